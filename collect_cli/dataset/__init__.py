"""The dataset on disk, read-only (:class:`Dataset`, :func:`open_dataset`), and its
backends' registry (:mod:`collect_cli.dataset.backend`), whose writers write it."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataset.backend import BACKENDS, backend, make_writer
from collect_cli.dataset.ownership import check_output, missing_dataset, shown, what_is
from collect_cli.errors import OutputError

__all__ = [
    "BACKENDS",
    "Dataset",
    "backend",
    "check_output",
    "locate",
    "make_writer",
    "open_dataset",
]


class NextView:
    """The logical ``next/<obs key>`` of a compact dataset, sliceable like a stored
    array (``[lanes, time, ...]``): rebuilt from the observations and the ``final/``
    table by ``dataformat``'s rule, lane by lane, for the slice asked."""

    def __init__(self, read: Callable[[str], Any], obs_key: fmt.Key, meta: dict[str, Any]):
        self._obs = read(fmt.path(obs_key))
        self._finals = read(fmt.path(fmt.final_key(obs_key)))
        self.shape, self.dtype = tuple(self._obs.shape), np.dtype(self._obs.dtype)
        self.ndim = len(self.shape)
        traj, mask = np.asarray(read(fmt.TRAJ)), np.asarray(read(fmt.MASK)).astype(bool)
        lane = np.asarray(read(fmt.path(fmt.FINAL_LANE_KEY)))
        time = np.asarray(read(fmt.path(fmt.FINAL_TIME_KEY)))
        ends = fmt.lane_steps(meta)
        ends = np.pad(ends, (0, max(0, len(mask) - len(ends))))[: len(mask)]
        self._t_next, self._row = fmt.next_sources(traj, mask, lane, time, ends)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        out = self[()]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, index: Any) -> np.ndarray:
        index = index if isinstance(index, tuple) else (index,)
        index = (*index, slice(None), slice(None))[: max(2, len(index))]
        lanes = np.arange(self.shape[0])[index[0]]
        times = np.arange(self.shape[1])[index[1]]
        one = np.ndim(lanes) == 0
        lanes = np.atleast_1d(lanes)
        out = np.zeros((len(lanes), *np.shape(times), *self.shape[2:]), self.dtype)
        for i, lane in enumerate(lanes.tolist()):
            t_next, row = self._t_next[lane, times], self._row[lane, times]
            src = t_next[t_next >= 0]
            if len(src):  # the lane's frames the slice's next observations are
                lo, hi = int(src.min()), int(src.max()) + 1
                block = np.asarray(self._obs[lane, lo:hi])
                out[i][t_next >= 0] = block[src - lo]
            rows = row[row >= 0]
            if len(rows):
                wanted, inverse = np.unique(rows, return_inverse=True)
                out[i][row >= 0] = np.asarray(self._finals[wanted.tolist()])[inverse]
        out = out[0] if one else out
        return out[(slice(None),) * (out.ndim - len(self.shape) + 2) + index[2:]]


