"""Where CPU work runs: torch's intra-op threads around small work, and the CPU of
a helper thread beside worker processes.

A CPU op on fewer than ``SERIAL_ELEMENTS`` elements takes microseconds, less
than handing it to torch's intra-op pool costs. torch's own loops stay serial
below that size (its grain), but BLAS calls (a policy's small matmuls) still
wake the pool, whose OpenMP threads then spin between steps: a core burnt for
nothing, or one taken from a writer thread. A policy's matmuls gain from the
threads again from a few million multiply-adds a step (``SERIAL_MACS``; measured:
``docs/performance.md``).

:class:`CpuFollower` moves a thread of this process (a run's writer) to the CPU
of the worker furthest ahead, where there are as many workers as CPUs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

SERIAL_ELEMENTS = 32768  # torch's grain size: work this small runs on one thread
SERIAL_MACS = 1 << 21  # multiply-adds a step (lanes x weights) one thread runs faster


def serial(elements: int, macs: int = 0) -> bool:
    """Whether work on ``elements`` numbers, with ``macs`` multiply-adds, runs faster
    on one intra-op thread."""
    return elements < SERIAL_ELEMENTS and macs < SERIAL_MACS


@contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """torch with ``count`` intra-op threads (at least 1) inside; the previous count
    is restored on the way out, errors included. Free when nothing changes."""
    import torch

    previous = torch.get_num_threads()
    count = max(1, count)
    if count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def last_cpu(stat: bytes) -> int:
    """The CPU a task last ran on, from the text of its ``/proc/<pid>/stat``: field 39
    ("processor"); the fields after the name, which may hold spaces, start at 3."""
    return int(stat.rsplit(b")", 1)[1].split()[36])


class CpuFollower:
    """Keeps thread ``tid`` of this process on the CPU one of ``pids`` last ran on.

    Where each CPU runs one worker, a busy thread beside them (the writer) shares one
    worker's core, and Linux leaves it there: that worker falls behind, and the
    others, done first with each batch, sleep until it catches up (8-13% of a
    2-core machine idle in a multisync run; ``docs/performance.md``). Following, at
    each batch, the worker furthest ahead shares the thread's time out between them.
    Linux only (``/proc/<pid>/stat``); :meth:`close` gives the thread back its CPUs.
    """

    def __init__(self, tid: int, pids: Sequence[int]):
        self.tid = tid
        self._cpus = os.sched_getaffinity(tid)  # restored by close()
        self._at: int | None = None
        self._stats: list[int] = []  # each process's /proc/<pid>/stat, read again each batch
        try:
            for pid in pids:
                self._stats.append(os.open(f"/proc/{pid}/stat", os.O_RDONLY))
        except OSError:
            self.close()
            raise

    @classmethod
    def where_needed(cls, tid: int | None, pids: Sequence[int]) -> CpuFollower | None:
        """A follower where it helps (one CPU for each of ``pids``), else None. With a
        CPU to spare, the scheduler's placement stands; with more processes than
        CPUs, they share the CPUs already, and a thread held to one of them only
        crowds it (3 workers on 2 CPUs: 0.86x the frames/s; ``docs/performance.md``)."""
        if tid is None or not pids or not hasattr(os, "sched_setaffinity"):
            return None
        try:
            if len(os.sched_getaffinity(0)) != len(pids):
                return None
            return cls(tid, pids)
        except OSError:
            return None

    def follow(self, index: int) -> None:
        """Move the thread to the CPU where process ``pids[index]`` last ran."""
        try:
            cpu = last_cpu(os.pread(self._stats[index], 1024, 0))
            if cpu != self._at and cpu in self._cpus:
                os.sched_setaffinity(self.tid, {cpu})
                self._at = cpu
        except (OSError, IndexError, ValueError):
            self.close()  # the thread or the process has ended

    def close(self) -> None:
        if self._at is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.tid, self._cpus)
            self._at = None
        for fd in self._stats:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stats = []
