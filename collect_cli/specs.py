"""Gymnasium spaces as flat lists of array leaves, and their JSON description.

A space is flattened into leaves (Box, Discrete, MultiDiscrete, MultiBinary,
Text); Dict and Tuple spaces nest, giving keys such as ``("pos",)`` or ``("0",)``.
Batched values travel as lists of numpy arrays in leaf order.

Text (observations only) is the one leaf whose value is not an array: it travels
as a fixed-width uint8 array, the string's UTF-8 bytes padded with zeros to
:func:`text_width` bytes (:func:`encode_text`, :func:`decode_text`), because
batches hold tensors. Other spaces of strings (MiniGrid's ``MissionSpace``) are
recorded as the Text space :func:`recorded` gives them.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from collect_cli.errors import CollectionError, SpaceError

LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary, Text (observations), Dict or Tuple"
TEXT_DTYPE = np.dtype(np.uint8)
# a space of strings with no length bound (MiniGrid's MissionSpace: BabyAI's longest
# missions are ~150 characters) is recorded as Text of printable ASCII up to this length
STRING_SPACE_LENGTH = 256


def is_strings(space: spaces.Space) -> bool:
    """A leaf space whose values are ``str``: gymnasium's Text, or another (MissionSpace)."""
    if isinstance(space, spaces.Text):
        return True
    dtype = getattr(space, "dtype", None)
    return not isinstance(space, (spaces.Dict, spaces.Tuple, *LEAF_SPACES)) and (
        dtype is not None and np.dtype(dtype).kind == "U"
    )


def recorded(space: spaces.Space) -> spaces.Space:
    """``space`` as rlcollect records it: spaces of strings that are not gymnasium
    Text become Text (printable ASCII, ``STRING_SPACE_LENGTH`` characters at most)."""
    if isinstance(space, spaces.Dict):
        return spaces.Dict({k: recorded(s) for k, s in space.spaces.items()})
    if isinstance(space, spaces.Tuple):
        return spaces.Tuple([recorded(s) for s in space.spaces])
    if is_strings(space) and not isinstance(space, spaces.Text):
        return spaces.Text(STRING_SPACE_LENGTH, min_length=0, charset=string.printable)
    return space


def text_width(space: spaces.Text) -> int:
    """Bytes a value of ``space`` takes: one a character for an ASCII charset, else
    four (UTF-8's longest)."""
    ascii_only = all(ord(c) < 128 for c in space.character_set)
    return int(space.max_length) * (1 if ascii_only else 4)


def encode_text(value: Any, width: int) -> np.ndarray:
    """A string (or an array of them) as ``[..., width]`` uint8: UTF-8, zero padded."""
    raw = np.asarray(value, dtype=object)
    out = np.zeros((*raw.shape, width), TEXT_DTYPE)
    flat = out.reshape(-1, width)
    for i, text in enumerate(raw.reshape(-1).tolist()):
        data = str(text).encode("utf-8")
        if len(data) > width:
            # the env broke its own space: a runtime failure, not a usage error
            raise CollectionError(
                f"text observation {str(text)[:40]!r} is {len(data)} bytes in UTF-8, more "
                f"than the {width} its Text space allows"
            )
        flat[i, : len(data)] = np.frombuffer(data, TEXT_DTYPE)
    return out


def decode_text(array: np.ndarray) -> np.ndarray:
    """Inverse of :func:`encode_text`: ``[..., width]`` uint8 (or fixed-length bytes
    ``S<width>``, HDF5's form) to an object array of ``str``."""
    array = np.asarray(array)
    if array.dtype.kind != "S":
        array = np.ascontiguousarray(array, TEXT_DTYPE)
        array = array.view(f"S{array.shape[-1]}")[..., 0]
    out = np.empty(array.shape, object)
    out.reshape(-1)[:] = [b.decode("utf-8") for b in array.reshape(-1).tolist()]
    return out


@dataclass(frozen=True)
class Leaf:
    key: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    space: spaces.Space


def leaves(space: spaces.Space, what: str = "space", text: bool = True) -> list[Leaf]:
    """The array leaves of ``space`` in a fixed order (``text``: Text leaves allowed)."""
    out: list[Leaf] = []
    _collect(space, (), out, what, text)
    return out


def _collect(
    space: spaces.Space, key: tuple[str, ...], out: list[Leaf], what: str, text: bool
) -> None:
    if isinstance(space, spaces.Dict):
        for name, sub in space.spaces.items():
            _collect(sub, (*key, str(name)), out, what, text)
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            _collect(sub, (*key, str(i)), out, what, text)
    elif isinstance(space, LEAF_SPACES):
        out.append(Leaf(key, tuple(space.shape), np.dtype(space.dtype), space))
    elif text and isinstance(space, spaces.Text):
        out.append(Leaf(key, (text_width(space),), TEXT_DTYPE, space))
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
    if isinstance(space, spaces.Text):
        return [encode_text(value, text_width(space))]
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
    if isinstance(space, spaces.Text):
        return decode_text(next(it))
    return next(it)


def describe(space: spaces.Space) -> dict[str, Any]:
    """A JSON-serialisable description of a space (enough to rebuild it)."""
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: describe(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [describe(s) for s in space.spaces]}
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "max_length": int(space.max_length),
            "min_length": int(space.min_length),
            "charset": "".join(sorted(space.character_set)),
            "width": text_width(space),  # bytes a value takes in the dataset
        }
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
    if kind == "Text":
        length, least = desc["max_length"], desc["min_length"]
        return spaces.Text(length, min_length=least, charset=desc["charset"])
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
