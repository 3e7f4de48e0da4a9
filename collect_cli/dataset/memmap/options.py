"""``writer=memmap``'s options: those every backend has."""

from __future__ import annotations

from dataclasses import dataclass

from collect_cli.schema import WriterConfig


@dataclass
class MemmapWriterConfig(WriterConfig):
    name: str = "memmap"


OPTIONS = MemmapWriterConfig
