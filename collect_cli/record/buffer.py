"""The steps a :class:`~collect_cli.record.Recorder` holds before it hands them to the
writer: one preallocated ``[lanes, capacity, ...]`` numpy array per frame key, filled
one time step at a time and given to the writer as a ``[lanes, steps]`` TensorDict
of views (the writer copies them out before the arrays are filled again)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from collect_cli import dataformat as fmt
from collect_cli import specs
from collect_cli.errors import UsageError

Key = fmt.Key
# the first part of the keys the format owns: an extra may not start with one
RESERVED = frozenset(
    {fmt.OBSERVATION, fmt.ACTION, fmt.NEXT, fmt.COLLECTOR, fmt.EPISODES, fmt.FINAL, *fmt.FLAGS}
)


def shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


Slot = tuple[Any, Any]  # (index into [lanes, capacity, ...] arrays, lanes of the value)


def put(array: np.ndarray, slot: Slot, src: Any, lanes: int | None, what: str) -> None:
    """Store ``src`` (``lanes`` lanes of a frame's value; None: one lane's, without the
    lane dimension) at ``slot``. Numbers of another dtype of the same kind are cast
    (float64 to float32); floats into an integer array only where they hold whole
    numbers (SB3 gives MultiBinary actions as floats)."""
    src = np.asarray(src)
    want = array.shape[2:] if lanes is None else (lanes, *array.shape[2:])
    if src.shape != want:
        raise UsageError(f"{what} has shape {shape_text(src.shape)}, expected {shape_text(want)}")
    index, sel = slot
    if sel is not None:
        src = src[sel]
    if not np.can_cast(src.dtype, array.dtype, "same_kind"):
        try:
            cast = src.astype(array.dtype)
        except (TypeError, ValueError):
            cast = None
        if cast is None or not np.array_equal(cast, src):
            raise UsageError(
                f"{what} holds {src.dtype} values that are not {array.dtype}, the space's dtype"
            ) from None
        src = cast
    array[index] = src


class StepBuffer:
    """``capacity`` time steps of ``lanes`` lanes, in the dataset's keys and dtypes."""

    def __init__(self, lanes: int, capacity: int, obs_space: spaces.Space, act_space: spaces.Space):
        self.lanes, self.capacity = lanes, capacity
        self._obs_space, self._act_space = specs.recorded(obs_space), act_space
        self.obs_leaves = specs.leaves(self._obs_space, "observation space")
        self.act_leaves = specs.leaves(act_space, "action space", text=False)
        self.obs = [self._alloc(leaf.shape, leaf.dtype) for leaf in self.obs_leaves]
        self.next_obs = [self._alloc(leaf.shape, leaf.dtype) for leaf in self.obs_leaves]
        self.action = [self._alloc(leaf.shape, leaf.dtype) for leaf in self.act_leaves]
        self.reward = self._alloc((1,), np.float32)
        self.terminated = self._alloc((1,), bool)
        self.truncated = self._alloc((1,), bool)
        self.done = self._alloc((1,), bool)
        self.root_flags = self._alloc((1,), bool)  # a stored state's own flags: always False
        self.traj = np.full((lanes, capacity), -1, np.int64)
        self.mask = np.zeros((lanes, capacity), bool)
        self.extras: dict[Key, np.ndarray] | None = None  # made at the first step

    def _alloc(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.zeros((self.lanes, self.capacity, *shape), dtype)

    @staticmethod
    def frame_bytes(lanes: int, obs_space: spaces.Space, act_space: spaces.Space) -> int:
        """Bytes one time step of ``lanes`` lanes takes in the buffer (extras aside)."""
        leaves = [
            *specs.leaves(specs.recorded(obs_space), "observation space"),
            *specs.leaves(specs.recorded(obs_space), "observation space"),
            *specs.leaves(act_space, "action space", text=False),
        ]
        one = sum(int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize for leaf in leaves)
        return lanes * (one + 4 + 4 + 8 + 1)

    # -- one time step ---------------------------------------------------------------
    def put_obs(self, arrays: list[np.ndarray], slot: Slot, value: Any, what: str) -> None:
        """The observation ``value`` (all lanes) into ``arrays`` at ``slot``."""
        for leaf, array, part in zip(
            self.obs_leaves, arrays, self._split(value, what), strict=True
        ):
            put(array, slot, part, self.lanes, self._name(what, leaf))

    def put_one_obs(
        self, arrays: list[np.ndarray], lane: int, t: int, value: Any, what: str
    ) -> None:
        """One lane's observation ``value`` (no lane dimension) at step ``t``."""
        for leaf, array, part in zip(
            self.obs_leaves, arrays, self._split(value, what), strict=True
        ):
            put(array, ((lane, t), None), part, None, self._name(what, leaf))

    def put_action(self, slot: Slot, value: Any) -> None:
        try:
            parts = specs.split(value, self._act_space)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UsageError(f"actions do not match the action space: {exc!r}") from None
        for leaf, array, part in zip(self.act_leaves, self.action, parts, strict=True):
            put(array, slot, part, self.lanes, self._name("actions", leaf))

    def put_extras(self, slot: Slot, extras: dict[Key, np.ndarray] | None) -> None:
        given = extras or {}
        if self.extras is None:
            self.extras = {key: self._alloc(v.shape[1:], v.dtype) for key, v in given.items()}
        if set(given) != set(self.extras):
            had = ", ".join(fmt.path(k) for k in self.extras) or "none"
            now = ", ".join(fmt.path(k) for k in given) or "none"
            raise UsageError(
                f"extras must name the same keys at every step: the first step gave {had}, "
                f"this one {now}"
            )
        for key, value in given.items():
            put(self.extras[key], slot, value, self.lanes, f"extras[{fmt.path(key)!r}]")

    def pad(self, lane: int, t0: int, t1: int) -> None:
        """Make steps ``t0:t1`` of ``lane`` padding: mask False, traj_id -1, entries 0."""
        for array in self._arrays():
            array[lane, t0:t1] = 0
        self.traj[lane, t0:t1] = -1
        self.mask[lane, t0:t1] = False

    def _arrays(self) -> list[np.ndarray]:
        arrays = [*self.obs, *self.next_obs, *self.action, self.reward]
        arrays += [self.terminated, self.truncated, self.done]
        return arrays + list((self.extras or {}).values())

    # -- the batch the writer gets ---------------------------------------------------
    def batch(self, steps: int):
        """Steps ``0:steps`` as a ``[lanes, steps]`` TensorDict of views of the arrays."""
        import torch
        from tensordict import TensorDict

        td = TensorDict({}, batch_size=[self.lanes, steps])

        def add(key: Key, array: np.ndarray) -> None:
            td.set(key, torch.from_numpy(array[:, :steps]))

        for leaf, obs, nxt in zip(self.obs_leaves, self.obs, self.next_obs, strict=True):
            add((fmt.OBSERVATION, *leaf.key), obs)
            add(fmt.next_key((fmt.OBSERVATION, *leaf.key)), nxt)
        for leaf, action in zip(self.act_leaves, self.action, strict=True):
            add((fmt.ACTION, *leaf.key), action)
        for flag in fmt.FLAGS:
            add((flag,), self.root_flags)
        add(fmt.REWARD_KEY, self.reward)
        add(fmt.TERMINATED_KEY, self.terminated)
        add(fmt.TRUNCATED_KEY, self.truncated)
        add(fmt.DONE_KEY, self.done)
        for key, array in (self.extras or {}).items():
            add(key, array)
        add(fmt.TRAJ_KEY, self.traj)
        add(fmt.MASK_KEY, self.mask)
        return td

    # -- helpers ---------------------------------------------------------------------
    def _split(self, value: Any, what: str) -> list[np.ndarray]:
        try:
            return specs.split(value, self._obs_space)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise UsageError(f"{what} does not match the observation space: {exc!r}") from None

    @staticmethod
    def _name(what: str, leaf: specs.Leaf) -> str:
        return f"{what}[{fmt.path(leaf.key)!r}]" if leaf.key else what


def extra_key(name: Any) -> Key:
    """An extra's frame key: a name, or a tuple of names (nested)."""
    key = tuple(name) if isinstance(name, tuple) else (name,)
    if not key or not all(isinstance(part, str) and part and "/" not in part for part in key):
        raise UsageError(f"extras key {name!r} must be a name (or a tuple of names) without '/'")
    if key[0] in RESERVED:
        raise UsageError(
            f"extras key {fmt.path(key)!r} is the dataset's own: choose another name "
            f"(not one starting with {', '.join(sorted(RESERVED))})"
        )
    return key