@dataclass
class Dataset:
    """A dataset on disk, read-only: metadata, keys, and arrays on demand.

    It gives the logical dataset whatever the layout: for a compact one
    (``dataformat.COMPACT``), ``next/observation`` is rebuilt on read and the
    ``final/`` table it is rebuilt from is not listed."""

    path: Path
    backend: str
    meta: dict[str, Any]

    @property
    def _impl(self) -> ModuleType:
        return backend(self.backend)

    @property
    def compact(self) -> list[fmt.Key]:
        """The observation keys stored once (compact layout); empty for full."""
        return [fmt.key_of(k) for k in self.meta.get(fmt.COMPACT_KEYS) or []]

    def describe(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(key, shape, dtype)`` of every array of the logical dataset, keys joined by ``/``."""
        stored = self._impl.describe_keys(self.path)
        if not self.compact:
            return stored
        out = [d for d in stored if fmt.key_of(d[0])[0] != fmt.FINAL]
        found = {d[0]: d for d in stored}
        for key in self.compact:
            if fmt.path(key) in found:
                _, shape, dtype = found[fmt.path(key)]
                out.append((fmt.path(fmt.next_key(key)), shape, dtype))
        return out

    def stored(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(key, shape, dtype)`` of every array as stored (the ``final/`` table too)."""
        return self._impl.describe_keys(self.path)

    def rebuilt(self, key: str) -> bool:
        """Whether ``key`` is rebuilt on read (compact layout), not stored."""
        return self._next_of(key) is not None

    def _next_of(self, key: str) -> fmt.Key | None:
        """The observation key whose compact ``next/`` entry ``key`` is, else None."""
        parts = fmt.key_of(key)
        return parts[1:] if parts[:1] == (fmt.NEXT,) and parts[1:] in self.compact else None

    def array(self, key: str):
        """One array of the logical dataset as numpy (``key`` joined by ``/``); a Text
        key's as ``str`` (an object array), whichever form its backend stores."""
        if self._next_of(key) is None:
            array = self._impl.read_array(self.path, key)
        else:
            with self.reader() as read:
                array = np.asarray(read(key))
        if fmt.key_of(key) in fmt.text_keys(self.meta):
            from collect_cli import specs  # gymnasium: not for `run --help`, which lists backends

            return specs.decode_text(array)
        return array

    def episodes(self) -> fmt.Rows:
        """The committed rows of the episodes table. A dataset written before the
        ``source`` column gets it from its shards (``dataformat.legacy_source``)."""
        count = int(self.meta.get("episodes") or 0)
        stored = {d[0] for d in self._impl.describe_keys(self.path)}
        rows = {}
        for name, dtype in fmt.COLUMNS.items():
            if fmt.column(name) in stored:
                rows[name] = np.asarray(self.array(fmt.column(name))[:count], dtype)
        if fmt.SOURCE not in rows and "lane" in rows:
            rows[fmt.SOURCE] = fmt.legacy_source(self.meta, rows["lane"])
        return rows

    def load(self):
        """The whole dataset as a TensorDict (memory-mapped or HDF5-backed). A compact
        one comes in memory, with ``next/observation`` rebuilt and no ``final/``."""
        if not self.compact:
            return self._impl.load(self.path)
        import torch
        from tensordict import TensorDict

        nexts = {fmt.next_key(k): self.array(fmt.path(fmt.next_key(k))) for k in self.compact}
        td = self._impl.load(self.path)
        out = TensorDict({}, batch_size=[])  # as load_memmap gives it: no batch dims
        for key, value in td.items(True, True):
            if key[0] != fmt.FINAL:
                out.set(key, torch.as_tensor(np.asarray(value)))
        if hasattr(td, "close"):
            td.close()  # the HDF5 file: everything is in memory now
        for key, value in nexts.items():
            out.set(key, torch.from_numpy(np.asarray(value)))
        return out

    @contextlib.contextmanager
    def reader(self, by_lane: bool = False) -> Iterator[Callable[[str], Any]]:
        """``with ds.reader() as read``: ``read(key)`` is a sliceable array of the logical
        dataset; ``by_lane`` sizes caches for reading lane by lane."""
        with self._impl.reader(self.path, by_lane=by_lane) as read:
            views: dict[str, NextView] = {}

            def logical(key: str) -> Any:
                obs_key = self._next_of(key)
                if obs_key is None:
                    return read(key)
                if key not in views:
                    views[key] = NextView(read, obs_key, self.meta)
                return views[key]

            yield logical


def open_dataset(path: str | Path) -> Dataset:
    """Open an rlcollect dataset (HDF5 file or memmap directory) by what is on disk."""
    path = Path(path)
    name = locate(path)
    return Dataset(path, name, backend(name).read_meta(path))


def locate(path: Path) -> str:
    """The backend a dataset at ``path`` would be, from the kind of thing there,
    without opening it (a FIFO would block the open); a usage error for nothing,
    or for something that is no file or folder (a FIFO, a device, a symlink loop)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise missing_dataset(path) from None
    except OSError as exc:
        raise OutputError(f"cannot open {shown(path)}: {exc.strerror or exc}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise OutputError(f"{shown(path)} is {what_is(path.resolve())}, not a dataset")
    return next(n for n, b in BACKENDS.items() if b.is_dir == stat.S_ISDIR(mode))
