"""Memmap backend: a directory that ``TensorDict.load_memmap(path)`` opens whole.

Frame keys are ``<key>.memmap`` files shaped ``[lanes, capacity, ...]`` (nested
keys in sub-directories), with the capacity allocated on disk up front (see build_frame_file): the
planned number of steps for a finite run, doubling for an endless one, and
compacted to the written steps when an endless run completes. Frames not yet
written carry ``collector/mask`` False. ``episodes/`` columns are append-only
files. Each directory holds the ``meta.json`` tensordict reads; rlcollect's
own metadata is ``rlcollect.json``. A commit writes the data, then replaces the
JSON files atomically, so a reader (or a run resumed after ``kill -9``) never
sees metadata ahead of the data; closing also ``msync``/``fsync``s everything.
``api.py`` is what the registry (``dataset/backend.py``) uses; ``options.py`` its
options, imported with the registry (so this package imports nothing itself).
"""
