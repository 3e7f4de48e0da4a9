"""A hand-written Pendulum swing-up controller: an "expert" to compare a random
dataset with (``docs/report.md``), no training needed.

    PYTHONPATH=examples/policies rlcollect run env=Pendulum policy=python \
        policy.target=pendulum_swingup:policy
"""

from __future__ import annotations

import torch

MAX_TORQUE = 2.0


def policy():
    """Far from upright, push energy toward that of resting upright (torque along
    the angular velocity while short of it, against it past it); near upright, a
    PD controller holds the pendulum up."""

    def act(obs: torch.Tensor) -> torch.Tensor:
        cos, sin, speed = obs[..., 0], obs[..., 1], obs[..., 2]
        angle = torch.atan2(sin, cos)  # 0 is upright
        # energy of Pendulum-v1's dynamics (theta'' = 15 sin + 3 u), 0 when resting upright
        energy = 0.5 * speed**2 - 15.0 * (1.0 - cos)
        pump = -MAX_TORQUE * torch.sign(speed * energy)
        hold = -(10.0 * angle + 2.0 * speed)
        torque = torch.where(cos > 0.8, hold, pump)
        return torque.clamp(-MAX_TORQUE, MAX_TORQUE).unsqueeze(-1)

    return act
