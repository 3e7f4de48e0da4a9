"""The numbers behind ``rlcollect report`` and ``rlcollect card``, read in bounded memory.

:func:`dataset_stats` reads a dataset once: the ``episodes/`` table whole (one
row per trajectory), then the per-frame columns in blocks of time steps over all
lanes (about ``BLOCK_BYTES`` a block). Per-dimension distributions come from a
systematic sample of at most ``SAMPLE_FRAMES`` valid frames (every k-th one),
so memory stays bounded whatever the dataset's size. Nothing here prints or
plots: the result is plain data, rendered by :mod:`collect_cli.report.html` and
printed as JSON by the CLI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from gymnasium import spaces

from collect_cli import dataformat as fmt
from collect_cli import specs
from collect_cli.dataformat import ACTION, MASK, OBSERVATION, TRAJ
from collect_cli.dataset import Dataset, open_dataset
from collect_cli.errors import DatasetError
from collect_cli.ops.frames import Source
from collect_cli.ops.summary import codec_words, episode_rows, summarize
from collect_cli.policies.provenance import NORMALIZED_SCORE

# metadata keys the report reads where the dataset has them

BLOCK_BYTES = 32 << 20  # frame bytes read per block, over all lanes and keys read
SAMPLE_FRAMES = 20_000  # valid frames sampled for the per-dimension distributions
MAX_DIMS = 8  # dimensions shown per group (action, observation): the first ones
MAX_CATEGORIES = 32  # discrete values shown as bars; more become a histogram
HIST_BINS = 40
DRIFT_POINTS = 200  # return against episode order: at most this many points
STRIP_FRAMES = 8  # frames of one episode shown for image observations
DISCRETE = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)  # bars, not histograms


@dataclass
class Stats:
    """Everything the report shows for one dataset. ``as_dict`` is its JSON form."""

    path: str
    name: str
    summary: dict[str, Any]
    returns: dict[str, float] | None
    episodes: dict[str, Any]
    dims: dict[str, list[dict[str, Any]]]
    sample: dict[str, int]
    padding: dict[str, Any]
    lanes: dict[str, list[int]]
    notes: list[str]
    sources: list[dict[str, Any]] = field(default_factory=list)  # ops.summary.by_source
    strip: dict[str, Any] | None = None
    strip_frames: list[np.ndarray] = field(default_factory=list)  # pixels: not in JSON

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "name": self.name,
            "summary": self.summary,
            "return": self.returns,
            "episodes": self.episodes,
            "dims": self.dims,
            "sample": self.sample,
            "padding": self.padding,
            "lanes": self.lanes,
            "sources": self.sources,
            "image_strip": self.strip,
            "notes": self.notes,
        }


def dataset_stats(
    path: str | Path, refs: tuple[float, float] | None = None, frames: bool = True
) -> Stats:
    """Read the dataset at ``path`` once and return the numbers behind its report;
    ``refs``: reference scores for the normalised score (else the dataset's own);
    ``frames``: the per-frame numbers too (the plots'; a card needs only the
    summary, from the metadata and the episodes table)."""
    ds = open_dataset(path)
    try:
        return _stats(ds, refs, frames)
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise DatasetError(
            f"cannot read {str(path)!r} ({exc}); `rlcollect validate {path}` says what is wrong"
        ) from None


def _stats(ds: Dataset, refs: tuple[float, float] | None, frames: bool = True) -> Stats:
    meta = ds.meta
    rows = episode_rows(ds)
    count = len(rows["traj_id"])
    complete = rows["complete"].astype(bool)
    returns = rows["return"][complete].astype(np.float64)
    lengths = rows["length"][complete]
    ret = fmt.return_stats(rows)
    notes = []
    status = meta.get("status")
    if status != fmt.COMPLETE:
        notes.append(
            f"{ds.path.name} is {status}: this report shows the frames committed so far "
            f"({meta.get('frames', 0)} frames, {count} episodes)"
        )
    obs_space, act_space = _space(meta, "observation_space"), _space(meta, "action_space")
    one = summarize(ds, rows, refs)
    stats = Stats(
        path=str(ds.path),
        name=ds.path.name,
        summary=summary(ds, one, ret, obs_space, act_space),
        sources=one[fmt.SOURCES],
        returns=ret,
        episodes={
            "return_hist": _histogram(returns),
            "length_hist": _histogram(lengths, integer=True),
            "drift": _drift(returns),
        },
        dims={ACTION: [], OBSERVATION: []},
        sample={"frames": 0, "of": 0, "every": 0},
        padding={},
        lanes={},
        notes=notes,
    )
    if not meta.get("frames"):
        notes.append(f"{ds.path.name} holds no committed frames yet: nothing to plot")
        return stats
    if not frames:  # the schema at least: a card of a damaged dataset is refused
        stored = {key for key, _, _ in ds.describe()}
        for key in fmt.REQUIRED_FRAME_KEYS:
            if not any(k == key or k.startswith(key + "/") for k in stored):
                raise KeyError(key)
        return stats
    try:
        src = Source(ds)
    except DatasetError:  # frames recorded, but no frame storage to read them from
        raise KeyError(MASK) from None
    try:
        _stream(src, rows, stats, obs_space, act_space)
        _image_strip(src, rows, stats, obs_space)
    finally:
        src.close()
    return stats


def _space(meta: dict[str, Any], key: str):
    desc = meta.get(key)
    try:
        return specs.rebuild(desc) if desc else None
    except (KeyError, TypeError, ValueError):
        return None  # a space this version cannot rebuild: shown as recorded


def _config(meta: dict[str, Any]) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(meta.get("config") or "")
    except yaml.YAMLError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def provenance(meta: dict[str, Any]) -> dict[str, Any]:
    """The user's ``dataset.`` keys and the policy's provenance, as far as recorded."""
    out: dict[str, Any] = {}
    policy_cfg = _config(meta).get("policy")
    if isinstance(policy_cfg, dict):
        out.update({f"policy.{k}": v for k, v in policy_cfg.items() if v not in (None, "", [])})
    for source in (meta.get(fmt.PROVENANCE), meta.get(fmt.DATASET)):
        if isinstance(source, dict):
            out.update({k: v for k, v in source.items() if v not in (None, "", [])})
    return out


def summary(ds: Dataset, one: dict[str, Any], ret, obs_space, act_space) -> dict[str, Any]:
    """The summary table's rows (label -> JSON value), in display order: the
    dataset's one summary (``ops.summary``), labelled for people."""
    meta = ds.meta
    out: dict[str, Any] = {
        "path": one["path"],
        "env": one["env_id"],
        "observation space": str(obs_space) if obs_space else meta.get("observation_space"),
        "action space": str(act_space) if act_space else meta.get("action_space"),
        "policy": one["policy"],
        "provenance": provenance(meta),
        "seed": one["seed"],
        "status": one["status"],
        "frames": one["frames"],
        "lanes x steps": f"{one['lanes']} x {one['steps']}",
        "episodes": one["episodes"],
        "complete episodes": one["complete_episodes"],
        "cut episodes": one["episodes"] - one["complete_episodes"],
    }
    for stat in ("mean", "std", "min", "max"):
        out[f"return {stat}"] = ret[stat] if ret else None
    refs = one["reference_scores"]
    if refs and ret:
        out["normalised score"] = one[NORMALIZED_SCORE]
        out["reference scores"] = f"{refs[0]:g} .. {refs[1]:g}"
    out["bytes on disk"] = one["size_bytes"]
    out["backend"] = one["backend"]
    out["layout"] = one["layout"]
    out["codec"] = codec_words(one)
    if one["shards"]:
        out["merged from"] = f"{one['shards']} shards"
    out["collected"] = f"{one['start_time']} .. {one['end_time'] or '(not ended)'}"
    out["rlcollect"] = one["rlcollect_version"]
    return out


def _histogram(values: np.ndarray, integer: bool = False) -> dict[str, list]:
    if not len(values):
        return {"edges": [], "counts": []}
    if integer:
        low, high = int(values.min()), int(values.max())
        width = max(1, math.ceil((high - low + 1) / HIST_BINS))  # whole lengths per bin
        edges = np.arange(low, high + width + 1, width) - 0.5
        counts, edges = np.histogram(values, bins=edges)
    else:
        counts, edges = np.histogram(values, bins=HIST_BINS)
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def _drift(returns: np.ndarray) -> dict[str, list]:
    """Mean (min, max) return of consecutive groups of episodes, in recorded order."""
    n = len(returns)
    groups = min(n, DRIFT_POINTS)
    if not groups:
        return {"episode": [], "mean": [], "min": [], "max": []}
    starts = (np.arange(groups) * n) // groups
    sizes = np.diff(np.append(starts, n))
    return {
        "episode": (starts + (sizes - 1) / 2).tolist(),
        "mean": (np.add.reduceat(returns, starts) / sizes).tolist(),
        "min": np.minimum.reduceat(returns, starts).tolist(),
        "max": np.maximum.reduceat(returns, starts).tolist(),
    }


def is_image(leaf: specs.Leaf) -> bool:
    return fmt.is_image(leaf.shape, leaf.dtype)


def _leaves(space, head: str) -> list[tuple[str, specs.Leaf]]:
    if space is None:
        return []
    return [("/".join((head, *leaf.key)), leaf) for leaf in specs.leaves(space)]


def _stream(src: Source, rows, stats: Stats, obs_space, act_space) -> None:
    """One pass over the frames: mask and per-lane counts, and the sampled frames."""
    lanes, steps = src.lanes, src.steps
    wanted = {
        group: [  # Text (strings) has no distribution to plot
            (k, leaf)
            for k, leaf in _leaves(space, group)
            if not is_image(leaf) and not specs.is_strings(leaf.space)
        ]
        for group, space in ((ACTION, act_space), (OBSERVATION, obs_space))
    }
    items = [item for group in wanted.values() for item in group]
    keys = [k for k, _ in items]
    frame_bytes = 1 + sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for _, leaf in items)
    window = max(1, BLOCK_BYTES // max(1, lanes * frame_bytes))
    total = int(stats.summary["frames"])
    every = max(1, math.ceil(total / SAMPLE_FRAMES))
    frames_per_lane = np.zeros(lanes, np.int64)
    padding_per_lane = np.zeros(lanes, np.int64)
    samples: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    seen = 0
    for t0 in range(0, steps, window):
        t1 = min(steps, t0 + window)
        mask = src.read(MASK, slice(None), t0, t1).reshape(lanes, t1 - t0).astype(bool)
        committed = np.arange(t0, t1)[None, :] < src.lane_steps[:, None]
        valid = mask & committed
        frames_per_lane += valid.sum(axis=1)
        padding_per_lane += (committed & ~mask).sum(axis=1)
        flat = np.flatnonzero(valid)
        picked = flat[(seen + np.arange(len(flat))) % every == 0]
        seen += len(flat)
        if not len(picked) or not keys:
            continue
        lane_i, t_i = np.divmod(picked, t1 - t0)
        for key in keys:
            block = src.read(key, slice(None), t0, t1)
            samples[key].append(block[lane_i, t_i].reshape(len(picked), -1))
    episodes_per_lane = np.bincount(rows["lane"], minlength=lanes)[:lanes]
    committed_slots = int(src.lane_steps.sum())
    valid_frames = int(frames_per_lane.sum())
    padding = int(padding_per_lane.sum())
    stats.padding = {
        "slots": lanes * steps,
        "committed_slots": committed_slots,
        "valid_frames": valid_frames,
        "padding_frames": padding,
        "padding_fraction": padding / committed_slots if committed_slots else 0.0,
        "unwritten_slots": lanes * steps - committed_slots,
        "lanes_with_padding": int((padding_per_lane > 0).sum()),
    }
    if valid_frames != total:
        stats.notes.append(
            f"{stats.name}: {valid_frames} valid frames on disk, metadata says {total}"
        )
    stats.lanes = {
        "frames": frames_per_lane.tolist(),
        "padding": padding_per_lane.tolist(),
        "episodes": episodes_per_lane.tolist(),
    }
    sampled = sum(len(s) for s in next(iter(samples.values()), []))
    stats.sample = {"frames": sampled, "of": valid_frames, "every": every}
    for group, items in wanted.items():
        shown: list[dict[str, Any]] = []
        dims_total = 0
        for key, leaf in items:
            values = np.concatenate(samples[key]) if samples[key] else np.zeros((0, 1), leaf.dtype)
            discrete = isinstance(leaf.space, DISCRETE)
            width = max(1, int(np.prod(leaf.shape)))
            dims_total += width
            for d in range(width):
                if len(shown) >= MAX_DIMS:
                    break
                label = f"{key}[{d}]" if width > 1 or leaf.shape else key
                shown.append(_distribution(label, values[:, d], discrete))
        stats.dims[group] = shown
        stats.sample[f"{group}_dims_shown"] = len(shown)
        stats.sample[f"{group}_dims"] = dims_total


def _distribution(label: str, values: np.ndarray, discrete: bool) -> dict[str, Any]:
    if discrete:
        uniq, counts = np.unique(values, return_counts=True)
        if len(uniq) <= MAX_CATEGORIES:
            return {
                "label": label,
                "kind": "discrete",
                "values": uniq.tolist(),
                "counts": counts.tolist(),
            }
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    hist = _histogram(finite.astype(np.float64))
    return {"label": label, "kind": "continuous", **hist}


def _image_strip(src: Source, rows, stats: Stats, obs_space) -> None:
    """Up to ``STRIP_FRAMES`` frames, evenly spaced, of the first (complete) episode."""
    images = [(k, leaf) for k, leaf in _leaves(obs_space, OBSERVATION) if is_image(leaf)]
    if not images or not len(rows["traj_id"]):
        return
    key = images[0][0]
    complete = np.flatnonzero(rows["complete"])
    row = int(complete[0]) if len(complete) else 0
    traj, lane = int(rows["traj_id"][row]), int(rows["lane"][row])
    start, length = int(rows["start"][row]), int(rows["length"][row])
    # padding may sit inside an episode: look a little past its length for its frames
    stop = min(int(src.lane_steps[lane]), start + 2 * length + 64)
    ids = src.read(TRAJ, lane, start, stop).reshape(-1)
    mask = src.read(MASK, lane, start, stop).reshape(-1).astype(bool)
    where = np.flatnonzero((ids == traj) & mask)
    if not len(where):
        return
    picks = np.unique(np.linspace(0, len(where) - 1, min(STRIP_FRAMES, len(where))).round())
    steps = picks.astype(np.int64)
    stats.strip_frames = [
        src.read(key, lane, start + int(where[s]), start + int(where[s]) + 1)[0] for s in steps
    ]
    stats.strip = {
        "key": key,
        "traj_id": traj,
        "lane": lane,
        "episode_length": length,
        "steps": steps.tolist(),
        "shape": list(stats.strip_frames[0].shape),
    }
