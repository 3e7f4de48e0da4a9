"""The metadata of a recorded training run: the keys ``rlcollect run`` writes (so that
``validate``, ``info``, ``export`` and ``merge`` read it as any dataset), with
``collector: recorder`` and the training's own config."""

from __future__ import annotations

from contextlib import suppress
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import yaml
from gymnasium import spaces

from collect_cli import __version__, specs
from collect_cli import dataformat as fmt
from collect_cli.errors import UsageError

COLLECTOR = "recorder"  # the metadata's ``collector``: steps handed in by a training loop
DISTRIBUTIONS = (
    "torch",
    "tensordict",
    "gymnasium",
    "numpy",
    "h5py",
    "stable-baselines3",
    "sb3-contrib",
)
# what shaped the stream, as rlcollect run records it: every step of every lane, in
# order, lanes reset by the env when an episode ends
STREAM = {
    **fmt.MEANING,
    "reset_at_each_iter": False,
    "max_frames_per_traj": -1,
    "init_random_frames": 0,
    "exploration_type": "random",
    "info_keys": [],
}


def library_versions() -> dict[str, str]:
    import platform

    out = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        with suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def plain(value: Any) -> Any:
    """``value`` made of what YAML's safe dumper writes: numpy numbers and arrays as
    Python ones, anything else it cannot write (a class, a schedule) as its repr."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def training_config(config: dict | str | None) -> tuple[Any, str | None]:
    """``(parsed, YAML text)`` of the training's config: a dict, or YAML text."""
    if config is None:
        return None, None
    if isinstance(config, str):
        try:
            return yaml.safe_load(config), config
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"config is not valid YAML: {first}") from None
    if isinstance(config, dict):
        parsed = plain(config)
        return parsed, yaml.safe_dump(parsed, sort_keys=False)
    raise UsageError(f"config must be a dict or YAML text, not {type(config).__name__}")


def metadata(
    *,
    env_id: str,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    num_envs: int,
    policy: str,
    algorithm: str | None,
    seed: int | None,
    config: Any,
    recorder: dict[str, Any],
    steps_per_commit: int,
    total_frames: int | None,
) -> dict[str, Any]:
    """A new recording's metadata (the sources table filled as policies act).

    ``config``: the training's parsed config, recorded under ``training`` in the
    metadata's config (whose ``env`` and ``policy`` sections keep the shape of
    ``rlcollect run``'s, which readers look into); ``recorder``: the Recorder's own
    arguments."""
    composed = {
        "env": {"id": env_id, "num_envs": num_envs},
        "policy": {"name": policy, "algorithm": algorithm},
        "seed": seed,
        COLLECTOR: recorder,
        "training": config,
    }
    record = {"policy": policy, "algorithm": algorithm, "library_versions": library_versions()}
    return {
        "rlcollect_version": __version__,
        "versions": library_versions(),
        "env_id": env_id,
        "observation_space": specs.describe(specs.recorded(observation_space)),
        "action_space": specs.describe(action_space),
        "policy": policy,
        "collector": COLLECTOR,
        "seed": seed,
        "frames_per_batch": num_envs * steps_per_commit,
        "total_frames": total_frames if total_frames is not None else -1,
        "env_lanes": num_envs,
        **STREAM,
        "config": yaml.safe_dump(plain(composed), sort_keys=False),
        fmt.PROVENANCE: {k: v for k, v in record.items() if v is not None},
        fmt.DATASET: {},
        fmt.SOURCES: [],
    }
