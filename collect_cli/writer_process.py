"""The writing half of a run in a process of its own, beside a collector in this one.

A writer thread shares this process's GIL with the collecting thread. Every torch
op of an env step releases it and takes it back, so the writer's HDF5 calls and
Python code keep making the collector wait: a native Pendulum batch (4096 lanes)
took 23-30 ms to collect beside the writer thread, 16-20 ms beside the same writer
in a process (docs/performance.md). The writer process is forked before the
collector is built, so it holds none of the envs; the collector's batch buffers are
moved into one shared file (:class:`~collect_cli.collectors.shared.SharedStores`)
that it maps, and batches are handed over by index, without a copy.

Protocol (one duplex pipe, main <-> writer), in the order of
:class:`~collect_cli.stream.WriteBehind`'s contract:

    main -> writer   ("open", WriterSpec)           create the dataset (or reopen it)
    writer -> main   ("opened", counters)
    main -> writer   ("buffers", SharedStores)       where batches come from, at most once
    writer -> main   ("mapped", None)
    main -> writer   ("batch", (lane_start, index))  write that buffer's batch, committed
                                                     if due (``Stream.write``)
    writer -> main   ("written", (returns, counters))  returns: None if not committed
    main -> writer   ("commit", None)                commit what is not yet
    writer -> main   ("committed", (returns, counters))  (returns: None if nothing was)
    main -> writer   ("flush", None)                 write what the stream held back
    writer -> main   ("flushed", (returns, counters))
    main -> writer   ("close", status)               close the dataset (if open), then exit
    writer -> main   ("closed", counters)
    writer -> main   ("error", (exception, traceback))  on any failure: from then on
                     only "close" is served, and closes with status "interrupted"

``counters`` are the writer's ``(frames, episodes, next_traj_id)``. The writer
ignores SIGINT and SIGTERM (the main process stops a run cleanly) and is killed
when the main process dies (``PR_SET_PDEATHSIG``), so a killed run leaves what a
killed run with a writer thread leaves.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import traceback
import weakref
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

from collect_cli import dataformat as fmt
from collect_cli.config import Settings
from collect_cli.errors import STOP_SIGNALS, WriteError
from collect_cli.stream import DEPTH, Stream, WriterSpec, close_quietly

log = logging.getLogger("rlcollect")

_LIVE: weakref.WeakSet[WriterProcess] = weakref.WeakSet()  # not shut down yet


@atexit.register
def _shutdown_live() -> None:
    """End the writer processes still running when the interpreter exits (a script that
    left one behind). The writer ignores SIGTERM, so multiprocessing's own exit hook,
    which terminates and joins daemonic children, would wait for ever; this one is
    registered after it (this module imports multiprocessing first), so runs before."""
    for sink in list(_LIVE):
        with contextlib.suppress(Exception):
            sink.shutdown(timeout=1.0)


PR_SET_PDEATHSIG = 1


def available() -> bool:
    """Whether a writer process can run here: Linux (fork, and a signal when the main
    process dies), at least two cores for this process (on one, the writer's work
    only takes turns with the collector's), and not inside a daemonic process
    (multiprocessing's pool workers), which may not have children."""
    if sys.platform != "linux" or multiprocessing.current_process().daemon:
        return False
    return len(os.sched_getaffinity(0)) >= 2


class WriterProcess:
    """:class:`~collect_cli.stream.WriteBehind`'s contract, with the stream and the
    writer in a child process (see the module's docstring). ``on_commit`` is called
    in this process, from :meth:`reserve`, :meth:`finish` and :meth:`flush`."""

    concurrent = True

    def __init__(self, settings: Settings, depth: int = DEPTH):
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=writer_main,
            args=(child, settings, os.getpid()),
            name="rlcollect-writer",
            daemon=True,
        )
        # durability D21: signals held until the child ignores them (a Ctrl-C at this
        # moment must not kill it before it can) and until this object can end it: a
        # held signal is raised as the mask is restored, and the run then aborts it
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self._proc.start()
        finally:
            child.close()
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held signal raises here
            except BaseException:
                self._conn.close()
                if self._proc.pid is not None:  # it holds nothing yet: no need to ask
                    self._proc.kill()
                    self._proc.join()
                raise
        _LIVE.add(self)
        self.depth = depth
        self.on_commit: Callable[[list[float]], None] = lambda returns: None
        self.frames = self.episodes = self.next_traj_id = 0
        self._index: dict[int, int] = {}  # where a lent batch's mask starts -> its buffer
        self._in_flight = 0
        self._error: BaseException | None = None
        self._ended = False  # closed or aborted

    # -- the contract -------------------------------------------------------------------
    def open(self, spec: WriterSpec) -> None:
        spec = replace(spec, options={**spec.options, "owner": os.getpid()})  # the run's pid
        self._send("open", spec)
        self._counters(self._expect("opened"))

    def start(self, collector, on_commit: Callable[[list[float]], None]) -> None:
        self.on_commit = on_commit
        shared, batches = collector.share_buffers()
        try:
            self._send("buffers", shared)
            self._expect("mapped")
        finally:
            shared.remove()  # both processes have mapped it
        self._index = {_where(batch): k for k, batch in enumerate(batches)}

    def reserve(self) -> None:
        self._raise()
        while self._conn.poll():  # commits already made: progress is reported promptly
            self._receive()
        while self._in_flight >= self.depth:
            self._receive()

    def unreserve(self) -> None:
        """Nothing to give back: reservations are counted by batches in flight."""

    def submit(self, lane_start: int, batch: Any) -> None:
        self._raise()
        index = self._index.get(_where(batch))
        if index is None:
            raise ValueError("submit() takes the batches the collector lends from its buffers")
        self._send("batch", (lane_start, index))
        self._in_flight += 1

    def finish(self) -> None:
        while self._in_flight and self._error is None:
            self._receive()
        self._send("commit", None)
        self._expect("committed")

    def flush(self) -> list[float]:
        self._send("flush", None)
        returns, counters = self._expect("flushed")
        self._counters(counters)
        return returns

    def close(self, status: str) -> None:
        self._send("close", status)
        self._ended = True
        self._counters(self._expect("closed"))  # the process then exits: shutdown() reaps it

    def abort(self) -> None:
        """Close as interrupted once the submitted batches are written (the writer works
        through them first), quietly; then make sure the process is gone."""
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send(("close", fmt.INTERRUPTED))
        try:
            while True:
                ready = wait([self._conn, self._proc.sentinel])
                if self._conn not in ready:
                    break
                kind, payload = self._conn.recv()
                if kind == "closed":
                    self._counters(payload)
                    break
        except (EOFError, OSError):
            pass
        self.shutdown()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Let the process end (after "close" it does; without, the pipe's end tells it
        to), killing it if it does not within ``timeout``. Idempotent."""
        self._conn.close()
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        _LIVE.discard(self)

    # -- messaging ----------------------------------------------------------------------
    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _counters(self, counters: tuple[int, int, int]) -> None:
        self.frames, self.episodes, self.next_traj_id = counters

    def _send(self, command: str, arg: Any) -> None:
        self._raise()
        try:
            self._conn.send((command, arg))
        except (BrokenPipeError, OSError):
            self._receive()  # its last messages, then why it is gone
            raise self._gone() from None

    def _receive(self) -> tuple[str, Any]:
        """The next message; a commit is counted and reported here, an error raised."""
        ready = wait([self._conn, self._proc.sentinel])
        if self._conn not in ready:  # what it sent before it ended is read first
            self._error = self._gone()
            raise self._error
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            self._error = self._gone()
            raise self._error from None
        if kind == "error":
            exc, trace = payload
            exc.worker_traceback = trace  # printed by the CLI with debug=true
            self._error = exc
            raise exc
        if kind in ("written", "committed"):
            returns, counters = payload
            self._in_flight -= kind == "written"
            self._counters(counters)
            if returns is not None:
                self.on_commit(returns)
        return kind, payload

    def _expect(self, kind: str) -> Any:
        while True:
            got, payload = self._receive()
            if got == kind:
                return payload

    def _gone(self) -> WriteError:
        from collect_cli.errors import exit_cause

        self._proc.join(1.0)
        return WriteError(
            f"the writer process (pid {self._proc.pid}) {exit_cause(self._proc.exitcode)}: "
            "the dataset holds the batches committed before; resume=true continues it"
        )


def writer_main(conn, settings: Settings, parent_pid: int) -> None:
    """The child's loop: the protocol of the module's docstring."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _die_with(parent_pid)
    import torch

    torch.set_num_threads(1)  # the other cores collect
    writer = stream = None
    batches: list = []
    failed = False
    while True:
        try:
            command, arg = conn.recv()
        except (EOFError, OSError):  # the main process is gone
            return
        try:
            if command == "close":
                if writer is not None:
                    if failed:
                        close_quietly(writer, fmt.INTERRUPTED)
                    else:
                        stream.close(arg)
                conn.send(("closed", _counters(writer)))
                return
            if failed:
                continue
            if command == "open":
                writer = arg.open()
                stream = Stream(settings, writer)
                conn.send(("opened", _counters(writer)))
            elif command == "buffers":
                batches = [store.transpose(0, 1) for store in arg.map()]
                conn.send(("mapped", None))
            elif command == "batch":
                lane_start, index = arg
                returns = stream.write(lane_start, batches[index])
                writer.write_back()  # the disk works while the next batch is collected
                conn.send(("written", (returns, _counters(writer))))
            elif command == "commit":
                conn.send(("committed", (stream.commit(), _counters(writer))))
            elif command == "flush":
                conn.send(("flushed", (stream.flush(), _counters(writer))))
            else:
                raise ValueError(f"unknown writer command {command!r}")
        except BaseException as exc:
            failed = True
            if not _send_error(conn, exc) or command == "close":
                return


def _where(batch) -> int:
    """Which shared buffer ``batch`` is a view of: where its mask's memory starts."""
    return batch.get(fmt.MASK_KEY).data_ptr()


def _counters(writer) -> tuple[int, int, int]:
    if writer is None:
        return 0, 0, 0
    return writer.frames, writer.episodes, writer.next_traj_id


def _send_error(conn, exc: BaseException) -> bool:
    """Send ``exc`` itself (its class decides the exit code), or a WriteError naming it
    where it does not pickle; False if the main process is gone."""
    trace = "".join(traceback.format_exception(exc))
    try:
        payload = pickle.dumps(("error", (exc, trace)))
    except Exception:
        text = f"the writer failed: {type(exc).__name__}: {exc}"
        payload = pickle.dumps(("error", (WriteError(text), trace)))
    try:
        conn.send_bytes(payload)
    except (BrokenPipeError, OSError):
        return False
    return True


def _die_with(parent_pid: int) -> None:
    """Have the kernel kill this process when the main process dies (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # it died before the line above
        os._exit(0)
