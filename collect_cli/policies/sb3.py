"""Stable-Baselines3 / sb3-contrib models and RL Zoo run folders as batched policies.

:func:`resolve` finds what to load (the model zip, its VecNormalize file, the
algorithm) without importing SB3, so that provenance can use it too.
:class:`Sb3Policy` runs ``model.policy`` once per step on all lanes, on the policy
device, feeding it observations normalised with the model's VecNormalize
statistics. SB3 zips and VecNormalize files are pickles: loading one runs code
from it, exactly as SB3's own ``load`` does.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from gymnasium import spaces
from tensordict import TensorDict
from torch import nn
from torch.distributions import Distribution

from collect_cli.config import Sb3PolicyConfig
from collect_cli.dataformat import ACTION_LOG_PROB, Q_VALUES, VALUE
from collect_cli.errors import PolicyError

# policy extras recorded per frame (top-level keys, like "action")

INSTALL_HINT = "pip install 'rlcollect[sb3]'"
VECNORMALIZE_FILES = ("vecnormalize.pkl", "vec_normalize.pkl")
ZOO_CONFIG, ZOO_ARGS = "config.yml", "args.yml"
ZOO_BEST = "best_model.zip"
# hyperparameters of an RL Zoo config.yml that change what the policy observes
ZOO_ENV_WRAPPER, ZOO_VEC_WRAPPER = "env_wrapper", "vec_env_wrapper"

# canonical algorithm class names, by their lower-case name and RL Zoo folder name
ALGOS = {
    "a2c": ("stable_baselines3", "A2C"),
    "ddpg": ("stable_baselines3", "DDPG"),
    "dqn": ("stable_baselines3", "DQN"),
    "ppo": ("stable_baselines3", "PPO"),
    "sac": ("stable_baselines3", "SAC"),
    "td3": ("stable_baselines3", "TD3"),
    "ars": ("sb3_contrib", "ARS"),
    "crossq": ("sb3_contrib", "CrossQ"),
    "maskableppo": ("sb3_contrib", "MaskablePPO"),
    "ppo_mask": ("sb3_contrib", "MaskablePPO"),
    "qrdqn": ("sb3_contrib", "QRDQN"),
    "recurrentppo": ("sb3_contrib", "RecurrentPPO"),
    "ppo_lstm": ("sb3_contrib", "RecurrentPPO"),
    "tqc": ("sb3_contrib", "TQC"),
    "trpo": ("sb3_contrib", "TRPO"),
}
# the module of a saved policy class names its algorithm (shared ones are told apart below)
ALGO_BY_POLICY_MODULE = {
    "stable_baselines3.sac.policies": "SAC",
    "stable_baselines3.dqn.policies": "DQN",
    "sb3_contrib.ars.policies": "ARS",
    "sb3_contrib.crossq.policies": "CrossQ",
    "sb3_contrib.qrdqn.policies": "QRDQN",
    "sb3_contrib.tqc.policies": "TQC",
    "sb3_contrib.common.maskable.policies": "MaskablePPO",
    "sb3_contrib.common.recurrent.policies": "RecurrentPPO",
}
# inference needs none of these; their pickles may not load across versions (RL Zoo does so too)
CUSTOM_OBJECTS = {
    "learning_rate": 0.0,
    "lr_schedule": lambda _: 0.0,
    "clip_range": lambda _: 0.0,
    "exploration_schedule": lambda _: 0.0,
}


@dataclass(frozen=True)
class Sb3Source:
    """What a ``policy=sb3`` config loads."""

    model: Path
    algo: str  # the class name: PPO, SAC, QRDQN...
    vecnormalize: Path | None
    zoo_folder: Path | None = None
    # the zoo's env_wrapper entries, applied to each env: ("module.Class", kwargs)
    env_wrappers: tuple[tuple[str, dict[str, Any]], ...] = ()


def resolve(cfg: Sb3PolicyConfig) -> Sb3Source:
    """The model file, VecNormalize file and algorithm ``cfg`` names (PolicyError if none)."""
    path = Path(cfg.path)
    zoo_algo, wrappers = None, ()
    if path.is_dir():
        model, beside, zoo_algo, wrappers = _zoo_files(path, cfg.checkpoint)
    elif path.is_file():
        if cfg.checkpoint is not None:
            raise PolicyError(
                f"policy.checkpoint applies to RL Zoo folders; policy.path {cfg.path!r} is a file"
            )
        model = path
        beside = next(
            (path.parent / n for n in VECNORMALIZE_FILES if (path.parent / n).is_file()), None
        )
    else:
        raise PolicyError(f"policy.path {cfg.path!r} does not exist")
    if cfg.vecnormalize is None:
        vecnormalize = beside
    elif cfg.vecnormalize.lower() == "none":
        vecnormalize = None
    else:
        vecnormalize = Path(cfg.vecnormalize)
        if not vecnormalize.is_file():
            raise PolicyError(f"policy.vecnormalize {cfg.vecnormalize!r} does not exist")
    algo = canonical_algo(cfg.algo) if cfg.algo else zoo_algo or algo_from_zip(model)
    return Sb3Source(model, algo, vecnormalize, path if path.is_dir() else None, wrappers)


def canonical_algo(name: str) -> str:
    entry = ALGOS.get(name.lower().replace("-", "_")) or ALGOS.get(name.lower().replace("-", ""))
    if entry is None:
        names = sorted({cls for _, cls in ALGOS.values()})
        raise PolicyError(f"policy.algo={name!r} is not known: choose from {', '.join(names)}")
    return entry[1]


def algo_from_zip(model: Path) -> str:
    """The algorithm a model zip was saved by, read from its ``data`` JSON."""
    try:
        with zipfile.ZipFile(model) as archive:
            data = json.loads(archive.read("data"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        raise PolicyError(
            f"policy.path {str(model)!r} is not a Stable-Baselines3 model (a zip with 'data')"
        ) from None
    policy_class = data.get("policy_class")
    module = policy_class.get("__module__", "") if isinstance(policy_class, dict) else ""
    if module in ALGO_BY_POLICY_MODULE:
        return ALGO_BY_POLICY_MODULE[module]
    if module == "stable_baselines3.td3.policies":  # DDPG is TD3 with these settings
        ddpg = data.get("policy_delay") == 1 and data.get("target_noise_clip") == 0.0
        return "DDPG" if ddpg else "TD3"
    if module == "stable_baselines3.common.policies":  # PPO, A2C and TRPO share the policy
        if "clip_range" in data:
            return "PPO"
        return "TRPO" if "cg_max_steps" in data else "A2C"
    raise PolicyError(
        f"cannot tell which algorithm saved {str(model)!r} (policy module {module or '?'}): "
        "set policy.algo, e.g. policy.algo=PPO"
    )


def _zoo_files(folder: Path, checkpoint: str | None) -> tuple[Path, Path | None, str | None, Any]:
    """(model, VecNormalize file, algorithm, env wrappers) of an RL Zoo run folder
    ``logs/<algo>/<env>_<n>``."""
    configs = sorted(p.parent for p in folder.glob(f"*/{ZOO_CONFIG}"))
    if len(configs) != 1:
        raise PolicyError(
            f"policy.path {str(folder)!r} is a folder but not an RL Zoo run folder "
            f"(expected one <env>/{ZOO_CONFIG} inside): name the model .zip instead"
        )
    params = configs[0]
    env_name = params.name
    hyper = read_zoo_yaml(params / ZOO_CONFIG)
    wrappers = _zoo_wrappers(folder, hyper)
    args = read_zoo_yaml(params / ZOO_ARGS) if (params / ZOO_ARGS).is_file() else {}
    stats = params / VECNORMALIZE_FILES[0]
    vecnormalize = stats if stats.is_file() else None
    if checkpoint is None:
        checkpoint = "best" if (folder / ZOO_BEST).is_file() else "last"
    if checkpoint == "best":
        model = folder / ZOO_BEST
    elif checkpoint == "last":
        model = folder / f"{env_name}.zip"
    else:
        model = folder / f"rl_model_{checkpoint}_steps.zip"
        saved = folder / f"rl_model_vecnormalize_{checkpoint}_steps.pkl"
        vecnormalize = saved if saved.is_file() else vecnormalize
    if not model.is_file():
        have = ", ".join(sorted(p.name for p in folder.glob("*.zip"))) or "no .zip"
        raise PolicyError(
            f"RL Zoo folder {str(folder)!r} has no {model.name} (it has {have}): "
            "set policy.checkpoint=best, last or a saved step count"
        )
    if hyper.get("normalize") and vecnormalize is None:
        raise PolicyError(
            f"RL Zoo folder {str(folder)!r} was trained with normalize but holds no "
            f"{params.name}/{VECNORMALIZE_FILES[0]}: give it as policy.vecnormalize=PATH"
        )
    algo = args.get("algo") or folder.parent.name
    return model, vecnormalize, canonical_algo(str(algo)) if algo else None, wrappers


def _zoo_wrappers(folder: Path, hyper: dict[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The zoo's ``env_wrapper`` entries as ``("module.Class", kwargs)``, applied to each
    env as the zoo does; the wrappers rlcollect cannot apply (vectorised ones, frame
    stacking) refuse the run: the policy would see other observations."""
    value = hyper.get(ZOO_VEC_WRAPPER)
    if value:
        names = [next(iter(w)) if isinstance(w, dict) else str(w) for w in _entries(value)]
        raise PolicyError(
            f"RL Zoo folder {str(folder)!r} was trained with {ZOO_VEC_WRAPPER} "
            f"{', '.join(names)}, which rlcollect cannot apply to its envs: the policy "
            "would see other observations"
        )
    wrappers = []
    for entry in _entries(hyper.get(ZOO_ENV_WRAPPER)):
        name, kwargs = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
        wrappers.append((str(name), dict(kwargs or {})))
    if int(hyper.get("frame_stack") or 0) > 1:
        raise PolicyError(
            f"RL Zoo folder {str(folder)!r} was trained with frame_stack="
            f"{hyper['frame_stack']} (VecFrameStack), which rlcollect cannot apply to its envs"
        )
    return tuple(wrappers)


