"""HDF5 backend: one ``.h5`` file, one chunked, resizable dataset per key.

Frame keys are datasets shaped ``[lanes, time, ...]`` growing along ``time``
(allocated ahead while the run goes on, cut to the steps written at close);
``episodes/<column>`` are 1-D datasets; metadata lives in the root attributes
(dicts as JSON strings). Opens with plain h5py and ``PersistentTensorDict.from_h5``.
``api.py`` is what the registry (``dataset/backend.py``) uses; ``options.py`` its
options, imported with the registry (so this package imports nothing itself).
"""
