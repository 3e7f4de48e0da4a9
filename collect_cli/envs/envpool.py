"""EnvPool backend: ``num_envs`` lanes stepped by envpool's C++ thread pool.

The dataset semantics are those of the gymnasium backend:

- Autoreset. envpool resets a finished env on the *next* step, returning the
  reset observation with a dummy transition (reward 0). The adapter never
  records that: the lanes whose episode ended in a step get that reset step
  (one batched call on those lanes) inside the same :meth:`step`, so
  ``next_obs`` is the true final observation and ``obs`` the reset one.
- Seeding. envpool fixes its seeds when the pool is built: env ``i`` draws from
  its own generator seeded with ``env_seed[i]``. :meth:`reset` therefore builds
  a fresh pool with ``env_seed`` = the lanes' seeds (reinterpreted as int32),
  so a run is reproducible from ``seed``. :meth:`reset_lanes` resets a subset
  in place; envpool cannot reseed one env, so those lanes continue their own
  generator (still reproducible) and the seeds passed are not used.
- Spaces. Where gymnasium registers the same id with the same layout, its
  spaces are reported (and observations cast to their dtypes if envpool's
  differ), so datasets from both backends have the same schema.
"""

from __future__ import annotations

import difflib
import os
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from collect_cli import specs
from collect_cli.envs.base import StepResult, VecEnv
from collect_cli.errors import SpaceError, UsageError

INSTALL_HINT = "pip install 'rlcollect[envpool]'"
# envpool options that rlcollect sets itself, and what to use instead
RESERVED = {
    "num_envs": "set env.num_envs",
    "batch_size": "rlcollect steps all lanes together (batch_size = env.num_envs)",
    "seed": "envpool is seeded from rlcollect's `seed`",
    "env_seed": "envpool is seeded from rlcollect's `seed`",
    "gym_reset_return_info": "rlcollect needs the reset info",
}
# make() options that are not fields of the env's config
WRAPPER_OPTIONS = (
    "from_pixels",
    "render_mode",
    "render_env_id",
    "render_width",
    "render_height",
    "render_camera_id",
)
KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
SHOWN_IDS = ("Pendulum-v1", "CartPole-v1", "MountainCar-v0", "Acrobot-v1", "Pong-v5")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def import_envpool() -> Any:
    try:
        import envpool
    except ImportError as exc:
        raise UsageError(
            f"env.backend=envpool needs the envpool package ({_one_line(exc)}): {INSTALL_HINT}"
        ) from None
    return envpool


def check_id(envpool: Any, env_id: str) -> None:
    known = envpool.list_all_envs()
    if env_id in known:
        return
    close = difflib.get_close_matches(env_id.split(":")[-1], known, n=3, cutoff=0.6)
    if close:
        hint = f"did you mean {', '.join(close)}?"
    else:
        hint = f"it has e.g. {', '.join(i for i in SHOWN_IDS if i in known)}"
    if ":" in env_id:
        hint += " (`module:EnvId` ids need env.backend=gymnasium)"
    raise UsageError(f"envpool {envpool.__version__} has no env {env_id!r}: {hint}")


def default_threads(num_envs: int) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(num_envs, cpus))


