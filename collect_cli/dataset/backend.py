"""The storage backends, one line each in :data:`BACKENDS`: ``writer=<name>`` picks one.

A backend is a package (``dataset/<name>/``) with two modules (a one-module
backend holds both parts itself):

- ``options.py``: ``OPTIONS``, its options class (Hydra's ``writer=<name>``, a
  :class:`~collect_cli.schema.WriterConfig`), and optionally ``check(options)``
  (a ConfigError for values it cannot write). It is imported whenever a config
  is composed: keep it light;
- ``api.py``, imported on first use: ``WRITER`` (its
  :class:`~collect_cli.dataset.writer.Writer` class); ``read_meta(path)``,
  ``describe_keys(path)``, ``read_array(path, key)``, ``load(path)`` (the whole
  dataset as a TensorDict); ``reader(path, by_lane=False)`` (a context manager
  giving ``read(key)``, a sliceable array per stored key, keys joined by ``/``);
  ``lanes_limit(lanes, what)`` (why a dataset cannot hold that many lanes, or
  None); and, where it can hold a merge, ``write_merged(tmp, dest, shards,
  virtual, meta, rows, keys)`` (``ops/merge.py`` says what a shard gives it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from collect_cli.errors import OutputError


@dataclass(frozen=True)
class Backend:
    package: str  # dataset/<name>/: its options.py and api.py (or one module with both)
    suffix: str  # of a dataset's default path: a file ".h5", a directory ""
    is_dir: bool  # a dataset is a directory (else a file)
    links: bool = False  # a merge may map the shards' frame arrays instead of copying them

    def part(self, name: str) -> ModuleType:
        """Its ``options`` or ``api`` module: the package's, or the one module itself."""
        module = importlib.import_module(self.package)
        if hasattr(module, "__path__"):
            return importlib.import_module(f"{self.package}.{name}")
        return module

    @property
    def options(self) -> type:
        return self.part("options").OPTIONS

    def check(self, options: Any) -> None:
        """Its options' values: a ConfigError for what it cannot write."""
        check = getattr(self.part("options"), "check", None)
        if check is not None:
            check(options)


BACKENDS = {
    "hdf5": Backend("collect_cli.dataset.hdf5", ".h5", is_dir=False, links=True),
    "memmap": Backend("collect_cli.dataset.memmap", "", is_dir=True),
}


def backend(name: str) -> ModuleType:
    """The ``api`` module of backend ``name`` (imported on first use)."""
    if name not in BACKENDS:
        raise OutputError(f"unknown writer {name!r}: choose from {', '.join(BACKENDS)}")
    return BACKENDS[name].part("api")


def make_writer(name: str, path: str | Path, **kwargs: Any):
    """The writer of backend ``name``, not yet opened."""
    return backend(name).WRITER(path, **kwargs)
