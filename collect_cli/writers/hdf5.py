"""HDF5 backend: one ``.h5`` file, one chunked, resizable dataset per key.

Frame keys are datasets shaped ``[lanes, time, ...]`` growing along ``time``
(allocated ahead while the run goes on, cut to the steps written at close);
``episodes/<column>`` are 1-D datasets; metadata lives in the root attributes
(dicts as JSON strings). Opens with plain h5py and ``PersistentTensorDict.from_h5``.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, Rows
from collect_cli.errors import ConfigError, OutputError, WriteError
from collect_cli.writers.arrays import contiguous
from collect_cli.writers.base import Writer
from collect_cli.writers.fsio import drop_behind, start_write_back
from collect_cli.writers.hdf5_file import (
    CommitOrderedFile,
    ReadOnlyFile,
    Tick,
    allocated_end,
    read_clock,
    settled_clock,
)

JSON_ATTRS = (
    "observation_space",
    "action_space",
    "versions",
    "shards",
    fmt.LANE_STEPS,
    "resumed",
    "sweep",
    "merged",
)
NULLABLE_TEXT = ("end_time",)  # None is stored as "" (and read back as None)
TEXT = h5py.string_dtype()  # how h5py stores a str: variable-length UTF-8
TEXT_INFO = h5py.check_string_dtype(TEXT)
FILL = {fmt.TRAJ_KEY: -1, fmt.FINAL_LANE_KEY: fmt.FINAL_FILL, fmt.FINAL_TIME_KEY: fmt.FINAL_FILL}
RESERVE_MARGIN = 1 << 20  # room for HDF5 metadata and for closing after a failed reservation
CHUNK_MIN, CHUNK_TARGET, CHUNK_MAX = 256 << 10, 512 << 10, 1 << 20  # bytes per chunk
CACHE_MAX = 64 << 20  # chunk cache per dataset, at most
READ_CACHE_MAX = 256 << 20  # chunk cache per dataset when reading lane by lane


MIN_CHUNK_STEPS = 16  # chunks shorter than this along time make per-lane reads slow


def chunk_shape(row_bytes: int, width: int, batch_steps: int, chunk_frames: int) -> tuple[int, int]:
    """``(lanes, time steps)`` of one chunk of a key whose frame is ``row_bytes`` bytes.

    A batch writes ``[width, batch_steps]`` frames and every commit flushes the
    chunks it touched in full, so a chunk should be filled by one batch: its
    time extent is the batch's (or a divisor of it), and it spans as many lanes
    as fit ``chunk_frames`` frames and ``CHUNK_MAX`` bytes (a divisor of
    ``width`` when one is close, so lane groups of asynchronous workers never
    share a chunk). Large frames (images): one lane, sized by bytes (0.25-1 MiB),
    preferring a divisor of the batch's steps. Tiny batches: chunks of
    ``MIN_CHUNK_STEPS`` steps, filled over several batches.
    """
    cap = max(1, min(chunk_frames, CHUNK_MAX // row_bytes))  # frames per chunk, at most
    if batch_steps >= cap:  # one lane's batch fills one chunk or more
        if cap * row_bytes < CHUNK_MIN:
            return 1, cap
        for steps in range(cap, 0, -1):
            if steps * row_bytes < CHUNK_MIN:
                break
            if batch_steps % steps == 0:
                return 1, steps
        return 1, max(1, min(cap, CHUNK_TARGET // row_bytes))
    steps = batch_steps * max(1, -(-min(MIN_CHUNK_STEPS, cap) // batch_steps))
    steps = min(steps, cap)
    lanes = max(1, min(width, cap // steps))
    for divisor in range(lanes, max(1, lanes // 2) - 1, -1):
        if width % divisor == 0:
            return divisor, steps
    return lanes, steps


def chunk_cache(chunk_bytes: int, chunks: int) -> dict[str, Any]:
    """h5py chunk-cache settings holding the ``chunks`` chunks across the lanes (the
    ones being filled), within ``CACHE_MAX``; full chunks are evicted first (``w0=1``)."""
    nbytes = min(CACHE_MAX, max(1 << 20, (chunks + 1) * chunk_bytes))
    return hash_slots(nbytes, chunk_bytes)


def hash_slots(nbytes: int, chunk_bytes: int) -> dict[str, Any]:
    """A chunk cache of ``nbytes`` (h5py's ``rdcc_*`` options) for chunks of ``chunk_bytes``."""
    slots = max(521, 10 * (nbytes // chunk_bytes + 1)) | 1
    while any(slots % d == 0 for d in range(3, int(slots**0.5) + 1, 2)):
        slots += 2  # a prime number of hash slots, as HDF5 advises
    return {"rdcc_nbytes": nbytes, "rdcc_nslots": slots, "rdcc_w0": 1.0}


def lane_reading_cache(f: h5py.File, steps: int) -> dict[str, Any]:
    """h5py open options for reading the file ``f`` lane by lane over ``steps`` steps.

    A chunk spans several lanes: reading one lane reads its whole chunks, so the
    cache holds a lane group's chunks over all its steps (within ``READ_CACHE_MAX``)
    and the group's next lanes are read from memory, not from the file again.
    """
    need, smallest = 1 << 20, CHUNK_MAX

    def visit(name: str, ds: Any) -> None:
        nonlocal need, smallest
        if isinstance(ds, h5py.Dataset) and ds.chunks is not None and ds.ndim >= 2:
            chunk = int(np.prod(ds.chunks, dtype=np.int64)) * ds.dtype.itemsize
            need = max(need, chunk // ds.chunks[1] * max(steps, ds.chunks[1]))
            smallest = min(smallest, chunk)

    f.visititems(visit)
    return hash_slots(min(READ_CACHE_MAX, need), smallest)


class Block:
    """One chunked dataset, written block by block through h5py's low-level API.

    h5py's ``resize`` and ``__setitem__`` rebuild a selection at each call, and
    even ``ds.id.shape`` and ``get_space()`` build new objects each time, so the
    shape and the dataspaces are kept here and rebuilt only when the extent
    changes. A block that covers whole chunks of an unfiltered dataset (a
    batch, by :func:`chunk_shape`'s design) is written chunk by chunk with
    ``H5Dwrite_chunk``: no selection, no copy into the chunk cache, and nothing
    left for the commit's flush to write but the chunk index (a third of the
    cost, measured). Other blocks go through the chunk cache (``H5Dwrite``).

    Tables that only grow (the episodes columns) are written by :meth:`append`:
    it holds their last, partial chunk and writes it whole each time, directly.
    """

    __slots__ = (
        "_chunk",
        "_direct",
        "_id",
        "_mem",
        "_mem_shape",
        "_space",
        "_tail",
        "_tail_at",
        "ds",
        "flags",
        "indexed",
        "shape",
    )

    def __init__(self, ds: h5py.Dataset) -> None:
        self.ds = ds
        self._id = ds.id
        self._chunk: tuple[int, ...] = ds.chunks or ()
        self._direct = bool(self._chunk) and ds.id.get_create_plist().get_nfilters() == 0
        self.flags = ds.dtype == np.bool_ and not ds.fillvalue  # unwritten chunks read False
        # whether the chunk index exists (HDF5 makes it with the first chunk)
        self.indexed = bool(self._chunk) and ds.id.get_num_chunks() > 0
        self._mem: Any = None  # the memory dataspace of the last block written through the cache
        self._mem_shape: tuple[int, ...] = ()
        self._tail: np.ndarray | None = None  # append(): the chunk holding the last rows
        self._tail_at = -1  # its first row
        self._extent_changed(ds.id.shape)

    def _extent_changed(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self._space: Any = None  # the file dataspace, made when a block needs the cache

    def resize(self, size: int, axis: int) -> None:
        self.ds.resize(size, axis=axis)
        self._extent_changed(self._id.shape)
        self._tail_at = -1

    def append(self, start: int, rows: np.ndarray) -> None:
        """``ds[start : start + len(rows)] = rows`` for a 1-d table that grows by
        appends: each chunk the rows touch is written whole with ``H5Dwrite_chunk``,
        the last one from the copy held here (a write through the chunk cache costs
        ~3x more, and the commit's flush then writes that chunk whole anyway)."""
        if not self._direct or len(self._chunk) != 1:
            self.write((start,), rows)
            return
        size, end = self._chunk[0], start + len(rows)
        if end > self.shape[0]:
            self._id.set_extent((end,))
            self._extent_changed((end,))
        at, done = start - start % size, 0
        while done < len(rows):
            if self._tail_at != at:  # another chunk: its rows already stored, then fill
                self._tail = np.zeros(size, self.ds.dtype)
                if start > at:
                    self._tail[: start - at] = self.ds[at:start]
                self._tail_at = at
            lo = start + done - at
            n = min(size - lo, len(rows) - done)
            self._tail[lo : lo + n] = rows[done : done + n]
            self._id.write_direct_chunk((at,), self._tail)
            done += n
            if lo + n == size:
                at += size

    def write(self, start: tuple[int, ...], array: np.ndarray) -> None:
        """``ds[start : start + array.shape] = array``, growing ``ds`` to hold it."""
        shape, lead, size = self.shape, len(start), array.shape
        if len(size) != len(shape) or size[lead:] != shape[lead:]:
            raise TypeError(f"can't write an array of shape {size} into {self.ds.name} {shape}")
        if not array.size:
            return
        # plain loops: this runs for every key of every batch (generators cost more here)
        grown, on_grid = list(shape), self._direct
        for axis in range(lead):
            begin, n, chunk = start[axis], size[axis], self._chunk[axis] if on_grid else 1
            grown[axis] = max(grown[axis], begin + n)
            on_grid = on_grid and begin % chunk == 0 and n % chunk == 0
        if grown != list(shape):
            self._id.set_extent(tuple(grown))
            self._extent_changed(tuple(grown))
        self.indexed = True
        if on_grid:
            self._write_chunks(start, array)
            return
        if self._space is None:
            self._space = self._id.get_space()
        self._space.select_hyperslab(start + (0,) * (array.ndim - lead), array.shape)
        if array.shape != self._mem_shape:
            self._mem, self._mem_shape = h5py.h5s.create_simple(array.shape), array.shape
        self._id.write(self._mem, self._space, np.ascontiguousarray(array))

    def _write_chunks(self, start: tuple[int, ...], array: np.ndarray) -> None:
        lead, chunk = len(start), self._chunk
        tail = (0,) * (array.ndim - lead)  # chunks span the feature dimensions whole
        if array.shape[:lead] == chunk[:lead]:
            self._id.write_direct_chunk(start + tail, contiguous(array))
            return
        if array.shape[1:lead] == chunk[1:lead] and math.prod(array.shape[lead:]) == 1:
            # one number a frame, chunks of whole lanes: one copy of the whole array,
            # then each chunk is a slice of it (torch transposes a whole 2-d array ~3x
            # faster; larger frames keep the copy per chunk, which bounds the memory)
            array = contiguous(array)
        grid = [range(0, n, c) for n, c in zip(array.shape[:lead], chunk, strict=False)]
        for offsets in itertools.product(*grid):
            piece = array[tuple(slice(o, o + c) for o, c in zip(offsets, chunk, strict=False))]
            at = tuple(s + o for s, o in zip(start, offsets, strict=True))
            self._id.write_direct_chunk(at + tail, contiguous(piece))


class RootAttrs:
    """A file's root attributes, stored from a metadata dict (dicts and lists as
    JSON text, ``lane_steps`` as an int64 array).

    Values unchanged since the last :meth:`store` are neither encoded nor
    rewritten: a commit per batch changes only the counters. Values already
    stored with the same shape (numbers) or kind (text) are overwritten in place:
    assigning an attribute makes h5py create a new one and delete the old, which
    rewrites the object header's layout in several writes, and a kill in the
    middle of the flush that writes them can leave the whole file unreadable.
    Text is replaced in the global heap, and the header only gets the new
    reference, in place. ``None`` for a key of ``NULLABLE_TEXT`` is stored as
    ``""`` for the same reason. The numbers' handles and types are kept: opening
    an attribute and reading its type cost several times the write itself.
    """

    def __init__(self, node: h5py.Group) -> None:
        self._attrs = node.attrs
        self._node_id = node.id
        self._written: dict[str, Any] = {}  # the values as last stored
        self._numbers: dict[str, tuple[Any, np.dtype, tuple[int, ...], Any]] = {}

    # durability D7 (docs/durability.md)
    def store(self, meta: dict[str, Any]) -> None:
        for key, value in meta.items():
            if key in self._written and _same(self._written[key], value):
                continue
            stored = value
            if key == fmt.LANE_STEPS and value:
                stored = np.asarray(value, np.int64)
            elif isinstance(value, (dict, list)):
                stored = json.dumps(value)
            elif value is None and key in NULLABLE_TEXT:
                stored = ""
            if stored is None or not self._overwrite(key, stored):
                old = self._numbers.pop(key, None)  # its handle is closed before h5py deletes it
                if key in GROWING and old is not None and isinstance(stored, np.ndarray):
                    most = MAX_LANES + (HEAD if key in COMMIT_SLOTS else 0)
                    room = max(len(stored), min(2 * old[2][0], most))  # room to grow
                    stored = _padded(stored, room)
                if stored is not None:
                    self._attrs[key] = stored
                elif key in self._attrs:
                    del self._attrs[key]
            self._written[key] = _snapshot(key, value)

    def _overwrite(self, key: str, value: Any) -> bool:
        """Write a number (or numeric array) into the stored attribute ``key`` of
        the same shape, or text into a text one; False (nothing written) if there
        is no such attribute."""
        if isinstance(value, str):
            return self._overwrite_text(key, value)
        array = np.asarray(value)
        if array.dtype.kind not in "iuf":
            return False
        handle = self._numbers.get(key)
        if handle is None:
            try:
                attr = h5py.h5a.open(self._node_id, key.encode())
            except KeyError:
                return False
            dtype = attr.dtype
            if dtype.kind not in "iuf":
                return False
            handle = self._numbers[key] = (attr, dtype, attr.shape, h5py.h5t.py_create(dtype))
        attr, dtype, shape, memtype = handle
        if shape != array.shape:
            if key not in GROWING or array.ndim != 1 or len(shape) != 1 or shape[0] < len(array):
                return False
            array = _padded(array, shape[0])
        attr.write(np.ascontiguousarray(array, dtype), memtype)
        return True

    def _overwrite_text(self, key: str, value: str) -> bool:
        try:
            attr = h5py.h5a.open(self._node_id, key.encode())
        except KeyError:
            return False
        if attr.shape != () or h5py.check_string_dtype(attr.dtype) != TEXT_INFO:
            return False
        try:
            attr.write(np.array(value, dtype=TEXT))
        except (OSError, RuntimeError):
            return False  # unreadable (a kill while it was written): replaced instead
        return True

    def release(self) -> None:
        """Close the kept attribute handles (before the file is closed)."""
        self._numbers.clear()


def _padded(array: np.ndarray, length: int) -> np.ndarray:
    return np.concatenate([array, np.full(length - len(array), PAD, array.dtype)])


def _snapshot(key: str, value: Any) -> Any:
    """A copy of ``value`` as stored; ``lane_steps`` (a flat list of ints, one per
    lane, at every commit) shallowly: deepcopy took 8 ms a commit for 4096 lanes."""
    return list(value) if key == fmt.LANE_STEPS else copy.deepcopy(value)


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except ValueError:  # arrays: compared element-wise
        return False


# Commit records, written in turn: [seq, frames, steps, episodes, lanes, *lane_steps, crc32].
# The counters are separate attributes, which one flush writes in several pieces:
# a kill between them left e.g. ``frames`` of one commit and ``lane_steps`` of the
# one before. A record is one attribute, and the other slot still holds the
# previous commit whole if the process dies while one is written.
COMMIT_SLOTS = ("commit_0", "commit_1")
COUNTERS = ("frames", "steps", "episodes")
# Counters one entry per lane: with split_trajs the lanes (rows) grow at every
# commit. Stored with room to grow (padded with PAD, the length doubling when
# full), so that a commit overwrites them in place instead of replacing them.
GROWING = (fmt.LANE_STEPS, *COMMIT_SLOTS)
PAD = -1
# Those counters are root attributes, and HDF5 keeps an attribute's message in
# the object header, under 64 KiB: room for this many lanes (rows), no more.
MAX_LANES = 8000
HEAD = 6  # a commit record's entries besides lane_steps


# durability D15 (docs/durability.md)
def lanes_limit(lanes: int, what: str) -> str | None:
    """Why ``lanes`` lanes (or rows) are too many for an HDF5 dataset; None if not."""
    if lanes <= MAX_LANES:
        return None
    return (
        f"writer=hdf5 records at most {MAX_LANES} {what} (their step counts are file "
        f"attributes, which HDF5 keeps under 64 KiB), not {lanes}"
    )


# durability D6 (docs/durability.md)
def commit_record(seq: int, meta: dict[str, Any]) -> np.ndarray:
    lanes = np.asarray(meta.get(fmt.LANE_STEPS) or [], np.int64)
    head = [seq, *(int(meta[key]) for key in COUNTERS), len(lanes)]
    body = np.concatenate([np.asarray(head, np.int64), lanes])
    return np.append(body, np.int64(zlib.crc32(body.tobytes())))


# durability D6 (docs/durability.md)
def read_commit(attrs: h5py.AttributeManager) -> dict[str, Any] | None:
    """The newest whole commit record (``seq``, counters, ``lane_steps``), or None
    (a file from an older rlcollect, or written by ``merge``)."""
    best = None
    for name in COMMIT_SLOTS:
        try:
            record = np.asarray(attrs[name], np.int64).ravel()
        except (KeyError, OSError, ValueError, TypeError):
            continue  # absent, or cut by a crash while it was rewritten
        if len(record) < HEAD or not 0 <= record[4] <= len(record) - HEAD:
            continue
        record = record[: HEAD + record[4]]  # without the room to grow (PAD)
        if zlib.crc32(record[:-1].tobytes()) != record[-1]:
            continue
        if best is None or record[0] > best[0]:
            best = record
    if best is None:
        return None
    counters = dict(zip(COUNTERS, (int(n) for n in best[1:4]), strict=True))
    return {"seq": int(best[0]), **counters, fmt.LANE_STEPS: best[5:-1].tolist()}


# durability D6 (docs/durability.md)
def file_meta(attrs: h5py.AttributeManager) -> tuple[dict[str, Any], int]:
    """The metadata with the counters of the last whole commit, and its sequence number."""
    meta = decode_attrs(attrs)
    meta.setdefault("status", "running")  # unreadable: killed while closing
    record = read_commit(attrs)
    if record is None:
        return meta, 0
    seq = record.pop("seq")
    meta.update(record)
    if record[fmt.LANE_STEPS]:  # the lanes too (split_trajs: grown by the commit after)
        meta["lanes"] = len(record[fmt.LANE_STEPS])
    return meta, seq


def decode_attrs(attrs: h5py.AttributeManager) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key in attrs:
        if key in COMMIT_SLOTS:
            continue
        try:
            value = attrs[key]
        except (OSError, RuntimeError):
            continue  # its last write was cut by a kill (the status when closing)
        if key in NULLABLE_TEXT and value == "":
            value = None
        elif isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, (np.generic, np.ndarray)):
            value = value.tolist()  # numbers; lane_steps is an int64 array
        if isinstance(value, str) and (key in JSON_ATTRS or value[:1] in ("{", "[")):
            value = json.loads(value)  # dicts and lists are stored as JSON text
        meta[key] = value
    return meta


def load_plugin() -> None:
    """Register hdf5plugin's filters (zstd, lz4, Blosc2) with HDF5, once."""
    try:
        import hdf5plugin  # noqa: F401  (importing it registers the filters)
    except ImportError:
        raise ConfigError(
            "this codec needs hdf5plugin: pip install 'rlcollect[codecs]' (or hdf5plugin)"
        ) from None


def codec_filter(name: str, level: int | None) -> dict[str, Any]:
    """h5py ``create_dataset`` options for codec ``name`` (``fmt.CODECS``) at ``level``."""
    meta = fmt.codec_meta(name, level)
    level = meta["level"]
    if name == "none":
        return {}
    if name == "gzip":
        return {"compression": "gzip", "compression_opts": level}
    if name == "lzf":
        return {"compression": "lzf"}
    load_plugin()
    import hdf5plugin

    if name == "zstd":
        return dict(hdf5plugin.Zstd(clevel=level))
    if name == "lz4":
        return dict(hdf5plugin.LZ4())
    cname = "zstd" if name == "blosc2-zstd" else "lz4"
    return dict(hdf5plugin.Blosc2(cname=cname, clevel=level, filters=hdf5plugin.Blosc2.SHUFFLE))


def needs_plugin(meta: dict[str, Any]) -> None:
    """Load hdf5plugin where the dataset's codec needs it (readers need no extra step)."""
    if (meta.get(fmt.CODEC) or {}).get("plugin"):
        load_plugin()


class Hdf5Writer(Writer):
    backend = "hdf5"

    def __init__(
        self,
        path,
        *,
        compression: str = "none",
        compression_level: int | None = None,
        chunk_frames: int = 65536,
        **kw,
    ):
        super().__init__(path, **kw)
        self.codec = codec_filter(compression, compression_level)
        self.meta[fmt.CODEC] = fmt.codec_meta(compression, compression_level)
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

    def _create(self, items, lanes: int) -> None:
        self._check_rows(lanes)
        self._text = fmt.text_keys(self.meta)
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
                **self.codec,
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
                **self.codec,
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


WRITER = Hdf5Writer


RACED_READS = 100  # reads in a row that commits raced, before a reader gives up
PIECE_BYTES = 16 << 20  # an array is read in pieces of this size at most, each of one commit


class LiveFile:
    """An HDF5 dataset file opened for reading, perhaps while a run commits to it.

    An HDF5 open is not a snapshot of the file: the superblock, with the end of
    allocated space, is read at open, the chunk index's nodes when a read first
    needs them. A commit in between gave a reader nodes that point past its end
    of allocation ("addr overflow") or an old parent with a child that a split
    had shrunk (chunks missing, read as fill values). So each :meth:`read` runs
    between two looks at the file's commit clock (``hdf5_file``): begun with no
    commit being written and ended with no commit begun, it read the file as one
    commit left it; else it is read again, from a new open (durability D22).
    Each open of a live file is made through a file object of its own: HDF5
    shares one open of a file among all of a process's opens of it, metadata
    cache included. A file that no writer holds a clock of (no run writes it; or
    its filesystem has no ``F_OFD_SETLK`` locks, where reads are as unguarded as
    plain h5py's) is read as it is, from an open made since it last changed.
    """

    def __init__(self, path: Path, **options: Any) -> None:
        self.path = Path(path)
        self.options = options  # h5py.File's (the chunk cache), for the next open
        self._fd: int | None = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        self._file: h5py.File | None = None
        self._opened_at: tuple = ()  # the clock (or the file's size and time) at that open

    def __enter__(self) -> LiveFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.reopen()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def reopen(self) -> None:
        """Close the HDF5 open: the next read opens the file again (with ``options``)."""
        if self._file is not None:
            with contextlib.suppress(Exception):
                self._file.close()
            self._file = None

    def read(self, fn: Callable[[h5py.File], Any]) -> Any:
        """``fn(file)``, of the file as one commit left it."""
        for _ in range(RACED_READS):
            start = settled_clock(self._fd)
            try:
                value, error = fn(self._open(start)), None
            except Exception as exc:  # a read that a commit raced may fail any way
                value, error = None, exc
            if read_clock(self._fd) == start:
                if error is not None:
                    raise error
                return value
            self.reopen()  # what HDF5 cached may be older than what it reads next
        raise OutputError(
            f"{str(self.path)!r} changed during each of {RACED_READS} reads in a row: "
            "the run writing it commits faster than it can be read"
        )

    def _open(self, tick: Tick | None) -> h5py.File:
        """The open to read with: the last one if no commit was made since. A file
        no writer holds is opened by its name, as before (HDF5 opens the files that
        a merge's virtual datasets read, named relative to it, with the driver that
        opened it, which the file object one is not): no writer, nothing to share."""
        if tick is None:  # no writer now: had one come and gone, the file changed
            st = os.fstat(self._fd)
            stamp: tuple = (None, st.st_size, st.st_mtime_ns)
        else:
            stamp = (tick,)
        if self._file is not None and stamp != self._opened_at:
            self.reopen()
        if self._file is None:
            where = self.path if tick is None else ReadOnlyFile(self._fd)
            self._file = h5py.File(where, "r", locking=False, **self.options)
            self._opened_at = stamp
        return self._file


class LiveArray:
    """A dataset of a :class:`LiveFile`, sliced like an h5py one. A slice made of
    integers and unit-step slices is read in pieces of ``PIECE_BYTES`` at most,
    each of one commit (reading a large array whole would race every commit);
    other indexes in one read. ``shape`` is the extent when it was got: what a
    piece finds past the dataset's extent (cut to the steps written when the run
    closed) is left the fill value, and frames past the last commit's steps are
    no part of the dataset (durability D4)."""

    def __init__(self, live: LiveFile, key: str) -> None:
        self._live, self.key = live, key

        def head(f: h5py.File) -> tuple:
            ds = f[key]
            return tuple(ds.shape), ds.dtype, ds.chunks, ds.fillvalue

        self.shape, self.dtype, self.chunks, self.fillvalue = live.read(head)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[()]
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, index: Any) -> Any:
        plan = basic_box(index, self.shape)
        if plan is None:
            return self._live.read(lambda f: f[self.key][index])
        box, drop = plan
        out = np.full([b - a for a, b in box], self.fillvalue, self.dtype)
        for piece in pieces(box, self.dtype.itemsize, self.chunks, PIECE_BYTES):
            got, data = self._live.read(lambda f, piece=piece: _read_box(f[self.key], piece))
            if data is not None:
                at = tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(got, box, strict=True))
                out[at] = data
        return out[drop]


def _read_box(ds: h5py.Dataset, box: list[tuple[int, int]]) -> tuple[list, np.ndarray | None]:
    """``ds``'s part of ``box`` within its extent now, and that part (None: empty)."""
    got = [(a, max(a, min(b, n))) for (a, b), n in zip(box, ds.shape, strict=True)]
    if any(a == b for a, b in got):
        return got, None
    return got, ds[tuple(slice(a, b) for a, b in got)]


def basic_box(index: Any, shape: tuple[int, ...]) -> tuple[list[tuple[int, int]], tuple] | None:
    """The box (``[start, stop)`` per axis) that ``index`` selects, and the index that
    drops its integer axes, for an index of integers, unit-step slices and one
    Ellipsis; None for others (and for an integer out of range: h5py says so)."""
    index = index if isinstance(index, tuple) else (index,)
    dots = [n for n, i in enumerate(index) if i is Ellipsis]
    if len(dots) > 1:
        return None
    if dots:
        at = dots[0]
        index = (*index[:at], *(slice(None),) * (len(shape) - len(index) + 1), *index[at + 1 :])
    if len(index) > len(shape):
        return None
    box, drop = [], []
    for axis, n in enumerate(shape):
        i = index[axis] if axis < len(index) else slice(None)
        if isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)):
            i = int(i) + (n if i < 0 else 0)
            if not 0 <= i < n:
                return None
            box.append((i, i + 1))
            drop.append(0)
        elif isinstance(i, slice) and i.step in (None, 1):
            start, stop, _ = i.indices(n)
            box.append((start, max(start, stop)))
            drop.append(slice(None))
        else:
            return None
    return box, tuple(drop)


