"""Stable-Baselines3 / sb3-contrib models as batched policies: :class:`Sb3Policy` runs
``model.policy`` once per step on all lanes, on the policy device, feeding it
observations normalised with the model's VecNormalize statistics. SB3 zips and
VecNormalize files are pickles: loading one runs code from it, exactly as SB3's
own ``load`` does.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict
from torch import nn
from torch.distributions import Distribution

from collect_cli.dataformat import ACTION_LOG_PROB, Q_VALUES, VALUE
from collect_cli.errors import PolicyError
from collect_cli.policies.sb3.locate import (
    ALGOS,
    CUSTOM_OBJECTS,
    INSTALL_HINT,
    resolve,
)
from collect_cli.policies.sb3.options import Sb3PolicyConfig


def algo_class(algo: str) -> type:
    """The SB3 / sb3-contrib class named ``algo`` (a usage error naming the extra if absent)."""
    import importlib

    module = {cls: mod for mod, cls in ALGOS.values()}[algo]
    try:
        return getattr(importlib.import_module(module), algo)
    except ImportError:
        package = module.replace("_", "-")
        raise PolicyError(f"policy=sb3 with {algo} needs {package}: {INSTALL_HINT}") from None


def _one_line(space: spaces.Space) -> str:
    return " ".join(str(space).split())


def load_vecnormalize(path: Path) -> Any:
    """The VecNormalize object pickled at ``path`` (as ``VecNormalize.load``, without a venv)."""
    from stable_baselines3.common.vec_env import VecNormalize

    try:
        with path.open("rb") as f:
            stats = pickle.load(f)  # trusted by the user: see docs/policies.md
    except Exception as exc:
        raise PolicyError(
            f"policy.vecnormalize {str(path)!r} cannot be read ({type(exc).__name__})"
        ) from None
    if not isinstance(stats, VecNormalize):
        raise PolicyError(
            f"policy.vecnormalize {str(path)!r} holds a {type(stats).__name__}, not VecNormalize"
        )
    return stats


class ObsNormalizer:
    """VecNormalize's observation normalisation in torch, on the policy device:
    ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)`` in float64,
    then float32, as ``VecNormalize.normalize_obs`` computes it in numpy."""

    def __init__(self, stats: Any, device: torch.device):
        def tensors(rms: Any) -> tuple[torch.Tensor, torch.Tensor]:
            mean = torch.as_tensor(np.asarray(rms.mean, np.float64), device=device)
            std = torch.sqrt(
                torch.as_tensor(np.asarray(rms.var, np.float64) + stats.epsilon, device=device)
            )
            return mean, std

        self.clip = float(stats.clip_obs)
        if isinstance(stats.obs_rms, dict):
            keys = stats.norm_obs_keys or list(stats.obs_rms)
            self.by_key = {k: tensors(stats.obs_rms[k]) for k in keys}
            self.whole = None
        else:
            self.by_key = {}
            self.whole = tensors(stats.obs_rms)

    def _apply(self, obs: torch.Tensor, mean_std: tuple[torch.Tensor, torch.Tensor]):
        mean, std = mean_std
        return ((obs.double() - mean) / std).clamp(-self.clip, self.clip).float()

    def __call__(self, obs: Any) -> Any:
        if self.whole is not None:
            return self._apply(obs, self.whole)
        out = dict(obs)
        for key, mean_std in self.by_key.items():
            out[key] = self._apply(obs[key], mean_std)
        return out


class Sb3Policy(nn.Module):
    """A Stable-Baselines3 model acting on every lane at once.

    Sets ``action`` (as ``model.predict`` returns it: unscaled or clipped into the
    action space) and the extras the model has: ``action_log_prob`` (actors with a
    distribution: PPO, A2C, TRPO, SAC, TQC...), ``value`` (PPO, A2C, TRPO) and
    ``q_values`` (DQN, QR-DQN). Sampling (``deterministic=false``) draws from its
    own random stream, seeded by ``seed``.
    """

    def __init__(
        self,
        cfg: Sb3PolicyConfig,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        device: torch.device,
        seed: int,
    ):
        super().__init__()
        self.source = resolve(cfg)
        self.device = torch.device(device)
        self.deterministic = bool(cfg.deterministic)
        if self.source.algo == "RecurrentPPO":
            raise PolicyError(
                "policy=sb3 cannot run RecurrentPPO: its LSTM state needs episode starts, "
                "which rlcollect's policies do not see"
            )
        cls = algo_class(self.source.algo)
        model = self._load(cls)
        self.sb3_policy = model.policy
        self.sb3_policy.set_training_mode(False)
        name = self.source.model.name
        self.transpose = self._check_observation(obs_space, model.observation_space, name)
        if action_space != model.action_space:
            raise PolicyError(
                f"policy.path {name}: the model's action space {_one_line(model.action_space)} "
                f"does not match the env's {_one_line(action_space)}"
            )
        self.obs_keys = list(obs_space.spaces) if isinstance(obs_space, spaces.Dict) else None
        self.normalize = None
        if self.source.vecnormalize is not None:
            stats = load_vecnormalize(self.source.vecnormalize)
            if stats.norm_obs:  # reward-only statistics leave the observations as they are
                self.normalize = ObsNormalizer(stats, self.device)
        self.kind = _kind(self.sb3_policy)
        self.exploration_rate = float(getattr(model, "exploration_rate", 0.0))
        self.action_space = action_space
        self.action_dtype = torch.from_numpy(np.empty(0, dtype=action_space.dtype)).dtype
        self.box = isinstance(action_space, spaces.Box)
        if self.box:
            self.low = torch.as_tensor(action_space.low, device=self.device)
            self.high = torch.as_tensor(action_space.high, device=self.device)
            self.span = torch.as_tensor(action_space.high - action_space.low, device=self.device)
        self.n_actions = int(action_space.n) if isinstance(action_space, spaces.Discrete) else 0
        self.samples = not self.deterministic and self.kind != "deterministic_actor"
        self.extras = bool(cfg.extras)
        self._rng_states = self._seeded_states(seed)

    def _load(self, cls: type) -> Any:
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

        # no replay buffer of the training size for acting (RL Zoo's enjoy does the same)
        extra = {"buffer_size": 1} if issubclass(cls, OffPolicyAlgorithm) else {}
        try:  # a model builds (and discards) fresh networks: leave the global RNG as it was
            with torch.random.fork_rng(devices=[]):
                return cls.load(
                    str(self.source.model),
                    device=self.device,
                    custom_objects=CUSTOM_OBJECTS,
                    print_system_info=False,
                    **extra,
                )
        except Exception as exc:
            detail = " ".join(str(exc).split())[:200]
            raise PolicyError(
                f"cannot load {str(self.source.model)!r} as {self.source.algo} "
                f"({type(exc).__name__}: {detail}): set policy.algo if it is another algorithm"
            ) from None

    @staticmethod
    def _check_observation(env_space: spaces.Space, model_space: spaces.Space, name: str) -> bool:
        """True when the model saw channel-first images of the env's channel-last ones
        (SB3's VecTransposeImage); a mismatch is a usage error naming both spaces."""
        if env_space == model_space:
            return False
        from stable_baselines3.common.preprocessing import is_image_space
        from stable_baselines3.common.vec_env import VecTransposeImage

        if (
            isinstance(env_space, spaces.Box)
            and is_image_space(env_space)
            and VecTransposeImage.transpose_space(env_space) == model_space
        ):
            return True
        raise PolicyError(
            f"policy.path {name}: the model's observation space {_one_line(model_space)} "
            f"does not match the env's {_one_line(env_space)}"
        )

    def _seeded_states(self, seed: int) -> list[torch.Tensor]:
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.manual_seed(seed)
            return self._current_states()

    def _rng_devices(self) -> list[torch.device]:
        return [self.device] if self.device.type == "cuda" else []

    def _current_states(self) -> list[torch.Tensor]:
        states = [torch.get_rng_state()]
        if self.device.type == "cuda":
            states.append(torch.cuda.get_rng_state(self.device))
        return states

    @contextmanager
    def _own_rng(self) -> Iterator[None]:
        """SB3 samples from torch's global generator: swap this policy's stream in."""
        if not self.samples:
            yield
            return
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.set_rng_state(self._rng_states[0])
            if self.device.type == "cuda":
                torch.cuda.set_rng_state(self._rng_states[1], self.device)
            yield
            self._rng_states = self._current_states()

    def _observation(self, td: TensorDict) -> Any:
        if self.obs_keys is None:
            obs = td.get("observation")
        else:
            obs = {k: td.get(("observation", k)) for k in self.obs_keys}
        if self.normalize is not None:
            obs = self.normalize(obs)
        if self.transpose:
            obs = obs.permute(0, 3, 1, 2)
        return obs

    def _actions(self, actions: torch.Tensor, n: int) -> torch.Tensor:
        """What ``model.predict`` returns for the policy's raw actions."""
        actions = actions.reshape(n, *self.action_space.shape)
        if self.box:
            if self.sb3_policy.squash_output:
                actions = self.low + (0.5 * (actions + 1.0) * self.span)
            else:
                actions = torch.clamp(actions, self.low, self.high)
        return actions.to(self.action_dtype)

    def forward(self, td: TensorDict) -> TensorDict:
        n = td.batch_size[0]
        obs = self._observation(td)
        # SB3 builds a torch distribution each step, and torch checks its parameters
        # each time (a quarter of a small policy's step): a loaded network needs no check
        validate = Distribution._validate_args
        Distribution.set_default_validate_args(False)
        try:
            with torch.no_grad():
                if self.samples:
                    with self._own_rng():
                        actions, extras = self._step(obs, n)
                else:
                    actions, extras = self._step(obs, n)
        finally:
            Distribution.set_default_validate_args(validate)
        for key, value in extras.items():
            td.set(key, value)
        td.set("action", self._actions(actions, n))
        return td

    def _step(self, obs: Any, n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy's raw actions and the extras it has, for a batch of ``n`` lanes."""
        policy, det = self.sb3_policy, self.deterministic
        if not self.extras and self.kind in ("actor_critic", "squashed_actor"):
            return policy._predict(obs, deterministic=det), {}  # the actor alone, as predict
        if self.kind == "actor_critic":
            actions, values, log_prob = policy(obs, deterministic=det)
            return actions, {VALUE: values.view(n), ACTION_LOG_PROB: log_prob.view(n)}
        if self.kind == "squashed_actor":
            mean, log_std, kwargs = policy.actor.get_action_dist_params(obs)
            dist = policy.actor.action_dist.proba_distribution(mean, log_std, **kwargs)
            actions = dist.get_actions(deterministic=det)
            if hasattr(dist, "gaussian_actions"):  # exact, where inverting tanh would not be
                log_prob = dist.log_prob(actions, dist.gaussian_actions)
            else:
                log_prob = dist.log_prob(actions)
            return actions, {ACTION_LOG_PROB: log_prob.view(n)}
        if self.kind in ("q", "quantile"):
            if self.kind == "q":
                q_values = policy.q_net(obs)
            else:  # quantiles [n, quantiles, actions]: their mean is the Q-value
                q_values = policy.quantile_net(obs).mean(dim=1)
            actions = q_values.argmax(dim=1)
            if not det and self.exploration_rate > 0:  # epsilon-greedy, per lane
                explore = torch.rand(n, device=self.device) < self.exploration_rate
                uniform = torch.randint(self.n_actions, (n,), device=self.device)
                actions = torch.where(explore, uniform, actions)
            return actions, {Q_VALUES: q_values} if self.extras else {}
        if self.kind == "deterministic_actor":
            return policy.actor(obs), {}
        return policy._predict(obs, deterministic=det), {}


def _kind(policy: nn.Module) -> str:
    from stable_baselines3.common.policies import ActorCriticPolicy

    if isinstance(policy, ActorCriticPolicy):
        return "actor_critic"
    if hasattr(policy, "q_net"):
        return "q"
    if hasattr(policy, "quantile_net"):
        return "quantile"
    actor = getattr(policy, "actor", None)
    if actor is not None and hasattr(actor, "get_action_dist_params"):
        return "squashed_actor"
    if actor is not None:
        return "deterministic_actor"
    return "generic"


def build(
    cfg: Sb3PolicyConfig,
    obs_space: spaces.Space,
    action_space: spaces.Space,
    device: torch.device,
    seed: int,
) -> Sb3Policy:
    """The batched policy of ``cfg`` (a usage error naming the extra when SB3 is absent)."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise PolicyError(f"policy=sb3 needs Stable-Baselines3: {INSTALL_HINT}") from None
    return Sb3Policy(cfg, obs_space, action_space, device, seed)
