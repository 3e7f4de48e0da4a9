"""Reading an HDF5 dataset, perhaps while a run commits to it (durability D22)."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from collect_cli.dataset.hdf5.attrs import file_meta
from collect_cli.dataset.hdf5.chunks import lane_reading_cache
from collect_cli.dataset.hdf5.codecs import needs_plugin
from collect_cli.dataset.hdf5.file import (
    ReadOnlyFile,
    Tick,
    read_clock,
    settled_clock,
)
from collect_cli.errors import OutputError

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