def check_kwargs(env_id: str, kwargs: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Refuse, one key at a time, what envpool would reject (or crash on)."""
    for key, value in kwargs.items():
        if key in RESERVED:
            raise UsageError(
                f"env.kwargs.{key} is not accepted by env.backend=envpool: {RESERVED[key]}"
            )
        if key in WRAPPER_OPTIONS:
            continue
        if key not in defaults:
            accepted = sorted(k for k in defaults if k not in RESERVED and k != "base_path")
            raise UsageError(
                f"env.kwargs.{key} is not an option of envpool's {env_id}: "
                f"choose from {', '.join(accepted)}"
            )
        default = defaults[key]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif isinstance(default, str):
            ok = isinstance(value, str)
        else:
            continue
        if not ok:
            raise UsageError(
                f"env.kwargs.{key} must be {KIND[type(default)]} like its default "
                f"{default!r}, got {value!r}"
            )
    steps = kwargs.get("max_episode_steps")
    if steps is not None and steps < 1:
        raise UsageError(f"env.kwargs.max_episode_steps must be at least 1, got {steps}")
    threads = kwargs.get("num_threads")
    if threads is not None and threads < 0:
        raise UsageError(
            f"env.kwargs.num_threads must be >= 0 (0: envpool's choice), got {threads}"
        )


def _as_space(space: Any) -> spaces.Space:
    """envpool may describe a multi-key space as a plain (nested) dict."""
    if isinstance(space, dict):
        return spaces.Dict({str(k): _as_space(v) for k, v in space.items()})
    return space


def _layout(space: spaces.Space) -> list[tuple] | None:
    try:
        return [(leaf.key, leaf.shape, type(leaf.space)) for leaf in specs.leaves(space)]
    except SpaceError:
        return None


def gymnasium_spaces(
    env_id: str, observation: spaces.Space, action: spaces.Space
) -> tuple[spaces.Space, spaces.Space]:
    """gymnasium's spaces for ``env_id`` where they describe the same arrays as envpool's."""
    if env_id not in gym.registry:
        return observation, action
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gym.make(env_id)
        try:
            theirs = env.observation_space, env.action_space
        finally:
            env.close()
    except Exception:  # its dependencies are missing, say: keep envpool's
        return observation, action
    ours = (observation, action)
    same = all(
        _layout(t) is not None and _layout(t) == _layout(o)
        for t, o in zip(theirs, ours, strict=True)
    )
    return theirs if same else ours


def _flat_info(info: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for key, value in info.items():
        if isinstance(value, dict):
            out.update(_flat_info(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class EnvpoolVecEnv(VecEnv):
    steps_in_python = False

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        kwargs: dict[str, Any] | None = None,
        info_keys: tuple[str, ...] = (),
        device: str = "cpu",  # envpool steps in numpy
        wrappers: tuple = (),  # gymnasium wrappers: refused by env_factory
    ):
        envpool = import_envpool()
        check_id(envpool, env_id)
        self._envpool = envpool
        self.env_id = env_id
        self.num_envs = int(num_envs)
        kwargs = dict(kwargs or {})
        with warnings.catch_warnings():  # envpool's Box casts its bounds noisily
            warnings.simplefilter("ignore")
            defaults = envpool.make_spec(env_id).config._asdict()
        check_kwargs(env_id, kwargs, defaults)
        kwargs.setdefault("num_threads", default_threads(self.num_envs))
        self._kwargs = kwargs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                spec = envpool.make_spec(env_id, num_envs=self.num_envs, **kwargs)
                observation = _as_space(spec.gymnasium_observation_space)
                action = _as_space(spec.gymnasium_action_space)
            except (TypeError, ValueError, AssertionError) as exc:
                raise UsageError(
                    f"env.kwargs rejected by envpool's {env_id}: {_one_line(exc)}"
                ) from None
        self._native_obs = observation
        self.observation_space, self.action_space = gymnasium_spaces(env_id, observation, action)
        steps = int(spec.config.max_episode_steps)
        self.max_episode_steps = steps if steps > 0 else None
        self._init_leaves()
        native = specs.leaves(observation)
        self._casts = [
            None if n.dtype == ours.dtype else ours.dtype
            for n, ours in zip(native, self.obs_leaves, strict=True)
        ]
        self._single_leaf_obs = (  # envpool returns the array itself: nothing to do
            not isinstance(observation, (spaces.Dict, spaces.Tuple)) and self._casts[0] is None
        )
        self._single_action = len(self.action_leaves) == 1
        state_keys = list(spec.state_array_spec)
        available = [k.removeprefix("info:") for k in state_keys if k.startswith("info:")]
        available.append("elapsed_step")
        missing = [k for k in info_keys if k not in available]
        if missing:
            raise UsageError(
                f"env.info_keys: envpool's {env_id} reports no {', '.join(map(repr, missing))} "
                f"in its info: choose from {', '.join(sorted(available))}"
            )
        self.info_keys = tuple(info_keys)
        self.info_shapes = tuple(() for _ in self.info_keys)
        self._ids = np.arange(self.num_envs, dtype=np.int32)
        self._pool: Any = None
        self._obs: list[np.ndarray] = []

    # -- helpers --------------------------------------------------------------------------
    def _leaves(self, obs: Any) -> list[np.ndarray]:
        if self._single_leaf_obs:
            return [obs]
        leaves = specs.split(obs, self._native_obs)
        return [a if c is None else a.astype(c) for a, c in zip(leaves, self._casts, strict=True)]

    def _reset_subset(self, lanes: np.ndarray) -> list[np.ndarray]:
        """Reset ``lanes`` (sorted, unique) in one call; their observations in that order."""
        obs, info = self._pool.reset(lanes.astype(np.int32))
        leaves = self._leaves(obs)
        order = info["env_id"]
        if not np.array_equal(order, lanes):
            perm = np.argsort(order)  # lanes are sorted: sorting the answer aligns it
            leaves = [a[perm] for a in leaves]
        return leaves

    def _restart(self, lanes: np.ndarray, actions: list[np.ndarray]) -> list[np.ndarray]:
        """Start the next episode of ``lanes`` (sorted), which just ended, as envpool's own
        autoreset does: stepping a finished env resets it (the action is not used). Not
        ``reset(env_id)``: that restarts an Atari game, which ``episodic_life=True``
        continues with its next life (envpool 1.2, measured)."""
        sub = [a[lanes] for a in actions]
        action = sub[0] if self._single_action else specs.join(sub, self.action_space)
        obs, _, _, _, info = self._pool.step(action, lanes.astype(np.int32))
        leaves = self._leaves(obs)
        if not np.array_equal(info["env_id"], lanes):
            perm = np.argsort(info["env_id"])
            leaves = [a[perm] for a in leaves]
        return leaves

    def _build(self, seeds: list[int]) -> None:
        if len(seeds) != self.num_envs:
            raise UsageError(f"reset needs {self.num_envs} seeds, got {len(seeds)}")
        env_seed = np.asarray([int(s) & 0xFFFFFFFF for s in seeds], np.uint32).view(np.int32)
        self.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                self._pool = self._envpool.make_gymnasium(
                    self.env_id,
                    num_envs=self.num_envs,
                    env_seed=env_seed.tolist(),
                    **self._kwargs,
                )
                # built lazily (with a precision warning) on the first step: build it now
                _ = self._pool.observation_space, self._pool.action_space
            except (TypeError, ValueError, AssertionError) as exc:
                raise UsageError(
                    f"env.kwargs rejected by envpool's {self.env_id}: {_one_line(exc)}"
                ) from None

    # -- VecEnv -----------------------------------------------------------------------------
    def reset(self, seeds: list[int]) -> list[np.ndarray]:
        """A fresh pool whose env ``i`` is seeded with ``seeds[i]``; first observations."""
        self._build(seeds)
        obs, info = self._pool.reset()
        leaves = self._leaves(obs)
        if not np.array_equal(info["env_id"], self._ids):
            perm = np.argsort(info["env_id"])
            leaves = [a[perm] for a in leaves]
        flat = _flat_info(info)
        self.info_shapes = tuple(np.shape(flat[k])[1:] for k in self.info_keys)
        self._obs = leaves
        return leaves

    def reset_lanes(self, lanes: np.ndarray, seeds: list[int]) -> list[np.ndarray]:
        """Reset ``lanes`` in place. Their generators continue: ``seeds`` are not used."""
        if self._pool is None:
            raise UsageError("reset_lanes before reset: reset every lane first")
        lanes = np.unique(np.asarray(lanes, dtype=np.int64))
        if not len(lanes):
            return self._obs
        fresh = self._reset_subset(lanes)
        obs = [a.copy() for a in self._obs]
        for dst, src in zip(obs, fresh, strict=True):
            dst[lanes] = src
        self._obs = obs
        return obs

    def step(self, actions: list[np.ndarray]) -> StepResult:
        action = actions[0] if self._single_action else specs.join(actions, self.action_space)
        obs, reward, terminated, truncated, info = self._pool.step(action, self._ids)
        next_leaves = self._leaves(obs)
        order = info["env_id"]
        if not np.array_equal(order, self._ids):  # not seen in sync mode; cheap to guard
            perm = np.argsort(order)
            next_leaves = [a[perm] for a in next_leaves]
            reward, terminated, truncated = reward[perm], terminated[perm], truncated[perm]
            info = {k: v[perm] for k, v in _flat_info(info).items()}
        ended = terminated | truncated
        obs_leaves = next_leaves
        if ended.any():
            lanes = np.flatnonzero(ended)
            fresh = self._restart(lanes, actions)
            obs_leaves = [a.copy() for a in next_leaves]
            for dst, src in zip(obs_leaves, fresh, strict=True):
                dst[lanes] = src
        self._obs = obs_leaves
        values = None
        if self.info_keys:
            flat = _flat_info(info)
            values = [np.asarray(flat[k], np.float64) for k in self.info_keys]
        return StepResult(
            obs=obs_leaves,
            next_obs=next_leaves,
            reward=np.asarray(reward, dtype=np.float32).reshape(self.num_envs),
            terminated=np.asarray(terminated, dtype=bool),
            truncated=np.asarray(truncated, dtype=bool),
            info=values,
        )

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
