"""Chunk shapes and caches, and :class:`Block`: one chunked dataset written block by block."""

from __future__ import annotations

import itertools
import math
from typing import Any

import h5py
import numpy as np

from collect_cli.dataset.arrays import contiguous

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
