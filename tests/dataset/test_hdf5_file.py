"""The HDF5 writer's file object: committed content changes only at a commit, in order."""

from __future__ import annotations

import fcntl
import os
import random
import subprocess
import sys
import time

import pytest

from collect_cli.dataset.hdf5 import file as hdf5_file
from collect_cli.dataset.hdf5.file import (
    CommitOrderedFile,
    Extents,
    Tick,
    read_clock,
    settled_clock,
)

needs_ofd_locks = pytest.mark.skipif(not hdf5_file.OFD_LOCKS, reason="no F_OFD_SETLK here")


def node(level: int, kids: tuple[int, ...] = (), tag: int = 0) -> bytes:
    """A group B-tree node's image (type 0: 32 entries of 8-byte keys, HDF5's default
    K of 16) listing ``kids``; ``tag`` marks one image from another."""
    head = b"TREE" + bytes([0, level]) + len(kids).to_bytes(2, "little") + bytes(16)
    body = b"".join(tag.to_bytes(8, "little") + kid.to_bytes(8, "little") for kid in kids)
    return head + body + bytes(NODE_SIZE - len(head) - len(body))


NODE_SIZE = 24 + 32 * 16 + 8


@pytest.fixture
def file(tmp_path):
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT, 0o644)
    yield CommitOrderedFile(fd)
    os.close(fd)


def write(f: CommitOrderedFile, at: int, data: bytes) -> None:
    f.seek(at)
    f.write(bytearray(data))


def on_disk(f: CommitOrderedFile, at: int, size: int) -> bytes:
    return os.pread(f.fd, size, at)


def test_new_space_is_written_at_once_and_committed_content_only_at_commit(file):
    write(file, 0, b"a" * 100)
    assert on_disk(file, 0, 100) == b"a" * 100  # nothing committed yet: written at once
    file.commit()
    write(file, 10, b"b" * 20)  # over committed content: held
    write(file, 200, b"c" * 10)  # past it: written at once
    assert on_disk(file, 0, 100) == b"a" * 100 and on_disk(file, 200, 10) == b"c" * 10
    assert file.holding == 20
    file.seek(0)
    assert file.read(40) == b"a" * 10 + b"b" * 20 + b"a" * 10  # reads see what is held
    file.commit()
    assert on_disk(file, 0, 40) == b"a" * 10 + b"b" * 20 + b"a" * 10 and file.holding == 0
    write(file, 205, b"d" * 10)  # committed now too (205-210), so held
    assert on_disk(file, 205, 10) == b"c" * 5  # held whole: the file still ends at 210


def test_held_writes_that_overlap_merge_the_newer_bytes_on_top(file):
    write(file, 0, bytes(100))
    file.commit()
    write(file, 10, b"x" * 20)
    write(file, 40, b"y" * 10)
    write(file, 25, b"z" * 20)  # over the end of the first and the start of the second
    write(file, 40, b"w" * 10)  # the same range again... inside the merged one
    file.seek(0)
    expected = bytes(10) + b"x" * 15 + b"z" * 15 + b"w" * 10 + bytes(50)
    assert file.read(100) == expected
    file.commit()
    assert on_disk(file, 0, 100) == expected


def test_commit_writes_new_b_tree_nodes_up_then_the_committed_ones_down(file, monkeypatch):
    """A split shrinks a node in place and gives its parent a pointer to the new one,
    which HDF5 may put in space it freed (committed content, so held too): the new
    node must reach the disk before its parent, and the parent before the shrunk
    node, wherever the three lie."""
    root, inner, leaf, freed = 1000, 3000, 2000, 4000  # the inner node above its leaf
    write(file, 0, bytes(5000))
    write(file, root, node(2, (inner,)))
    write(file, inner, node(1, (leaf,)))
    write(file, leaf, node(0))
    file.commit()
    order = []
    real = hdf5_file._pwrite

    def recording(fd, data, at):
        order.append(at)
        real(fd, data, at)

    monkeypatch.setattr(hdf5_file, "_pwrite", recording)
    write(file, leaf, node(0, tag=1))  # the leaf, shrunk by its split
    write(file, freed, node(0, tag=2))  # its new sibling, in freed space
    write(file, inner, node(1, (leaf, freed)))  # their parent
    write(file, root, node(2, (inner,), tag=3))  # its keys changed
    write(file, 600, b"header" * 4)  # an object header
    write(file, 0, b"super" * 4)  # the superblock
    assert order == []
    file.commit()
    # everything else; the nodes no committed node points to (new, or the root) from
    # the leaves up; then the committed ones from the root down
    assert order == [0, 600, freed, root, inner, leaf]
    assert on_disk(file, freed, NODE_SIZE) == node(0, tag=2)


def test_truncation_does_not_shrink_the_file_and_sets_the_end(file):
    write(file, 0, b"a" * 100)
    os.ftruncate(file.fd, 4096)  # space reserved ahead (D9)
    file.truncate(150)
    assert os.fstat(file.fd).st_size == 4096
    assert file.seek(0, os.SEEK_END) == 150  # HDF5's end of file, as sec2 keeps it
    file.truncate(8192)
    assert os.fstat(file.fd).st_size == 8192
    file.seek(8000)
    assert file.read(400) == bytes(400)  # past the end: zeros


