"""The worker process: a :class:`SyncCollector` writing into shared memory.

Protocol (one duplex pipe per worker, main <-> worker):

    worker -> main   ("ready", shared_batch_buffers)    once, after start-up
    main -> worker   ("collect", None)                   fill the next buffer in turn
                     (up to ``batch_buffers`` may be queued: the main process
                     asks ahead, and reads buffer k % batch_buffers for batch k)
    worker -> main   ("batch", valid_frames)
    main -> worker   ("buffers", (SharedStores, lanes))  at most once, before any "collect":
                     fill slice ``lanes`` of those buffers from now on, in turn,
                     instead of its own
    main -> worker   ("update", weights) | ("seed", (seed, static)) | ("reset", None)
                     | ("state_dict", None) | ("load_state_dict", state)
    worker -> main   ("ok", result)
    main -> worker   ("close", None)
    worker -> main   ("error", (type name, message, traceback))   on any failure

Workers ignore SIGINT/SIGTERM (the main process coordinates a clean stop) and
exit on their own when the main process disappears.
"""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any

from collect_cli import dataformat as fmt
from collect_cli import errors
from collect_cli.envs import EnvFactory
from collect_cli.errors import CollectionError
from collect_cli.rollout import RolloutOptions

PARENT_POLL_S = 1.0


@dataclass
class WorkerSpec:
    index: int
    workers: int
    env_factory: EnvFactory
    policy: Any  # nn.Module, a factory(obs_space, action_space) -> policy, or None (random)
    frames_per_batch: int
    device: str
    seed: int
    num_threads: int = 1
    traj_id_start: int = 0  # worker w numbers trajectories start + w, start + w + W, ...
    options: RolloutOptions = field(default_factory=RolloutOptions)  # this worker's share
    batch_buffers: int = 1  # shared buffers, filled in turn (the main process's prefetch)
    device_path: bool | None = None  # as SyncCollector's
    memory: tuple[int, int] | None = None  # as SyncCollector's: the run's, for its check


def worker_main(spec: WorkerSpec, conn, stop_event, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    collector = None
    try:
        import torch

        from collect_cli import specs
        from collect_cli.collectors.sync import SyncCollector

        torch.set_num_threads(spec.num_threads)
        collector = SyncCollector(
            spec.env_factory,
            spec.policy,
            frames_per_batch=spec.frames_per_batch,
            total_frames=-1,
            device=spec.device,
            seed=spec.seed,
            traj_id_start=spec.traj_id_start + spec.index,
            traj_id_stride=spec.workers,
            return_same_td=True,
            shared_memory=True,
            batch_buffers=spec.batch_buffers,
            options=spec.options,
            device_path=spec.device_path,
            memory=spec.memory,
        )
        env = collector.env
        spaces = (specs.describe(env.observation_space), specs.describe(env.action_space))
        conn.send(("ready", (collector._buffers, env.env_id, spaces, env.max_episode_steps)))
        while True:
            if not conn.poll(PARENT_POLL_S):
                if os.getppid() != parent_pid:
                    return  # the main process is gone: do not linger as an orphan
                continue
            command, arg = conn.recv()
            if command == "collect":
                batch = collector.rollout(stop=stop_event.is_set if stop_event else None)
                conn.send(("batch", int(batch.get(fmt.MASK_KEY).sum())))
            elif command == "close":
                return
            else:
                conn.send(("ok", _control(collector, command, arg)))
    except BaseException as exc:
        if not isinstance(exc, (EOFError, BrokenPipeError, KeyboardInterrupt)):
            _send_error(conn, exc)
    finally:
        if collector is not None:
            collector.shutdown()


def _control(collector, command: str, arg: Any) -> Any:
    if command == "buffers":
        shared, lanes = arg
        collector.adopt([store[:, lanes] for store in shared.map()])
        return None
    if command == "update":
        collector.update_policy_weights_(arg)
        return None
    if command == "seed":
        seed, static = arg
        return collector.set_seed(seed, static)
    if command == "reset":
        collector.reset()
        return None
    if command == "state_dict":
        return collector.state_dict()
    if command == "load_state_dict":
        collector.load_state_dict(arg)
        return None
    raise ValueError(f"unknown worker command {command!r}")


def _send_error(conn, exc: BaseException) -> None:
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    cause = exc.__cause__
    trace = "".join(traceback.format_exception(exc))
    if cause is not None:  # the env's own exception explains more than our wrapper
        trace = "".join(traceback.format_exception(cause)) + trace
    with contextlib.suppress(OSError, EOFError):
        conn.send(("error", (type(exc).__name__, message, trace)))


def worker_error(index: int, pid: int | None, kind: str, message: str, trace: str):
    """Rebuild a worker's exception: usage errors stay usage errors (exit 2)."""
    cls = getattr(errors, kind, None)
    text = f"worker {index} (pid {pid}) failed: {kind}: {message}"
    if isinstance(cls, type) and issubclass(cls, errors.UsageError):
        exc: errors.RlcollectError = cls(message)
    else:
        exc = CollectionError(text)
    exc.worker_traceback = trace  # type: ignore[attr-defined]
    return exc
