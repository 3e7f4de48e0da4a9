"""Building the configured policy: its kind's ``build``, wrapped in exploration noise."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gymnasium import spaces
from torch import nn

from collect_cli.policies.exploration import ExplorationNoise
from collect_cli.policies.nets import RandomPolicy
from collect_cli.policies.registry import kind_of
from collect_cli.schema import PolicyConfig


@dataclass(frozen=True)
class PolicyFactory:
    """A picklable recipe for the configured policy (each worker builds its own)."""

    cfg: PolicyConfig
    device: str
    seed: int

    def __call__(self, obs_space: spaces.Space, action_space: spaces.Space) -> nn.Module:
        return build_policy(self.cfg, obs_space, action_space, torch.device(self.device), self.seed)


def env_wrappers(cfg: PolicyConfig) -> tuple[tuple[str, dict], ...]:
    """The env wrappers the policy was trained inside (an RL Zoo run's ``env_wrapper``),
    to apply around each env so that it sees what it saw in training."""
    return kind_of(cfg).env_wrappers(cfg)


def build_policy(
    cfg: PolicyConfig,
    obs_space: spaces.Space,
    action_space: spaces.Space,
    device: torch.device,
    seed: int,
) -> nn.Module:
    """Build the configured policy on ``device``, reproducibly from ``seed``,
    wrapped in its exploration noise (``policy.noise``) when one is set."""
    policy = kind_of(cfg).build(cfg, obs_space, action_space, device, seed)
    if cfg.noise == "none":
        return policy
    return ExplorationNoise(
        policy,
        action_space,
        cfg.noise,
        noise_scale=cfg.noise_scale,
        epsilon=cfg.epsilon,
        seed=seed + 1,
        device=device,
        sampler=RandomPolicy,
    )
