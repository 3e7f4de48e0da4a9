"""Rollout options: how a collector steps its envs.

One frozen :class:`RolloutOptions` goes whole from the config (``config.load``) to the
collectors and on to their worker processes; nobody copies its fields into
keyword lists. Its own invariants are checked when it is made, so a library
user's ``RolloutOptions(...)`` fails exactly as the CLI's config does. Nothing here
imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from collect_cli.errors import ConfigError

EXPLORATION_TYPES = ("random", "mode", "mean")


@dataclass(frozen=True)
class RolloutOptions:
    """The options TorchRL's collectors take, with its names."""

    # truncate episodes after this many steps (``truncated`` True); -1: the env's own limit
    max_frames_per_traj: int = -1
    # the first frames, over all lanes and workers, take uniformly random actions
    init_random_frames: int = 0
    # every env is reset when a batch starts (the running episodes are cut)
    reset_at_each_iter: bool = False
    # False: an episode end starts no new trajectory (one trajectory per lane)
    reset_when_done: bool = True
    # the interaction type the policy runs under (noise is added only under "random")
    exploration_type: str = "random"

    def __post_init__(self) -> None:
        limit = self.max_frames_per_traj
        if limit == 0 or limit < -1:
            raise ConfigError(
                f"max_frames_per_traj must be a positive integer or -1 (no limit), got {limit}"
            )
        if self.init_random_frames < 0:
            raise ConfigError(f"init_random_frames must be >= 0, got {self.init_random_frames}")
        if self.exploration_type not in EXPLORATION_TYPES:
            raise ConfigError(
                f"exploration_type={self.exploration_type!r} is not valid: choose from "
                f"{', '.join(EXPLORATION_TYPES)}"
            )
        if limit > 0 and not self.reset_when_done:
            raise ConfigError(
                "max_frames_per_traj needs reset_when_done=true: a truncated episode must be reset"
            )

    def share(self, workers: int) -> RolloutOptions:
        """One worker's part: ``init_random_frames`` is counted over all workers."""
        return replace(self, init_random_frames=math.ceil(self.init_random_frames / workers))

    def after(self, frames: int) -> RolloutOptions:
        """The rest of a run that already collected ``frames`` frames (resume)."""
        return replace(self, init_random_frames=max(0, self.init_random_frames - frames))
