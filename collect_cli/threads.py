"""torch's intra-op threads around small CPU work: one rule, one setter.

A CPU op on fewer than ``SERIAL_ELEMENTS`` elements takes microseconds, less
than handing it to torch's intra-op pool costs. torch's own loops stay serial
below that size (its grain), but BLAS calls (a policy's small matmuls) still
wake the pool, whose OpenMP threads then spin between steps: a core burnt for
nothing, or one taken from a writer thread. A policy's matmuls gain from the
threads again from a few million multiply-adds a step (``SERIAL_MACS``; measured:
``docs/performance.md``).
"""

from __future__ import annotations

from collections.abc import Iterator
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
