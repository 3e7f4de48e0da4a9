"""Small deterministic gymnasium envs for tests (importable as ``toyenvs:<Id>``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CounterEnv(gym.Env):
    """obs = step index; reward = step index + 1; terminates after ``length`` steps."""

    def __init__(self, length: int = 5):
        self.length = length
        self.observation_space = spaces.Box(0, 1000, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float(self.t)
        return np.array([self.t], np.float32), reward, self.t >= self.length, False, {}


class NestedEnv(gym.Env):
    """Dict obs (Box, Discrete, MultiBinary); Tuple action (Discrete, Box, MultiDiscrete)."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1, 1, (2,), np.float32),
                "mode": spaces.Discrete(3),
                "flags": spaces.MultiBinary(4),
            }
        )
        self.action_space = spaces.Tuple(
            (spaces.Discrete(4), spaces.Box(-2, 2, (3,), np.float32), spaces.MultiDiscrete([2, 5]))
        )
        self.t = 0

    def _obs(self):
        return {
            "pos": np.array([self.t / 10, -self.t / 10], np.float32),
            "mode": self.t % 3,
            "flags": np.array([self.t % 2, 1, 0, 1], np.int8),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        choice, vec, multi = action
        assert self.action_space.contains((int(choice), np.asarray(vec, np.float32), multi))
        self.t += 1
        return self._obs(), float(choice), False, self.t >= 7, {}


class TextEnv(gym.Env):
    """Text obs (non-ASCII charset): "é" * (t % 4) + "ab"[t % 2] at step t; terminates
    after 5 steps. ``overlong``: from its 6th step on, a string longer than the space allows."""

    observation_space = spaces.Text(6, min_length=1, charset="abé")
    action_space = spaces.Discrete(2)

    def __init__(self, overlong: bool = False):
        self.overlong = overlong
        self.t = self.steps = 0

    def _obs(self) -> str:
        if self.overlong and self.steps >= 6:
            return "é" * 40
        return "é" * (self.t % 4) + "ab"[self.t % 2]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.steps += 1
        return self._obs(), 0.0, self.t >= 5, False, {}


class TextActionEnv(gym.Env):
    observation_space = spaces.Discrete(2)
    action_space = spaces.Text(8)

    def reset(self, *, seed=None, options=None):
        return 0, {}

    def step(self, action):
        return 0, 0.0, False, False, {}


gym.register("Counter-v0", entry_point=CounterEnv)
gym.register("Nested-v0", entry_point=NestedEnv)
gym.register("Text-v0", entry_point=TextEnv)
gym.register("TextAction-v0", entry_point=TextActionEnv)


class FaultyEnv(CounterEnv):
    """A CounterEnv whose ``step`` raises on its ``fail_at``-th call (counted per env copy)."""

    def __init__(self, length: int = 5, fail_at: int = 50):
        super().__init__(length)
        self.fail_at = fail_at
        self.calls = 0

    def step(self, action):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"simulated failure at step {self.calls}")
        return super().step(action)


gym.register("Faulty-v0", entry_point=FaultyEnv)


class SlowEnv(CounterEnv):
    """Sleeps ``delay`` seconds per step: uneven workers for preemption tests."""

    def __init__(self, length: int = 1000, delay: float = 0.0):
        super().__init__(length)
        self.delay = delay

    def step(self, action):
        if self.delay:
            import time

            time.sleep(self.delay)
        return super().step(action)


gym.register("Slow-v0", entry_point=SlowEnv)


class InfoEnv(CounterEnv):
    """Counter with an info dict: ``x_position`` (scalar), ``terms`` (vector), ``label`` (text)."""

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, {"x_position": 0.0, "terms": np.zeros(2), "label": "start"}

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        info = {"x_position": self.t * 0.5, "terms": np.array([self.t, -self.t]), "label": "x"}
        return obs, reward, terminated, truncated, info


gym.register("Info-v0", entry_point=InfoEnv)


class ChattyEnv(CounterEnv):
    """A Counter that prints on every reset, from Python and from C (as BabyAI's
    level sampler and some native env libraries do)."""

    def reset(self, *, seed=None, options=None):
        import ctypes

        print("chatty: reset")
        ctypes.CDLL(None).puts(b"chatty: reset from C")
        return super().reset(seed=seed, options=options)


gym.register("Chatty-v0", entry_point=ChattyEnv)
