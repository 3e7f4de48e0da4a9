"""``export --format hf``: Parquet with one row per episode, laid out as the Decision
Transformer gym-replay datasets on the Hugging Face Hub: ``observations``,
``actions``, ``rewards``, ``dones`` (an episode's end), ``terminals`` and
``timeouts``, plus the recorded extras (``infos.*``), under ``data/`` as
``train-NNNNN-of-NNNNN.parquet`` shards, with the card (``README.md``) beside them.
``datasets.load_dataset("parquet", data_dir=DIR)`` loads it.

A per-step value of shape ``S`` is a list of ``prod(S)`` numbers (its shape is in
the schema's ``rlcollect`` metadata); a scalar is a number. Streams: memory is
bounded by one row group (``ROW_GROUP_BYTES`` of frames), not by the dataset.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import __version__
from collect_cli.errors import UsageError
from collect_cli.ops.frames import INCOMPLETE_END, Plan, Source, blocks, d4rl_name, episodes

INSTALL = "pip install 'rlcollect[export]'"
ROW_GROUP_BYTES = 64 << 20  # frames buffered before a row group is written
SHARD_BYTES = 512 << 20  # frames per Parquet file, about
CORE = ("observations", "actions", "rewards")  # the first columns, then FLAGS
FLAGS = ("dones", "terminals", "timeouts")


def require_pyarrow() -> None:
    try:
        importlib.import_module("pyarrow.parquet")
    except ImportError as exc:
        raise UsageError(f"--format hf needs pyarrow ({exc}): {INSTALL}") from None


def hf_column(key: str) -> str | None:
    """The column a dataset key becomes (None: not exported). Rows are whole
    episodes, so ``next/observation`` is the next row's observation and is left out."""
    name = d4rl_name(key)
    if name is None or name.startswith("next_observations"):
        return None
    return name.replace("/", ".")


def is_hf_export(path: Path) -> bool:
    """An hf export's folder (what ``--overwrite`` may replace), or an empty one."""
    if not path.is_dir():
        return False
    return any((path / "data").glob("train-*.parquet")) or not any(path.iterdir())


def write_hf(src: Source, plan: Plan, path: Path, readme: str | None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = {k: hf_column(k) for k in src.keys}
    keys = [k for k, name in names.items() if name is not None]
    (path / "data").mkdir(parents=True)
    shapes: dict[str, list[int]] = {}
    writer: Any = None
    shards: list[Path] = []
    written = 0  # frame bytes in the open shard
    rows: list[dict[str, np.ndarray]] = []
    buffered = 0

    def flush() -> None:
        nonlocal writer, written, rows, buffered
        if not rows:
            return
        table = _table(pa, rows, names, shapes)
        if writer is None or written >= SHARD_BYTES:
            if writer is not None:
                writer.close()
            shards.append(path / "data" / f"train-{len(shards):05d}.parquet")
            meta = {b"rlcollect": json.dumps(_metadata(src, plan, shapes)).encode()}
            writer = pq.ParquetWriter(shards[-1], table.schema.with_metadata(meta))
            written = 0
        writer.write_table(table)
        written += buffered
        rows, buffered = [], 0

    ends = plan.starts + plan.lengths
    flags = {
        "dones": plan.terminals | plan.timeouts,
        "terminals": plan.terminals,
        "timeouts": plan.timeouts,
    }
    for index, episode in enumerate(episodes(blocks(src, keys, plan.keep), plan.lengths)):
        frames = slice(int(plan.starts[index]), int(ends[index]))
        rows.append({**episode, **{flag: values[frames] for flag, values in flags.items()}})
        buffered += sum(v.nbytes for v in episode.values())
        if buffered >= ROW_GROUP_BYTES:
            flush()
    flush()
    if writer is not None:
        writer.close()
    for i, shard in enumerate(shards):  # the Hub's names, now that the count is known
        shard.rename(shard.with_name(f"train-{i:05d}-of-{len(shards):05d}.parquet"))
    if readme is not None:
        (path / "README.md").write_text(readme)


def _table(pa, rows: list[dict[str, np.ndarray]], names: dict[str, str | None], shapes):
    """A table of ``rows`` (episodes), each column a list per episode of the step
    values, in the order of the Hub's replay datasets: CORE, FLAGS, then the extras."""
    lengths = np.array([len(row["dones"]) for row in rows], np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    column = {key: names.get(key) or key for key in rows[0]}
    head = {key: name.split(".")[0] for key, name in column.items()}
    rank = {key: CORE.index(h) if h in CORE else len(CORE) + 1 for key, h in head.items()}
    rank.update({flag: len(CORE) for flag in FLAGS})
    columns: dict[str, Any] = {}
    for key in sorted(rows[0], key=lambda k: (rank[k], column[k])):
        values = np.concatenate([row[key] for row in rows])
        if column[key] == "rewards":
            values = values.reshape(len(values))  # a number a step, as D4RL's
        shapes[column[key]] = list(values.shape[1:])
        columns[column[key]] = pa.ListArray.from_arrays(offsets, _steps(pa, values))
    return pa.table(columns)


def _steps(pa, values: np.ndarray):
    """One Arrow value per step: a number, a string, or a flat list of numbers."""
    if values.dtype.kind == "S":  # Text, as fixed-length UTF-8 bytes
        return pa.array(np.char.decode(values.reshape(len(values)), "utf-8").tolist(), pa.string())
    if values.ndim == 1:
        return pa.array(values)
    flat = values.reshape(len(values), -1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


def _metadata(src: Source, plan: Plan, shapes: dict[str, list[int]]) -> dict[str, Any]:
    meta = src.meta
    return {
        "format": "hf",
        "exported_by": f"rlcollect {__version__}",
        "env_id": meta.get("env_id"),
        "policy": meta.get("policy"),
        "seed": meta.get("seed"),
        "source": str(src.ds.path.absolute()),
        "source_status": meta.get("status"),
        "episodes": len(plan.starts),
        "frames": len(plan.ids),
        "incomplete_episodes": plan.incomplete,
        "incomplete": "dropped" if plan.dropped else INCOMPLETE_END["hf"],
        "shapes": shapes,  # each column's per-step shape
        "observation_space": meta.get("observation_space"),
        "action_space": meta.get("action_space"),
        "provenance": meta.get("provenance"),
    }
