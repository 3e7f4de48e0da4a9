"""A toy env for the Ray sweep test (importable as ``rayenvs:HangOnce-v0``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym
from sweepenvs import SeedFailEnv


class HangOnceEnv(SeedFailEnv):
    """SeedFailEnv that never fails, but whose copy in the job of ``run_seed ==
    hang_seed`` hangs on its ``hang_at``-th step, once: it writes its process id to
    ``pid_file`` and sleeps until killed. Once ``pid_file`` exists (a rerun of the
    job), it runs like the others."""

    def __init__(self, run_seed: int = 0, hang_seed: int = 1, hang_at: int = 150, pid_file=""):
        super().__init__(run_seed=run_seed, fail_seed=-1)
        self.hang = run_seed == hang_seed and bool(pid_file) and not Path(pid_file).exists()
        self.hang_at, self.pid_file = hang_at, Path(pid_file)

    def step(self, action):
        if self.hang and self.calls + 1 == self.hang_at:
            part = self.pid_file.with_name(self.pid_file.name + ".part")
            part.write_text(str(os.getpid()))
            part.replace(self.pid_file)  # whole, or not there
            while True:
                time.sleep(1)
        return super().step(action)


gym.register("HangOnce-v0", entry_point=HangOnceEnv)
