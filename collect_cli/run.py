"""Build everything from validated settings and drive collector -> writer.

Data flows one way: settings -> (env, policy) -> collector -> batches -> writer.
Progress is reported through a callback; this module never prints.
"""

from __future__ import annotations

import logging
import math
import platform
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from collect_cli import __version__, specs
from collect_cli.config import Settings
from collect_cli.dataformat import COMPLETE, DERIVED, FORMAT_VERSION, INTERRUPTED
from collect_cli.devices import resolve_device
from collect_cli.errors import ConfigError, OutputError
from collect_cli.policies import provenance
from collect_cli.rollout import RolloutOptions
from collect_cli.stream import DEPTH, WriteBehind, WriterSpec, pump
from collect_cli.threads import intra_op_threads

log = logging.getLogger("rlcollect")


@dataclass
class RunResult:
    path: str
    frames: int
    episodes: int
    seconds: float
    frames_per_s: float
    status: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProgressState:
    frames: int
    total_frames: int
    episodes: int
    mean_return: float | None
    elapsed: float
    frames_before: int = 0  # frames a resumed dataset held when this run started


ProgressFn = Callable[[ProgressState], None]


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "tensordict", "gymnasium", "numpy", "h5py", "hydra-core"):
        with suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


class StopFlag:
    """Set by SIGINT/SIGTERM; the loop finishes its batch, flushes and stops."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal_name = signal.Signals(signum).name

    @property
    def raised(self) -> bool:
        return self.signal_name is not None


# durability D12 (docs/durability.md)
@contextmanager
def trap_signals(flag: StopFlag) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, flag) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if flag.raised and hasattr(handler, "fired"):
                handler.fired = True  # the CLI's: this stop is being handled already
            signal.signal(sig, handler)


def build_collector(
    settings: Settings,
    device,
    storing_device,
    *,
    total_frames: int | None = None,
    seed: int | None = None,
    traj_id_start: int = 0,
    rollout: RolloutOptions | None = None,
):
    """The configured collector over the configured env and policy (not yet iterated);
    ``rollout`` replaces the settings' (a resume's rest of the run)."""
    from collect_cli import collectors
    from collect_cli.collectors import derive_seeds
    from collect_cli.envs import env_factory
    from collect_cli.policies.build import PolicyFactory, env_wrappers

    env_cfg, coll = settings.env, settings.collector
    make_env = env_factory(
        env_cfg.id,
        env_cfg.num_envs,
        env_cfg.backend,
        env_cfg.kwargs,
        env_cfg.info_keys,
        device=str(device),
        wrappers=env_wrappers(settings.policy),
        state=settings.record_state,
    )
    policy = PolicyFactory(settings.policy, str(device), derive_seeds(settings.seed, 1, 2)[0])
    common = {
        "frames_per_batch": settings.frames_per_batch,
        "total_frames": settings.total_frames if total_frames is None else total_frames,
        "device": device,
        "storing_device": storing_device,
        "seed": settings.seed if seed is None else seed,
        "traj_id_start": traj_id_start,
        "options": settings.rollout if rollout is None else rollout,
    }
    # Batches are lent from the collectors' buffers, not copied: the writer holds
    # at most DEPTH of them, and a buffer is refilled only DEPTH batches later.
    if coll.name == "sync":  # the run writes one buffer while filling the other
        return collectors.SyncCollector(
            make_env, policy, return_same_td=True, batch_buffers=DEPTH, **common
        )
    # Workers get their next batch queued ahead (prefetch=2): none waits for this
    # process, whose writer thread shares the CPU with them. Preemption's stop
    # signal must reach only the batch being gathered, so it asks one at a time.
    common["start_method"] = None if coll.start_method == "auto" else coll.start_method
    common["hold"] = DEPTH
    if coll.name == "multisync":
        return collectors.MultiSyncCollector(
            make_env,
            policy,
            num_workers=coll.workers,
            preemptive_threshold=coll.preemptive_threshold,
            prefetch=2 if coll.preemptive_threshold >= 1.0 else 1,
            **common,
        )
    if coll.name == "multiasync":
        return collectors.MultiAsyncCollector(
            make_env, policy, num_workers=coll.workers, prefetch=2, **common
        )
    return collectors.AsyncCollector(make_env, policy, prefetch=2, **common)


def planned_steps(collector, total_frames: int, split_trajs: bool = False) -> int | None:
    """Time steps per lane a finite run will write (preallocation hint for writers)."""
    from collect_cli.collectors import MultiAsyncCollector

    if split_trajs:  # rows are episodes: their length is the env's limit at most
        return getattr(collector, "max_episode_steps", None)
    if total_frames <= 0:
        return None
    batches = math.ceil(total_frames / collector.frames_per_batch)
    if isinstance(collector, MultiAsyncCollector):  # each batch covers one worker's lanes
        batches = math.ceil(batches / collector.num_workers)
    return batches * collector.steps_per_batch


def _stream_options(settings: Settings) -> dict[str, Any]:
    """What shapes the recorded stream (metadata; a resume must use the same)."""
    return {
        "split_trajs": settings.split_trajs,
        "postproc": asdict(settings.postproc),
        **asdict(settings.rollout),
        "info_keys": list(settings.env.info_keys),
        "record_state": settings.record_state,
    }


def _writer_options(settings: Settings) -> dict[str, Any]:
    """The backend's own options (``compression``, ``chunk_frames``...)."""
    return {k: v for k, v in vars(settings.writer).items() if k != "name"}


