"""The run config's schema: one dataclass per group's base and the options that are
not plug-ins (collectors, postproc). Hydra composes ``conf/`` against them; each
plug-in kind brings its own option class (a policy kind, a storage backend) and
its registry lists it (``collect_cli/config.py`` gathers them into Hydra groups).
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from collect_cli.config_checks import ranged


@dataclass
class EnvConfig:
    name: str = MISSING  # the preset (conf/env/<name>.yaml), recorded as env_preset
    id: str = MISSING  # a gymnasium id; "module:EnvId" imports the module first
    num_envs: int = ranged(8, low=1)  # upper bound: the env backend's max_envs (envs/)
    backend: str = "gymnasium"  # gymnasium | envpool | native
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the env's make
    info_keys: list[str] = field(default_factory=list)  # numeric info entries, under info/


@dataclass
class PolicyConfig:
    """Exploration noise, applied when ``exploration_type=random`` (every policy)."""

    name: str = MISSING
    noise: str = "none"  # none | gaussian (Box actions) | epsilon (discrete actions)
    noise_scale: float = ranged(0.1, low=0.0)  # std of the Gaussian noise, in action units
    epsilon: float = ranged(0.1, 0.0, 1.0)  # probability of a uniformly random discrete action


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
class RecordConfig:
    """What a run records beside the transitions."""

    state: bool = False  # the simulator state each step (state/..., next/state/...)


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
    record: RecordConfig = field(default_factory=RecordConfig)
