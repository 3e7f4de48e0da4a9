"""The collector contract: an iterator (and torch ``IterableDataset``) of TensorDict
batches shaped ``[lanes, time]``, with the seed's lifecycle methods."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
from tensordict import TensorDictBase
from torch.utils.data import IterableDataset

from collect_cli import dataformat as fmt
from collect_cli.errors import CollectionError, RlcollectError


def derive_seeds(seed: int, count: int, *stream: int) -> list[int]:
    """``count`` distinct, reproducible 32-bit seeds for one stream of ``seed``.

    Streams (worker index, purpose) never collide: each is its own SeedSequence child.
    """
    seq = np.random.SeedSequence(int(seed) & 0xFFFFFFFFFFFFFFFF, spawn_key=tuple(stream))
    return [int(s) for s in seq.generate_state(count, dtype=np.uint32)]


FLAG_KEYS = fmt.FLAGS


class BatchViews(NamedTuple):
    """The per-key views of one time-major batch buffer that a rollout writes."""

    obs: list[Any]
    next_obs: list[Any]
    policy: list[tuple[tuple[str, ...], Any]]  # every policy output, actions included
    act_idx: list[int]  # where the actions are in ``policy``
    extras: list[Any]  # the other policy outputs (zeros during random steps)
    reward: Any
    traj: Any
    done: Any
    terminated: Any
    truncated: Any


def batch_views(
    v: Mapping[tuple[str, ...], Any],
    obs_keys: list[tuple[str, ...]],
    policy_keys: list[tuple[str, ...]],
    act_keys: list[tuple[str, ...]],
) -> BatchViews:
    """Pick a rollout's views out of ``v`` (key tuple -> numpy array or tensor)."""
    policy = [(k, v[k]) for k in policy_keys]
    act_idx = [policy_keys.index(k) for k in act_keys]
    return BatchViews(
        obs=[v[k] for k in obs_keys],
        next_obs=[v[(fmt.NEXT, *k)] for k in obs_keys],
        policy=policy,
        act_idx=act_idx,
        extras=[view for i, (_, view) in enumerate(policy) if i not in act_idx],
        reward=v[fmt.REWARD_KEY],
        traj=v[fmt.TRAJ_KEY],
        done=v[fmt.DONE_KEY],
        terminated=v[fmt.TERMINATED_KEY],
        truncated=v[fmt.TRUNCATED_KEY],
    )


def env_error(env_id: str, exc: Exception) -> CollectionError:
    """The one-line ``CollectionError`` for an exception from the env's own code."""
    text = str(exc).strip().splitlines()
    detail = f": {text[0]}" if text else ""
    return CollectionError(f"env {env_id} raised {type(exc).__name__}{detail}")


@contextlib.contextmanager
def env_errors(env_id: str) -> Iterator[None]:
    """An exception from the env's own code becomes a one-line ``CollectionError``."""
    try:
        yield
    except RlcollectError:
        raise
    except Exception as exc:
        raise env_error(env_id, exc) from exc


def pad_steps(views: Mapping[tuple[str, ...], Any], start: int) -> None:
    """Steps ``start...`` of time-major buffer ``views`` (numpy arrays or tensors)
    become padding: ``collector/mask`` False, ``traj_ids`` -1, everything else 0."""
    for key, view in views.items():
        if key == fmt.MASK_KEY:
            view[:start] = True
            view[start:] = False
        elif key == fmt.TRAJ_KEY:
            view[start:] = -1
        else:
            view[start:] = 0


class CollectorBase(IterableDataset, metaclass=abc.ABCMeta):
    """Iterate to receive batches; ``shutdown()`` (or a ``with`` block) releases everything."""

    total_frames: int
    frames_per_batch: int
    lanes: int  # env lanes over all workers
    # Whether iterating keeps this process's GIL busy (envs stepped in Python here),
    # so that a consumer thread working beside it would only slow it down.
    busy_in_python: bool = False
    # Whether iterating runs an env's torch ops on this process's CPU (env.backend=native).
    torch_on_cpu: bool = False

    def __iter__(self) -> Iterator[TensorDictBase]:
        return self.iterator()

    def next(self) -> TensorDictBase:
        """The next batch, from a persistent iterator (``StopIteration`` at the end)."""
        if getattr(self, "_next_iter", None) is None:
            self._next_iter = self.iterator()
        return next(self._next_iter)

    def __enter__(self) -> CollectorBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter teardown: nothing left to release
            self.shutdown()

    def iterator(self) -> Iterator[TensorDictBase]:
        """Yield batches until ``total_frames`` frames were collected (forever if -1).

        Batches are ``[lanes, time]``; :func:`~collect_cli.collectors.split_trajectories`
        regroups one into its trajectory pieces (TorchRL's ``split_trajs``).
        """
        for _, batch in self.iter_with_lanes():
            yield batch

    def place_helper(self, thread_id: int | None) -> None:
        """Where collecting shares the CPUs with thread ``thread_id`` of this process
        (a writer beside it), let the collector place that thread from the next batch
        on; None: no longer. Only :class:`MultiSyncCollector` does; the others leave
        it to the OS."""

    @abc.abstractmethod
    def iter_with_lanes(self) -> Iterator[tuple[int, TensorDictBase]]:
        """Like :meth:`iterator`, with the index of each batch's first lane.

        Lanes are global over all workers: worker ``w`` owns lanes
        ``w * num_envs ... (w + 1) * num_envs - 1``.
        """

    @abc.abstractmethod
    def shutdown(self) -> None: ...

    @abc.abstractmethod
    def set_seed(self, seed: int, static_seed: bool = False) -> int: ...

    @abc.abstractmethod
    def reset(self) -> None: ...

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def update_policy_weights_(self, weights: dict[str, Any] | None = None) -> None: ...
