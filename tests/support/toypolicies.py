"""Policy factories for ``policy=python`` tests (importable as ``toypolicies:<name>``)."""

from __future__ import annotations

import torch
from tensordict.nn import NormalParamExtractor, ProbabilisticTensorDictModule, TensorDictModule
from tensordict.nn import TensorDictSequential as Seq
from torch import nn
from torch.distributions import Normal


def constant(observation_space, action_space):
    """A plain callable on the observation tensor: always the middle of the Box."""
    mid = torch.as_tensor((action_space.low + action_space.high) / 2)

    def act(obs):
        return mid.expand(obs.shape[0], *mid.shape).clone()

    return act


def beyond(observation_space, action_space):
    """Twice the Box's upper bound, always: the env clips it, rlcollect records it."""
    high = torch.as_tensor(action_space.high) * 2

    def act(obs):
        return high.expand(obs.shape[0], *high.shape).clone()

    return act


def linear():
    """A bare nn.Module (no arguments taken by the factory)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 1), nn.Tanh())


def gaussian(observation_space, action_space):
    """A TensorDictModule policy recording loc, scale and the log-prob of its action."""
    net = TensorDictModule(
        nn.Sequential(nn.Linear(3, 2), NormalParamExtractor()),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    )
    dist = ProbabilisticTensorDictModule(
        in_keys=["loc", "scale"],
        out_keys=["action"],
        distribution_class=Normal,
        return_log_prob=True,
    )
    return Seq(net, dist)


def broken():
    raise RuntimeError("factory exploded")


def first_action(observation_space, action_space):
    """A plain callable: always the lowest discrete action (0 for Discrete(n))."""

    def act(obs):
        return torch.full((obs.shape[0],), int(action_space.start), dtype=torch.int64)

    return act


THREADS_SEEN: list[int] = []


class WideThreadsSeen(torch.nn.Module):
    """``threads_seen`` as a module with 2M weights (which it does not use)."""

    def __init__(self, observation_space, action_space):
        super().__init__()
        self.wide = torch.nn.Linear(1024, 2048)
        self.act = threads_seen(observation_space, action_space)

    def forward(self, obs):
        return self.act(obs)


def threads_seen(observation_space, action_space):
    """A plain callable: the middle of the Box (action 0 if discrete), recording
    torch's intra-op threads."""
    if hasattr(action_space, "n"):
        mid = torch.tensor(0)
    else:
        mid = torch.as_tensor((action_space.low + action_space.high) / 2)

    def act(obs):
        THREADS_SEEN.append(torch.get_num_threads())
        return mid.expand(obs.shape[0], *mid.shape).clone()

    return act
