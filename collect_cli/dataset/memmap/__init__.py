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
"""

from collect_cli.dataset.memmap.read import (
    describe_keys,
    lanes_limit,
    load,
    read_array,
    read_meta,
    reader,
)
from collect_cli.dataset.memmap.write import MemmapWriter

WRITER = MemmapWriter
__all__ = ["WRITER", "describe_keys", "lanes_limit", "load", "read_array", "read_meta", "reader"]
