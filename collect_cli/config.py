"""The run config: the Hydra groups (each plug-in registry gives its group's options),
their registration, and validation. Hydra composes ``conf/`` against the schemas
(``schema.py`` and the plug-ins' option classes); :func:`load` turns the composed
``DictConfig`` into a :class:`Settings` of plain, validated Python values.
Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from collect_cli.config_checks import (
    as_frames_per_batch,
    as_int,
    check_numbers,
    check_scale,
    choice,
)
from collect_cli.dataformat import LAYOUTS
from collect_cli.dataset.backend import BACKENDS as STORAGE_BACKENDS
from collect_cli.envs import BACKENDS as ENV_BACKENDS
from collect_cli.errors import ConfigError
from collect_cli.policies.registry import KINDS as POLICY_KINDS
from collect_cli.policies.registry import kind_of
from collect_cli.rollout import RolloutOptions
from collect_cli.schema import (
    AsyncCollectorConfig,
    CollectorConfig,
    DatasetConfig,
    EnvConfig,
    MultiAsyncCollectorConfig,
    MultiStepPostprocConfig,
    MultiSyncCollectorConfig,
    NoPostprocConfig,
    PolicyConfig,
    PostprocConfig,
    ProcessCollectorConfig,
    RunConfig,
    SyncCollectorConfig,
    WriterConfig,
)

NOISES = ("none", "gaussian", "epsilon")
PROGRESS_MODES = ("auto", "rich", "plain", "none")
START_METHODS = ("auto", "fork", "spawn", "forkserver")


# the options of each group, by name (Hydra's group/option)
GROUPS: dict[str, dict[str, type]] = {
    "policy": {name: kind.config for name, kind in POLICY_KINDS.items()},
    "collector": {
        "sync": SyncCollectorConfig,
        "multisync": MultiSyncCollectorConfig,
        "multiasync": MultiAsyncCollectorConfig,
        "async": AsyncCollectorConfig,
    },
    "writer": {name: backend.options for name, backend in STORAGE_BACKENDS.items()},
    "postproc": {"none": NoPostprocConfig, "multistep": MultiStepPostprocConfig},
}


@dataclass(frozen=True)
class Settings:
    """The validated run settings: what ``run.run`` consumes."""

    env: EnvConfig
    policy: PolicyConfig
    collector: CollectorConfig
    writer: WriterConfig
    postproc: PostprocConfig
    rollout: RolloutOptions
    total_frames: int
    frames_per_batch: int
    device: str
    storing_device: str
    seed: int
    out: Path
    overwrite: bool
    resume: bool
    progress: str
    debug: bool
    split_trajs: bool = False
    config_yaml: str = ""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    record_state: bool = False  # record.state: the simulator state each step
    # recorded with the dataset's metadata, e.g. the sweep a shard belongs to
    extra_metadata: dict[str, Any] = field(default_factory=dict)


def register() -> None:
    """Register the main schema and every group option in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="rlcollect_schema", node=RunConfig)
    for group, options in GROUPS.items():
        for name, schema in options.items():
            store.store(group=group, name=name, node=schema)


def conf_dir() -> Path:
    """The directory holding the Hydra YAML groups (shipped as ``collect_cli.conf``)."""
    from importlib.resources import files

    return Path(str(files("collect_cli.conf")))


