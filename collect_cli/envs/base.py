"""The one interface every env backend implements: a batch of ``num_envs`` lanes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from collect_cli import dataformat as fmt
from collect_cli import specs


@dataclass
class StepResult:
    """One vectorised step. Arrays are lane-major; observations are leaf lists.

    ``next_obs`` is the true s_{t+1} of every lane (the final observation where
    the episode ended); ``obs`` is what the policy sees next: equal to
    ``next_obs`` except in lanes that were reset, where it is the reset state.
    """

    obs: list[np.ndarray]
    next_obs: list[np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: list[np.ndarray] | None = None  # one float64 array per ``info_keys`` entry
    # record.state: arrays per ``state_keys`` leaf: s_t, and s_{t+1} (the final state
    # where the episode ended, before the reset)
    state: list[np.ndarray] | None = None
    next_state: list[np.ndarray] | None = None

    def recorded(self) -> list[np.ndarray]:
        """What the step reports beside the transition, in the collector's order:
        info entries, then the state's leaves, then the next state's."""
        return [*(self.info or ()), *(self.state or ()), *(self.next_state or ())]


class VecEnv(ABC):
    """``num_envs`` copies of one environment, stepped as a batch, auto-resetting."""

    env_id: str
    num_envs: int
    observation_space: spaces.Space
    action_space: spaces.Space
    max_episode_steps: int | None = None
    # Whether stepping runs Python bytecode most of the time (holding the GIL), as
    # gymnasium's envs do; C++ (envpool) and torch (native) envs release it.
    steps_in_python: bool = True
    # Whether stepping runs torch ops on this process's CPU (their intra-op threads).
    torch_on_cpu: bool = False
    info_keys: tuple[str, ...] = ()
    info_shapes: tuple[tuple[int, ...], ...] = ()  # per info key, known after reset
    state_keys: tuple[str, ...] = ()  # record.state: the state's leaves (state/<leaf>)
    state_shapes: tuple[tuple[int, ...], ...] = ()  # per state leaf, known after reset
    state_dtypes: tuple[np.dtype, ...] = ()  # ...and its dtype (float64, the seed int64)

    def _init_leaves(self) -> None:
        self.obs_leaves = specs.leaves(self.observation_space, "observation space")
        # a policy's actions are tensors: Text is recorded as an observation only
        self.action_leaves = specs.leaves(self.action_space, "action space", text=False)

    def recorded_specs(self) -> list[tuple[tuple[str, ...], tuple[int, ...], np.dtype]]:
        """``(frame key, shape, dtype)`` of what each step reports beside the transition,
        in :meth:`StepResult.recorded`'s order (known after a reset)."""
        states = [(fmt.STATE, k) for k in self.state_keys]
        keys = [*(("info", k) for k in self.info_keys), *states, *((fmt.NEXT, *k) for k in states)]
        shapes = (*self.info_shapes, *self.state_shapes, *self.state_shapes)
        floats = [np.dtype(np.float64)] * len(self.info_keys)
        dtypes = (*floats, *self.state_dtypes, *self.state_dtypes)
        return list(zip(keys, shapes, dtypes, strict=True))

    @abstractmethod
    def reset(self, seeds: list[int]) -> list[np.ndarray]:
        """Reset every lane with its own seed; return the first observations."""

    @abstractmethod
    def reset_lanes(self, lanes: np.ndarray, seeds: list[int]) -> list[np.ndarray]:
        """Reset only ``lanes`` (each with its seed); return every lane's observation."""

    @abstractmethod
    def step(self, actions: list[np.ndarray]) -> StepResult:
        """Step all lanes; lanes whose episode ended are reset in the same call."""

    def step_into(self, actions: list[np.ndarray], out: StepResult) -> StepResult:
        """:meth:`step`, its ``next_obs``, ``reward``, ``terminated`` and ``truncated``
        written into ``out``'s arrays (a batch buffer's row: no copy where the backend
        writes them in place). Returns the step, whose arrays are ``out``'s; its
        ``obs`` may be them too, valid until they are written again."""
        step = self.step(actions)
        for dst, src in zip(out.next_obs, step.next_obs, strict=True):
            dst[...] = src
        for name in ("reward", "terminated", "truncated"):
            getattr(out, name)[...] = getattr(step, name)
        obs = out.next_obs if step.obs is step.next_obs else step.obs
        return StepResult(
            obs, out.next_obs, out.reward, out.terminated, out.truncated, step.info,
            step.state, step.next_state,
        )  # fmt: skip

    @abstractmethod
    def close(self) -> None:
        """Release the environments."""