def pieces(
    box: list[tuple[int, int]], itemsize: int, chunks: tuple[int, ...] | None, limit: int
) -> Iterator[list[tuple[int, int]]]:
    """``box`` in boxes of ``limit`` bytes at most (one item at least): whole along the
    last axes, cut along the first axis where a step of them fits (at chunk
    boundaries where a piece holds whole chunks), one index at a time before it."""
    sizes = [b - a for a, b in box]
    if not all(sizes):
        return
    step_bytes = [itemsize * math.prod(sizes[k + 1 :]) for k in range(len(box))]
    if not box or step_bytes[0] * sizes[0] <= limit:
        yield list(box)
        return
    axis = next((k for k, size in enumerate(step_bytes) if size <= limit), len(box) - 1)
    step = max(1, limit // step_bytes[axis])
    if chunks and step >= chunks[axis]:
        step -= step % chunks[axis]
    outer = itertools.product(*(range(a, b) for a, b in box[:axis]))
    a, b = box[axis]
    for head in outer:
        start = a
        while start < b:
            stop = min(b, (start // step + 1) * step)  # at multiples of step
            yield [*((i, i + 1) for i in head), (start, stop), *box[axis + 1 :]]
            start = stop


def read_meta(path: Path) -> dict[str, Any]:
    try:
        with LiveFile(path) as live:
            meta = live.read(lambda f: file_meta(f.attrs)[0])
    except OSError as exc:
        raise OutputError(f"{str(path)!r} is not a readable HDF5 dataset ({exc})") from None
    needs_plugin(meta)
    return meta


def describe_keys(path: Path) -> list[tuple[str, tuple[int, ...], str]]:
    """``(key, shape, dtype)`` of every dataset in the file."""

    def describe(f: h5py.File) -> list[tuple[str, tuple[int, ...], str]]:
        out: list[tuple[str, tuple[int, ...], str]] = []

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                out.append((name, tuple(obj.shape), str(obj.dtype)))

        f.visititems(visit)
        return out

    with LiveFile(path) as live:
        return live.read(describe)


def read_array(path: Path, key: str) -> np.ndarray:
    with LiveFile(path) as live:
        return LiveArray(live, key)[()]


def load(path: Path):
    from tensordict import PersistentTensorDict

    return PersistentTensorDict.from_h5(str(path))


@contextlib.contextmanager
def reader(path: Path, by_lane: bool = False) -> Iterator[Callable[[str], Any]]:
    """``read(key)``: the dataset, sliced lazily, each slice of one commit (a
    :class:`LiveArray`); ``by_lane`` caches a lane group's chunks for reads that go
    lane by lane."""
    with LiveFile(path) as live:
        if by_lane:
            steps = live.read(lambda f: file_meta(f.attrs)[0].get("steps", 0))
            live.options = live.read(lambda f: lane_reading_cache(f, steps))
            live.reopen()
        arrays: dict[str, LiveArray] = {}

        def read(key: str) -> LiveArray:
            if key not in arrays:
                arrays[key] = LiveArray(live, key)
            return arrays[key]

        yield read
