"""Native backend: gymnasium's classic-control envs as batched torch on a device.

``env.backend=native`` runs Pendulum-v1, CartPole-v1, MountainCar-v0,
MountainCarContinuous-v0 and Acrobot-v1 for all lanes at once with torch ops
(:mod:`collect_cli.envs.native_dynamics`) on ``device`` (``cpu`` or ``cuda:N``).
The dataset semantics are the gymnasium backend's:

- Spaces, time limits (``max_episode_steps``, truncation as gymnasium's
  ``TimeLimit``: ``truncated`` when the step count reaches it, even on the step
  that terminates), rewards, termination and initial-state distributions are
  gymnasium's, and so is the precision of the state (float64, float32 for
  MountainCarContinuous: see ``native_dynamics``); observations and rewards are float32.
- Autoreset in the same step: lanes whose episode ended get a fresh initial
  state with ``torch.where`` over all lanes; ``next_obs`` is the true final
  observation, ``obs`` the reset one. No fake transitions.
- Seeding. One ``torch.Generator`` per env instance, on its device, seeded in
  :meth:`reset` from all lanes' seeds; every later initial state is drawn from
  it, so a run is reproducible on a given device (CPU and CUDA generators draw
  different streams). :meth:`reset_lanes` reseeds it from the seeds it is given.
- Arrays. :meth:`step` returns numpy arrays: on CPU views of the torch tensors
  (no copies), on CUDA copied to the host. :meth:`step_tensors` keeps
  everything on the device: the collector's device path (``collectors.device``)
  steps with it and copies a whole batch to the host at once.
- Threads. A step is a few dozen elementwise ops on ``lanes`` numbers each; CPU
  envs with fewer than ``SERIAL_ELEMENTS`` lanes run them with one intra-op
  thread (:mod:`collect_cli.threads`; torch parallelises sin/cos from ~1000
  elements, and on a busy machine waits milliseconds for its threads). The
  setting is restored after each call.
"""

from __future__ import annotations

import difflib
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import numpy as np
import torch

from collect_cli.devices import resolve_device
from collect_cli.envs.base import StepResult, VecEnv
from collect_cli.envs.native_dynamics import ENVS, Dynamics
from collect_cli.errors import CollectionError, UsageError
from collect_cli.threads import intra_op_threads, serial

KIND = {bool: "true or false", int: "an integer", float: "a number"}


