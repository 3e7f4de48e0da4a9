"""Structured configs (dataclasses), their Hydra registration, and validation.

Hydra composes ``conf/`` against these schemas; :func:`load` turns the composed
``DictConfig`` into a :class:`Settings` of plain, validated Python values.
Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from collect_cli.config_checks import (
    RANGE,
    Range,
    as_frames_per_batch,
    as_int,
    check_codec,
    check_numbers,
    check_scale,
    choice,
    ranged,
)
from collect_cli.dataformat import CODECS, LAYOUTS
from collect_cli.errors import ConfigError
from collect_cli.rollout import RolloutOptions

ENV_BACKENDS = ("gymnasium", "envpool", "native")
NOISES = ("none", "gaussian", "epsilon")
ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "silu", "identity")
COMPRESSIONS = tuple(CODECS)
PROGRESS_MODES = ("auto", "rich", "plain", "none")
START_METHODS = ("auto", "fork", "spawn", "forkserver")

# Each group's options are the schemas below, registered in Hydra's ConfigStore
# (:func:`register`); ``conf/`` holds only what differs from them (the env presets
# and the defaults list). A group's field in :class:`RunConfig` is typed with the
# group's base class, so Hydra checks every key and value while composing.


@dataclass
class EnvConfig:
    name: str = MISSING  # the preset (conf/env/<name>.yaml), recorded as env_preset
    id: str = MISSING  # a gymnasium id; "module:EnvId" imports the module first
    num_envs: int = ranged(8, low=1)  # upper bound: config_checks.MAX_ENVS
    backend: str = "gymnasium"  # gymnasium | envpool | native
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the env's make
    info_keys: list[str] = field(default_factory=list)  # numeric info entries, under info/


@dataclass
class PolicyConfig:
    """Exploration noise, applied when ``exploration_type=random`` (every policy)."""

    # the user's own code acts: its actions are recorded as it returned them, bounds or
    # not (the env may clip them); rlcollect's own policies act inside the action space
    user_code: ClassVar[bool] = False
    name: str = MISSING
    noise: str = "none"  # none | gaussian (Box actions) | epsilon (discrete actions)
    noise_scale: float = ranged(0.1, low=0.0)  # std of the Gaussian noise, in action units
    epsilon: float = ranged(0.1, 0.0, 1.0)  # probability of a uniformly random discrete action


@dataclass
class RandomPolicyConfig(PolicyConfig):
    name: str = "random"


@dataclass
class MlpPolicyConfig(PolicyConfig):
    """A deterministic MLP; weights from ``checkpoint`` (a state_dict file) or seeded."""

    name: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [64, 64], metadata={RANGE: Range(low=1)})
    activation: str = "tanh"
    checkpoint: str | None = None


@dataclass
class TorchScriptPolicyConfig(PolicyConfig):
    """A TorchScript module (deprecated upstream: prefer ``policy=export``)."""

    user_code: ClassVar[bool] = True
    name: str = "torchscript"
    path: str = MISSING


@dataclass
class PythonPolicyConfig(PolicyConfig):
    """``pkg.module:factory`` returning a module or callable on the observation."""

    user_code: ClassVar[bool] = True
    name: str = "python"
    target: str = MISSING


@dataclass
class ExportPolicyConfig(PolicyConfig):
    """A ``torch.export`` program from the observation to the action (or a dict)."""

    user_code: ClassVar[bool] = True
    name: str = "export"
    path: str = MISSING


@dataclass
class Sb3PolicyConfig(PolicyConfig):
    """A Stable-Baselines3 / sb3-contrib model (a pickle: load only trusted files)."""

    name: str = "sb3"
    path: str = MISSING  # a Stable-Baselines3 .zip or an RL Zoo run folder
    algo: str | None = None  # PPO, SAC, QRDQN...; None: read from the zip (or the zoo folder)
    deterministic: bool = True
    vecnormalize: str | None = None  # None: the file beside the model; "none": no normalisation
    checkpoint: str | None = None  # RL Zoo folder: best | last | <steps>; None: best, else last
    extras: bool = True  # record action_log_prob / value / q_values where the model has them


@dataclass
class DatasetConfig:
    """Provenance the user gives, recorded in the metadata (Minari's field names)."""

    author: str | None = None
    author_email: str | None = None
    code_permalink: str | None = None
    description: str | None = None
    ref_min_score: float | None = None
    ref_max_score: float | None = None


@dataclass
class CollectorConfig:
    name: str = MISSING


@dataclass
class SyncCollectorConfig(CollectorConfig):
    name: str = "sync"


@dataclass
class ProcessCollectorConfig(CollectorConfig):
    """Collectors whose envs step in worker processes."""

    start_method: str = "auto"  # auto (fork on CPU, spawn with CUDA) | fork | spawn | forkserver


@dataclass
class AsyncCollectorConfig(ProcessCollectorConfig):
    """One background worker: collection overlaps with writing."""

    name: str = "async"


@dataclass
class MultiCollectorConfig(ProcessCollectorConfig):
    workers: int = ranged(2, low=1)  # upper bound: config_checks.max_workers()


@dataclass
class MultiAsyncCollectorConfig(MultiCollectorConfig):
    """Each worker's batch is written as soon as it is ready."""

    name: str = "multiasync"


@dataclass
class MultiSyncCollectorConfig(MultiCollectorConfig):
    """Workers collect in lock-step; each batch concatenates every worker's lanes."""

    name: str = "multisync"
    # < 1: stop stragglers once this fraction is done
    preemptive_threshold: float = ranged(1.0, 0.0, 1.0, low_open=True)


@dataclass
class WriterConfig:
    name: str = MISSING
    layout: str = "auto"  # auto | full | compact (each image observation stored once)
    # seconds between commits at least (0: after every batch)
    commit_interval: float = ranged(0.1, low=0.0, noun="a number of seconds")


@dataclass
class Hdf5WriterConfig(WriterConfig):
    name: str = "hdf5"
    # auto (image leaves zstd, the rest raw) | none | gzip | lzf | zstd | lz4 | blosc2 | blosc2-zstd
    compression: str = "auto"
    compression_level: int | None = None  # None: the codec's default
    chunk_frames: int = ranged(65536, low=1)  # frames per chunk (lanes x time steps), at most


@dataclass
class MemmapWriterConfig(WriterConfig):
    name: str = "memmap"


@dataclass
class PostprocConfig:
    name: str = MISSING


@dataclass
class NoPostprocConfig(PostprocConfig):
    name: str = "none"


@dataclass
class MultiStepPostprocConfig(PostprocConfig):
    """n-step returns, exact across batches: ``next/reward`` sums up to n rewards
    inside the episode; ``next/*`` are those of the n-th step ahead."""

    name: str = "multistep"
    n: int = ranged(3, low=1)
    gamma: float = ranged(0.99, 0.0, 1.0)


@dataclass
class RunConfig:
    env: EnvConfig = MISSING
    policy: PolicyConfig = MISSING
    collector: CollectorConfig = MISSING
    writer: WriterConfig = MISSING
    postproc: PostprocConfig = MISSING
    # Any: these accept 1e6 and "1e6"; load() checks they are integral
    total_frames: Any = 1_000_000  # -1: until interrupted
    frames_per_batch: Any = 1000  # over all envs
    device: str = "cpu"  # the policy's device; cuda:N allowed
    storing_device: str = "cpu"  # the device of the yielded batches
    seed: int = 0  # the whole run is reproducible from it
    out: str | None = None  # default: data/<env id>_<policy>_s<seed>[.h5]
    overwrite: bool = False
    resume: bool = False  # continue an interrupted or killed dataset at `out`
    # the rollout options (collect_cli/rollout.py)
    max_frames_per_traj: int = -1
    init_random_frames: Any = 0
    reset_at_each_iter: bool = False
    reset_when_done: bool = True
    exploration_type: str = "random"
    split_trajs: bool = False  # dataset rows are whole episodes [episodes, time]
    progress: str = "auto"  # auto | rich | plain | none
    debug: bool = False  # print tracebacks for errors
    dataset: DatasetConfig = field(default_factory=DatasetConfig)


# the options of each group, by name (Hydra's group/option)
GROUPS: dict[str, dict[str, type]] = {
    "policy": {
        "random": RandomPolicyConfig,
        "mlp": MlpPolicyConfig,
        "torchscript": TorchScriptPolicyConfig,
        "python": PythonPolicyConfig,
        "export": ExportPolicyConfig,
        "sb3": Sb3PolicyConfig,
    },
    "collector": {
        "sync": SyncCollectorConfig,
        "multisync": MultiSyncCollectorConfig,
        "multiasync": MultiAsyncCollectorConfig,
        "async": AsyncCollectorConfig,
    },
    "writer": {"hdf5": Hdf5WriterConfig, "memmap": MemmapWriterConfig},
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


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def default_out(env_id: str, policy: str, seed: int, writer: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", env_id).strip("_")
    from collect_cli.dataformat import SUFFIXES

    suffix = SUFFIXES[writer]
    return Path("data") / f"{stem}_{policy}_s{seed}{suffix}"


def load(cfg: DictConfig) -> Settings:
    """Validate a composed config into :class:`Settings` (raises ConfigError).

    Hydra already checked every key and type against the schemas; what is left
    are the values' ranges and choices, then the combinations (:func:`_combinations`).
    """
    if OmegaConf.is_missing(cfg.env, "id"):
        raise ConfigError("env=gym needs an id: add env.id=<gymnasium id>, e.g. env.id=Hopper-v5")
    for option, key, example in (
        ("torchscript", "path", "policy.path=policy.pt"),
        ("export", "path", "policy.path=policy.pt2"),
        ("sb3", "path", "policy.path=model.zip (or an RL Zoo folder logs/ppo/CartPole-v1_1)"),
        ("python", "target", "policy.target=my_pkg.policies:make_policy"),
    ):
        if cfg.policy.get("name") == option and OmegaConf.is_missing(cfg.policy, key):
            raise ConfigError(f"policy={option} needs policy.{key}: add {example}")
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
    choice("env.backend", env.backend, ENV_BACKENDS)
    check_scale(env.backend, env.num_envs, getattr(collector, "workers", 1))
    if not env.id:
        raise ConfigError("env.id is empty: name a gymnasium id, e.g. env=gym env.id=Hopper-v5")
    choice("policy.noise", policy.noise, NOISES)
    if isinstance(policy, MlpPolicyConfig):
        choice("policy.activation", policy.activation, ACTIVATIONS)
        if not policy.hidden:
            raise ConfigError("policy.hidden must be one layer size at least, e.g. [64, 64]")
    checkpoint = policy.checkpoint if isinstance(policy, Sb3PolicyConfig) else None
    if checkpoint is not None and checkpoint not in ("best", "last") and not checkpoint.isdigit():
        raise ConfigError(
            f"policy.checkpoint={checkpoint!r} is not valid: choose best, last "
            "or a step count such as 100000"
        )
    if isinstance(collector, ProcessCollectorConfig):
        choice("collector.start_method", collector.start_method, START_METHODS)
    choice("writer.layout", writer.layout, LAYOUTS)
    if isinstance(writer, Hdf5WriterConfig):
        check_codec(writer.compression, writer.compression_level)
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
