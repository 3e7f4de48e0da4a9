"""The HDF5 writer's file: HDF5's writes ordered so that a kill at any moment leaves
the last commit readable (durability D8, docs/durability.md).

HDF5 writes a flush's dirty metadata in increasing address order, and outside
SWMR mode it puts no child before its parent. When a chunk B-tree node splits,
the new node is placed at the end of the file, above the parent that gains a
pointer to it, so the parent was written first: a kill between the two writes
left the parent pointing at an unwritten node, and the dataset unreadable.

:class:`CommitOrderedFile` is the file object h5py's ``fileobj`` driver hands
every read and write of HDF5 to. It keeps one rule: **what the last commit left
on disk changes only inside** :meth:`CommitOrderedFile.commit`, and there in an
order that keeps it readable after every single write.

================================  ==============================================
HDF5 writes to                    what happens
================================  ==============================================
space no commit wrote (a new      written at once: nothing committed points there
chunk, a new B-tree node)         yet, so a kill leaves it unused
committed content (a node that    held in memory (reads see it) until ``commit``
gains an entry, an object header,
the superblock, a chunk rewritten
in place)
``commit()``                      writes what is held: everything but B-tree
                                  nodes first, in address order (the superblock
                                  with the new end of allocation, dataset
                                  extents, chunks rewritten in place); then the
                                  nodes no committed node points to (roots, and
                                  new nodes HDF5 put in space it freed), from
                                  the leaves up; then the others from the root
                                  down
================================  ==============================================

So a parent points to a new node only once that node is on disk, and a node a
split shrank is rewritten only after its parent points to the new node that took
part of its entries (a kill in between leaves those entries reachable from the
parent through the new node, and stale copies in the old one that lookups do not
reach). What a kill cuts is never worse than losing the commit in progress.
Whether a node is new is read from the committed images of the nodes rewritten
(their children): HDF5 reuses space it freed (the writer frees the episodes'
first chunks before its first commit), so a new node can lie where committed
content was.

**Readers of a live file** (durability D22). An HDF5 open is not a snapshot: a
reader reads the superblock, with its end of allocation (EOA), when it opens the
file, and each chunk index node when a read first needs it. A commit in between
gave it nodes that point past its EOA ("addr overflow"), or an old parent with a
child that a split had shrunk (chunks missing, read as fill values). So the
writer keeps a *commit clock* that readers look at before and after each read:
a lock (``F_OFD_SETLK``) on one byte far past the data, whose place counts the
commits made and says whether one is being written (:func:`read_clock`). It
moves only around :meth:`CommitOrderedFile.commit`'s writes over committed
content (writes to space no commit wrote are not counted: nothing a reader of a
commit follows leads there), so a read that began with no commit being written
and ended with the clock where it was read the file as one commit left it
(``dataset/hdf5/`` :class:`~collect_cli.dataset.hdf5.LiveFile`). The clock is
the kernel's, not the file's: it writes nothing, leaves the format as it is, and
goes with the writer (a killed writer's lock is gone: its file changes no more).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import os
import struct
import time
from typing import NamedTuple

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
TREE = b"TREE"  # a version-1 B-tree node's signature; then its type, level, entries used
NODE_HEAD = 24  # signature, type, level, entries used, left and right sibling addresses


# The commit clock: the writer's (read) lock on byte CLOCK_AT + 4n while n commits are
# made (n counted from a random start, so that a writer that took over a killed one's
# file shows another clock), on CLOCK_AT + 4n + 2 while it writes the next one. Locks
# of one owner on adjacent bytes would merge; these never touch.
CLOCK_AT = 1 << 62
LOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, length, pid
OFD_LOCKS = hasattr(fcntl, "F_OFD_SETLK")  # Linux 3.15 and later
SETTLE_WAIT = 5.0  # seconds a reader waits for a writer to end the commit it writes


class Tick(NamedTuple):
    """The commit clock as a reader finds it: commits made (from the writer's random
    start), and whether the next one is being written."""

    commits: int
    writing: bool


def _lock(kind: int, at: int, length: int) -> bytes:
    """A ``struct flock`` of ``length`` bytes (0: all) from ``CLOCK_AT + at``."""
    return LOCK.pack(kind, os.SEEK_SET, CLOCK_AT + at, length, 0)


def read_clock(fd: int) -> Tick | None:
    """The commit clock of the file open as ``fd``; None where no writer holds one
    (the file is not being written, or its filesystem has no such locks)."""
    if not OFD_LOCKS:
        return None
    try:  # the first lock from CLOCK_AT on that a write lock there would meet
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock(fcntl.F_WRLCK, 0, 0))
    except OSError:
        return None
    kind, _, start, _, _ = LOCK.unpack(got)
    if kind == fcntl.F_UNLCK:
        return None
    commits, writing = divmod(start - CLOCK_AT, 4)
    return Tick(commits, bool(writing))


_stalled: set[tuple[int, int, Tick]] = set()  # commits waited for in vain (a stopped writer)
_clocks: set[int] = set()  # the commit clocks' file descriptors this process holds


def _drop_inherited_clocks() -> None:
    # a forked child (a collector worker) must not keep its parent's clock: it would
    # outlive a killed writer, and readers would wait for a commit no one writes
    for fd in list(_clocks):
        with contextlib.suppress(OSError):
            os.close(fd)
    _clocks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_clocks)


def settled_clock(fd: int, wait: float = SETTLE_WAIT) -> Tick | None:
    """The commit clock once no commit is being written: where one is, waited for
    up to ``wait`` seconds (a commit's writes take microseconds; a writer that
    outlasts the wait, stopped or stuck, is not waited for again at that commit)."""
    tick = read_clock(fd)
    if tick is None or not tick.writing:
        return tick
    st = os.fstat(fd)
    deadline, pause = time.monotonic() + wait, 0.0002
    while tick is not None and tick.writing and (st.st_dev, st.st_ino, tick) not in _stalled:
        if time.monotonic() > deadline:
            _stalled.add((st.st_dev, st.st_ino, tick))
            break
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
        tick = read_clock(fd)
    return tick


def node_entries(superblock: bytes) -> dict[int, int]:
    """Entries (2K) a version-1 B-tree node of each type holds (0: groups, 1: chunks),
    as superblock versions 0 and 1 record them; HDF5's defaults for other versions."""
    group_k, chunk_k = 16, 32
    if superblock[:8] == HDF5_SIGNATURE and superblock[8] in (0, 1):
        group_k = int.from_bytes(superblock[18:20], "little")
        if superblock[8] == 1:
            chunk_k = int.from_bytes(superblock[24:26], "little")
    return {0: 2 * group_k, 1: 2 * chunk_k}


