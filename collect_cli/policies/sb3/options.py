"""``policy=sb3``'s options."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from collect_cli.schema import PolicyConfig


@dataclass
class Sb3PolicyConfig(PolicyConfig):
    """A Stable-Baselines3 / sb3-contrib model (a pickle: load only trusted files)."""

    name: str = "sb3"
    path: str = MISSING  # a Stable-Baselines3 .zip or an RL Zoo run folder
    algo: str | None = None  # PPO, SAC, QRDQN...; None: read from the zip (or the zoo folder)
    deterministic: bool = True
    vecnormalize: str | None = None  # None: the file beside the model; "none": no normalisation
    checkpoint: str | None = None  # RL Zoo folder: best | last | <steps>; None: best, else last
    extras: bool = True  # record action_log_prob / value / q_values where the model has them
