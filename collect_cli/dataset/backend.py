"""The storage backends, one line each in :data:`BACKENDS`: ``writer=<name>`` picks one.

A backend is a package (``dataset/<name>/``) whose face module (``api.py``) provides:

- ``WRITER``: its :class:`~collect_cli.dataset.writer.Writer` class;
- ``read_meta(path)``, ``describe_keys(path)``, ``read_array(path, key)``,
  ``load(path)`` (the whole dataset as a TensorDict);
- ``reader(path, by_lane=False)``: a context manager giving ``read(key)``, a
  sliceable array per stored key (keys joined by ``/``);
- ``lanes_limit(lanes, what)``: why a dataset cannot hold that many lanes, or None;
- ``write_merged(tmp, dest, shards, virtual, meta, rows)`` where it can hold a
  merge (``ops/merge.py`` says what a shard gives it).

The module is imported on first use; the options class (Hydra's ``writer=<name>``
group) is imported with this registry, so it lives in a light module of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from collect_cli.dataset.hdf5.options import Hdf5WriterConfig
from collect_cli.dataset.hdf5.options import check as check_hdf5
from collect_cli.dataset.memmap.options import MemmapWriterConfig
from collect_cli.errors import OutputError
from collect_cli.schema import WriterConfig


def _no_check(options: Any) -> None:
    return None


@dataclass(frozen=True)
class Backend:
    module: str  # the backend's module (the API above), imported on first use
    options: type[WriterConfig]  # its options: writer=<name>
    suffix: str  # of a dataset's default path: a file ".h5", a directory ""
    is_dir: bool  # a dataset is a directory (else a file)
    links: bool = False  # a merge may map the shards' frame arrays instead of copying them
    check: Callable[[Any], None] = field(default=_no_check)  # its options' values


BACKENDS = {
    "hdf5": Backend(
        "collect_cli.dataset.hdf5.api", Hdf5WriterConfig, ".h5", False, True, check_hdf5
    ),
    "memmap": Backend("collect_cli.dataset.memmap.api", MemmapWriterConfig, "", is_dir=True),
}


def backend(name: str) -> ModuleType:
    """The module of backend ``name`` (imported on first use)."""
    if name not in BACKENDS:
        raise OutputError(f"unknown writer {name!r}: choose from {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name].module)


def make_writer(name: str, path: str | Path, **kwargs: Any):
    """The writer of backend ``name``, not yet opened."""
    return backend(name).WRITER(path, **kwargs)
