"""Reading a memmap dataset: tensordict's ``load_memmap``, arrays mapped on access."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import MEMMAP_META_FILE as META_FILE
from collect_cli.errors import OutputError


def read_meta(path: Path) -> dict[str, Any]:
    if not (path / META_FILE).is_file():
        raise OutputError(f"{str(path)!r} is a directory without {META_FILE}: not a dataset")
    with open(path / META_FILE) as f:
        return json.load(f)


def load(path: Path):
    from tensordict import TensorDict

    return TensorDict.load_memmap(path)


def describe_keys(path: Path) -> list[tuple[str, tuple[int, ...], str]]:
    """``(key, shape, dtype)`` of every stored array."""
    return [
        (fmt.path(key), tuple(value.shape), str(value.dtype).split(".")[-1])
        for key, value in load(path).items(True, True)
    ]


def read_array(path: Path, key: str) -> np.ndarray:
    return load(path).get(fmt.key_of(key)).numpy()


@contextlib.contextmanager
def reader(path: Path, by_lane: bool = False) -> Iterator[Callable[[str], Any]]:
    """``read(key)``: the memory-mapped array (pages read on access)."""
    td = load(path)
    yield lambda key: td.get(fmt.key_of(key)).numpy()


def lanes_limit(lanes: int, what: str) -> str | None:
    return None  # one file per key: no per-lane record to outgrow
