"""A merge written as one HDF5 file: the shards' frames linked (virtual datasets) or copied."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import h5py
import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, TRAJ
from collect_cli.dataset.fsio import reserve
from collect_cli.dataset.hdf5.attrs import RootAttrs
from collect_cli.dataset.hdf5.codecs import codec_filter


def write_merged(tmp: Path, dest: Path, shards: list, virtual: bool, meta, rows, keys) -> None:
    """Write the merge of ``shards`` (``ops.merge.Shard``s) into the file ``tmp``:
    their frames linked by virtual datasets where ``virtual`` (each shard's path
    relative to ``dest``'s folder), else copied; ``meta`` and ``rows`` are the merged
    metadata and episodes table, ``keys`` its frame keys ``{key: (per-frame shape,
    dtype)}``: where a shard lacks one, its frames hold the fill (``dataformat.fill_value``)."""
    lanes, steps = meta["lanes"], meta["steps"]
    readers = contextlib.ExitStack()
    with readers, h5py.File(tmp, "w", locking=False) as f:
        reads = [readers.enter_context(s.ds.reader()) for s in shards]
        dtypes = {key: np.dtype(dtype) for key, (_, dtype) in keys.items()}

        def copied(key: str) -> bool:
            return not virtual or any(s.changed(key) for s in shards if key in s.arrays)

        def row_bytes(key: str) -> int:
            return max(1, int(np.prod(keys[key][0], dtype=np.int64))) * dtypes[key].itemsize

        # durability D9: the space first, so that a full disk fails before HDF5 writes
        episodes = sum(np.asarray(column).nbytes for column in rows.values())
        reserve(tmp, lanes * steps * sum(row_bytes(k) for k in dtypes if copied(k)) + episodes)
        for key, (feat, _) in keys.items():
            dtype = dtypes[key]
            fill = -1 if key == TRAJ else 0
            if dtype.kind == "S":  # Text, as fixed-length bytes
                fill = b""
            holders = [(s, r) for s, r in zip(shards, reads, strict=True) if key in s.arrays]
            if len(holders) < len(shards):
                fill = fmt.fill_value(dtype)
            if copied(key):
                if fmt.leaf_codec(fmt.AUTO, feat, dtype) != "none" and not meta.get(fmt.CODEC):
                    meta[fmt.CODEC] = fmt.codec_meta(fmt.IMAGE_CODEC, None, fmt.IMAGE_LEAVES)
                row = row_bytes(key)
                chunk = max(1, min(1024, steps, (1 << 20) // row))
                ds = f.create_dataset(
                    key,
                    shape=(lanes, steps, *feat),
                    dtype=dtype,
                    chunks=(1, chunk, *feat),
                    fillvalue=fill,
                    # frames copied are stored as a run's defaults store them
                    **codec_filter(fmt.leaf_codec(fmt.AUTO, feat, dtype), None),
                )
                for shard, read in holders:
                    shard.copy_into(read, key, ds)
                continue
            layout = h5py.VirtualLayout(shape=(lanes, steps, *feat), dtype=dtype)
            for shard, _ in holders:
                # relative to the merged file's directory: HDF5 looks there first
                name = os.path.relpath(shard.path.resolve(), dest.resolve().parent)
                src = h5py.VirtualSource(name, key, shape=shard.arrays[key][0], dtype=dtype)
                lo = shard.lane_offset
                if shard.whole:
                    layout[lo : lo + shard.lanes, : shard.steps] = src[:, : shard.steps]
                    continue
                for lane, committed in enumerate(shard.lane_steps.tolist()):
                    if committed:
                        layout[lo + lane, :committed] = src[lane, :committed]
            f.create_virtual_dataset(key, layout, fillvalue=fill)
        for name in COLUMNS:
            f.create_dataset(fmt.column(name), data=rows[name])
        RootAttrs(f).store(meta)
        f.flush()
        used = f.id.get_filesize()  # HDF5's end of allocated space
    os.truncate(tmp, used)  # give back what was reserved beyond it
