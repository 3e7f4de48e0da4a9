"""The HDF5 backend's face: what the registry (``dataset/backend.py``) uses."""

from collect_cli.dataset.hdf5.attrs import lanes_limit
from collect_cli.dataset.hdf5.merged import write_merged
from collect_cli.dataset.hdf5.read import describe_keys, load, read_array, read_meta, reader
from collect_cli.dataset.hdf5.write import Hdf5Writer

WRITER = Hdf5Writer
__all__ = [
    "WRITER",
    "describe_keys",
    "lanes_limit",
    "load",
    "read_array",
    "read_meta",
    "reader",
    "write_merged",
]