def run(settings: Settings, progress: ProgressFn | None = None) -> RunResult:
    """Collect ``settings.total_frames`` frames into the dataset at ``settings.out``."""
    from collect_cli.dataset.ownership import claim

    device = resolve_device(settings.device)
    storing_device = resolve_device(settings.storing_device, "storing_device")
    with claim(settings.out, "rlcollect run"):  # durability D17: one writer per out
        return _run_claimed(settings, device, storing_device, progress)


def _run_claimed(settings: Settings, device, storing_device, progress) -> RunResult:
    from collect_cli.dataset import backend, check_output

    if settings.resume and (settings.out.exists() or settings.out.is_symlink()):
        return _resume(settings, device, storing_device, progress)
    check_output(settings.out, settings.overwrite)
    coll = settings.collector
    lanes = settings.env.num_envs * (coll.workers if coll.name.startswith("multi") else 1)
    limit = backend(settings.writer.name).lanes_limit(lanes, "env lanes")
    if limit and not settings.split_trajs:  # durability D15: before any env is built
        raise ConfigError(f"{limit}: use writer=memmap, or fewer env.num_envs x collector.workers")

    with _writing_half(settings, device, storing_device) as sink:
        collector = build_collector(settings, device, storing_device)
        try:
            metadata = {
                "rlcollect_version": __version__,
                "versions": library_versions(),
                "env_id": collector.env_id,
                "env_preset": settings.env.name,
                "env_backend": settings.env.backend,
                "observation_space": specs.describe(collector.observation_space),
                "action_space": specs.describe(collector.action_space),
                "policy": settings.policy.name,
                "collector": settings.collector.name,
                "seed": settings.seed,
                "frames_per_batch": collector.frames_per_batch,
                "total_frames": settings.total_frames,
                "env_lanes": collector.lanes,
                **_stream_options(settings),
                "config": settings.config_yaml,
                **provenance.metadata(
                    settings.policy, settings.dataset, settings.seed, settings.config_yaml
                ),
                **settings.extra_metadata,  # e.g. "sweep": the sweep a shard belongs to
            }
            split = settings.split_trajs
            options = {
                "metadata": metadata,
                "overwrite": settings.overwrite,
                "planned_steps": planned_steps(collector, settings.total_frames, split),
                "lanes": None if split else collector.lanes,
                **_writer_options(settings),
            }
            sink.open(WriterSpec(settings.writer.name, settings.out, options))
            return _drive(collector, sink, settings, progress)
        finally:
            collector.shutdown()


