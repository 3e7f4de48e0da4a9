"""Where a Stable-Baselines3 policy is: the model zip, its VecNormalize file and the
algorithm, from a zip or an RL Zoo run folder, found without importing SB3 (so
that provenance and the env wrappers can use it too)."""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from collect_cli.errors import PolicyError
from collect_cli.policies.sb3.options import Sb3PolicyConfig

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