def _entries(value: Any) -> list[Any]:
    """A zoo wrapper setting (one entry or a list of them) as a list."""
    return [] if not value else value if isinstance(value, list) else [value]


class _ZooLoader(yaml.SafeLoader):
    """SafeLoader plus the two python tags RL Zoo writes; any other tag is refused."""


def _ordered_dict(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
    # !!python/object/apply:collections.OrderedDict [[[key, value], ...]]
    args = loader.construct_sequence(node, deep=True)  # type: ignore[arg-type]
    return {str(k): v for k, v in args[0]} if args else {}


def _tuple(loader: yaml.SafeLoader, node: yaml.Node) -> tuple:
    return tuple(loader.construct_sequence(node, deep=True))  # type: ignore[arg-type]


_ZooLoader.add_constructor(
    "tag:yaml.org,2002:python/object/apply:collections.OrderedDict", _ordered_dict
)
_ZooLoader.add_constructor("tag:yaml.org,2002:python/tuple", _tuple)


def read_zoo_yaml(path: Path) -> dict[str, Any]:
    """An RL Zoo ``config.yml``/``args.yml`` as a dict, constructing no other python object."""
    try:
        data = yaml.load(path.read_text(), Loader=_ZooLoader)  # a SafeLoader
    except (OSError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())
        raise PolicyError(f"cannot read RL Zoo file {str(path)!r}: {detail}") from None
    if not isinstance(data, dict):
        raise PolicyError(f"RL Zoo file {str(path)!r} does not hold a mapping")
    return data


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
