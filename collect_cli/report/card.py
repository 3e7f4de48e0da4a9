"""``rlcollect card``: a Markdown dataset card with Hugging Face dataset-card front matter.

The card holds YAML front matter (license, task category, tags, size category),
the description and provenance, the same summary table as ``rlcollect report``,
the schema (keys, shapes, dtypes) and the few lines that load the dataset. The
loading snippets name the dataset relative to the card's folder, so they run
from there (a card written beside its dataset runs as it is).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from collect_cli.dataformat import DATASET, EPISODES, MASK, OBSERVATION
from collect_cli.dataset import open_dataset
from collect_cli.report.stats import Stats

TASK = "reinforcement-learning"
DEFAULT_LICENSE = "unknown"  # a license id the Hub accepts; --license sets the real one
LICENSE_META = "license"
DESCRIPTION_META = "description"
# the Hub's size categories, by number of rows (frames here)
SIZES = (
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
)


def size_category(frames: int) -> str:
    for limit, name in SIZES:
        if frames < limit:
            return name
    return "n>1B"


def _tag(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def front_matter(stats: Stats, meta: dict[str, Any], license_id: str | None) -> dict[str, Any]:
    user = meta.get(DATASET) if isinstance(meta.get(DATASET), dict) else {}
    tags = ["rlcollect", "offline-rl"]
    for value in (meta.get("env_id"), f"policy-{meta.get('policy')}", meta.get("backend")):
        if value and _tag(str(value)) not in tags:
            tags.append(_tag(str(value)))
    return {
        "license": license_id or user.get(LICENSE_META) or DEFAULT_LICENSE,
        "task_categories": [TASK],
        "tags": tags,
        "size_categories": [size_category(int(stats.summary["frames"]))],
        "pretty_name": f"{meta.get('env_id')} {meta.get('policy')} (rlcollect)",
    }


def _md(value: Any) -> str:
    """A table cell: pipes escaped, dicts as ``key: value`` pairs."""
    if isinstance(value, dict):
        value = "; ".join(f"{k}: {v}" for k, v in value.items()) or "(none recorded)"
    elif isinstance(value, float):
        value = f"{value:.6g}"
    elif value is None:
        value = ""
    return str(value).replace("|", "\\|").replace("\n", " ")


def loading_snippets(ds_path: Path, backend: str, card_dir: Path) -> list[tuple[str, str]]:
    """``(language, code)`` blocks that load the dataset from the card's folder."""
    rel = os.path.relpath(ds_path.absolute(), card_dir.absolute())
    ident = f"rlcollect/{_tag(ds_path.stem) or 'dataset'}-v0"
    if backend == "hdf5":
        python = f"""import h5py
from tensordict import PersistentTensorDict

# plain h5py: one array per key, leading dims [lanes, time]
with h5py.File({json.dumps(rel)}, "r") as f:
    mask = f["{MASK}"][()]  # False marks padding
    observations = f["{OBSERVATION}"][0, :10]  # lane 0, first 10 steps
    episodes = {{name: f["{EPISODES}/" + name][()] for name in f["{EPISODES}"]}}
    print(int(mask.sum()), "valid frames,", len(episodes["traj_id"]), "episodes")

# the same dataset as a TensorDict, read lazily from the file
td = PersistentTensorDict.from_h5({json.dumps(rel)})
print(td.batch_size)
td.close()
"""
    else:
        python = f"""from tensordict import TensorDict

# the whole dataset, memory-mapped; frame keys have leading dims [lanes, time]
td = TensorDict.load_memmap({json.dumps(rel)})
frames = td.exclude("{EPISODES}")
mask = frames[{", ".join(f'"{k}"' for k in MASK.split("/"))}]  # False marks padding
frames.batch_size = mask.shape
valid = frames[mask]  # every valid frame, flat, in memory
print(valid.batch_size[0], "valid frames,", td["{EPISODES}", "traj_id"].shape[0], "episodes")
"""
    shell = f"rlcollect export {shlex.quote(rel)} --format minari --out minari/{ident}"
    minari = f"""import os

import minari

os.environ["MINARI_DATASETS_PATH"] = "minari"  # where the export above wrote it
dataset = minari.load_dataset("{ident}")
print(dataset.total_episodes, "episodes")
"""
    return [("python", python), ("bash", shell), ("python", minari)]


def is_card(path: Path) -> bool:
    """A card rlcollect wrote: Markdown whose front matter is tagged ``rlcollect``."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(1 << 16)
        _, front, _ = head.split("---\n", 2)
        return head.startswith("---\n") and "rlcollect" in (yaml.safe_load(front) or {})["tags"]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return False


def render_card(
    path: str | Path, stats: Stats, card_dir: Path, license_id: str | None = None
) -> str:
    """The card's Markdown text for the dataset at ``path`` (``stats`` from report)."""
    ds = open_dataset(path)
    meta = ds.meta
    user = meta.get(DATASET) if isinstance(meta.get(DATASET), dict) else {}
    front = yaml.safe_dump(front_matter(stats, meta, license_id), sort_keys=False)
    title = f"{meta.get('env_id')}: {meta.get('policy')} policy, {stats.summary['frames']:,} frames"
    description = user.get(DESCRIPTION_META) or (
        f"Trajectories of a {meta.get('policy')} policy in {meta.get('env_id')}, collected by "
        f"rlcollect {meta.get('rlcollect_version')} with seed {meta.get('seed')}."
    )
    lines = [f"---\n{front}---", f"# {title}", "", description, ""]
    lines += [f"> **Note:** {note}" for note in stats.notes]
    lines += ["", "## Summary", "", "| field | value |", "| --- | --- |"]
    lines += [f"| {_md(k)} | {_md(v)} |" for k, v in stats.summary.items()]
    lines += [
        "",
        "## Sources",
        "",
        "Each episode's `source` is its row here (the policy whose actions it holds):",
        "",
    ]
    lines += [
        "| source | policy | algorithm | checkpoint | training step | episodes | mean return |"
    ]
    lines += ["| --- | --- | --- | --- | --- | --- | --- |"]
    for row in stats.sources:
        mean = (row["return"] or {}).get("mean")
        cells = [row["source"], row["policy"], row["algorithm"], row["checkpoint"]]
        cells += [row["training_step"], row["episodes"], None if mean is None else f"{mean:.4g}"]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines += ["", "## Schema", ""]
    lines += [
        "Frame keys have leading dims `[lanes, time]` (one lane per environment, episodes "
        "contiguous in their lane); `collector/mask` is False on padding. `episodes/` has one "
        "row per trajectory.",
        "",
        "| key | shape | dtype |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{k}` | {tuple(shape)} | {dtype} |" for k, shape, dtype in ds.describe()]
    lines += ["", "## Load it", "", "From this card's folder:", ""]
    for language, code in loading_snippets(ds.path, ds.backend, card_dir):
        if language == "bash":
            lines += ["As a Minari dataset (`pip install 'rlcollect[export]'`):", ""]
        lines += [f"```{language}", code.rstrip("\n"), "```", ""]
    lines += [
        "## Provenance",
        "",
        f"Collected by rlcollect {meta.get('rlcollect_version')} from "
        f"{meta.get('start_time')} to {meta.get('end_time') or '(not ended)'}; the full "
        "composed config:",
        "",
        "```yaml",
        str(meta.get("config") or "").rstrip("\n"),
        "```",
        "",
    ]
    return "\n".join(lines)
