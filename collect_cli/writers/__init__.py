"""Writers and readers: one pair per backend, looked up by name in :data:`BACKENDS`.

A backend module (imported only when a dataset of its kind is used) provides:

- ``WRITER``: its :class:`~collect_cli.writers.base.Writer` class;
- ``read_meta(path)``, ``describe_keys(path)``, ``read_array(path, key)``,
  ``load(path)`` (the whole dataset as a TensorDict);
- ``reader(path, by_lane=False)``: a context manager giving ``read(key)``, a
  sliceable array per stored key (keys joined by ``/``);
- ``lanes_limit(lanes, what)``: why a dataset cannot hold that many lanes, or None.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from collect_cli import dataformat as fmt
from collect_cli import specs
from collect_cli.errors import OutputError
from collect_cli.writers.base import Writer, check_output, missing_dataset


@dataclass(frozen=True)
class Backend:
    module: str
    is_dir: bool  # a dataset is a directory (else a file)
    links: bool  # a merge may map the shards' frame arrays instead of copying them


BACKENDS = {
    "hdf5": Backend("collect_cli.writers.hdf5", is_dir=False, links=True),
    "memmap": Backend("collect_cli.writers.memmap", is_dir=True, links=False),
}

__all__ = [
    "BACKENDS",
    "Dataset",
    "Writer",
    "backend",
    "check_output",
    "make_writer",
    "open_dataset",
]


def backend(name: str) -> ModuleType:
    """The module of backend ``name`` (imported on first use)."""
    if name not in BACKENDS:
        raise OutputError(f"unknown writer {name!r}: choose from {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name].module)


def make_writer(name: str, path: str | Path, **kwargs: Any) -> Writer:
    """The writer of backend ``name`` (``hdf5`` | ``memmap``), not yet opened."""
    return backend(name).WRITER(path, **kwargs)


@dataclass
class Dataset:
    """A dataset on disk, read-only: metadata, keys, and arrays on demand."""

    path: Path
    backend: str
    meta: dict[str, Any]

    @property
    def _impl(self) -> ModuleType:
        return backend(self.backend)

    def describe(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(key, shape, dtype)`` of every stored array, keys joined by ``/``."""
        return self._impl.describe_keys(self.path)

    def array(self, key: str):
        """One array as numpy (``key`` joined by ``/``); a Text key's as ``str`` (an
        object array), whichever form its backend stores."""
        array = self._impl.read_array(self.path, key)
        if fmt.key_of(key) in fmt.text_keys(self.meta):
            return specs.decode_text(array)
        return array

    def episodes(self) -> dict[str, Any]:
        return {name: self.array(fmt.column(name)) for name in fmt.COLUMNS}

    def load(self):
        """The whole dataset as a TensorDict (memory-mapped or HDF5-backed)."""
        return self._impl.load(self.path)

    def reader(self, by_lane: bool = False) -> AbstractContextManager[Callable[[str], Any]]:
        """``with ds.reader() as read``: ``read(key)`` is a sliceable array; ``by_lane``
        sizes caches for reading lane by lane."""
        return self._impl.reader(self.path, by_lane=by_lane)


def open_dataset(path: str | Path) -> Dataset:
    """Open an rlcollect dataset (HDF5 file or memmap directory) by what is on disk."""
    path = Path(path)
    if not path.exists():
        raise missing_dataset(path)
    name = next(n for n, b in BACKENDS.items() if b.is_dir == path.is_dir())
    return Dataset(path, name, backend(name).read_meta(path))