def test_extents_match_a_set_of_bytes():
    rng = random.Random(0)
    for _ in range(200):
        extents, covered = Extents(), set()
        for _ in range(rng.randint(1, 12)):
            start = rng.randrange(0, 100)
            end = start + rng.randint(1, 15)
            extents.add(start, end)
            covered |= set(range(start, end))
            assert all(a < b for a, b in zip(extents.ends, extents.starts[1:], strict=False))
            ranges = zip(extents.starts, extents.ends, strict=True)
            assert {i for a, b in ranges for i in range(a, b)} == covered
        for _ in range(20):
            start = rng.randrange(0, 120)
            end = start + rng.randint(1, 10)
            assert extents.overlaps(start, end) == bool(covered & set(range(start, end)))


def _reader(f: CommitOrderedFile) -> int:
    """Another open of ``f``'s file, as a reader's."""
    return os.open(f"/proc/self/fd/{f.fd}", os.O_RDONLY)


@needs_ofd_locks
def test_the_commit_clock_moves_around_the_writes_over_committed_content(file, monkeypatch):
    """Durability D22: a reader that finds the clock at rest before its read and at
    the same place after it read none of a commit's writes over committed content."""
    reader = _reader(file)
    try:
        first = read_clock(reader)
        assert first is not None and not first.writing
        write(file, 0, bytes(1000))
        file.commit()  # new space only: written at once, nothing counted
        assert read_clock(reader) == first
        seen = []
        real = hdf5_file._pwrite

        def recording(fd, data, at):
            seen.append((at, bytes(data), read_clock(reader)))
            real(fd, data, at)

        monkeypatch.setattr(hdf5_file, "_pwrite", recording)
        write(file, 600, b"b" * 10)  # over committed content: held
        write(file, 2000, b"c" * 10)  # new space: written at once, the clock at rest
        write(file, 100, b"d" * 10)
        file.commit()
        writing = Tick(first.commits, True)
        assert seen == [
            (2000, b"c" * 10, first),
            (100, b"d" * 10, writing),
            (600, b"b" * 10, writing),
        ]
        assert read_clock(reader) == Tick(first.commits + 1, False)
        file.commit()  # nothing held: the clock stays
        assert read_clock(reader) == Tick(first.commits + 1, False)
    finally:
        os.close(reader)


@needs_ofd_locks
def test_the_clock_goes_with_its_writer_and_a_new_writer_shows_another(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(100))
    reader = os.open(path, os.O_RDONLY)
    script = (
        "import os, sys, time\n"
        "from collect_cli.dataset.hdf5.file import CommitOrderedFile\n"
        "f = CommitOrderedFile(os.open(sys.argv[1], os.O_RDWR))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    killed = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=-1)
    try:
        assert killed.stdout.readline() == b"ready\n"
        tick = read_clock(reader)
        assert tick is not None and not tick.writing
        killed.kill()
        killed.wait()
        assert read_clock(reader) is None  # gone with it: the file changes no more
        fd = os.open(path, os.O_RDWR)
        resumed = CommitOrderedFile(fd, committed=100)
        assert read_clock(reader) not in (None, tick)  # a random start: another clock
        resumed.close_clock()  # closed
        assert read_clock(reader) is None
        os.close(fd)
    finally:
        killed.kill()
        killed.wait()
        os.close(reader)


@needs_ofd_locks
def test_readers_wait_for_a_commit_being_written_and_not_twice_for_one_that_stalls(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(100))
    script = (
        "import fcntl, os, struct, sys, time\n"
        "lock = struct.Struct('hhqqi4x')\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "def at(n, kind=fcntl.F_WRLCK):\n"
        "    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock.pack(kind, 0, (1 << 62) + n, 1, 0))\n"
        "at(4 * 7 + 2)\n"  # writing commit 8
        "print('ready', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "at(4 * 8); at(4 * 7 + 2, fcntl.F_UNLCK)\n"  # at rest: 8 commits
        "time.sleep(60)\n"
    )
    reader = os.open(path, os.O_RDONLY)
    writers = []
    try:
        writer = subprocess.Popen([sys.executable, "-c", script, str(path), "0.3"], stdout=-1)
        writers.append(writer)
        assert writer.stdout.readline() == b"ready\n"
        assert read_clock(reader) == Tick(7, True)
        start = time.monotonic()
        assert settled_clock(reader) == Tick(8, False)  # waited for
        assert time.monotonic() - start >= 0.2
        writer.kill()
        writer.wait()
        assert read_clock(reader) is None

        stuck = subprocess.Popen([sys.executable, "-c", script, str(path), "60"], stdout=-1)
        writers.append(stuck)  # stopped in the middle of a commit, say
        assert stuck.stdout.readline() == b"ready\n"
        start = time.monotonic()
        assert settled_clock(reader, wait=0.3) == Tick(7, True)
        assert time.monotonic() - start >= 0.3
        start = time.monotonic()
        assert settled_clock(reader, wait=0.3) == Tick(7, True)  # not waited for again
        assert time.monotonic() - start < 0.1
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
        os.close(reader)


@needs_ofd_locks
def test_where_the_filesystem_refuses_the_clock_commits_go_on_without_it(file, monkeypatch):
    def refuse(fd, cmd, arg=0):
        raise OSError(37, "No locks available")

    reader = _reader(file)
    try:
        write(file, 0, bytes(100))
        file.commit()
        assert read_clock(reader) is not None
        monkeypatch.setattr(fcntl, "fcntl", refuse)
        write(file, 10, b"x" * 10)
        file.commit()
        monkeypatch.undo()
        assert on_disk(file, 10, 10) == b"x" * 10
        assert read_clock(reader) is None  # none from then on: readers read as they find
    finally:
        os.close(reader)
