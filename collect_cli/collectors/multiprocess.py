"""Multi-process collectors: ``MultiSyncCollector``, ``MultiAsyncCollector``, ``AsyncCollector``.

Each worker process runs a :class:`SyncCollector` over its own lanes and fills a
batch buffer in shared memory; only small messages travel through the pipes.
Worker ``w`` owns lanes ``w * num_envs ...``, gets its own seed stream, and
numbers trajectories ``w, w + W, w + 2W, ...`` so ids are unique over the run.

A worker that raises sends its exception (type, message, traceback); one that
dies is seen through its process sentinel at once. Either way the collector
raises :class:`CollectionError` naming the worker and the cause. No idle
timeout: workers wait for the main process as long as it takes, and exit by
themselves if it disappears.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import weakref
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait
from typing import Any

import torch
from tensordict import TensorDictBase

from collect_cli import dataformat as fmt
from collect_cli import specs
from collect_cli.collectors.base import CollectorBase, derive_seeds
from collect_cli.collectors.shared import SharedStores
from collect_cli.collectors.worker import WorkerSpec, worker_error, worker_main
from collect_cli.envs import EnvFactory
from collect_cli.errors import STOP_SIGNALS, CollectionError, exit_cause
from collect_cli.rollout import RolloutOptions
from collect_cli.threads import CpuFollower

JOIN_TIMEOUT_S = 5.0


_LIVE: weakref.WeakSet[_MultiCollector] = weakref.WeakSet()  # collectors not shut down yet


@atexit.register
def _shutdown_live() -> None:
    """Stop the workers of collectors still running when the interpreter exits.

    Workers ignore SIGTERM (signals are the main process's to handle), so
    multiprocessing's own exit hook, which terminates and then joins them, would
    wait for ever. This hook is registered after that one (this module imports
    multiprocessing first) and so runs before it."""
    for collector in list(_LIVE):
        with contextlib.suppress(Exception):
            collector.shutdown()


class _MultiCollector(CollectorBase):
    def __init__(
        self,
        create_env_fn: EnvFactory | Sequence[EnvFactory],
        policy: Any = None,
        *,
        num_workers: int | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: str | torch.device = "cpu",
        storing_device: str | torch.device = "cpu",
        seed: int = 0,
        start_method: str | None = None,
        worker_threads: int = 1,
        prefetch: int = 1,
        hold: int = 0,
        traj_id_start: int = 0,
        options: RolloutOptions | None = None,
        device_path: bool | None = None,
    ):
        """``options`` as in :class:`SyncCollector`; its ``init_random_frames``
        counts over all workers (each takes its share).

        ``prefetch``: batches each worker may have asked for and not yet handed
        over (each in a shared buffer of its own). With 1, a worker starts its
        next batch as soon as its last one is copied out; with 2 it already has
        the next one queued when it finishes, so it never waits for the main
        process (whose writer thread competes for the CPU), and a slower
        worker's lag is absorbed over two batches. Weights sent by
        :meth:`update_policy_weights_` then reach the batch after the ones
        already asked for.

        ``hold``: 0 (default), each yielded batch is a copy of its own. With
        ``hold=n`` it is lent straight from the shared buffers the workers fill,
        with no copy, and stays valid while the consumer holds at most ``n``
        batches: it must be done with batch k before it asks for batch k + n.
        The buffers are used in turn, ``prefetch + hold`` of them per worker."""
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if hold < 0:
            raise ValueError(f"hold must be >= 0, got {hold}")
        self._closed = True
        self.prefetch = int(prefetch)
        self.hold = int(hold)
        self._slots = self.prefetch + self.hold  # a batch's buffer is reused `_slots` batches on
        factories = (
            list(create_env_fn)
            if isinstance(create_env_fn, Sequence)
            else [create_env_fn] * (num_workers or 1)
        )
        if num_workers is not None and len(factories) != num_workers:
            raise ValueError(f"{len(factories)} env factories given for {num_workers} workers")
        self.num_workers = len(factories)
        self.device = torch.device(device)
        self.storing_device = torch.device(storing_device)
        self.total_frames = total_frames
        self.requested_frames_per_batch = frames_per_batch
        self.seed = seed
        if start_method is None:
            start_method = "spawn" if self.device.type == "cuda" else "fork"
        self.start_method = start_method
        ctx = torch.multiprocessing.get_context(start_method)
        self._stop_event = ctx.Event()
        # workers poll the event after every step: only where it can be set
        polled = self._stop_event if self._preempts() else None
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._batches: list[TensorDictBase] = []  # whole batches' buffers, where shared
        # per worker: batches asked for, received, and handed over (copied out)
        self._asked = [0] * self.num_workers
        self._got = [0] * self.num_workers
        self._used = [0] * self.num_workers
        self._arrived = [0] * self.num_workers  # when each worker's last batch came, in turn
        self._arrivals = 0
        self._follower: CpuFollower | None = None
        self._closed = False
        _LIVE.add(self)
        worker_seeds = derive_seeds(seed, self.num_workers, 3)
        self.options = options or RolloutOptions()
        try:
            for index, factory in enumerate(factories):
                spec = WorkerSpec(
                    index=index,
                    workers=self.num_workers,
                    traj_id_start=traj_id_start,
                    env_factory=factory,
                    policy=policy,
                    frames_per_batch=self._worker_frames(),
                    device=str(self.device),
                    seed=worker_seeds[index],
                    num_threads=worker_threads,
                    options=self.options.share(self.num_workers),
                    batch_buffers=self._worker_buffers(),
                    device_path=device_path,
                    memory=(self._held_batches(), frames_per_batch),
                )
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=worker_main,
                    args=(spec, child, polled, os.getpid()),
                    name=f"rlcollect-worker-{index}",
                    daemon=True,
                )
                # a signal at the fork is held until shutdown() knows the worker: it
                # is raised as the mask is restored, and the except below ends them all
                held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    proc.start()
                finally:
                    child.close()
                    if proc.pid is not None:
                        self._procs.append(proc)
                        self._conns.append(parent)
                    signal.pthread_sigmask(signal.SIG_SETMASK, held)
            self._buffers: list[list[TensorDictBase]] = []
            for index in range(self.num_workers):
                buffers, env_id, spaces, max_steps = self._expect(index, "ready")
                self._buffers.append(buffers)
            self.env_id = env_id
            self.observation_space = specs.rebuild(spaces[0])
            self.action_space = specs.rebuild(spaces[1])
            self.max_episode_steps = max_steps
            widths = [b[0].batch_size[0] for b in self._buffers]
            self.lane_starts = [sum(widths[:i]) for i in range(self.num_workers)]
            self.lanes = sum(widths)
            self.steps_per_batch = self._buffers[0][0].batch_size[1]
            self._share()
        except BaseException:
            self.shutdown()
            raise

    def _worker_frames(self) -> int:
        return self.requested_frames_per_batch

    def _worker_buffers(self) -> int:
        """Batch buffers each worker allocates for itself."""
        return self._slots

    def _held_batches(self) -> int:
        """Batch buffers of a worker's size the run holds, over all processes."""
        return self.num_workers * self._worker_buffers()

    def _share(self) -> None:
        """Set up the buffers batches are handed over from, once the workers are ready."""

    def _preempts(self) -> bool:
        """Whether workers may be told to stop a batch early (``_stop_event``)."""
        return False

    # -- messaging ---------------------------------------------------------------------
    def _recv(self, candidates: set[int]) -> tuple[int, tuple[str, Any]]:
        """The next message from any worker in ``candidates``; raises if one died or failed.
        A batch message is counted as received here."""
        by_conn = {self._conns[i]: i for i in candidates}
        by_sentinel = {self._procs[i].sentinel: i for i in candidates}
        while True:
            ready = wait(list(by_conn) + list(by_sentinel))
            for obj in ready:  # messages first: a failing worker sends, then exits
                if obj in by_conn:
                    index = by_conn[obj]
                    try:
                        message = obj.recv()
                    except (EOFError, OSError):
                        continue  # the sentinel tells why
                    if message[0] == "error":
                        raise worker_error(index, self._procs[index].pid, *message[1])
                    if message[0] == "batch":
                        self._got[index] += 1
                        self._arrivals += 1
                        self._arrived[index] = self._arrivals
                    return index, message
            for obj in ready:
                if obj in by_sentinel:
                    index = by_sentinel[obj]
                    proc = self._procs[index]
                    proc.join(0.1)
                    raise CollectionError(
                        f"worker {index} (pid {proc.pid}) {exit_cause(proc.exitcode)}"
                    )

    def _expect(self, index: int, kind: str) -> Any:
        """Wait for ``kind`` from worker ``index`` (batches arriving first are banked)."""
        while True:
            _, (what, payload) = self._recv({index})
            if what == kind:
                return payload

    def _send(self, index: int, command: str, arg: Any = None) -> None:
        try:
            self._conns[index].send((command, arg))
        except (BrokenPipeError, OSError):
            # The worker is gone. Messages it sent before dying (batches) are still
            # read first; once they are, _recv raises with its error or exit cause.
            while True:
                self._recv({index})

    def _collect(self, index: int) -> None:
        """Ask worker ``index`` for one more batch (into its next buffer in turn)."""
        self._send(index, "collect")
        self._asked[index] += 1

    def _room(self, index: int) -> bool:
        """Whether worker ``index`` has a free buffer for another batch."""
        return self._asked[index] - self._used[index] < self.prefetch

    def _next_batch(self, candidates: set[int]) -> int:
        """A worker among ``candidates`` with a batch received and not yet handed
        over, waiting for one if needed (the caller has asked for it)."""
        for index in sorted(candidates):
            if self._got[index] > self._used[index]:
                return index
        waiting = {i for i in candidates if self._asked[i] > self._got[i]}
        while True:
            index, (what, _) = self._recv(waiting)
            if what == "batch":
                return index

    def _hand_over(self, index: int) -> TensorDictBase:
        """Worker ``index``'s oldest unused batch, in its buffer (reused ``_slots``
        batches of this worker later)."""
        buffer = self._buffers[index][self._used[index] % self._slots]
        self._used[index] += 1
        return buffer

    def _lend(self, batch: TensorDictBase) -> TensorDictBase:
        """What is yielded for a batch in a shared buffer: itself or a copy (``hold``)."""
        if self.hold == 0:
            batch = batch.apply(lambda x: x.clone(memory_format=torch.contiguous_format))
        return self._out(batch)

    def _drain(self) -> None:
        """Wait for batches still being collected (before control commands).

        They stay banked: the next iteration steps yield them.
        """
        while busy := {i for i in range(self.num_workers) if self._asked[i] > self._got[i]}:
            self._recv(busy)

    def _control(self, command: str, arg_for=lambda index: None) -> list[Any]:
        self._drain()
        for index in range(self.num_workers):
            self._send(index, command, arg_for(index))
        return [self._expect(index, "ok") for index in range(self.num_workers)]

    # -- API -----------------------------------------------------------------------------
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Reseed every worker (each its own derived stream) and reset its envs."""
        self.seed = seed
        seeds = derive_seeds(seed, self.num_workers, 3)
        self._control("seed", lambda index: (seeds[index], True))
        return seed if static_seed else seed + self.lanes

    def reset(self) -> None:
        self._control("reset")

    def state_dict(self) -> dict[str, Any]:
        states = self._control("state_dict")
        return {f"worker{index}": state for index, state in enumerate(states)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._control("load_state_dict", lambda index: state_dict[f"worker{index}"])

    def update_policy_weights_(self, weights: dict[str, Any] | None = None) -> None:
        """Send new policy weights (a state_dict) to every worker."""
        if weights is None:
            return
        if isinstance(weights, TensorDictBase):
            weights = weights.flatten_keys(".").to_dict()
        weights = {k: v.detach().cpu().clone() for k, v in weights.items()}
        self._control("update", lambda index: weights)

    def shutdown(self) -> None:
        """Stop every worker (politely, then by force); idempotent."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        self.place_helper(None)
        for index, proc in enumerate(self._procs):
            if proc.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    self._conns[index].send(("close", None))
        for proc in self._procs:
            proc.join(JOIN_TIMEOUT_S)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in self._conns:
            conn.close()
        self._buffers = []
        self._batches = []

    def _out(self, batch: TensorDictBase) -> TensorDictBase:
        if self.storing_device.type != "cpu":
            return batch.to(self.storing_device, non_blocking=True)
        return batch

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(env={getattr(self, 'env_id', '?')}, "
            f"workers={self.num_workers}, lanes={getattr(self, 'lanes', '?')}, "
            f"total_frames={self.total_frames})"
        )


class MultiSyncCollector(_MultiCollector):
    """Every worker collects ``ceil(frames_per_batch / workers)`` frames; the batch
    concatenates them along lanes. With ``preemptive_threshold < 1``, once that
    fraction of workers is done the others stop early and pad (mask False,
    ``traj_ids`` -1). Deterministic for a given seed without preemption."""

    def __init__(self, *args: Any, preemptive_threshold: float = 1.0, **kwargs: Any):
        if not 0.0 < preemptive_threshold <= 1.0:
            raise ValueError(f"preemptive_threshold must be in (0, 1], got {preemptive_threshold}")
        if preemptive_threshold < 1.0 and kwargs.get("prefetch", 1) > 1:
            # one stop signal for all: it must only reach the batch being gathered
            raise ValueError("preemptive_threshold < 1 needs prefetch=1")
        self.preemptive_threshold = preemptive_threshold
        super().__init__(*args, **kwargs)
        self.frames_per_batch = self.lanes * self.steps_per_batch

    def _worker_frames(self) -> int:
        return math.ceil(self.requested_frames_per_batch / self.num_workers)

    def _worker_buffers(self) -> int:
        return 1  # the workers fill their lanes of the buffers `_share` makes

    def _held_batches(self) -> int:
        return super()._held_batches() + self.num_workers * self._slots  # and `_share`'s

    def _share(self) -> None:
        """One time-major buffer per turn over all lanes; each worker fills its own
        lanes of it, so a batch is handed over whole, without a concatenation."""
        template = torch.cat([own[0].transpose(0, 1) for own in self._buffers], 1)
        shared = SharedStores.create(template, self._slots)
        try:
            stores = shared.map()
            ends = [*self.lane_starts[1:], self.lanes]
            lanes = [slice(a, b) for a, b in zip(self.lane_starts, ends, strict=True)]
            for index, own in enumerate(lanes):
                self._send(index, "buffers", (shared, own))
            for index, own in enumerate(lanes):
                self._expect(index, "ok")
                self._buffers[index] = [store[:, own].transpose(0, 1) for store in stores]
        finally:
            shared.remove()  # every process that uses it has mapped it
        self._batches = [store.transpose(0, 1) for store in stores]

    def _preempts(self) -> bool:
        return self.preemptive_threshold < 1.0

    def place_helper(self, thread_id: int | None) -> None:
        """Keep thread ``thread_id`` on the CPU of the worker furthest ahead, where
        there are as many workers as CPUs (:class:`~collect_cli.threads.CpuFollower`):
        at each batch, the one with the most batches in, the first in if tied."""
        if self._follower is not None:
            self._follower.close()
        pids = [proc.pid for proc in self._procs]
        self._follower = CpuFollower.where_needed(thread_id, pids)

    def _ahead(self) -> int:
        return max(range(self.num_workers), key=lambda i: (self._got[i], -self._arrived[i]))

    def iter_with_lanes(self) -> Iterator[tuple[int, TensorDictBase]]:
        everyone = set(range(self.num_workers))
        quorum = math.ceil(self.preemptive_threshold * self.num_workers)
        frames = 0

        def ask_ahead() -> None:
            # rounds asked beyond those handed over, at most a full batch each
            while all(self._room(i) for i in everyone):
                ahead = max(self._asked[i] - self._used[i] for i in everyone)
                if 0 <= self.total_frames <= frames + ahead * self.frames_per_batch:
                    return
                for index in everyone:
                    self._collect(index)

        while self.total_frames < 0 or frames < self.total_frames:
            ask_ahead()
            done: set[int] = set()
            while done != everyone:
                done.add(self._next_batch(everyone - done))
                if len(done) >= quorum and done != everyone:
                    self._stop_event.set()
            self._stop_event.clear()
            if self._follower is not None:
                self._follower.follow(self._ahead())
            batch = self._batches[self._used[0] % self._slots]
            for index in everyone:
                self._hand_over(index)
            frames += int(batch.get(fmt.MASK_KEY).sum())
            batch = self._lend(batch)  # (a copy is taken before the buffer is asked for again)
            ask_ahead()  # the next batches are collected while this one is used
            yield 0, batch


class MultiAsyncCollector(_MultiCollector):
    """Yields each worker's batch (``frames_per_batch`` frames of its lanes) as soon
    as it is ready; the other workers keep collecting meanwhile."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.frames_per_batch = self._buffers[0][0].numel()

    def iter_with_lanes(self) -> Iterator[tuple[int, TensorDictBase]]:
        everyone = set(range(self.num_workers))
        frames = 0

        def ask_ahead() -> None:
            for _ in range(self.prefetch):  # round-robin over the workers' free buffers
                for index in sorted(everyone):
                    if not self._room(index):
                        continue
                    ahead = sum(self._asked[i] - self._used[i] for i in everyone)
                    if 0 <= self.total_frames <= frames + ahead * self.frames_per_batch:
                        return
                    self._collect(index)

        while self.total_frames < 0 or frames < self.total_frames:
            ask_ahead()
            index = self._next_batch(everyone)
            batch = self._hand_over(index)
            frames += int(batch.get(fmt.MASK_KEY).sum())
            batch = self._lend(batch)
            ask_ahead()
            yield self.lane_starts[index], batch


class AsyncCollector(MultiAsyncCollector):
    """One background worker: collection overlaps with whatever consumes the batches."""

    def __init__(self, create_env_fn: EnvFactory, policy: Any = None, **kwargs: Any):
        kwargs.pop("num_workers", None)
        super().__init__(create_env_fn, policy, num_workers=1, **kwargs)
