"""``filter``, ``split`` and ``merge --take``: new datasets of whole episodes of
others (which ones: ``select.py``; how they are copied: ``pack.py``).

Each checks everything before it writes: an input that does not validate, a
destination that is an input (or holds one), an unknown source, a fraction out
of (0, 1] and an empty result all exit 2 with nothing created.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataset import BACKENDS, locate
from collect_cli.dataset.fsio import publish
from collect_cli.dataset.ownership import (
    check_destination,
    claim,
    is_dataset,
    remove_leftovers,
    staging_name,
)
from collect_cli.dataset.writer import now
from collect_cli.errors import UsageError
from collect_cli.ops import pack, select
from collect_cli.ops.merge import KEYS, Shard, _check, _filled, _load, _metadata, _place, keys
from collect_cli.ops.select import Conditions

HALVES = ("train", "val")  # split's two datasets, inside its --out folder


def _copied_meta(shard: Shard, derived: dict[str, Any]) -> dict[str, Any]:
    """The metadata of a copy of some of ``shard``'s episodes: its own, with its
    sources table (an older dataset's read as one) and what made the copy."""
    return {**shard.meta, fmt.SOURCES: fmt.sources(shard.meta), fmt.DERIVED: derived}


def _derived(op: str, inputs: list[Shard], **details: Any) -> dict[str, Any]:
    return {
        "op": op,
        "time": now(),
        "inputs": [{"path": str(s.path), "episodes": len(s.rows["traj_id"])} for s in inputs],
        **details,
    }


def filter_dataset(
    path: str | Path, dest: str | Path, conditions: Conditions, *, overwrite: bool = False
) -> dict[str, Any]:
    """Write the episodes of ``path`` that meet ``conditions`` to ``dest``."""
    path, dest = Path(path), Path(dest)
    with claim(dest, "rlcollect filter"):  # durability D17
        replaces = check_destination(dest, overwrite=overwrite, inputs=[path])
        shard = _load(path)
        keep = conditions.choose(shard.rows, fmt.sources(shard.meta))
        meta = _copied_meta(shard, _derived("filter", [shard], conditions=conditions.asked()))
        result = pack.write([(shard, keep)], dest, replaces, meta, _keys(shard))
    return {**result, "from_episodes": len(keep), "from_frames": int(shard.meta["frames"])}


def _keys(shard: Shard) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (shape[2:], dtype) for k, (shape, dtype) in shard.arrays.items()}


def split_dataset(
    path: str | Path, out: str | Path, val: float, *, seed: int = 0, overwrite: bool = False
) -> dict[str, Any]:
    """Write ``out/train`` and ``out/val``: the episodes of ``path``, ``val`` of each
    source's in the second."""
    path, out = Path(path), Path(out)
    select.fraction(val, "--val")
    suffix = BACKENDS[locate(path)].suffix
    with claim(out, "rlcollect split"):  # durability D17
        replaces = check_destination(
            out, overwrite=overwrite, inputs=[path], kind="a split", replaceable=is_split
        )
        shard = _load(path)
        chosen = select.split(shard.rows, val, seed)
        halves = {"train": ~chosen, "val": chosen}
        for name, keep in halves.items():
            if not keep.any():
                raise UsageError(
                    f"--val {val:g} leaves the {name} half empty ({len(keep)} episodes): "
                    "choose another fraction"
                )
        remove_leftovers(out)
        tmp = staging_name(out, "splitting")
        tmp.mkdir()
        results = {}
        try:
            for name, keep in halves.items():
                derived = _derived("split", [shard], half=name, val=val, seed=seed)
                meta = _copied_meta(shard, derived)
                dest = tmp / f"{name}{suffix}"
                results[name] = pack.write([(shard, keep)], dest, None, meta, _keys(shard))
                results[name]["path"] = str(out / dest.name)
            publish(tmp, out, replaces)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return {"path": str(out), **results}


def is_split(path: Path) -> bool:
    """A folder ``split`` wrote (its two datasets and nothing else), or an empty one."""
    if not path.is_dir():
        return False
    inside = list(path.iterdir())
    names = {p.name for p in inside}
    wanted = {f"{h}{b.suffix}" for h in HALVES for b in BACKENDS.values()}
    return not inside or (names <= wanted and all(is_dataset(p) for p in inside))


def take(
    paths: list[str | Path],
    dest: str | Path,
    fractions: list[float],
    *,
    seed: int = 0,
    which: str = "all",
    allow_incomplete: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """``merge --take``: ``fractions[i]`` of shard ``i``'s episodes (at random, for
    ``seed``), whole, merged into ``dest`` (copied)."""
    dest = Path(dest)
    if len(fractions) != len(paths):
        raise UsageError(
            f"--take has {len(fractions)} fractions for {len(paths)} shards: give one each"
        )
    for value in fractions:
        select.fraction(value, "--take")
    if which not in KEYS:
        raise UsageError(f"--keys {which!r}: choose from {', '.join(KEYS)}")
    with claim(dest, "rlcollect merge"):  # durability D17
        replaces = check_destination(dest, overwrite=overwrite, inputs=paths)
        shards = [_load(Path(p)) for p in paths]
        if len({s.path.resolve() for s in shards}) < len(shards):
            raise UsageError("a shard is named twice: each shard merges once")
        _check(shards, allow_incomplete)
        _place(shards)
        merged = keys(shards, which)
        parts = [
            (s, select.take(s.rows, f, seed, i))
            for i, (s, f) in enumerate(zip(shards, fractions, strict=True))
        ]
        rows = {k: np.concatenate([s.rows[k][keep] for s, keep in parts]) for k in fmt.COLUMNS}
        meta = _metadata(shards, dest, rows, virtual=False)
        meta["merged"]["take"] = list(fractions)
        filled = _filled(shards, merged)
        if filled:
            meta[fmt.FILLED] = filled
        meta[fmt.DERIVED] = _derived("take", shards, fractions=list(fractions), seed=seed)
        offsets = [s.traj_offset for s in shards]
        result = pack.write(parts, dest, replaces, meta, merged, offsets)
    taken = [int(k.sum()) for _, k in parts]
    return {**result, "shards": len(shards), "taken": taken, "filled": sorted(filled or {})}
