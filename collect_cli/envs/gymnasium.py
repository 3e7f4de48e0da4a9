"""Gymnasium backend: ``num_envs`` copies in one ``SyncVectorEnv``.

The vector env runs in same-step autoreset mode: a lane whose episode ends is
reset inside the same ``step`` call and its true final observation comes back
in ``info["final_obs"]``. So no fake transition ever crosses an episode
boundary, and ``next/observation`` of a last step is the real final state.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from collect_cli import specs
from collect_cli.envs.base import StepResult, VecEnv
from collect_cli.errors import CollectionError, UsageError


def _unknown_env(env_id: str, exc: Exception) -> UsageError:
    known = list(gym.registry.keys())
    close = difflib.get_close_matches(env_id.split(":")[-1], known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `rlcollect envs` lists presets"
    return UsageError(f"unknown env id {env_id!r} ({_one_line(exc)}){hint}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def make_single(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    try:
        return gym.make(env_id, **kwargs)
    except (gym.error.Error, ModuleNotFoundError) as exc:
        raise _unknown_env(env_id, exc) from None
    except TypeError as exc:
        raise UsageError(f"env.kwargs rejected by {env_id}: {_one_line(exc)}") from None


class GymnasiumVecEnv(VecEnv):
    def __init__(
        self,
        env_id: str,
        num_envs: int,
        kwargs: dict[str, Any] | None = None,
        info_keys: tuple[str, ...] = (),
    ):
        kwargs = dict(kwargs or {})
        first = make_single(env_id, kwargs)
        envs = [first] + [make_single(env_id, kwargs) for _ in range(num_envs - 1)]
        self._vec = SyncVectorEnv(
            [(lambda e=e: e) for e in envs], autoreset_mode=AutoresetMode.SAME_STEP
        )
        self.env_id = env_id
        self.num_envs = num_envs
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        spec = first.spec
        self.max_episode_steps = spec.max_episode_steps if spec is not None else None
        self.info_keys = tuple(info_keys)
        self.info_shapes = tuple(() for _ in self.info_keys)
        self._init_leaves()

    def reset(self, seeds: list[int]) -> list[np.ndarray]:
        obs, info = self._vec.reset(seed=[int(s) for s in seeds])
        self.info_shapes = tuple(
            np.shape(info[key][0]) if key in info and info[f"_{key}"][0] else ()
            for key in self.info_keys
        )
        return specs.split(obs, self.observation_space)

    def reset_lanes(self, lanes: np.ndarray, seeds: list[int]) -> list[np.ndarray]:
        mask = np.zeros(self.num_envs, bool)
        mask[lanes] = True
        full = [0] * self.num_envs
        for lane, seed in zip(lanes, seeds, strict=True):
            full[int(lane)] = int(seed)
        obs, _ = self._vec.reset(seed=full, options={"reset_mask": mask})
        return specs.split(obs, self.observation_space)

    def _info(self, info: dict[str, Any], ended: np.ndarray | None) -> list[np.ndarray]:
        """The ``info_keys`` entries of one step (NaN where a lane did not report one).

        A lane that ended and was reset in this step reports its last step's info
        under ``final_info``; the reset's own info is not a transition's.
        """
        final = info.get("final_info", {})
        out = []
        for key, shape in zip(self.info_keys, self.info_shapes, strict=True):
            values = np.full((self.num_envs, *shape), np.nan)
            for source, lanes in ((info, ended is None or ~ended), (final, ended)):
                present = source.get(f"_{key}")
                if present is None or lanes is None:
                    continue
                rows = np.flatnonzero(present & lanes)
                if not len(rows):
                    continue
                try:
                    values[rows] = np.asarray(
                        [np.asarray(source[key][r], np.float64) for r in rows]
                    ).reshape(len(rows), *shape)
                except (TypeError, ValueError):
                    sample = source[key][rows[0]]
                    raise CollectionError(
                        f"env.info_keys: info[{key!r}] of {self.env_id} is {sample!r}, "
                        f"not a number array of shape {shape}"
                    ) from None
            out.append(values)
        return out

    def step(self, actions: list[np.ndarray]) -> StepResult:
        action = specs.join(actions, self.action_space)
        obs, reward, terminated, truncated, info = self._vec.step(action)
        obs_leaves = specs.split(obs, self.observation_space)
        next_leaves = obs_leaves
        ended = info.get("_final_obs")
        if ended is not None and ended.any():
            lanes = np.flatnonzero(ended)
            finals = info["final_obs"]
            if not isinstance(self.observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
                next_leaves = [obs_leaves[0].copy()]
                next_leaves[0][lanes] = np.stack([finals[lane] for lane in lanes])
            else:
                next_leaves = [a.copy() for a in obs_leaves]
                for lane in lanes:
                    final = specs.split(finals[lane], self.observation_space)
                    for dst, src in zip(next_leaves, final, strict=True):
                        dst[lane] = src
        return StepResult(
            obs=obs_leaves,
            next_obs=next_leaves,
            reward=np.asarray(reward, dtype=np.float32),
            terminated=np.asarray(terminated, dtype=bool),
            truncated=np.asarray(truncated, dtype=bool),
            info=self._info(info, ended) if self.info_keys else None,
        )

    def close(self) -> None:
        self._vec.close()
