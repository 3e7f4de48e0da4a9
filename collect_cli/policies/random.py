"""``policy=random``: uniform actions inside the action space."""

from __future__ import annotations

from dataclasses import dataclass

from collect_cli.policies.kind import PolicyKind
from collect_cli.schema import PolicyConfig


@dataclass
class RandomPolicyConfig(PolicyConfig):
    name: str = "random"


def build(cfg: RandomPolicyConfig, obs_space, action_space, device, seed: int):
    from collect_cli.policies.nets import RandomPolicy

    return RandomPolicy(action_space, device, seed)


KIND = PolicyKind("random", RandomPolicyConfig, build, "uniform actions in the action space")
