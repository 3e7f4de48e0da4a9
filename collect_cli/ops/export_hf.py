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
from collect_cli import dataformat as fmt
from collect_cli.errors import UsageError
from collect_cli.ops.frames import INCOMPLETE_END, Plan, Source, blocks, d4rl_name

INSTALL = "pip install 'rlcollect[export]'"
ROW_GROUP_BYTES = 8 << 20  # frames buffered before a row group is written (peak RSS)
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
    ends = plan.starts + plan.lengths  # in export order: frame index of each episode's end
    flags = {"dones": plan.terminals | plan.timeouts}
    flags.update(terminals=plan.terminals, timeouts=plan.timeouts)
    shapes: dict[str, list[int]] = {}
    writer: Any = None
    shards: list[Path] = []
    written = 0  # frame bytes in the open shard
    pending: list[dict[str, np.ndarray]] = []  # blocks of frames not written yet
    first = 0  # export index of pending's first frame: an episode's start
    episode = 0  # its episode

    def write(stop: int, last: int) -> None:
        """Write the pending frames up to ``stop``, the end of episode ``last - 1``."""
        nonlocal writer, written, pending, first, episode
        joined = {k: np.concatenate([b[k] for b in pending]) for k in pending[0]}
        frames = {k: v[: stop - first] for k, v in joined.items()}
        frames.update({flag: values[first:stop] for flag, values in flags.items()})
        table = _table(pa, frames, plan.lengths[episode:last], names, shapes)
        table = table.append_column(fmt.SOURCE, pa.array(plan.sources[episode:last], pa.int64()))
        if writer is None or written >= SHARD_BYTES:
            if writer is not None:
                writer.close()
            shards.append(path / "data" / f"train-{len(shards):05d}.parquet")
            meta = {b"rlcollect": json.dumps(_metadata(src, plan, shapes)).encode()}
            writer = pq.ParquetWriter(shards[-1], table.schema.with_metadata(meta))
            written = 0
        writer.write_table(table)
        written += sum(v.nbytes for v in frames.values())
        rest = {k: v[stop - first :] for k, v in joined.items()}
        pending = [rest] if len(next(iter(rest.values()))) else []
        first, episode = stop, last

    have, size = first, 0
    for block in blocks(src, keys, plan.keep):
        pending.append(block)
        have += len(next(iter(block.values())))
        size += sum(v.nbytes for v in block.values())
        if size >= ROW_GROUP_BYTES:  # the whole episodes buffered, as one row group
            last = int(np.searchsorted(ends, have, side="right"))
            if last > episode:
                write(int(ends[last - 1]), last)
                size = sum(v.nbytes for b in pending for v in b.values())
    if pending:
        write(int(ends[-1]), len(ends))
    if writer is not None:
        writer.close()
    for i, shard in enumerate(shards):  # the Hub's names, now that the count is known
        shard.rename(shard.with_name(f"train-{i:05d}-of-{len(shards):05d}.parquet"))
    if readme is not None:
        (path / "README.md").write_text(readme)


def _table(pa, frames: dict[str, np.ndarray], lengths: np.ndarray, names, shapes):
    """A table of whole episodes of ``lengths`` from their ``frames``: each column a
    list per episode of the step values, in the order of the Hub's replay datasets:
    CORE, FLAGS, then the extras."""
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    column = {key: names.get(key) or key for key in frames}
    head = {key: name.split(".")[0] for key, name in column.items()}
    rank = {key: CORE.index(h) if h in CORE else len(CORE) + 1 for key, h in head.items()}
    rank.update({flag: len(CORE) for flag in FLAGS})
    columns: dict[str, Any] = {}
    for key in sorted(frames, key=lambda k: (rank[k], column[k])):
        values = frames[key]
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
        "frames": plan.frames,
        "incomplete_episodes": plan.incomplete,
        "incomplete": "dropped" if plan.dropped else INCOMPLETE_END["hf"],
        "shapes": shapes,  # each column's per-step shape
        "observation_space": meta.get("observation_space"),
        "action_space": meta.get("action_space"),
        "provenance": meta.get("provenance"),
        fmt.SOURCES: fmt.sources(meta),  # the source column of an episode: its row
    }
