"""A toy pixel env for tests and benchmarks (``env=gym env.id=pixelenvs:Pixels-v0``).

Observations are ``size x size x 3`` uint8 images: flat colour bands and tiles
with a bright square that the action moves around, i.e. structured frames that
compress well, like rendered scenes do. Episodes end by truncation after
``length`` steps (never by termination).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])  # stay, up, down, left, right


class PixelEnv(gym.Env):
    """A ``size``-pixel square image; reward = minus the square's distance to the centre."""

    def __init__(self, size: int = 64, length: int = 50, square: int = 8):
        self.size, self.length, self.square = size, length, square
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(len(MOVES))
        rows, cols = np.indices((size, size))
        self._background = np.stack(  # flat bands and tiles, as in rendered scenes
            [(rows // 8) * 24 % 256, (cols // 16) * 48 % 256, np.full((size, size), 60)],
            axis=-1,
        ).astype(np.uint8)
        self.pos = np.zeros(2, np.int64)
        self.t = 0

    def _obs(self) -> np.ndarray:
        frame = self._background.copy()
        y, x = self.pos
        frame[y : y + self.square, x : x + self.square] = (255, 255, 255)
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.integers(0, self.size - self.square, size=2)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        step = MOVES[int(action)] * max(1, self.size // 32)
        self.pos = np.clip(self.pos + step, 0, self.size - self.square)
        centre = (self.size - self.square) / 2
        reward = -float(np.abs(self.pos - centre).sum()) / self.size
        return self._obs(), reward, False, self.t >= self.length, {}


gym.register("Pixels-v0", entry_point=PixelEnv)
