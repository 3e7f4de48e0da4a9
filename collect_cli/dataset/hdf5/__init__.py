"""HDF5 backend: one ``.h5`` file, one chunked, resizable dataset per key.

Frame keys are datasets shaped ``[lanes, time, ...]`` growing along ``time``
(allocated ahead while the run goes on, cut to the steps written at close);
``episodes/<column>`` are 1-D datasets; metadata lives in the root attributes
(dicts as JSON strings). Opens with plain h5py and ``PersistentTensorDict.from_h5``.
"""

from collect_cli.dataset.hdf5.attrs import lanes_limit
from collect_cli.dataset.hdf5.read import describe_keys, load, read_array, read_meta, reader
from collect_cli.dataset.hdf5.write import Hdf5Writer

WRITER = Hdf5Writer
__all__ = ["WRITER", "describe_keys", "lanes_limit", "load", "read_array", "read_meta", "reader"]
