"""The writing half of a run: batches -> (post-processing) -> writer, on its own thread.

:class:`Stream` is the one-way path from a collector batch to the dataset
(n-step post-processing, episode rows, the writer). :class:`WriteBehind` runs it
on a background thread, so that the next batch is collected while the last one
is written: disk I/O and HDF5's work overlap with the envs and the policy.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from collect_cli.config import Settings

# Batches a WriteBehind has in flight at most: the collector it is fed from lends
# batches out of buffers it reuses only after this many more (see run.py).
DEPTH = 2


class Stream:
    """collector batches -> (multistep) -> (episode rows) -> writer, one way.

    ``postproc=multistep`` holds back each lane's last n-1 frames until the next
    batch decides their n-step targets; ``split_trajs`` holds each lane's running
    episode until it ends. :meth:`flush` writes what is held at a clean stop.
    """

    def __init__(self, settings: Settings, writer):
        post = settings.postproc
        self.writer = writer
        self.multistep = self.splitter = None
        if post.name == "multistep":
            from collect_cli.collectors.postproc import MultiStep

            self.multistep = MultiStep(post.n, post.gamma)
        if settings.split_trajs:
            from collect_cli.collectors.postproc import TrajectorySplitter

            self.splitter = TrajectorySplitter()

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

    def flush(self) -> list:
        returns = []
        if self.multistep is not None:
            for lane_start, batch in self.multistep.flush():
                returns += self._write(lane_start, batch)
        if self.splitter is not None:
            rows = self.splitter.flush()
            if rows is not None:
                returns += self.writer.append(rows, self.writer.lanes or 0)["return"].tolist()
        return returns


class WriteBehind:
    """Writes (and commits) each submitted batch on a background thread.

    With ``background=False`` the same calls write in the calling thread: for
    collectors that keep the GIL busy themselves (gymnasium envs stepped in this
    process), a writer thread would only contend for it (measured: ~15% slower).

    At most ``depth`` batches are in flight: :meth:`reserve` blocks the
    collecting thread until one of them is written, so a collector that reuses
    ``depth`` buffers in turn never overwrites a batch not yet on disk. Batches
    are written in submission order; after each commit ``on_commit`` gets the
    returns of the episodes it finished (called on the writer thread). In the
    background the writer also starts the kernel writing its frames out as it goes
    (``Writer.write_back``), so that closing the dataset does not wait on the disk.

    An error while writing stops the thread; it is raised in the collecting
    thread by the next :meth:`reserve`/:meth:`submit`/:meth:`finish`. Whatever
    happens in the collecting thread, :meth:`finish` writes the batches already
    submitted (they are whole batches) before it returns.
    """

    def __init__(
        self,
        stream: Stream,
        on_commit: Callable[[list[float]], None],
        depth: int = DEPTH,
        background: bool = True,
    ) -> None:
        self.stream = stream
        self.on_commit = on_commit
        self._free = threading.Semaphore(depth)
        self._queue: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="rlcollect-writer", daemon=True)
        self.background = background
        if background:
            self._thread.start()

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
        """Write everything submitted, stop the thread; raise its error if any."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            if not self._write(*item):
                return

    def _write(self, lane_start: int, batch: Any) -> bool:
        """Push, commit and report one batch; False (the error kept) if that failed."""
        try:
            returns = self.stream.push(lane_start, batch)
            self.stream.writer.commit()
            if self.background:  # the disk works while the next batch is collected
                self.stream.writer.write_back()
            self.on_commit(returns)
        except BaseException as exc:  # re-raised in the collecting thread
            self._error = exc
            return False
        finally:  # the batch's buffer may be reused (a collector in reserve() wakes up)
            self._free.release()
        return True
