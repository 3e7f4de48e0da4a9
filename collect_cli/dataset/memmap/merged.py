"""A merge written as one memmap directory: every shard's frames copied."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, TRAJ
from collect_cli.dataformat import MEMMAP_META_FILE as META_FILE
from collect_cli.dataset.fsio import reserve
from collect_cli.dataset.memmap.tdmeta import write_json, write_td_meta


def write_merged(tmp: Path, dest: Path, shards: list, virtual: bool, meta, rows, keys) -> None:
    """Write the merge of ``shards`` (``ops.merge.Shard``s) into the directory ``tmp``:
    every frame copied (memmap files cannot link), ``meta`` and ``rows`` the merged
    metadata and episodes table, ``keys`` its frame keys ``{key: (per-frame shape,
    dtype)}``: where a shard lacks one, its lanes hold the fill (``dataformat.fill_value``)."""
    lanes, steps = meta["lanes"], meta["steps"]
    tmp.mkdir()
    leaves: dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]] = {}
    with contextlib.ExitStack() as readers:
        reads = [readers.enter_context(s.ds.reader()) for s in shards]
        for key, (feat, dtype) in keys.items():
            parts = tuple(key.split("/"))
            file = tmp.joinpath(*parts[:-1], parts[-1] + ".memmap")
            file.parent.mkdir(parents=True, exist_ok=True)
            full = (lanes, steps, *feat)
            dtype = np.dtype(dtype)
            # durability D9: real blocks (zeros: mask False), so that a full disk fails
            # here, not as a SIGBUS while the mapping is written
            file.touch()
            reserve(file, int(np.prod(full, dtype=np.int64)) * dtype.itemsize)
            os.truncate(file, int(np.prod(full, dtype=np.int64)) * dtype.itemsize)
            dst = np.memmap(file, dtype=dtype, mode="r+", shape=full)
            for shard, read in zip(shards, reads, strict=True):
                if key not in shard.arrays:
                    dst[shard.lane_offset : shard.lane_offset + shard.lanes] = fmt.fill_value(dtype)
                    continue
                shard.copy_into(read, key, dst)
                if key == TRAJ:
                    dst[shard.lane_offset : shard.lane_offset + shard.lanes, shard.steps :] = -1
            dst.flush()
            del dst
            leaves[parts] = (full, dtype)
    (tmp / fmt.EPISODES).mkdir()
    for name, dtype in COLUMNS.items():
        with open(tmp / fmt.EPISODES / f"{name}.memmap", "wb") as f:
            f.write(np.ascontiguousarray(rows[name], dtype).tobytes())
            os.fsync(f.fileno())
    write_td_meta(tmp, leaves, len(rows["traj_id"]))
    write_json(tmp / META_FILE, meta, sync=True)