# durability D13 (docs/durability.md)
def _resume(settings: Settings, device, storing_device, progress: ProgressFn | None) -> RunResult:
    """Continue the dataset at ``settings.out`` up to ``total_frames`` (fresh episodes)."""
    from collect_cli.collectors import derive_seeds
    from collect_cli.dataset import open_dataset
    from collect_cli.ops.validate import validate

    meta = open_dataset(settings.out).meta
    done = int(meta.get("frames", 0))
    if DERIVED not in meta and "merged" in meta:
        raise ConfigError(
            f"cannot resume {str(settings.out)!r}: it is a merged dataset; resume each shard "
            "(resume=true out=SHARD), then merge them again"
        )
    if DERIVED in meta:
        raise ConfigError(
            f"cannot resume {str(settings.out)!r}: `rlcollect {meta[DERIVED].get('op')}` made it "
            "from other datasets; resume those, then make it again"
        )
    if meta.get("status") == COMPLETE:
        log.info("%s is complete: nothing to resume", settings.out)
        return RunResult(str(settings.out), done, int(meta.get("episodes", 0)), 0.0, 0.0, COMPLETE)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ConfigError(
            f"cannot resume {str(settings.out)!r}: it is in format_version "
            f"{meta.get('format_version')} and this rlcollect writes {FORMAT_VERSION}; resume it "
            "with the rlcollect that wrote it, or start a new dataset"
        )
    # durability D20: continue only what validates (a resume seals the dataset)
    problems = validate(settings.out)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise OutputError(
            f"cannot resume {str(settings.out)!r}: it fails validation: {problems[0]}{more}; "
            f"`rlcollect validate {settings.out}` lists what is wrong"
        )
    if meta.get("backend") != settings.writer.name:
        raise ConfigError(
            f"cannot resume {str(settings.out)!r}: it is a {meta.get('backend')} dataset, "
            f"not writer={settings.writer.name}"
        )
    remaining = -1 if settings.total_frames < 0 else max(0, settings.total_frames - done)
    options = {"metadata": {}, **_writer_options(settings)}
    with _writing_half(settings, device, storing_device) as sink:
        sink.open(WriterSpec(settings.writer.name, settings.out, options, resume=True))
        try:
            collector = build_collector(
                settings,
                device,
                storing_device,
                total_frames=remaining,
                seed=derive_seeds(settings.seed, 1, 7, done)[0],  # new episodes, not a replay
                traj_id_start=sink.next_traj_id,
                rollout=settings.rollout.after(done),
            )
        except BaseException:
            sink.abort()
            raise
        try:
            mismatch = [
                what
                for what, ours, theirs in (
                    ("env", collector.env_id, meta.get("env_id")),
                    ("lanes", collector.lanes, meta.get("env_lanes", meta.get("lanes"))),
                    (
                        "observation space",
                        specs.describe(collector.observation_space),
                        _described(meta.get("observation_space")),
                    ),
                    (
                        "action space",
                        specs.describe(collector.action_space),
                        _described(meta.get("action_space")),
                    ),
                    ("policy checkpoint", *_checkpoints(settings, meta)),
                    *(
                        (key, value, meta.get(key, value))
                        for key, value in _stream_options(settings).items()
                        if key
                        in (
                            "split_trajs",
                            "postproc",
                            "reset_when_done",
                            "info_keys",
                            "record_state",
                        )
                    ),
                )
                if ours != theirs
            ]
            if mismatch:
                sink.abort()
                raise ConfigError(
                    f"cannot resume {str(settings.out)!r}: its {', '.join(mismatch)} differ "
                    "from this config (use the same env, env.num_envs, collector.workers, "
                    "split_trajs, postproc, reset_when_done, env.info_keys and policy "
                    "checkpoint)"
                )
            if remaining == 0:
                sink.close(COMPLETE)
                return RunResult(str(settings.out), sink.frames, sink.episodes, 0.0, 0.0, COMPLETE)
            return _drive(collector, sink, settings, progress)
        finally:
            collector.shutdown()


