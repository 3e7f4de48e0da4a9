"""Writers (one contract, backends chosen by name) and dataset readers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collect_cli.errors import OutputError
from collect_cli.writers.base import Writer, check_output, missing_dataset
from collect_cli.writers.episodes import COLUMNS

BACKENDS = ("hdf5", "memmap")

__all__ = ["BACKENDS", "Dataset", "Writer", "check_output", "make_writer", "open_dataset"]


def make_writer(name: str, path: str | Path, **kwargs: Any) -> Writer:
    """The writer backend ``name`` (``hdf5`` | ``memmap``), not yet opened."""
    if name == "hdf5":
        from collect_cli.writers.hdf5 import Hdf5Writer

        return Hdf5Writer(path, **kwargs)
    if name == "memmap":
        from collect_cli.writers.memmap import MemmapWriter

        kwargs.pop("compression", None)
        kwargs.pop("chunk_frames", None)
        return MemmapWriter(path, **kwargs)
    raise OutputError(f"unknown writer {name!r}: choose from {', '.join(BACKENDS)}")


@dataclass
class Dataset:
    """A dataset on disk, read-only: metadata, keys, and arrays on demand."""

    path: Path
    backend: str
    meta: dict[str, Any]

    def describe(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(key, shape, dtype)`` of every stored array, keys joined by ``/``."""
        if self.backend == "hdf5":
            from collect_cli.writers.hdf5 import describe_keys

            return describe_keys(self.path)
        td = self.load()
        return [
            (
                "/".join(k) if isinstance(k, tuple) else k,
                tuple(v.shape),
                str(v.dtype).split(".")[-1],
            )
            for k, v in td.items(True, True)
        ]

    def array(self, key: str):
        """One array as numpy (``key`` joined by ``/``)."""
        if self.backend == "hdf5":
            from collect_cli.writers.hdf5 import read_array

            return read_array(self.path, key)
        return self.load().get(tuple(key.split("/"))).numpy()

    def episodes(self) -> dict[str, Any]:
        return {name: self.array(f"episodes/{name}") for name in COLUMNS}

    def load(self):
        """The whole dataset as a TensorDict (memory-mapped or HDF5-backed)."""
        if self.backend == "hdf5":
            from tensordict import PersistentTensorDict

            return PersistentTensorDict.from_h5(str(self.path))
        from tensordict import TensorDict

        return TensorDict.load_memmap(self.path)


def open_dataset(path: str | Path) -> Dataset:
    """Open an rlcollect dataset (HDF5 file or memmap directory) by what is on disk."""
    path = Path(path)
    if path.is_dir():
        from collect_cli.writers.memmap import META_FILE, read_meta

        if not (path / META_FILE).is_file():
            raise OutputError(f"{str(path)!r} is a directory without {META_FILE}: not a dataset")
        return Dataset(path, "memmap", read_meta(path))
    if path.is_file():
        from collect_cli.writers.hdf5 import read_meta

        try:
            return Dataset(path, "hdf5", read_meta(path))
        except OSError as exc:
            raise OutputError(f"{str(path)!r} is not a readable HDF5 dataset ({exc})") from None
    raise missing_dataset(path)