def allocated_end(fd: int) -> int:
    """The end of allocated space (EOA) the superblock records: the committed part of
    a file being reopened (a killed run wrote past it only what no commit counted).
    The file's size for superblock versions other than 0 and 1 (h5py's default)."""
    head = os.pread(fd, 48, 0)
    if head[:8] != HDF5_SIGNATURE or head[8] not in (0, 1) or head[13] != 8:
        return os.fstat(fd).st_size
    at = 40 if head[8] == 0 else 44  # version 1 has 4 more bytes before it
    return struct.unpack_from("<Q", head, at)[0]


def is_node(image: bytes | bytearray) -> bool:
    return image[:4] == TREE and len(image) > NODE_HEAD


def children(image: bytes, entries: dict[int, int]) -> set[int]:
    """The child addresses an internal node's image lists (none for leaves, whose
    children are chunks or symbol tables, or for an image of unexpected size)."""
    slots = entries.get(image[4])
    if image[5] == 0 or slots is None:
        return set()
    # key, child, key, child, ..., key: the key size follows from the node's size
    key, rest = divmod(len(image) - NODE_HEAD - 8 * slots, slots + 1)
    if rest or key <= 0:
        return set()
    used = min(int.from_bytes(image[6:8], "little"), slots)
    first = NODE_HEAD + key
    return {
        int.from_bytes(image[at : at + 8], "little")
        for at in range(first, first + used * (key + 8), key + 8)
    }


