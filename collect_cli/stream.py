"""The writing half of a run: batches -> (post-processing) -> writer, beside collection.

:class:`Stream` is the one-way path from a collector batch to the dataset
(n-step post-processing, episode rows, the writer). :class:`WriteBehind` runs it
on a background thread of this process (or inline), and
:class:`~collect_cli.writer_process.WriterProcess` in a process of its own; the
run drives both through the same calls (the contract is :class:`WriteBehind`'s).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collect_cli import dataformat as fmt
from collect_cli import specs
from collect_cli.config import Settings

log = logging.getLogger("rlcollect")

# Batches a WriteBehind has in flight at most: the collector it is fed from lends
# batches out of buffers it reuses only after this many more (see run.py).
DEPTH = 2

# A joined batch holds this many frames and bytes at most: the writer's cost is
# mostly per batch (docs/performance.md, "Small batches are joined before the writer").
JOIN_FRAMES = 4096
JOIN_BYTES = 1 << 20


@dataclass(frozen=True)
class WriterSpec:
    """How a run's writer is made: ``make_writer(backend, path, **options)``, then
    opened, or with ``resume`` the dataset at ``path`` reopened after its last commit."""

    backend: str
    path: Path
    options: dict[str, Any] = field(default_factory=dict)
    resume: bool = False

    def open(self):
        from collect_cli.dataset import make_writer

        writer = make_writer(self.backend, self.path, **self.options)
        return writer.reopen() if self.resume else writer.open()


def writes_inline(collector) -> bool:
    """Whether writing beside this collector in the same process only slows it:
    envs stepped in this process keep the GIL busy, and a writer thread would contend
    for it (measured: ~15% slower); but image frames make the writer's work
    (compression, I/O) large, and the codecs and the env's C++ step (ALE) run
    without the GIL: then it overlaps."""
    leaves = specs.leaves(collector.observation_space)
    images = any(fmt.is_image(leaf.shape, leaf.dtype) for leaf in leaves)
    return collector.busy_in_python and not images


def close_quietly(writer, status: str) -> None:
    """Close ``writer`` with ``status``, keeping quiet about a failure: the error that
    led here matters more, and the last commit stands."""
    try:
        writer.close(status)
    except Exception as exc:
        log.debug("could not finalise %s: %s", writer.path, exc)


def pump(sink, batches, stopped: Callable[[], bool] = lambda: False) -> None:
    """Hand ``batches`` (``(lane_start, batch)`` pairs) to ``sink`` one at a time,
    each reserved first, until they run out or ``stopped()``; then finish writing."""
    while not stopped():
        sink.reserve()
        item = next(batches, None)
        if item is None:
            sink.unreserve()
            break
        sink.submit(*item)
    sink.finish()


def joins(settings: Settings) -> bool:
    """Whether a run's small batches may be joined before the writer: not where a
    batch boundary means something (``postproc=multistep`` and ``split_trajs`` hold
    frames across it, ``reset_at_each_iter`` starts every lane afresh at it)."""
    return not (
        settings.postproc.name == "multistep"
        or settings.split_trajs
        or settings.rollout.reset_at_each_iter
    )


def join_count(batch) -> int:
    """How many batches like ``batch`` one joined batch holds: 1 (none joined) unless
    it is a ``[lanes, time]`` TensorDict of CPU tensors."""
    import torch
    from tensordict import TensorDict, is_leaf_nontensor

    if not isinstance(batch, TensorDict) or batch.batch_dims != 2 or not batch.numel():
        return 1
    leaves = list(batch.values(True, True, is_leaf=is_leaf_nontensor))
    if not all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in leaves):
        return 1
    size = sum(v.numel() * v.element_size() for v in leaves)
    return max(1, min(JOIN_FRAMES // batch.numel(), JOIN_BYTES // max(size, 1)))


class Joiner:
    """Joins consecutive batches of one lane group in time, so that the writer appends
    a few large batches rather than many small ones.

    ``add(lane_start, batch, at)`` returns the ``(lane_start, batch)`` pairs to append
    now, in order (``at``: the time step the writer would put ``batch`` at, not counting
    what the joiner holds); ``drain()`` returns the one batch joined from those held, or
    None, and holds nothing after. A joined batch is a view of the joiner's stage:
    append it before the next ``add``. The stream drains before every commit, so a
    commit holds every batch added before it, joined or not, and a kill loses no more
    than it did.

    The first batch decides ``count``, the batches a joined one holds (:func:`join_count`,
    up to ``JOIN_FRAMES`` frames and ``JOIN_BYTES`` bytes), and so :attr:`steps`, a
    joined batch's time steps: each batch is copied into the stage, which is handed out
    once it holds ``count``, or sooner where it ends at a multiple of :attr:`steps`:
    after a drain the joined batches line up with the writer's time again (HDF5 sizes
    its chunks by them, and writes a whole chunk at a time). With ``count`` 1 every
    batch passes through uncopied. A batch of another lane group or shape than the
    first (asynchronous workers take turns) drains the stage and sets ``count`` to 1
    for good.
    """

    def __init__(self):
        self.count: int | None = None
        self._shape: tuple[int, ...] = ()  # (lane_start, lanes, steps) of the batches joined
        self._stage = None  # [lanes, count * steps], of the first batch's leaves
        self._keys: list = []  # the stage's leaf keys
        self._slots: list[list] = []  # for each batch held, its views of the stage's leaves
        self._held = 0
        self._at = 0  # the time step of the first batch held

    @property
    def steps(self) -> int:
        """The time steps of a full joined batch (0 before the first batch)."""
        return (self.count or 0) * (self._shape[2] if self._shape else 0)

    def add(self, lane_start: int, batch, at: int = 0) -> list[tuple[int, Any]]:
        shape = (lane_start, *batch.batch_size)
        if self.count is None:
            self.count, self._shape = join_count(batch), shape
        if self.count > 1 and shape != self._shape:
            held = self.drain()
            self.count = 1
            return ([held] if held is not None else []) + [(lane_start, batch)]
        if self.count == 1:
            return [(lane_start, batch)]
        steps = shape[2]
        if self._stage is None:
            lanes, count = shape[1], self.count
            self._stage = batch.apply(
                lambda v: v.new_empty((lanes, count * steps, *v.shape[2:])),
                batch_size=[lanes, count * steps],
            )
            self._keys = list(self._stage.keys(True, True))
            leaves = [self._stage.get(k) for k in self._keys]
            self._slots = [
                [v[:, i * steps : (i + 1) * steps] for v in leaves] for i in range(count)
            ]
        # leaf by leaf: a TensorDict's indexed copy_ costs ~40x more on small batches
        for dst, key in zip(self._slots[self._held], self._keys, strict=True):
            dst.copy_(batch.get(key))
        if not self._held:
            self._at = at
        self._held += 1
        if self._held < self.count and (self._at + self._held * steps) % self.steps:
            return []
        return [self._hand_out()]

    def drain(self) -> tuple[int, Any] | None:
        return self._hand_out() if self._held else None

    def _hand_out(self) -> tuple[int, Any]:
        held, self._held = self._held, 0
        stage = self._stage if held == self.count else self._stage[:, : held * self._shape[2]]
        return self._shape[0], stage


class Stream:
    """collector batches -> (multistep) -> (episode rows) -> writer, one way.

    ``postproc=multistep`` holds back each lane's last n-1 frames until the next
    batch decides their n-step targets; ``split_trajs`` holds each lane's running
    episode until it ends. :meth:`flush` writes what is held at a clean stop.
    :meth:`write` commits as often as ``writer.commit_interval`` lets it, small
    batches joined in between (:class:`Joiner`; not when it commits every batch).
    """

    def __init__(self, settings: Settings, writer):
        post = settings.postproc
        self.writer = writer
        self._ended: list[float] = []  # the returns of episodes written, not yet committed
        self._pending = False  # batches written since the last commit
        self.multistep = self.splitter = None
        if post.name == "multistep":
            from collect_cli.collectors.postproc import MultiStep

            self.multistep = MultiStep(post.n, post.gamma)
        if settings.split_trajs:
            from collect_cli.collectors.postproc import TrajectorySplitter

            self.splitter = TrajectorySplitter()
        joined = joins(settings) and writer.commit_interval > 0
        self.joiner = Joiner() if joined else None

    def write(self, lane_start: int, batch) -> list[float] | None:
        """Push one batch, then commit if the writer's commit is due: the returns of
        the episodes that commit made durable (all since the last one), or None."""
        self._pending = True
        if self.joiner is None:
            self._ended += self.push(lane_start, batch)
        else:
            at = self.writer.next_step(lane_start, batch.batch_size[0])
            for item in self.joiner.add(lane_start, batch, at):
                self._ended += self.push(*item)
            self.writer.batch_steps = self.writer.batch_steps or self.joiner.steps
        if not self.writer.commit_due():
            return None
        return self.commit()

    def commit(self) -> list[float] | None:
        """Commit what :meth:`write` left uncommitted, if anything: as :meth:`write`."""
        if not self._pending:
            return None
        self._ended += self._drain()
        self.writer.commit()
        return self._committed()

    def _drain(self) -> list[float]:
        held = self.joiner.drain() if self.joiner is not None else None
        return self.push(*held) if held is not None else []

    def _committed(self) -> list[float]:
        returns, self._ended, self._pending = self._ended, [], False
        return returns

    def push(self, lane_start: int, batch) -> list:
        if self.multistep is not None:
            batch = self.multistep(batch, lane_start)
            if batch is None:
                return []
        return self._write(lane_start, batch)

    def _write(self, lane_start: int, batch) -> list:
        if self.splitter is not None:
            batch = self.splitter(batch, lane_start)
            if batch is None:
                return []
            lane_start = self.writer.lanes or 0
        return self.writer.append(batch, lane_start)["return"].tolist()

    def close(self, status: str) -> None:
        """Append what the joiner holds (a run cut short), then close the writer."""
        self._drain()
        self.writer.close(status)

    def flush(self) -> list:
        returns = self._drain()
        if self.multistep is not None:
            for lane_start, batch in self.multistep.flush():
                returns += self._write(lane_start, batch)
        if self.splitter is not None:
            rows = self.splitter.flush()
            if rows is not None:
                returns += self.writer.append(rows, self.writer.lanes or 0)["return"].tolist()
        return returns


class WriteBehind:
    """The writing half of a run in this process: each submitted batch is written and
    committed on a background thread (``background``) or in the calling thread.

    The run drives it, and :class:`~collect_cli.writer_process.WriterProcess`, so:

    ========================================  =========================================
    ``open(spec)``                            create (or reopen) the dataset; ``frames``,
                                              ``episodes`` and ``next_traj_id`` then count
                                              what it holds
    ``start(collector, on_commit)``           take that collector's lent batches from now
                                              on; after each commit ``on_commit`` gets the
                                              returns of the episodes it made durable; a
                                              writer thread is the collector's to place
                                              (``place_helper``)
    ``reserve()``, then ``submit(lane_start,  one batch: ``reserve`` waits until fewer than
    batch)`` or ``unreserve()``               ``depth`` are in flight
    ``finish()``                              every submitted batch written and committed
    ``flush() -> returns``                    what the stream held back written
    ``close(status)`` or ``abort()``          the dataset closed with ``status``; ``abort``:
                                              the submitted batches written, then closed as
                                              interrupted, keeping quiet about failures
    ========================================  =========================================

    At most ``depth`` batches are in flight, so a collector that reuses ``depth``
    buffers in turn never overwrites a batch not yet on disk. Batches are written
    in submission order; a batch is committed with the first commit due (the first
    batch at once, then at most every ``writer.commit_interval`` seconds, small
    batches appended joined in between: :meth:`Stream.write`), and :meth:`finish`
    commits the rest. ``background=None`` decides at :meth:`start`: inline where
    the collector keeps this process's GIL busy (:func:`writes_inline`). On its
    thread the writer calls ``on_commit`` there, and starts the kernel writing its
    frames out as it goes (``Writer.write_back``), so that closing the dataset does
    not wait on the disk.

    An error while writing stops the thread; it is raised in the collecting thread
    by the next :meth:`reserve`/:meth:`submit`/:meth:`finish`. Whatever happens in
    the collecting thread, :meth:`finish` and :meth:`abort` write the batches
    already submitted (they are whole batches) before they return.
    """

    def __init__(self, settings: Settings, depth: int = DEPTH, background: bool | None = None):
        self.settings = settings
        self.background = background
        self.stream: Stream | None = None
        self.on_commit: Callable[[list[float]], None] = lambda returns: None
        self._free = threading.Semaphore(depth)
        self._queue: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="rlcollect-writer", daemon=True)

    @property
    def concurrent(self) -> bool:
        """Whether batches are written while the next ones are collected."""
        return bool(self.background)

    @property
    def frames(self) -> int:
        return self.stream.writer.frames

    @property
    def episodes(self) -> int:
        return self.stream.writer.episodes

    @property
    def next_traj_id(self) -> int:
        return self.stream.writer.next_traj_id

    def open(self, spec: WriterSpec) -> None:
        self.stream = Stream(self.settings, spec.open())

    def start(self, collector, on_commit: Callable[[list[float]], None]) -> None:
        self.on_commit = on_commit
        if self.background is None:
            self.background = not writes_inline(collector)
        if self.background:
            self._thread.start()
            collector.place_helper(self._thread.native_id)

    def reserve(self) -> None:
        """Wait until a batch may be collected (fewer than ``depth`` in flight)."""
        self._free.acquire()
        self._raise()

    def unreserve(self) -> None:
        """Give back a reservation no batch was submitted for."""
        self._free.release()

    def submit(self, lane_start: int, batch: Any) -> None:
        self._raise()
        if self.background:
            self._queue.put((lane_start, batch))
        else:
            self._write(lane_start, batch)
            self._raise()

    def finish(self) -> None:
        """Write and commit everything submitted, stop the thread; raise its error if any."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        elif not self.background and self.stream is not None and self._error is None:
            self._report(self.stream.commit)
        self._raise()

    def flush(self) -> list[float]:
        return self.stream.flush()

    def close(self, status: str) -> None:
        self.stream.close(status)

    def abort(self) -> None:
        try:  # the batches already collected still reach the disk
            self.finish()
        except BaseException as exc:
            log.debug("while writing the last batches: %s", exc)
        if self.stream is not None:
            close_quietly(self.stream.writer, fmt.INTERRUPTED)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            if not self._write(*item):
                return
        self._report(self.stream.commit)

    def _write(self, lane_start: int, batch: Any) -> bool:
        """Write one batch, committed and reported if due; False (the error kept) if
        that failed."""
        try:
            return self._report(lambda: self.stream.write(lane_start, batch))
        finally:  # the batch's buffer may be reused (a collector in reserve() wakes up)
            self._free.release()

    def _report(self, commit: Callable[[], list[float] | None]) -> bool:
        """Run ``commit``; if it committed, report it; False (the error kept) if it failed."""
        try:
            returns = commit()
            if self.background:  # the disk works while the next batch is collected
                self.stream.writer.write_back()
            if returns is not None:
                self.on_commit(returns)
        except BaseException as exc:  # re-raised in the collecting thread
            self._error = exc
            return False
        return True
