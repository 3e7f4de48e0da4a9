"""Toy envs for sweep tests (importable as ``sweepenvs:<Id>``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SeedFailEnv(gym.Env):
    """obs = step index, reward 1, episodes of ``length`` steps; ``step`` raises on
    its ``fail_at``-th call when ``run_seed == fail_seed`` (pass the sweep's seed as
    ``+env.kwargs.run_seed=${seed}``): one job of a sweep fails, the others do not."""

    def __init__(self, run_seed: int = 0, fail_seed: int = 1, fail_at: int = 150, length: int = 7):
        self.observation_space = spaces.Box(0, 1000, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.fail = run_seed == fail_seed
        self.fail_at, self.length = fail_at, length
        self.t = self.calls = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.calls += 1
        if self.fail and self.calls == self.fail_at:
            raise RuntimeError(f"simulated failure at step {self.calls}")
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= self.length, False, {}


class WideObsEnv(SeedFailEnv):
    """Like SeedFailEnv (never failing) with observations of ``width`` float64 values:
    same env id, another observation space than its default."""

    def __init__(self, width: int = 1):
        super().__init__(fail_seed=-1)
        self.observation_space = spaces.Box(
            0, 1000, (width,), np.float64 if width > 1 else np.float32
        )
        self.width = width

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return np.repeat(obs, self.width).astype(self.observation_space.dtype), info

    def step(self, action):
        obs, *rest = super().step(action)
        return (np.repeat(obs, self.width).astype(self.observation_space.dtype), *rest)


gym.register("SeedFail-v0", entry_point=SeedFailEnv)
gym.register("WideObs-v0", entry_point=WideObsEnv)
