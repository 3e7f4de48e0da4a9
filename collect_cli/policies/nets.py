"""rlcollect's own policy modules: uniform random actions, a deterministic MLP, and
:class:`ObservationPolicy` around a user's function of the observation. A policy
maps a TensorDict of observations (batch ``[lanes]``) to the same TensorDict with
``action`` set (nested for Dict/Tuple action spaces) and optional extra outputs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from torch import nn

from collect_cli import specs
from collect_cli.errors import PolicyError


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class RandomPolicy(nn.Module):
    """Uniform actions inside the action space, sampled for all lanes at once.

    Bounded Box dims are uniform; half-bounded dims are shifted exponentials and
    unbounded dims normal (gymnasium's rule). The sampler of each leaf is chosen
    once, so a step costs one or two torch calls per leaf.
    """

    def __init__(self, action_space: spaces.Space, device: torch.device | str, seed: int = 0):
        super().__init__()
        self.leaves = specs.leaves(action_space, "action space")
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._samplers = [self._sampler(leaf) for leaf in self.leaves]
        # Whether one draw of k*n actions gives the values of k draws of n in turn:
        # true of torch's CPU uniform and integer samplers on one leaf; not of its
        # normal sampler (a Box dim unbounded), of CUDA's, nor of leaves interleaved.
        (leaf,) = self.leaves if len(self.leaves) == 1 else (None,)
        self.draws_in_sequence = (
            self.device.type == "cpu"
            and leaf is not None
            and (
                isinstance(leaf.space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary))
                or bool(np.isfinite(leaf.space.low).all() and np.isfinite(leaf.space.high).all())
            )
        )

    def _sampler(self, leaf: specs.Leaf) -> Callable[[int], torch.Tensor]:
        g, dev, space = self.generator, self.device, leaf.space
        dtype = torch_dtype(leaf.dtype)

        def rand(n: int, dt: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.rand((n, *leaf.shape), generator=g, device=dev, dtype=dt)

        if isinstance(space, spaces.Discrete):
            start, count = int(space.start), int(space.n)
            return lambda n: torch.randint(
                start, start + count, (n,), generator=g, device=dev, dtype=dtype
            )
        if isinstance(space, spaces.MultiDiscrete):
            start = torch.as_tensor(space.start, device=dev)
            nvec = torch.as_tensor(space.nvec, device=dev, dtype=torch.float64)
            return lambda n: (start + torch.floor(rand(n, torch.float64) * nvec)).to(dtype)
        if isinstance(space, spaces.MultiBinary):
            return lambda n: torch.randint(
                0, 2, (n, *leaf.shape), generator=g, device=dev, dtype=dtype
            )
        low = torch.as_tensor(space.low, dtype=torch.float64, device=dev)
        high = torch.as_tensor(space.high, dtype=torch.float64, device=dev)
        lo_ok, hi_ok = torch.isfinite(low), torch.isfinite(high)
        integral = not np.issubdtype(leaf.dtype, np.floating)
        if bool((lo_ok & hi_ok).all()):
            if integral:  # integers low..high inclusive
                span = high - low + 1
                return lambda n: torch.floor(low + span * rand(n, torch.float64)).to(dtype)
            work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
            low_w, span_w = low.to(work), (high - low).to(work)
            # low + span * u, computed in place (the same values)
            return lambda n: rand(n, work).mul_(span_w).add_(low_w).to(dtype)

        def mixed(n: int) -> torch.Tensor:
            u = rand(n, torch.float64)
            e = -torch.log1p(-u)
            z = torch.randn(u.shape, generator=g, device=dev, dtype=torch.float64)
            value = torch.where(lo_ok & hi_ok, low + (high - low) * u, z)
            value = torch.where(lo_ok & ~hi_ok, low + e, value)
            value = torch.where(~lo_ok & hi_ok, high - e, value)
            return (torch.floor(value) if integral else value).to(dtype)

        return mixed

    def sample(self, n: int) -> list[torch.Tensor]:
        return [sampler(n) for sampler in self._samplers]

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The action of a single-leaf action space for ``len(obs)`` lanes."""
        return self._samplers[0](obs.shape[0])

    def forward(self, td: TensorDict) -> TensorDict:
        for leaf, value in zip(self.leaves, self.sample(td.batch_size[0]), strict=True):
            td.set(("action", *leaf.key), value)
        return td


class MlpPolicy(nn.Module):
    """A deterministic MLP over the concatenated observation leaves.

    Box actions are tanh-squashed into bounded ranges; Discrete, MultiDiscrete
    and MultiBinary actions take the argmax (or sign) of their logits.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        hidden: list[int],
        activation: type[nn.Module] = nn.Tanh,
    ):
        super().__init__()
        if isinstance(action_space, (spaces.Dict, spaces.Tuple)):
            raise PolicyError(
                f"policy=mlp needs a single action leaf, got {type(action_space).__name__}: "
                "use policy=random or a python policy"
            )
        self.obs_keys = [("observation", *leaf.key) for leaf in specs.leaves(obs_space)]
        in_dim = sum(math.prod(leaf.shape) for leaf in specs.leaves(obs_space))
        self.action_space = action_space
        self.action_dtype = torch_dtype(np.dtype(action_space.dtype))
        if isinstance(action_space, spaces.Box):
            out_dim = math.prod(action_space.shape)
            low = torch.as_tensor(action_space.low, dtype=torch.float32)
            high = torch.as_tensor(action_space.high, dtype=torch.float32)
            bounded = torch.isfinite(low) & torch.isfinite(high)
            self.register_buffer("low", torch.where(bounded, low, -1.0), persistent=False)
            self.register_buffer("high", torch.where(bounded, high, 1.0), persistent=False)
            self.register_buffer("bounded", bounded, persistent=False)
            self.register_buffer("span", self.high - self.low, persistent=False)
            self.all_bounded = bool(bounded.all())
        elif isinstance(action_space, spaces.Discrete):
            out_dim = int(action_space.n)
        elif isinstance(action_space, spaces.MultiDiscrete):
            out_dim = int(action_space.nvec.sum())
        else:
            out_dim = math.prod(action_space.shape)
        layers: list[nn.Module] = []
        sizes = [in_dim, *hidden]
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), activation()]
        layers.append(nn.Linear(sizes[-1], out_dim))
        self.net = nn.Sequential(*layers)
        self._layers = tuple(layers)  # a plain tuple: no Module.__getattr__ a step
        self._start = int(action_space.start) if isinstance(action_space, spaces.Discrete) else 0

    def forward(self, td: TensorDict) -> TensorDict:
        n = td.batch_size[0]
        x = torch.cat([td.get(k).reshape(n, -1).float() for k in self.obs_keys], dim=-1)
        td.set("action", self._action(x))
        return td

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The action for the observation tensor of a single-leaf observation space:
        :meth:`forward` without the TensorDict, the same values."""
        if obs.dim() != 2 or obs.dtype != torch.float32:
            obs = obs.reshape(obs.shape[0], -1).float()
        return self._action(obs)

    def _action(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        for layer in self._layers:  # without nn.Module.__call__'s hook dispatch (~3 us a layer)
            x = layer.forward(x)
        y = x
        space = self.action_space
        if isinstance(space, spaces.Box):
            # low + (tanh(y) + 1) * 0.5 * (high - low), in place, in that order
            buffers = self._buffers  # not Module.__getattr__'s search
            squashed = torch.tanh(y).add_(1).mul_(0.5).mul_(buffers["span"]).add_(buffers["low"])
            if not self.all_bounded:
                squashed = torch.where(buffers["bounded"].flatten(), squashed, y)
            action = squashed if len(space.shape) == 1 else squashed.reshape(n, *space.shape)
        elif isinstance(space, spaces.Discrete):
            action = y.argmax(-1)
            if self._start:
                action = action + self._start
        elif isinstance(space, spaces.MultiDiscrete):
            chunks = y.split([int(k) for k in space.nvec.flatten()], dim=-1)
            action = torch.stack([c.argmax(-1) for c in chunks], -1).reshape(n, *space.shape)
            action = action + torch.as_tensor(space.start, device=y.device)
        else:
            action = (y > 0).reshape(n, *space.shape)
        return action if action.dtype == self.action_dtype else action.to(self.action_dtype)


class ObservationPolicy(nn.Module):
    """Adapts a module or callable on observations to the TensorDict policy interface.

    It receives the observation tensor (a TensorDict for Dict/Tuple spaces) and
    returns the action, or a dict/TensorDict with ``action`` and extra outputs
    (``sample_log_prob``, ...), which are all recorded.
    """

    def __init__(self, fn: Callable[..., object], name: str):
        super().__init__()
        self.fn = fn  # an nn.Module is registered as a submodule: state_dict, .to() work
        self.name = name

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The action alone, for a function that returns an action tensor."""
        out = self.fn(obs)
        return out if isinstance(out, torch.Tensor) else out["action"]

    def forward(self, td: TensorDict) -> TensorDict:
        out = self.fn(td.get("observation"))
        if isinstance(out, (dict, TensorDictBase)):
            for key, value in out.items():
                td.set(key, value)
        elif isinstance(out, torch.Tensor):
            td.set("action", out)
        else:
            raise PolicyError(
                f"policy {self.name} returned {type(out).__name__}: "
                "expected an action tensor or a dict with 'action'"
            )
        return td


def tensor_policy(policy: object, obs_leaves: int, outputs: list[tuple[str, ...]]):
    """``policy`` as a function from the observation tensor to the action tensor,
    where it is one of rlcollect's own policy classes, the observation space has one
    leaf and the policy's only output is ``action`` (its TensorDict run showed it);
    else None. The collectors call it instead of building a TensorDict each step."""
    if obs_leaves != 1 or outputs != [("action",)]:
        return None
    if type(policy) in (MlpPolicy, ObservationPolicy):
        return policy.act
    if type(policy) is RandomPolicy and len(policy.leaves) == 1 and not policy.leaves[0].key:
        return policy.act
    return None