def env_presets() -> list[dict[str, Any]]:
    """The env presets (``conf/env/<name>.yaml``): name, gymnasium id, usage."""
    import yaml

    presets = []
    for file in sorted((conf_dir() / "env").glob("*.yaml")):
        data = yaml.safe_load(file.read_text())
        env_id = None if data.get("id") == "???" else data.get("id")
        usage = f"env={file.stem}" + ("" if env_id else " env.id=<gymnasium id>")
        presets.append({"name": file.stem, "id": env_id, "usage": usage})
    return presets


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def default_out(env_id: str, policy: str, seed: int, writer: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", env_id).strip("_")
    suffix = STORAGE_BACKENDS[writer].suffix
    return Path("data") / f"{stem}_{policy}_s{seed}{suffix}"


def load(cfg: DictConfig) -> Settings:
    """Validate a composed config into :class:`Settings` (raises ConfigError).

    Hydra already checked every key and type against the schemas; what is left
    are the values' ranges and choices, then the combinations (:func:`_combinations`).
    """
    if OmegaConf.is_missing(cfg.env, "id"):
        raise ConfigError("env=gym needs an id: add env.id=<gymnasium id>, e.g. env.id=Hopper-v5")
    kind = POLICY_KINDS.get(cfg.policy.get("name"))
    if kind is not None and kind.needs and OmegaConf.is_missing(cfg.policy, kind.needs[0]):
        key, example = kind.needs
        raise ConfigError(f"policy={kind.name} needs policy.{key}: add {example}")
    try:
        run = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {_first_line(exc)}") from None
    env, policy, collector, writer, postproc = (
        run.env,
        run.policy,
        run.collector,
        run.writer,
        run.postproc,
    )

    check_numbers(run)  # finite floats, int64 integers, each option's range
    choice("env.backend", env.backend, tuple(ENV_BACKENDS))
    workers = getattr(collector, "workers", 1)
    check_scale(env.backend, ENV_BACKENDS[env.backend], env.num_envs, workers)
    if not env.id:
        raise ConfigError("env.id is empty: name a gymnasium id, e.g. env=gym env.id=Hopper-v5")
    choice("policy.noise", policy.noise, NOISES)
    kind_of(policy).check(policy)
    if isinstance(collector, ProcessCollectorConfig):
        choice("collector.start_method", collector.start_method, START_METHODS)
    choice("writer.layout", writer.layout, LAYOUTS)
    STORAGE_BACKENDS[writer.name].check(writer)
    choice("progress", run.progress, PROGRESS_MODES)
    init_random = 0 if run.init_random_frames in (0, -1) else run.init_random_frames
    rollout = RolloutOptions(
        max_frames_per_traj=run.max_frames_per_traj,
        init_random_frames=as_int("init_random_frames", init_random) if init_random else 0,
        reset_at_each_iter=run.reset_at_each_iter,
        reset_when_done=run.reset_when_done,
        exploration_type=run.exploration_type,
    )
    settings = Settings(
        env=env,
        policy=policy,
        collector=collector,
        writer=writer,
        postproc=postproc,
        rollout=rollout,
        total_frames=as_int("total_frames", run.total_frames, allow_endless=True),
        frames_per_batch=as_frames_per_batch(run.frames_per_batch),
        device=str(run.device),
        storing_device=str(run.storing_device),
        seed=run.seed,
        out=Path(run.out) if run.out else default_out(env.id, policy.name, run.seed, writer.name),
        overwrite=run.overwrite,
        resume=run.resume,
        progress=run.progress,
        debug=run.debug,
        split_trajs=run.split_trajs,
        config_yaml=OmegaConf.to_yaml(cfg),
        dataset=_dataset(run.dataset),
        record_state=bool(run.record.state),
    )
    _combinations(settings)
    return settings


def _combinations(s: Settings) -> None:
    """The checks that span several groups or keys, all here (a rollout's own
    combinations are checked by :class:`~collect_cli.rollout.RolloutOptions`)."""
    if s.split_trajs and not s.rollout.reset_when_done:
        raise ConfigError(
            "split_trajs=true needs reset_when_done=true: without resets a lane is one "
            "endless trajectory"
        )
    threshold = getattr(s.collector, "preemptive_threshold", 1.0)
    if isinstance(s.postproc, MultiStepPostprocConfig) and threshold < 1.0:
        raise ConfigError(
            "postproc=multistep needs whole batches: drop collector.preemptive_threshold"
        )
    if s.writer.layout == "compact" and isinstance(s.postproc, MultiStepPostprocConfig):
        raise ConfigError(
            "writer.layout=compact cannot hold postproc=multistep (next/observation looks "
            "n steps ahead): use writer.layout=auto or full"
        )
    if s.resume and s.overwrite:
        raise ConfigError("resume=true and overwrite=true contradict each other: pick one")


def _dataset(dataset: DatasetConfig) -> DatasetConfig:
    """The ``dataset.`` provenance keys; reference scores come in pairs, min < max."""
    low, high = dataset.ref_min_score, dataset.ref_max_score
    if (low is None) != (high is None):
        raise ConfigError(
            "dataset.ref_min_score and dataset.ref_max_score go together: set both or neither"
        )
    if low is not None and not low < high:  # both finite: check_numbers
        raise ConfigError(
            f"dataset.ref_min_score ({low}) must be below dataset.ref_max_score ({high})"
        )
    return dataset


def compose(overrides: list[str]) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides (raises ConfigError)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    register()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            return hydra_compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise hydra_error(exc) from None


def hydra_error(exc: Exception) -> ConfigError:
    """A one-line :class:`ConfigError` for a Hydra or OmegaConf exception."""
    message = _hydra_message(exc)
    key = _failing_key(exc)
    if key and key not in message:
        message = f"{key}: {message}"
    return ConfigError(message)


def _failing_key(exc: BaseException | None) -> str | None:
    """The config key OmegaConf blamed, searched along the exception chain."""
    while exc is not None:
        key = getattr(exc, "full_key", None)
        if key:
            return str(key)
        exc = exc.__cause__ or exc.__context__
    return None


def _hydra_message(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        detail = str(cause).strip().splitlines()[0]
        if lines and lines[0].startswith("Could not override"):
            return f"{lines[0]} {detail}"
        return detail
    if not lines:
        return type(exc).__name__
    missing = re.search(r"Could not find '([^']+)/([^/']*)'", lines[0])
    if missing:
        group, option = missing.groups()
        options = []
        if "Available options" in str(exc):
            start = next(i for i, ln in enumerate(lines) if ln.startswith("Available options"))
            options = [ln for ln in lines[start + 1 :] if not ln.startswith("Config search path")]
            options = options[: next((i for i, o in enumerate(options) if "=" in o), len(options))]
        return f"unknown {group} {option!r}: choose from {', '.join(options)}"
    return lines[0]
