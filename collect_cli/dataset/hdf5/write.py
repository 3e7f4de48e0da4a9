"""The HDF5 writer: frames into chunked ``[lanes, time, ...]`` datasets, a commit per batch."""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, Rows
from collect_cli.dataset.fsio import drop_behind, start_write_back
from collect_cli.dataset.hdf5.attrs import (
    COMMIT_SLOTS,
    RootAttrs,
    commit_record,
    file_meta,
    lanes_limit,
)
from collect_cli.dataset.hdf5.chunks import CHUNK_TARGET, Block, chunk_cache, chunk_shape
from collect_cli.dataset.hdf5.codecs import codec_filter, needs_plugin
from collect_cli.dataset.hdf5.file import (
    CommitOrderedFile,
    allocated_end,
)
from collect_cli.dataset.writer import Writer
from collect_cli.errors import ConfigError, WriteError

FILL = {fmt.TRAJ_KEY: -1, fmt.FINAL_LANE_KEY: fmt.FINAL_FILL, fmt.FINAL_TIME_KEY: fmt.FINAL_FILL}
RESERVE_MARGIN = 1 << 20  # room for HDF5 metadata and for closing after a failed reservation


class Hdf5Writer(Writer):
    backend = "hdf5"

    def __init__(
        self,
        path,
        *,
        compression: str = fmt.AUTO,
        compression_level: int | None = None,
        chunk_frames: int = 65536,
        **kw,
    ):
        super().__init__(path, **kw)
        self.compression, self.level = compression, compression_level
        named = compression if compression != fmt.AUTO else "none"  # auto: known at _create
        codec_filter(named, compression_level)  # a missing plugin fails here, not mid-run
        self.meta[fmt.CODEC] = fmt.codec_meta(named, compression_level)
        self.chunk_frames = chunk_frames
        self._file: h5py.File | None = None
        self._attrs: RootAttrs | None = None
        self._frames: dict[tuple[str, ...], Block] = {}
        self._episodes: dict[str, Block] = {}
        self._finals: dict[tuple[str, ...], Block] = {}
        self._fd: int | None = None
        self._io: CommitOrderedFile | None = None
        self._behind = (0, 0)  # the file's bytes the last write-back started writing out
        self._reserved = 0
        self._seq = 0  # commits made (the last commit record's number)
        self._text: set[tuple[str, ...]] = set()  # Text keys: stored as fixed-length bytes
        if self.lanes is not None and (why := lanes_limit(self.lanes, "env lanes")):
            raise ConfigError(
                f"{why}: use writer=memmap, or fewer env.num_envs x collector.workers"
            )

    # durability D9 (docs/durability.md)
    def _reserve(self, nbytes: int) -> None:
        """Allocate disk space ahead of HDF5, so that a full disk (or a file-size
        limit) fails here, before HDF5 writes anything, and never inside HDF5,
        which cannot recover from a failed write and may leave the file unreadable."""
        want = self._file.id.get_filesize() + nbytes + RESERVE_MARGIN
        if want > self._reserved:
            want = max(want, self._reserved + self._reserved // 4)
            os.posix_fallocate(self._fd, 0, want)
            self._reserved = want

    # durability D1 (docs/durability.md)
    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        self._io = CommitOrderedFile(self._fd)  # with the commit clock (durability D22)
        self._file = h5py.File(self._io, "w", locking=False)
        self._reserve(0)
        self._attrs = RootAttrs(self._file)
        self._attrs.store(self.meta)
        for name, dtype in COLUMNS.items():
            ds = self._file.create_dataset(
                fmt.column(name), shape=(1,), maxshape=(None,), dtype=dtype, chunks=(4096,)
            )
            ds[0] = 0
            self._episodes[name] = Block(ds)
        # A chunked dataset gets its chunk index with its first chunk, and the flush
        # that writes them both writes the header pointing to the index first. So
        # the index is made here, in the file not yet renamed into place: one row
        # written, flushed, and cut again (an empty index stays).
        self._flush()
        for block in self._episodes.values():
            block.resize(0, axis=0)
        self._flush()
        self._behind = (self._file.id.get_filesize(),) * 2  # what is before: never dropped

    def _reopen(self) -> dict[str, Any]:
        self._fd = os.open(self.path, os.O_RDWR)
        self._io = CommitOrderedFile(self._fd, committed=allocated_end(self._fd))
        self._file = h5py.File(self._io, "r+", locking=False)
        self._reserved = os.fstat(self._fd).st_size
        self._behind = (self._file.id.get_filesize(),) * 2
        self._attrs = RootAttrs(self._file)

        def collect(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                if fmt.is_episodes(name):
                    self._episodes[name.split("/", 1)[1]] = Block(obj)
                elif fmt.key_of(name)[0] == fmt.FINAL:
                    self._finals[fmt.key_of(name)] = Block(obj)
                else:
                    self._frames[tuple(name.split("/"))] = Block(obj)
                    if obj.dtype.kind == "S":
                        self._text.add(tuple(name.split("/")))

        meta, self._seq = file_meta(self._file.attrs)
        needs_plugin(meta)
        self._file.visititems(collect)
        self._created = bool(self._frames)
        return meta

    def _drop_uncommitted(self) -> None:
        for block in self._episodes.values():
            block.resize(self.episodes, axis=0)
        if not self._created:
            return
        for block in self._frames.values():
            block.resize(self.steps, axis=1)
            block.resize(self.lanes, axis=0)  # rows appended after the last commit
        mask, traj = self._frames[fmt.MASK_KEY].ds, self._frames[fmt.TRAJ_KEY].ds
        for lane in np.flatnonzero(self.cursor < self.steps):
            mask[lane, self.cursor[lane] :] = False
            traj[lane, self.cursor[lane] :] = -1

    def _cut_finals(self, count: int) -> None:
        for block in self._finals.values():
            block.resize(count, axis=0)

    def _read(self, key: str) -> np.ndarray:
        return self._file[key][()]

    def _has(self, key: str) -> bool:
        return tuple(key.split("/")) in self._frames

    def _window(self, key: fmt.Key, lane: int, t0: int, t1: int) -> np.ndarray:
        return self._frames[key].ds[lane, t0:t1]

    def _set_points(self, key: fmt.Key, lanes: np.ndarray, times: np.ndarray) -> None:
        ds = self._frames[key].ds
        chunk = ds.chunks
        touched = len(np.unique(lanes // chunk[0] * (1 << 32) + times // chunk[1]))
        self._reserve(touched * int(np.prod(chunk, dtype=np.int64)) * ds.dtype.itemsize)
        for t in np.unique(times).tolist():  # one write per time step: lanes in a row
            at = np.unique(lanes[times == t]).tolist()
            ds[at if len(at) > 1 else at[0], t] = True
        # durability D13: on disk before the next key's (next/truncated before next/done),
        # so that a kill between them leaves a cut not yet flagged done, as memmap's does
        self._flush()

    def _check_rows(self, lanes: int) -> None:
        """Rows (split_trajs: one an episode) past :data:`MAX_LANES` stop the run
        before any is written; what was committed stays."""
        if why := lanes_limit(lanes, "rows"):
            raise WriteError(
                f"{why}: with split_trajs=true every episode is a row; the dataset is readable "
                f"up to the last commit ({self.meta.get('frames', 0)} frames); use "
                "writer=memmap for more episodes"
            )

    def _grow_lanes(self, lanes: int) -> None:
        self._check_rows(lanes)
        for block in self._frames.values():
            block.resize(lanes, axis=0)

    def _codec(self, feat: tuple[int, ...], dtype: np.dtype) -> dict[str, Any]:
        return codec_filter(fmt.leaf_codec(self.compression, feat, dtype), self.level)

    def _create(self, items, lanes: int) -> None:
        self._check_rows(lanes)
        self._text = fmt.text_keys(self.meta)
        if self.compression == fmt.AUTO and any(
            fmt.is_image(a.shape[2:], a.dtype) for _, a in items
        ):
            self.meta[fmt.CODEC] = fmt.codec_meta(fmt.IMAGE_CODEC, self.level, fmt.IMAGE_LEAVES)
        for key, array in items:
            if key in self._text:
                array = fmt.fixed_bytes(array)
            feat = array.shape[2:]
            row_bytes = max(1, int(np.prod(feat, dtype=np.int64)) * array.dtype.itemsize)
            batch_steps = max(array.shape[1], self.batch_steps)
            block, steps = chunk_shape(row_bytes, len(array), batch_steps, self.chunk_frames)
            ds = self._file.create_dataset(
                "/".join(key),
                shape=(lanes, 0, *feat),
                maxshape=(None, None, *feat),
                dtype=array.dtype,
                chunks=(block, steps, *feat),
                **self._codec(feat, array.dtype),
                fillvalue=b"" if key in self._text else FILL.get(key, 0),
                **chunk_cache(block * steps * row_bytes, -(-lanes // block)),
            )
            self._frames[key] = Block(ds)
        for key, (feat, dtype) in self.final_specs.items():
            row_bytes = max(1, int(np.prod(feat, dtype=np.int64)) * np.dtype(dtype).itemsize)
            rows = max(1, min(64, CHUNK_TARGET // row_bytes))  # whole frames, a few per chunk
            ds = self._file.create_dataset(
                "/".join(key),
                shape=(0, *feat),
                maxshape=(None, *feat),
                dtype=dtype,
                chunks=(rows, *feat),
                fillvalue=FILL.get(key, 0),
                **self._codec(feat, np.dtype(dtype)),
            )
            self._finals[key] = Block(ds)

    def _write_finals(self, rows, start: int) -> None:
        self._reserve(2 * sum(array.nbytes for array in rows.values()))
        for key, array in rows.items():  # lane and time last (they make a row count)
            self._finals[key].write((start,), np.ascontiguousarray(array))

    def _write_frames(self, items, lanes: slice, t0: int, steps: int) -> None:
        """Each frame is written once, into extents grown ahead. So a flag block with
        no flag set (root flags, ``terminated`` of an env that never ends: most
        batches) is left unwritten, and its chunks read as the fill value, False,
        once its dataset has a chunk index: the first batch makes every one
        (durability D8: a commit that made an index would write the header
        pointing to it before the index). A resumed run cuts the frames to the
        committed steps first (:meth:`_drop_uncommitted`), which gives what a
        killed run wrote past them the fill value again."""
        self._reserve(2 * sum(array.nbytes for _, array in items))
        self._allocate_steps(t0 + steps)
        start = (lanes.start or 0, t0)
        for key, array in items:
            block = self._frames[key]
            if block.flags and block.indexed and not array.any():
                continue
            block.write(start, fmt.fixed_bytes(array) if key in self._text else array)

    def _allocate_steps(self, steps: int) -> None:
        """Grow the frame datasets' time extent to hold ``steps``, ahead as memmap's
        capacity grows (:meth:`_steps_to_allocate`). An extent changed at every batch
        rewrote every frame dataset's header at each commit (~8% of the writer's time
        on 1000-frame batches, measured); :meth:`_close` cuts the extent to the steps
        written."""
        extent = next(iter(self._frames.values())).shape[1]
        if steps > extent:
            extent = self._steps_to_allocate(extent, steps)
            for block in self._frames.values():
                block.resize(extent, axis=1)

    def _write_episodes(self, rows: Rows, start: int) -> None:
        count = len(rows["traj_id"])
        if not count:
            return
        for name, block in self._episodes.items():
            block.append(start, np.asarray(rows[name], COLUMNS[name]))

    # durability D4, D5, D6 (docs/durability.md)
    def _commit(self) -> None:
        # The frames first, then the attributes that count them: a flush writes dirty
        # metadata in HDF5's own order, so with one flush a kill in its middle could
        # leave the new frame count on disk without the chunk index entries (each
        # batch allocates new chunks) that make the batch's frames readable.
        self._flush()
        self._attrs.store(self.meta)
        self._seq += 1
        record = commit_record(self._seq, self.meta)
        # both slots made by the first commit (before the file is renamed into place)
        slots = COMMIT_SLOTS if self._seq == 1 else (COMMIT_SLOTS[self._seq % 2],)
        self._attrs.store(dict.fromkeys(slots, record))
        self._flush()

    # durability D8 (docs/durability.md)
    def _flush(self) -> None:
        """``H5Fflush``, then the file's held writes in an order a kill cannot break
        (``hdf5_file``): HDF5's own order left B-tree parents pointing at nodes not
        yet written."""
        self._file.flush()
        self._io.commit()

    def _write_back(self) -> None:
        # the file's part the last write-back started has had a batch's time to reach
        # the disk; each part is dropped once (chunks are written once)
        end = self._file.id.get_filesize()
        drop_behind(self._fd, *self._behind)
        start_write_back(self._fd)  # committed: the flush put it all in the OS's cache
        self._behind = (self._behind[1], end)

    # durability D11 (docs/durability.md)
    def _close(self) -> None:
        if self._file is None:  # nothing to write (or h5py could not make the file)
            if self._io is not None:
                self._io.close_clock()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            return
        for block in self._frames.values():  # the steps allocated ahead and not written
            if block.shape[1] > self.steps:
                block.resize(self.steps, axis=1)
        self._flush()
        used = self._file.id.get_filesize()  # HDF5's end of allocated space
        if self._attrs is not None:
            self._attrs.release()
        self._file.close()  # writes the superblock once more
        self._file = None
        self._io.commit()
        self._io.close_clock()  # durability D22: the file changes no more
        self._io = None
        if os.fstat(self._fd).st_size > used:
            os.ftruncate(self._fd, used)  # give back the space reserved ahead
        os.fsync(self._fd)  # durable across power loss once closed
        os.close(self._fd)
        self._fd = None
