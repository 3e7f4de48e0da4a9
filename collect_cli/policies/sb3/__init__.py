"""``policy=sb3``: Stable-Baselines3 / sb3-contrib models and RL Zoo run folders.
``locate`` finds the files without SB3; ``act`` runs the model (SB3 imported there)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from collect_cli.errors import ConfigError
from collect_cli.policies.kind import PolicyKind, file_record, versions
from collect_cli.policies.sb3.options import Sb3PolicyConfig

DISTRIBUTIONS = ("stable-baselines3", "sb3-contrib")


def check(cfg: Sb3PolicyConfig) -> None:
    checkpoint = cfg.checkpoint
    if checkpoint is not None and checkpoint not in ("best", "last") and not checkpoint.isdigit():
        raise ConfigError(
            f"policy.checkpoint={checkpoint!r} is not valid: choose best, last "
            "or a step count such as 100000"
        )


def build(cfg: Sb3PolicyConfig, obs_space, action_space, device, seed: int):
    from collect_cli.policies.sb3.act import build as build_sb3

    return build_sb3(cfg, obs_space, action_space, device, seed)


def provenance(cfg: Sb3PolicyConfig) -> dict:
    from collect_cli.policies.sb3.locate import resolve

    source = resolve(cfg)
    record = {"algorithm": source.algo, "checkpoint": file_record(source.model)}
    step = training_step(source.model)
    if step is not None:
        record["training_step"] = step
    if source.vecnormalize is not None:
        record["vecnormalize"] = file_record(source.vecnormalize)
    if source.zoo_folder is not None:
        record["zoo_folder"] = source.zoo_folder.name
    record["deterministic"] = bool(cfg.deterministic)
    record["library_versions"] = versions(*DISTRIBUTIONS)
    return record


def training_step(model: Path) -> int | None:
    """The environment steps the model had trained for when saved (``num_timesteps``
    in the zip's ``data``), read without SB3; None where the zip does not say."""
    try:
        with zipfile.ZipFile(model) as archive:
            data = json.loads(archive.read("data"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    step = data.get("num_timesteps") if isinstance(data, dict) else None
    return int(step) if isinstance(step, (int, float)) else None


def env_wrappers(cfg: Sb3PolicyConfig) -> tuple[tuple[str, dict], ...]:
    from collect_cli.policies.sb3.locate import resolve

    return resolve(cfg).env_wrappers


KIND = PolicyKind(
    "sb3",
    Sb3PolicyConfig,
    build,
    "a Stable-Baselines3 zip or RL Zoo folder (policy.path)",
    needs=("path", "policy.path=model.zip (or an RL Zoo folder logs/ppo/CartPole-v1_1)"),
    check=check,
    provenance=provenance,
    env_wrappers=env_wrappers,
)
