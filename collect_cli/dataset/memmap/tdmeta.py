"""A memmap dataset's JSON files: the ``meta.json`` files tensordict's ``load_memmap``
reads, and rlcollect's metadata, each replaced atomically (durability D5)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS
from collect_cli.dataset.fsio import swap

TD_CLASS = {"_type": "<class 'tensordict._td.TensorDict'>", "_format_version": 1}


@functools.cache
def torch_dtype_name(dtype: np.dtype) -> str:
    return str(torch.from_numpy(np.empty(0, dtype=dtype)).dtype)


def numpy_dtype(name: str) -> np.dtype:
    """``"torch.float32"`` -> ``float32`` (the dtype names tensordict writes)."""
    return torch.empty(0, dtype=getattr(torch, name.split(".")[-1])).numpy().dtype


def spare(path: Path) -> Path:
    """Where :func:`write_json` writes ``path``'s next content."""
    return path.with_name(path.name + ".tmp")


# durability D5 (docs/durability.md)
def write_json(path: Path, data: dict[str, Any], sync: bool = False) -> None:
    """Atomically replace ``path`` with ``data``: written beside it as ``<name>.tmp``,
    then swapped in. Commits (``sync`` False) overwrite that spare in place and
    exchange the two names, keeping the old content as the next spare: on ext4 a
    rename over a file flushes the new one's data first (~0.5 ms, twice a commit),
    which an exchange does not. With ``sync`` the file is fsynced and renamed, and
    no spare is left."""
    tmp = spare(path)
    text = json.dumps(data).encode()  # one line, by json's C encoder: 3-4x faster per commit
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o644)  # no O_TRUNC: ext4 flushes after it too
    try:
        os.pwrite(fd, text, 0)
        os.ftruncate(fd, len(text))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if sync or not path.exists() or not swap(tmp, path):
        os.replace(tmp, path)


def td_meta_tree(
    leaves: dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]],
) -> dict[tuple[str, ...], dict[str, Any]]:
    """The ``meta.json`` content of every directory, keyed by directory key."""
    dirs: dict[tuple[str, ...], dict[str, Any]] = {(): {}}
    for key, (shape, dtype) in leaves.items():
        for depth in range(1, len(key)):
            parent, name = key[: depth - 1], key[depth - 1]
            dirs.setdefault(key[:depth], {})
            dirs[parent][name] = {"type": "TensorDict"}
        dirs[key[:-1]][key[-1]] = {
            "device": "cpu",
            "shape": list(shape),
            "dtype": torch_dtype_name(dtype),
            "is_nested": False,
        }
    return dirs


def write_td_meta(
    root: Path,
    frames: dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]],
    episodes: int,
    *,
    finals: dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]] | None = None,
    only_episodes: bool = False,
    skip_episodes: bool = False,
) -> None:
    """Write the ``meta.json`` files tensordict's ``load_memmap`` reads, under ``root``:
    ``frames`` (key -> full shape, dtype), the episodes columns of ``episodes`` rows and
    the ``final/`` table (compact layout: key -> full shape, dtype). The two tables are
    written alone with ``only_episodes``, left out with ``skip_episodes``."""
    leaves = {} if only_episodes else dict(frames)  # (most commits write the tables alone)
    for name, dtype in COLUMNS.items():
        leaves[(fmt.EPISODES, name)] = ((episodes,), dtype)
    leaves.update(finals or {})
    for key, content in td_meta_tree(leaves).items():
        is_episodes = key[:1] in ((fmt.EPISODES,), (fmt.FINAL,))
        if (only_episodes and not is_episodes) or (skip_episodes and is_episodes):
            continue
        rows = [episodes] if key == (fmt.EPISODES,) else []
        content.update(shape=rows, device="cpu", **TD_CLASS)
        content["_class"] = "tensordict:TensorDict"
        write_json(root.joinpath(*key, "meta.json"), content)