def check_kwargs(cls: type[Dynamics], kwargs: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The env's parameters and its time limit from ``env.kwargs``; refuse anything else."""
    params: dict[str, Any] = {}
    steps = cls.max_episode_steps
    accepted = [*cls.options, "max_episode_steps"]
    for key, value in kwargs.items():
        if key == "render_mode":
            raise UsageError(
                "env.kwargs.render_mode: native envs do not render; drop it or use "
                "env.backend=gymnasium"
            )
        if key == "max_episode_steps":
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(
                    f"env.kwargs.max_episode_steps must be a positive integer, got {value!r}"
                )
            steps = value
            continue
        if key not in cls.options:
            raise UsageError(
                f"env.kwargs.{key} is not a parameter of native {cls.env_id}: "
                f"choose from {', '.join(accepted)}"
            )
        kind = cls.options[key][0]
        if kind is bool:
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise UsageError(f"env.kwargs.{key} must be {KIND[kind]}, got {value!r}")
        params[key] = kind(value)
    return params, steps


class TensorStep(NamedTuple):
    """One step of every lane, as tensors on the env's device."""

    obs: torch.Tensor  # [lanes, obs]: what the policy sees next (reset where ended)
    next_obs: torch.Tensor  # [lanes, obs]: the true s_{t+1}
    reward: torch.Tensor  # [lanes] float32
    terminated: torch.Tensor  # [lanes] bool
    truncated: torch.Tensor  # [lanes] bool


def generator_seed(seeds: list[int] | np.ndarray) -> int:
    """One 63-bit generator seed that depends on every seed in ``seeds``."""
    entropy = [int(s) % 2**64 for s in seeds]
    state = np.random.SeedSequence(entropy).generate_state(2, np.uint32)
    return (int(state[0]) << 31 ^ int(state[1])) & (2**63 - 1)


class NativeVecEnv(VecEnv):
    steps_in_python = False

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        kwargs: dict[str, Any] | None = None,
        info_keys: tuple[str, ...] = (),
        device: str | torch.device = "cpu",
        wrappers: tuple = (),  # gymnasium wrappers: refused by env_factory
    ):
        cls = ENVS.get(env_id)
        if cls is None:
            close = difflib.get_close_matches(env_id.split(":")[-1], list(ENVS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UsageError(
                f"env.backend=native has no env {env_id!r}{hint}: it implements "
                f"{', '.join(ENVS)}; use env.backend=gymnasium for other ids"
            )
        if info_keys:
            raise UsageError(
                "env.info_keys: native envs report no info; drop env.info_keys or use "
                "env.backend=gymnasium"
            )
        if num_envs < 1:
            raise UsageError(f"env.num_envs must be at least 1, got {num_envs}")
        params, steps = check_kwargs(cls, dict(kwargs or {}))
        self.device = resolve_device(device)
        self.dynamics = cls(self.device, **params)
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.observation_space, self.action_space = self.dynamics.spaces()
        self.max_episode_steps = steps
        self.info_keys = ()
        self.info_shapes = ()
        self._init_leaves()
        self._cpu = self.torch_on_cpu = self.device.type == "cpu"
        self._serial = self._cpu and serial(self.num_envs)
        self._generator = torch.Generator(device=self.device)
        self._state: torch.Tensor | None = None
        self._obs: torch.Tensor | None = None
        self._elapsed = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    # -- helpers ------------------------------------------------------------------------
    def _threads(self) -> AbstractContextManager:
        """One intra-op thread for small CPU envs (see the module's docstring)."""
        return intra_op_threads(1) if self._serial else nullcontext()

    def _host(self, t: torch.Tensor) -> np.ndarray:
        return t.numpy() if self._cpu else t.cpu().numpy()

    def _draw_initial(self) -> torch.Tensor:
        dyn = self.dynamics
        shape = (dyn.init_size, self.num_envs)
        u = torch.rand(shape, generator=self._generator, device=self.device, dtype=dyn.dtype)
        return self.dynamics.initial(u)

    def _action(self, action: np.ndarray) -> torch.Tensor:
        n, dyn = self.num_envs, self.dynamics
        if dyn.discrete:
            a = np.asarray(action).reshape(n)
            if a.dtype.kind not in "iu":
                raise CollectionError(f"{self.env_id} takes integer actions, got {a.dtype}")
            low, high = a.min(), a.max()
            if low < 0 or high >= dyn.discrete:
                bad = low if low < 0 else high
                raise CollectionError(
                    f"{self.env_id} takes actions 0..{dyn.discrete - 1}, got {bad}"
                )
            return torch.as_tensor(a, device=self.device).to(torch.int64)
        a = np.asarray(action).reshape(n, 1)
        return torch.as_tensor(a, dtype=torch.float32, device=self.device)

    def _require_reset(self) -> torch.Tensor:
        if self._state is None:
            raise UsageError("step or reset_lanes before reset: reset every lane first")
        return self._state

    # -- state access (tests, debugging) -----------------------------------------------------
    def get_state(self) -> torch.Tensor:
        """Every lane's internal state, ``[lanes, state]`` on the env's device (gymnasium's
        dtype: float64, float32 for MountainCarContinuous)."""
        return self._require_reset().T.clone()

    def set_state(self, state: torch.Tensor | np.ndarray) -> list[np.ndarray]:
        """Put every lane in ``state`` (as gymnasium's ``env.unwrapped.state``)."""
        self._require_reset()
        state = torch.as_tensor(np.asarray(state), dtype=self.dynamics.dtype).to(self.device)
        if state.T.shape != self._state.shape:
            raise UsageError(f"set_state needs shape {tuple(self._state.T.shape)}")
        self._state = state.T.contiguous()
        with self._threads():
            self._obs = self.dynamics.observe(self._state)
        return [self._host(self._obs)]

    # -- VecEnv -----------------------------------------------------------------------------
    def reset(self, seeds: list[int]) -> list[np.ndarray]:
        """Seed the generator from ``seeds`` (one per lane) and reset every lane."""
        with self._threads():
            return self._reset(seeds)

    def reset_lanes(self, lanes: np.ndarray, seeds: list[int]) -> list[np.ndarray]:
        """Reset ``lanes``; the generator is reseeded from ``seeds`` (one per lane)."""
        with self._threads():
            return self._reset_lanes(lanes, seeds)

    def step(self, actions: list[np.ndarray]) -> StepResult:
        with self._threads():
            return self._host_step(self._step(self._action(actions[0])))

    # -- tensors on the device (the collector's device path) ----------------------------
    def obs_tensors(self) -> list[torch.Tensor]:
        """Every lane's current observation, on the env's device."""
        if self._obs is None:
            raise UsageError("no observation before reset: reset every lane first")
        return [self._obs]

    def step_tensors(self, actions: list[torch.Tensor]) -> TensorStep:
        """:meth:`step` without leaving the device: actions and results are tensors
        there (flags ``[lanes]`` bool, reward ``[lanes]`` float32); no host sync.

        Discrete actions are not checked (that needs a sync): out-of-range ones are
        clamped into range, and the collector refuses the batch that held them."""
        with self._threads():
            action = actions[0]
            if self.dynamics.discrete:
                action = action.reshape(self.num_envs).to(torch.int64)
                action = action.clamp(0, self.dynamics.discrete - 1)
            else:
                action = action.reshape(self.num_envs, 1).to(torch.float32)
            return self._step(action)

    def close(self) -> None:
        self._state = self._obs = None

    # -- the work ----------------------------------------------------------------------------
    def _reset(self, seeds: list[int]) -> list[np.ndarray]:
        if len(seeds) != self.num_envs:
            raise UsageError(f"reset needs {self.num_envs} seeds, got {len(seeds)}")
        self._generator.manual_seed(generator_seed(seeds))
        self._state = self._draw_initial()
        self._elapsed.zero_()
        self._obs = self.dynamics.observe(self._state)
        return [self._host(self._obs)]

    def _reset_lanes(self, lanes: np.ndarray, seeds: list[int]) -> list[np.ndarray]:
        state = self._require_reset()
        lanes = np.asarray(lanes, dtype=np.int64).reshape(-1)
        if len(seeds) != len(lanes):
            raise UsageError(f"reset_lanes needs one seed per lane, got {len(seeds)}")
        if not len(lanes):
            return [self._host(self._obs)]
        if lanes.min() < 0 or lanes.max() >= self.num_envs:
            raise UsageError(f"reset_lanes: lanes must be in 0..{self.num_envs - 1}")
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[lanes] = True
        picked = torch.from_numpy(mask).to(self.device)
        self._generator.manual_seed(generator_seed(seeds))
        self._state = torch.where(picked, self._draw_initial(), state)
        self._elapsed.masked_fill_(picked, 0)
        self._obs = self.dynamics.observe(self._state)
        return [self._host(self._obs)]

    def _step(self, action: torch.Tensor) -> TensorStep:
        state = self._require_reset()
        state, reward, terminated = self.dynamics.step(state, action)
        self._elapsed += 1
        truncated = self._elapsed >= self.max_episode_steps
        next_obs = self.dynamics.observe(state)
        obs = next_obs
        ended = terminated | truncated
        # on CUDA always take the branch-free path: no device sync in the middle of a step
        if not self._cpu or ended.numpy().any():
            state = torch.where(ended, self._draw_initial(), state)
            self._elapsed.masked_fill_(ended, 0)
            obs = self.dynamics.observe(state)
        self._state, self._obs = state, obs
        return TensorStep(obs, next_obs, reward.to(torch.float32), terminated, truncated)

    def _host_step(self, step: TensorStep) -> StepResult:
        next_host = self._host(step.next_obs)
        return StepResult(
            obs=[next_host if step.obs is step.next_obs else self._host(step.obs)],
            next_obs=[next_host],
            reward=self._host(step.reward),
            terminated=self._host(step.terminated),
            truncated=self._host(step.truncated),
        )