class Extents:
    """Sorted, disjoint byte ranges ``[start, end)``, merged as they are added."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        starts, ends = self.starts, self.ends
        if starts and start >= starts[-1]:  # the usual case: at or after the last range
            if start <= ends[-1]:
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(start)
                ends.append(end)
            return
        lo = bisect.bisect_left(ends, start)  # the first range that ends at or after start
        hi = bisect.bisect_right(starts, end)  # past the last range that starts at or before end
        if lo < hi:
            start, end = min(start, starts[lo]), max(end, ends[hi - 1])
        starts[lo:hi] = [start]
        ends[lo:hi] = [end]

    def overlaps(self, start: int, end: int) -> bool:
        if not self.ends or start >= self.ends[-1]:  # past the end: new space, the usual case
            return False
        i = bisect.bisect_right(self.starts, start) - 1
        if i >= 0 and self.ends[i] > start:
            return True
        return i + 1 < len(self.starts) and self.starts[i + 1] < end


class CommitOrderedFile:
    """A file descriptor as the Python file object h5py's ``fileobj`` driver needs
    (``seek``, ``tell``, ``read``, ``write``, ``truncate``, ``flush``), with the
    rule above. ``committed`` is how many bytes from the start hold committed
    content when an existing file is reopened (its superblock's end of
    allocation); 0 for a new file. It holds the file's commit clock where the
    filesystem has such locks, until :meth:`close_clock`.

    Its end of file is HDF5's, as the ``sec2`` driver keeps it (the end of what
    was written, or of the last truncation), not the file's size: the writer
    reserves space past it (D9), and HDF5's truncation at each flush is not let
    shrink the file (the writer does at close)."""

    def __init__(self, fd: int, committed: int = 0) -> None:
        self.fd = fd
        self._pos = 0
        self._end = os.fstat(fd).st_size
        self._committed = Extents()
        if committed:
            self._committed.add(0, committed)
        self._fresh: list[tuple[int, int]] = []  # written since the last commit, at once
        self._held: dict[int, bytearray] = {}  # over committed content: start -> bytes
        self._held_at: list[int] = []  # their starts, sorted
        self._entries: dict[int, int] | None = None  # node_entries, read at the first commit
        self._clock: int | None = None  # the commit clock's open of the file (its own locks)
        self._clock_at = 0  # the byte it locks, from CLOCK_AT
        self._clock_pid = os.getpid()  # a forked child's copy of this object has no clock
        if OFD_LOCKS:
            self._start_clock()

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence:  # h5py seeks to an address before each read and write, and to the end
            pos += self._pos if whence == os.SEEK_CUR else self._end
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int) -> bytes:
        start = self._pos
        data = os.pread(self.fd, size, start)
        if len(data) < size:  # past the end: zeros, as the sec2 driver reads them
            data += bytes(size - len(data))
        self._pos = start + size
        if not self._held_at:
            return data
        out = None
        for at in self._overlapping(start, start + size):
            held = self._held[at]
            lo, hi = max(at, start), min(at + len(held), start + size)
            out = bytearray(data) if out is None else out
            out[lo - start : hi - start] = held[lo - at : hi - at]
        return data if out is None else bytes(out)

    def write(self, data: bytearray) -> int:
        # this runs for each of HDF5's writes (~60 a commit): the usual cases first
        start, size = self._pos, len(data)
        end = self._pos = start + size
        if end > self._end:
            self._end = end
        held = self._held.get(start)
        if held is not None and len(held) == size:  # the same entry again (no other overlaps)
            self._held[start] = data if isinstance(data, bytearray) else bytearray(data)
        elif self._committed.overlaps(start, end):
            self._hold(start, data if isinstance(data, bytearray) else bytearray(data))
        else:
            _pwrite(self.fd, data, start)
            self._fresh.append((start, end))
        return size

    def truncate(self, size: int) -> int:
        if size > os.fstat(self.fd).st_size:
            os.ftruncate(self.fd, size)
        self._end = size
        return size

    def flush(self) -> None:
        """HDF5 calls this at the end of each flush; :meth:`commit` is called by the writer."""

    def commit(self) -> None:
        """Write what is held, in the order of the module's rule; what HDF5 wrote since
        the last commit is committed content from now on."""
        held = self._held
        nodes = {at: data for at, data in held.items() if is_node(data)}
        pointed: set[int] = set()  # nodes a committed node points to
        if nodes:
            if self._entries is None:  # the superblock's, fixed when the file was made
                self._entries = node_entries(os.pread(self.fd, 32, 0))
            entries = self._entries
            for at, data in nodes.items():
                head = os.pread(self.fd, 6, at)  # a committed leaf points to no node
                if head[:4] == TREE and head[5] > 0:
                    pointed |= children(os.pread(self.fd, len(data), at), entries)
        level = {at: data[5] for at, data in nodes.items()}
        order = sorted(at for at in held if at not in nodes)
        order += sorted((at for at in nodes if at not in pointed), key=lambda at: (level[at], at))
        order += sorted((at for at in nodes if at in pointed), key=lambda at: (-level[at], at))
        if order:
            self._write_held(order)
        for at in order:
            self._committed.add(at, at + len(held[at]))
        for start, end in self._fresh:
            self._committed.add(start, end)
        self._fresh.clear()
        self._held.clear()
        self._held_at.clear()

    def _write_held(self, order: list[int]) -> None:
        """The held writes, with the commit clock at "writing" (durability D22): a
        reader that found it at rest before its read and at the same place after
        it read none of them."""
        clock = self._clock is not None and self._clock_pid == os.getpid()
        if clock:
            self._move_clock(self._clock_at + 2)  # writing the next commit
        for at in order:
            _pwrite(self.fd, self._held[at], at)
        if clock and self._clock is not None:
            self._move_clock(self._clock_at + 2)  # at rest, one commit more

    def _start_clock(self) -> None:
        """Lock the clock's first byte, at a random count of 2**40 commits or fewer (so
        that CLOCK_AT + 4n stays below 2**63), through an open of the file of its own:
        closing it drops the clock whatever else fails."""
        try:
            self._clock = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return  # no /proc: no clock
        _clocks.add(self._clock)
        self._clock_at = 4 * int.from_bytes(os.urandom(5), "little")
        try:
            fcntl.fcntl(self._clock, fcntl.F_OFD_SETLK, _lock(fcntl.F_RDLCK, self._clock_at, 1))
        except OSError:
            self.close_clock()  # a filesystem without such locks

    def _move_clock(self, at: int) -> None:
        """Lock the clock's byte ``CLOCK_AT + at``, then unlock the one locked before;
        where the filesystem refuses, no clock from then on (readers read the file
        as they find it, as plain h5py does)."""
        try:
            fcntl.fcntl(self._clock, fcntl.F_OFD_SETLK, _lock(fcntl.F_RDLCK, at, 1))
            fcntl.fcntl(self._clock, fcntl.F_OFD_SETLK, _lock(fcntl.F_UNLCK, self._clock_at, 1))
            self._clock_at = at
        except OSError:
            self.close_clock()

    def close_clock(self) -> None:
        """Drop the commit clock (the writer is done with the file)."""
        if self._clock is not None and self._clock_pid == os.getpid():
            _clocks.discard(self._clock)
            with contextlib.suppress(OSError):
                os.close(self._clock)
        self._clock = None

    @property
    def holding(self) -> int:
        """Bytes held for the next commit."""
        return sum(map(len, self._held.values()))

    def _overlapping(self, start: int, end: int) -> list[int]:
        """Starts of the held writes that overlap ``[start, end)``."""
        at = self._held_at
        i = bisect.bisect_right(at, start) - 1
        if i < 0 or at[i] + len(self._held[at[i]]) <= start:
            i += 1
        j = i
        while j < len(at) and at[j] < end:
            j += 1
        return at[i:j]

    def _hold(self, start: int, data: bytearray) -> None:
        hits = self._overlapping(start, start + len(data))
        if len(hits) == 1 and hits[0] == start and len(self._held[start]) == len(data):
            self._held[start] = data  # the same metadata entry written again: the usual case
            return
        if hits:  # merge with what it overlaps, the newer bytes on top
            lo = min(start, hits[0])
            hi = max(start + len(data), max(at + len(self._held[at]) for at in hits))
            merged = bytearray(hi - lo)
            for at in hits:
                held = self._held.pop(at)
                merged[at - lo : at - lo + len(held)] = held
            merged[start - lo : start - lo + len(data)] = data
            i = bisect.bisect_left(self._held_at, hits[0])
            del self._held_at[i : i + len(hits)]
            start, data = lo, merged
        self._held[start] = data
        bisect.insort(self._held_at, start)


def _pwrite(fd: int, data: bytes | bytearray | memoryview, at: int) -> None:
    done = os.pwrite(fd, data, at)
    if done < len(data):  # a short write (rare): the rest
        view = memoryview(data)
        while done < len(view):
            done += os.pwrite(fd, view[done:], at + done)


class ReadOnlyFile:
    """A file descriptor as the file object h5py's ``fileobj`` driver reads through.

    HDF5 shares one open of a file among all of a process's opens of it (the
    ``sec2`` driver matches them by inode), metadata cache and end of allocation
    included, so a new open made while an older one is open reads what the older
    one cached. Through a file object of its own, each open is its own: a reader
    of a live file needs that (durability D22)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pos = 0

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence:
            pos += self._pos if whence == os.SEEK_CUR else os.fstat(self.fd).st_size
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int) -> bytes:
        data = os.pread(self.fd, size, self._pos)
        self._pos += size
        return data if len(data) == size else data + bytes(size - len(data))

    def write(self, data: bytes) -> int:
        raise OSError(f"file descriptor {self.fd} is open for reading only")

    def truncate(self, size: int) -> int:
        raise OSError(f"file descriptor {self.fd} is open for reading only")

    def flush(self) -> None:
        pass
