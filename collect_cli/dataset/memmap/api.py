"""The memmap backend's face: what the registry (``dataset/backend.py``) uses."""

from collect_cli.dataset.memmap.merged import write_merged
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
