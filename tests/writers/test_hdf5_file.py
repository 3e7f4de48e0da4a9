"""The HDF5 writer's file object: committed content changes only at a commit, in order."""

from __future__ import annotations

import os
import random

import pytest

from collect_cli.writers import hdf5_file
from collect_cli.writers.hdf5_file import CommitOrderedFile, Extents


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
