"""Gymnasium spaces as flat lists of array leaves, and their JSON description.

A space is flattened into leaves (Box, Discrete, MultiDiscrete, MultiBinary);
Dict and Tuple spaces nest, giving keys such as ``("pos",)`` or ``("0",)``.
Batched values travel as lists of numpy arrays in leaf order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from collect_cli.errors import SpaceError

LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple"


@dataclass(frozen=True)
class Leaf:
    key: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    space: spaces.Space


def leaves(space: spaces.Space, what: str = "space") -> list[Leaf]:
    """The array leaves of ``space`` in a fixed order."""
    out: list[Leaf] = []
    _collect(space, (), out, what)
    return out


def _collect(space: spaces.Space, key: tuple[str, ...], out: list[Leaf], what: str) -> None:
    if isinstance(space, spaces.Dict):
        for name, sub in space.spaces.items():
            _collect(sub, (*key, str(name)), out, what)
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            _collect(sub, (*key, str(i)), out, what)
    elif isinstance(space, LEAF_SPACES):
        out.append(Leaf(key, tuple(space.shape), np.dtype(space.dtype), space))
    else:
        where = "/".join(key) or "top level"
        raise SpaceError(
            f"unsupported {what} {type(space).__name__} at {where}: rlcollect records {SUPPORTED}"
        )


def split(value: Any, space: spaces.Space) -> list[np.ndarray]:
    """Flatten a (batched or single) value of ``space`` into leaf arrays."""
    if isinstance(space, spaces.Dict):
        return [a for name, sub in space.spaces.items() for a in split(value[name], sub)]
    if isinstance(space, spaces.Tuple):
        return [a for v, sub in zip(value, space.spaces, strict=True) for a in split(v, sub)]
    return [np.asarray(value)]


def join(arrays: list[np.ndarray], space: spaces.Space) -> Any:
    """Inverse of :func:`split`: rebuild the nested value gymnasium expects."""
    it = iter(arrays)
    value = _join(it, space)
    return value


def _join(it: Any, space: spaces.Space) -> Any:
    if isinstance(space, spaces.Dict):
        return {name: _join(it, sub) for name, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_join(it, sub) for sub in space.spaces)
    return next(it)


def describe(space: spaces.Space) -> dict[str, Any]:
    """A JSON-serialisable description of a space (enough to rebuild it)."""
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: describe(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe(s) for s in space.spaces]}
    desc: dict[str, Any] = {"type": type(space).__name__, "dtype": str(np.dtype(space.dtype))}
    if isinstance(space, spaces.Box):
        # one number where every entry has the same bound (images): a Pong frame's
        # lists would make a 1 MB attribute, rewritten and compared at every commit
        desc.update(shape=list(space.shape), low=_bound(space.low), high=_bound(space.high))
    elif isinstance(space, spaces.Discrete):
        desc.update(n=int(space.n), start=int(space.start))
    elif isinstance(space, spaces.MultiDiscrete):
        desc.update(nvec=space.nvec.tolist(), start=space.start.tolist())
    elif isinstance(space, spaces.MultiBinary):
        desc.update(n=np.asarray(space.n).tolist())
    return desc


def _bound(values: np.ndarray) -> Any:
    flat = values.reshape(-1)
    return flat[0].item() if len(flat) and (flat == flat[0]).all() else values.tolist()


def rebuild(desc: dict[str, Any]) -> spaces.Space:
    """Inverse of :func:`describe`."""
    kind = desc["type"]
    if kind == "Dict":
        return spaces.Dict({k: rebuild(v) for k, v in desc["spaces"].items()})
    if kind == "Tuple":
        return spaces.Tuple([rebuild(v) for v in desc["spaces"]])
    dtype = np.dtype(desc["dtype"])
    if kind == "Box":
        shape = tuple(desc["shape"])
        low = np.broadcast_to(np.array(desc["low"], dtype), shape).copy()
        high = np.broadcast_to(np.array(desc["high"], dtype), shape).copy()
        return spaces.Box(low, high, desc["shape"], dtype)
    if kind == "Discrete":
        return spaces.Discrete(desc["n"], start=desc["start"])
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(desc["nvec"], dtype=dtype, start=desc["start"])
    if kind == "MultiBinary":
        return spaces.MultiBinary(desc["n"])
    raise SpaceError(f"unknown space type {kind!r} in dataset metadata")