def writes_from_a_process(settings: Settings, device, storing_device) -> bool:
    """Whether a run of ``settings`` writes from a writer process (see
    :func:`_writing_half`)."""
    from collect_cli import writer_process

    single = settings.collector.name == "sync"
    on_cpu = device.type == storing_device.type == "cpu"
    return single and on_cpu and writer_process.available()


@contextmanager
def _writing_half(settings: Settings, device, storing_device) -> Iterator:
    """The sink a run writes through (``stream.WriteBehind``'s contract): a writer
    process where one can run beside a single-process collector on the CPU
    (``writer_process``), else this process's own writer thread or inline writing.
    CUDA runs keep the thread: their host buffers are pinned for the copies from the
    device, and a shared file is not. The process is forked here, before the
    collector exists. A run that leaves without closing the dataset aborts it."""
    from collect_cli import writer_process

    sink = None
    try:  # a signal may arrive at any moment, the fork included (durability D21)
        if writes_from_a_process(settings, device, storing_device):
            sink = writer_process.WriterProcess(settings, depth=DEPTH)
        else:
            sink = WriteBehind(settings, depth=DEPTH)
        yield sink
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    finally:
        if isinstance(sink, writer_process.WriterProcess):
            sink.shutdown()


def _checkpoints(settings: Settings, meta: dict[str, Any]) -> tuple[Any, Any]:
    """(this config's, the dataset's) checkpoint sha256; equal when the dataset has none."""
    theirs = ((meta.get(provenance.PROVENANCE) or {}).get("checkpoint") or {}).get("sha256")
    if theirs is None:
        return None, None
    ours = provenance.policy_provenance(settings.policy).get("checkpoint") or {}
    return ours.get("sha256"), theirs


def _writer_core(leave: bool) -> AbstractContextManager:
    """With ``leave``, one intra-op thread fewer for torch while inside (the writer
    thread's copies start inside too, so they take the same). An env stepped in torch
    on this CPU and the writer thread each keep a core busy; torch's intra-op threads
    beside them only oversubscribe the cores, and OpenMP's workers spin while they
    wait for one (measured: ``docs/performance.md``)."""
    if not leave:
        return nullcontext()
    import torch

    return intra_op_threads(torch.get_num_threads() - 1)


# durability D12 (docs/durability.md)
def _drive(collector, sink, settings: Settings, progress: ProgressFn | None) -> RunResult:
    flag = StopFlag()
    recent: deque[float] = deque(maxlen=100)
    frames_before = sink.frames  # a resumed dataset already holds these
    status = COMPLETE

    def report() -> None:
        if progress is not None:
            progress(
                ProgressState(
                    frames=sink.frames,
                    total_frames=settings.total_frames,
                    episodes=sink.episodes,
                    mean_return=sum(recent) / len(recent) if recent else None,
                    elapsed=time.perf_counter() - start,
                    frames_before=frames_before,
                )
            )

    def committed(returns: list[float]) -> None:  # where the sink reports commits
        recent.extend(returns)
        report()

    try:
        sink.start(collector, committed)
        start = time.perf_counter()  # collection and writing, from here on
        report()
        with _writer_core(collector.torch_on_cpu and sink.concurrent), trap_signals(flag):
            pump(sink, collector.iter_with_lanes(), lambda: flag.raised)
            if flag.raised:
                log.warning("%s received: dataset flushed, stopping", flag.signal_name)
                status = INTERRUPTED
            recent.extend(sink.flush())
    except BaseException as exc:
        sink.abort()  # while the collector's buffers still hold the batches submitted
        exc.committed = {"frames": sink.frames, "episodes": sink.episodes}  # for the CLI
        raise
    sink.close(status)
    seconds = time.perf_counter() - start
    return RunResult(
        path=str(settings.out),
        frames=sink.frames,
        episodes=sink.episodes,
        seconds=round(seconds, 3),
        frames_per_s=round((sink.frames - frames_before) / seconds, 1) if seconds > 0 else 0.0,
        status=status,
    )


# durability D12 (docs/durability.md)
def _described(desc: dict | None) -> dict | None:
    """A stored space description as this version writes it (bounds may be lists)."""
    return None if desc is None else specs.describe(specs.rebuild(desc))
