"""Exploration: the interaction type of probabilistic policies and additive noise.

``exploration_type`` (random | mode | mean) is the tensordict interaction type the
policy runs under: a probabilistic TensorDict policy samples its distribution
(random), or takes its mode or mean. Noise is applied on top of the policy's
action only under ``random``, as TorchRL's exploration modules do:

- ``gaussian``: every Box action leaf gets ``N(0, noise_scale)`` added, clipped
  to the leaf's finite bounds;
- ``epsilon``: in each lane, with probability ``epsilon``, every discrete leaf
  (Discrete, MultiDiscrete, MultiBinary) is replaced by a uniformly random action.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from gymnasium import spaces
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, set_interaction_type
from tensordict.nn.probabilistic import interaction_type  # not re-exported before 0.15
from torch import nn

from collect_cli import specs
from collect_cli.errors import PolicyError

INTERACTION_TYPES = {
    "random": InteractionType.RANDOM,
    "mode": InteractionType.MODE,
    "mean": InteractionType.MEAN,
}
DISCRETE = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def interaction(exploration_type: str) -> contextlib.AbstractContextManager:
    """The context a policy runs in for ``exploration_type``."""
    return set_interaction_type(INTERACTION_TYPES[exploration_type])


class ExplorationNoise(nn.Module):
    """Wraps a TensorDict policy; perturbs its actions under ``exploration_type=random``.

    ``sampler(space, device, seed)`` builds the uniform action sampler (``.sample(n)``)
    epsilon draws from: the policies module's, passed in so that this module stays
    below it.
    """

    def __init__(
        self,
        policy: nn.Module,
        action_space: spaces.Space,
        kind: str,
        *,
        noise_scale: float,
        epsilon: float,
        seed: int,
        device: torch.device,
        sampler: Callable[[spaces.Space, torch.device, int], Any],
    ):
        super().__init__()
        self.policy = policy
        self.kind = kind
        self.noise_scale = float(noise_scale)
        self.epsilon = float(epsilon)
        leaves = specs.leaves(action_space, "action space")
        wanted = spaces.Box if kind == "gaussian" else DISCRETE
        self.leaves = [leaf for leaf in leaves if isinstance(leaf.space, wanted)]
        if not self.leaves:
            what = "continuous (Box)" if kind == "gaussian" else "discrete"
            other = "epsilon" if kind == "gaussian" else "gaussian"
            raise PolicyError(
                f"policy.noise={kind} needs {what} actions, and {action_space} has none: "
                f"use policy.noise={other} or none"
            )
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._random = sampler(spaces.Tuple([leaf.space for leaf in self.leaves]), device, seed + 1)
        self._bounds = []
        for leaf in self.leaves:
            if kind != "gaussian":
                self._bounds.append(None)
                continue
            low = torch.as_tensor(leaf.space.low, dtype=torch.float32, device=device)
            high = torch.as_tensor(leaf.space.high, dtype=torch.float32, device=device)
            self._bounds.append((low, high))

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td = self.policy(td)
        if interaction_type() not in (None, InteractionType.RANDOM):
            return td
        keys = [("action", *leaf.key) for leaf in self.leaves]
        n = td.batch_size[0]
        if self.kind == "gaussian":
            for key, (low, high) in zip(keys, self._bounds, strict=True):
                action = td.get(key)
                noise = (
                    torch.randn(action.shape, generator=self.generator, device=action.device)
                    * self.noise_scale
                )
                noisy = torch.maximum(torch.minimum(action.float() + noise, high), low)
                td.set(key, noisy.to(action.dtype))
            return td
        explore = torch.rand(n, generator=self.generator, device=self.generator.device)
        explore = explore < self.epsilon
        if bool(explore.any()):
            for key, random in zip(keys, self._random.sample(n), strict=True):
                action = td.get(key)
                mask = explore.reshape(n, *([1] * (action.dim() - 1)))
                td.set(key, torch.where(mask, random.to(action.device, action.dtype), action))
        return td
