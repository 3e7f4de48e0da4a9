"""HDF5 backend: block writes, commit records, and kills inside a commit (fault injection)."""

from __future__ import annotations

import math
import mmap
import os

import h5py
import numpy as np
import pytest
import torch

from collect_cli.collectors import SyncCollector
from collect_cli.dataset import fsio, make_writer, open_dataset
from collect_cli.dataset import writer as base
from collect_cli.dataset.hdf5 import file as hdf5_file
from collect_cli.dataset.hdf5 import read as hdf5
from collect_cli.dataset.hdf5.attrs import (
    COMMIT_SLOTS,
    MAX_LANES,
    PAD,
    RootAttrs,
    commit_record,
    decode_attrs,
    file_meta,
    read_commit,
)
from collect_cli.dataset.hdf5.chunks import Block
from collect_cli.dataset.hdf5.read import (
    LiveArray,
    LiveFile,
    basic_box,
    pieces,
    read_array,
    read_meta,
)
from collect_cli.envs import env_factory
from collect_cli.errors import ConfigError, WriteError
from collect_cli.ops.validate import validate
from tests.helpers import resident_pages

META = {"env_id": "CartPole-v1", "config": {}}


@pytest.fixture(scope="module")
def batches():
    with SyncCollector(env_factory("CartPole-v1", 3), frames_per_batch=60, total_frames=300) as c:
        return [b for b in c]


# (start, shape) of blocks into a [lanes, time, 3] dataset chunked (2, 4, 3): one
# chunk, a grid of chunks, off the grid along lanes, along time, partial chunks,
# and a chunk already half written through the cache rewritten whole.
BLOCKS = [
    ((0, 0), (2, 4)),
    ((0, 4), (6, 8)),
    ((1, 12), (3, 4)),
    ((0, 12), (2, 3)),
    ((4, 13), (2, 5)),
    ((2, 16), (2, 4)),
    ((0, 16), (2, 4)),
]


@pytest.mark.parametrize(
    ("planned", "extents"), [(None, [20, 40, 80, 80, 160]), (70, [70] * 3 + [140] * 2)]
)
def test_the_time_extent_grows_ahead_and_is_cut_to_the_steps_at_close(
    tmp_path, batches, planned, extents
):
    # an extent changed at every batch rewrote every frame dataset's header at each commit
    path = tmp_path / "x.h5"
    w = make_writer("hdf5", path, metadata=META, planned_steps=planned).open()
    seen = []
    for batch in batches:
        w.append(batch)
        w.commit()
        with h5py.File(path, "r", locking=False) as f:
            keys = ("observation", "next/done", "collector/mask")
            seen.append({f[name].shape[1] for name in keys})
    assert seen == [{n} for n in extents]
    w.close("interrupted")
    with h5py.File(path, "r", locking=False) as f:
        assert f["observation"].shape[:2] == f["collector/mask"].shape == (3, 100)
    assert validate(path) == []


def test_flag_blocks_with_no_flag_set_are_left_unwritten_and_read_false(tmp_path, batches):
    path = tmp_path / "x.h5"
    w = make_writer("hdf5", path, metadata=META).open()
    for batch in batches:
        w.append(batch)
        w.commit()
    w.close()
    with h5py.File(path, "r", locking=False) as f:
        assert not f["done"][()].any() and f["done"].shape == (3, 100, 1)  # root flags: never set
        assert f["done"].id.get_num_chunks() == 1  # the first batch's: it makes the index
        assert f["next/done"].id.get_num_chunks() > 0  # CartPole's episodes end
        done = np.concatenate([b["next", "done"].numpy() for b in batches], 1)
        done[:, -1] = True  # closing cuts each lane's running episode there
        np.testing.assert_array_equal(f["next/done"][()], done)
    assert validate(path) == []


def test_a_resumed_run_reads_no_flag_a_killed_one_wrote_past_its_last_commit(tmp_path, batches):
    # the killed run set root flags in a batch it never committed; the resumed run
    # writes the same frames with none set, which it leaves unwritten
    path = tmp_path / "x.h5"
    pid = os.fork()
    if pid == 0:  # the killed run
        try:
            w = make_writer("hdf5", path, metadata=META).open()
            w.append(batches[0])
            w.commit()
            flagged = batches[1].clone()
            flagged["done"][:] = True
            w.append(flagged)
            w._file.flush()  # HDF5's writes of that batch reach the file object...
        finally:
            os._exit(0)  # ...and the process dies before the commit
    assert os.waitpid(pid, 0)[1] == 0
    w = make_writer("hdf5", path, metadata=META).reopen()
    assert w.steps == 20
    for batch in batches[1:]:
        w.append(batch)
        w.commit()
    w.close()
    with h5py.File(path, "r", locking=False) as f:  # (the batches' ids continue the cut
        assert f["collector/mask"][()].all()  # episodes: a real resume starts new ones)
        assert f["done"].shape == (3, 100, 1) and not f["done"][()].any()


@pytest.mark.parametrize("dtype", ["f4", "i8", "?"])
def test_block_writes_equal_numpy_through_both_paths(tmp_path, dtype):
    rng = np.random.default_rng(0)
    expected = np.full((6, 20, 3), 7, dtype)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        blocks = [
            Block(f.create_dataset(name, (6, 0, 3), dtype, maxshape=(None, None, 3),
                                   chunks=(2, 4, 3), fillvalue=7, compression=comp))
            for name, comp in (("direct", None), ("cached", "gzip"))
        ]  # fmt: skip
        for (lane, t), (n, steps) in BLOCKS:
            block = (rng.integers(0, 2 if dtype == "?" else 100, (n, steps, 3))).astype(dtype)
            expected[lane : lane + n, t : t + steps] = block
            for b in blocks:
                b.write((lane, t), block)
        assert [b.shape for b in blocks] == [(6, 20, 3)] * 2
    with h5py.File(tmp_path / "b.h5", "r") as f:
        np.testing.assert_array_equal(f["direct"][()], expected)
        np.testing.assert_array_equal(f["cached"][()], expected)


def test_blocks_on_the_chunk_grid_reach_the_file_at_once(tmp_path):
    # Whole chunks of an unfiltered dataset are written directly (H5Dwrite_chunk),
    # not held in the chunk cache until the commit's flush.
    path = tmp_path / "b.h5"
    aligned = np.frombuffer(b"ALIGNED!" * 16, np.float64).reshape(2, 8)  # one chunk
    cached = np.frombuffer(b"CACHED!!" * 8, np.float64).reshape(2, 4)  # half a chunk
    with h5py.File(path, "w") as f:
        a = Block(f.create_dataset("a", (2, 0), "f8", maxshape=(None, None), chunks=(2, 8)))
        b = Block(f.create_dataset("b", (2, 0), "f8", maxshape=(None, None), chunks=(2, 8)))
        a.write((0, 0), aligned)
        b.write((0, 0), cached)
        raw = path.read_bytes()
        assert aligned.tobytes() in raw
        assert cached[0].tobytes() not in raw  # a row: the chunk's other half is fill
    assert cached[0].tobytes() in path.read_bytes()  # flushed at close


def test_a_block_of_the_wrong_shape_is_refused(tmp_path):
    with h5py.File(tmp_path / "b.h5", "w") as f:
        b = Block(f.create_dataset("x", (2, 0, 3), "f4", maxshape=(None, None, 3)))
        with pytest.raises(TypeError, match=r"shape \(2, 4, 2\) into /x \(2, 0, 3\)"):
            b.write((0, 0), np.zeros((2, 4, 2), "f4"))


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_appended_rows_equal_numpy_across_chunks_cuts_and_reopening(tmp_path, compression):
    # Block.append holds the last partial chunk (direct writes; gzip: through the
    # cache): rows within a chunk, across several, a cut back (resize) into a chunk
    # and appends after it, then appends in a new Block over the reopened file.
    path, rng = tmp_path / "t.h5", np.random.default_rng(1)
    expected = np.zeros(0, "i8")

    def append(block, count):
        nonlocal expected
        rows = rng.integers(0, 1000, count)
        block.append(len(expected), rows)
        expected = np.concatenate([expected, rows])

    with h5py.File(path, "w") as f:
        ds = f.create_dataset(
            "t", (0,), "i8", maxshape=(None,), chunks=(4,), compression=compression
        )
        block = Block(ds)
        for count in (1, 2, 0, 5, 4, 11):
            append(block, count)
        block.resize(10, axis=0)  # resume drops uncommitted rows: mid-chunk
        expected = expected[:10]
        append(block, 3)
    with h5py.File(path, "r+") as f:
        np.testing.assert_array_equal(f["t"][()], expected)
        block = Block(f["t"])  # a new writer: the partial chunk is read back first
        append(block, 6)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["t"][()], expected)


def test_root_attrs_overwrite_numbers_in_place_and_replace_the_rest(tmp_path):
    meta = {"frames": 1, "lane_steps": [1, 2], "spaces": {"a": 1}, "end_time": None}
    with h5py.File(tmp_path / "a.h5", "w") as f:
        attrs = RootAttrs(f)
        attrs.store({**meta, "status": "running", "seed": 3, "extent": np.arange(2)})
        attrs.store({"frames": 5, "lane_steps": [3, 4], "spaces": {"a": 2}, "end_time": "now"})
        attrs.store({"extent": np.arange(3), "status": "interrupted", "seed": None})
        attrs.store({"end_time": None})  # back to not set
        attrs.release()
    with h5py.File(tmp_path / "a.h5", "r") as f:
        assert f.attrs["frames"] == 5
        assert f.attrs["extent"].tolist() == [0, 1, 2]  # a new shape: replaced
        assert f.attrs["lane_steps"].tolist() == [3, 4]
        assert f.attrs["spaces"] == '{"a": 2}'
        assert f.attrs["status"] == "interrupted"  # text, a longer value
        assert f.attrs["end_time"] == ""  # kept, so that closing only overwrites it
        assert "seed" not in f.attrs
        assert decode_attrs(f.attrs)["end_time"] is None


def test_commit_records_alternate_and_carry_the_counters(tmp_path, batches):
    path = tmp_path / "d.h5"
    w = make_writer("hdf5", path, metadata={}).open()
    for b in batches[:3]:
        w.append(b)
        w.commit()
    with h5py.File(path, "r", locking=False) as f:
        record = read_commit(f.attrs)
        assert record == {
            "seq": 3,
            "frames": 180,
            "steps": 60,
            "episodes": w.episodes,
            "lane_steps": [60, 60, 60],
        }
        assert set(COMMIT_SLOTS) <= set(f.attrs)
    w.close()
    assert not set(COMMIT_SLOTS) & set(open_dataset(path).meta)  # not shown as metadata


def test_per_lane_counters_grow_with_room_and_are_read_without_it(tmp_path):
    """split_trajs adds lanes at every commit: ``lane_steps`` and the commit records
    keep room to grow (PAD), so that most commits overwrite them in place."""
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        attrs = RootAttrs(f)
        for seq, lanes in enumerate([2, 3, 4, 5], 1):
            meta = {"frames": 10 * lanes, "steps": 5, "episodes": lanes, "lanes": lanes}
            meta["lane_steps"] = list(range(1, lanes + 1))
            attrs.store({**meta, "commit_0": commit_record(seq, meta)})
            if lanes == 3:  # grown from 2: the length doubled
                assert f.attrs["lane_steps"].tolist() == [1, 2, 3, PAD]
        attrs.release()
    with h5py.File(path, "r") as f:
        assert f.attrs["lane_steps"].tolist() == [1, 2, 3, 4, 5, PAD, PAD, PAD]
        assert len(f.attrs["commit_0"]) == 16  # 6 + 5 lanes, room for 5 more
        assert read_commit(f.attrs) == {
            "seq": 4,
            "frames": 50,
            "steps": 5,
            "episodes": 5,
            "lane_steps": [1, 2, 3, 4, 5],
        }
        meta, seq = file_meta(f.attrs)
        assert seq == 4 and meta["lane_steps"] == [1, 2, 3, 4, 5] and meta["lanes"] == 5


def _tiled(batch, copies: int, first: int = 0):
    """``batch``'s lanes ``copies`` times over, each copy with trajectory ids of its own."""
    lanes = batch.batch_size[0]
    out = torch.cat([batch] * copies, 0)
    ids = out.get(("collector", "traj_ids"))
    copy = first + torch.arange(copies).repeat_interleave(lanes)[:, None]
    out.set(("collector", "traj_ids"), torch.where(ids >= 0, ids + copy * 1_000_000, ids))
    return out


def test_more_lanes_than_the_attributes_hold_is_a_usage_error(tmp_path, batches):
    """Per-lane counters are root attributes, under 64 KiB each in HDF5: a run with
    more lanes is refused before anything is written; MAX_LANES lanes fit."""
    path = tmp_path / "w.h5"
    with pytest.raises(ConfigError) as refused:
        make_writer("hdf5", path, metadata=META, lanes=MAX_LANES + 1)
    assert str(refused.value) == (
        f"writer=hdf5 records at most {MAX_LANES} env lanes (their step counts are file "
        f"attributes, which HDF5 keeps under 64 KiB), not {MAX_LANES + 1}: use writer=memmap, "
        "or fewer env.num_envs x collector.workers"
    )
    assert not list(tmp_path.iterdir())
    copies = -(-MAX_LANES // batches[0].batch_size[0])
    w = make_writer("hdf5", path, metadata=META, lanes=MAX_LANES).open()
    for batch in batches[:2]:
        w.append(_tiled(batch, copies)[:MAX_LANES])
        w.commit()
    w.close()
    assert not validate(path)
    assert read_meta(path)["lane_steps"] == [40] * MAX_LANES


def test_rows_past_the_limit_stop_the_run_and_keep_what_was_committed(tmp_path, batches):
    """split_trajs rows (one an episode) grow the per-lane counters; their room to
    grow stops at MAX_LANES, and the row after it is refused before it is written."""
    path = tmp_path / "r.h5"
    w = make_writer("hdf5", path, metadata=META).open()  # rows, not fixed lanes
    for i, rows in enumerate((3000, 3000, 2000)):
        w.append(_tiled(batches[0], 1000, first=1000 * i)[:rows], w.lanes or 0)
        w.commit()
    assert w.lanes == MAX_LANES
    frames = w.frames
    with pytest.raises(WriteError) as stopped:
        w.append(_tiled(batches[0], 1, first=5000)[:1], w.lanes)
    assert str(stopped.value) == (
        f"writer=hdf5 records at most {MAX_LANES} rows (their step counts are file "
        f"attributes, which HDF5 keeps under 64 KiB), not {MAX_LANES + 1}: with "
        "split_trajs=true every episode is a row; the dataset is readable up to the last "
        f"commit ({frames} frames); use writer=memmap for more episodes"
    )
    w.close("interrupted")
    assert not validate(path)
    meta = read_meta(path)
    assert meta["lanes"] == MAX_LANES and meta["frames"] == frames
    assert meta["status"] == "interrupted"
    with h5py.File(path, "r") as f:  # the room stopped at the limit
        assert len(f.attrs["lane_steps"]) == MAX_LANES


def test_lanes_come_from_the_last_whole_commit(tmp_path, batches):
    """A kill between a split_trajs commit's attribute writes can leave ``lanes`` of
    the new commit beside the previous commit's record: the record wins."""
    path = tmp_path / "l.h5"
    w = make_writer("hdf5", path, metadata=META).open()
    w.append(batches[0])
    w.commit()
    w.close()
    with h5py.File(path, "r+") as f:
        f.attrs["lanes"] = 6  # as if the next commit had written this much only
    meta = read_meta(path)
    assert meta["lanes"] == 3 and meta["lane_steps"] == [20, 20, 20]


def test_a_torn_record_falls_back_to_the_previous_commit(tmp_path, batches):
    path = tmp_path / "d.h5"
    w = make_writer("hdf5", path, metadata=META).open()
    for b in batches[:2]:
        w.append(b)
        w.commit()
    episodes_then = w.episodes
    w.append(batches[2])
    w.commit()  # record 3
    w._file.close()  # dies without closing the writer
    with h5py.File(path, "r+", locking=False) as f:
        newest = COMMIT_SLOTS[3 % 2]
        torn = f.attrs[newest].copy()
        torn[-1] ^= 1  # its checksum no longer matches
        f.attrs.modify(newest, torn)
        f.attrs.modify("frames", 999)  # the loose counters are not trusted
    meta = open_dataset(path).meta
    assert (meta["frames"], meta["steps"], meta["episodes"]) == (120, 40, episodes_then)
    assert meta["lane_steps"] == [40, 40, 40]
    assert validate(path) == []
    resumed = make_writer("hdf5", path, metadata=META).reopen()  # continues after commit 2
    assert resumed.frames == 120 and list(resumed.cursor) == [40, 40, 40]
    resumed.close()
    meta = open_dataset(path).meta
    assert meta["frames"] == 120 and meta["status"] == "complete"
    with h5py.File(path, "r", locking=False) as f:  # the loose counters are right again
        assert f.attrs["frames"] == 120 and read_commit(f.attrs)["seq"] > 3
    assert validate(path) == []


def _drops_pages(directory) -> bool:
    """Whether this filesystem drops clean pages on request (tmpfs keeps them: they
    are the file)."""
    probe = directory / "probe"
    probe.write_bytes(b"x" * 4 * mmap.PAGESIZE)
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    dropped = not resident_pages(probe).any()
    probe.unlink()
    return dropped


@pytest.fixture
def drops_pages(tmp_path):
    if not hasattr(os, "posix_fadvise") or not _drops_pages(tmp_path):
        pytest.skip("this filesystem keeps written pages in memory (tmpfs)")


def test_drop_behind_keeps_every_page_outside_the_span(tmp_path, drops_pages):
    """Pages wholly inside the span leave the page cache (all but those sharing a
    large folio with the span's edges); no page outside it does."""
    mib, page, path = 1 << 20, mmap.PAGESIZE, tmp_path / "f"
    with path.open("wb") as fh:
        for _ in range(8):
            fh.write(os.urandom(mib))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        fsio.drop_behind(fd, mib + 1, 7 * mib - 1)
        kept = resident_pages(path)
        per_mib = mib // page
        assert kept[: per_mib + 1].all() and kept[7 * per_mib - 1 :].all()
        assert kept[per_mib : 7 * per_mib].mean() < 0.5
        fsio.drop_behind(fd, 0, 0)  # nothing
        assert (resident_pages(path) == kept).all()
    finally:
        os.close(fd)


def test_write_back_drops_the_chunks_the_last_one_wrote_out(tmp_path, monkeypatch, drops_pages):
    """Each write-back drops from the page cache what the one before it started writing
    out (the batches' chunks, once on the device): the dataset's frames do not pile up
    in memory, and read back intact."""
    make = env_factory("Pendulum-v1", 512, "native")
    with SyncCollector(make, frames_per_batch=51200, total_frames=4 * 51200) as c:
        batches = [b for b in c]  # 2.4 MB each
    monkeypatch.setattr(base, "WRITE_BACK_BYTES", 1)
    path = tmp_path / "d.h5"
    w = make_writer("hdf5", path, metadata=META, planned_steps=400).open()
    cached = []  # MB of the file in the page cache after each write-back
    for b in batches:
        w.append(b)
        w.commit()
        fd = os.open(w.path, os.O_RDONLY)  # what write_back started is on the device
        os.fsync(fd)
        os.close(fd)
        w.write_back()
        cached.append(resident_pages(w.path).sum() * mmap.PAGESIZE / 1e6)
    w.close()
    # a batch stays cached until the next write-back drops it (but for the pages
    # HDF5's metadata shares with it): about one batch is cached, not all of them
    mb = batches[0].bytes() / 1e6
    assert 0.9 * mb < cached[0] < 1.3 * mb, (mb, cached)
    assert all(c < 1.3 * mb for c in cached), (mb, cached)
    td = open_dataset(path).load()
    whole = torch.cat(batches, 1)
    for key in ("observation", ("next", "observation"), ("next", "reward"), "action"):
        assert torch.equal(torch.as_tensor(np.asarray(td.get(key))), whole.get(key)), key


def _read_all(path) -> None:
    """Read every dataset of the file whole (what a kill that broke an index breaks)."""
    names: list[str] = []
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None
        )
        for name in names:
            f[name][()]
    assert len(names) > 10


def test_a_kill_at_any_write_of_splitting_commits_or_of_closing_keeps_a_whole_commit(
    tmp_path, monkeypatch
):
    """Every chunk of a key is an entry of its chunk B-tree; ``chunk_frames=16``
    makes each batch of 8 lanes add about 16, so commits split nodes (the root's,
    then leaves'; some new nodes land in the episodes' first chunks, freed before
    the first commit: an order by level alone failed there), and closing flags
    the cut trajectories in chunks of several datasets. Every write the writer
    makes is recorded, and the file a kill just before each write of those
    commits and of closing would leave (the writes before it: a killed process's
    writes stay in the page cache) must read whole; every fifth one, and each of
    closing, must validate, with the frames of a whole commit, equal to those
    written. HDF5's own order wrote a split's parent before the new node it
    points to ("wrong B-tree signature"), and one flush wrote next/done and
    next/truncated of a cut in either order."""
    with SyncCollector(env_factory("Pendulum-v1", 8), frames_per_batch=200, total_frames=4000) as c:
        batches = list(c)
    writes: list[tuple[int, bytes]] = []
    real = hdf5_file._pwrite

    def recording(fd, data, at):
        writes.append((at, bytes(data)))
        real(fd, data, at)

    monkeypatch.setattr(hdf5_file, "_pwrite", recording)
    path = tmp_path / "split.h5"
    w = make_writer("hdf5", path, metadata=META, chunk_frames=16).open()
    commits = []  # (writes made when the commit returned, frames it counted)
    for b in batches:
        w.append(b)
        w.commit()
        commits.append((len(writes), w.frames))
    w.close()
    monkeypatch.undo()
    with h5py.File(path, "r") as f:
        obs = f["observation"][()]

    seen, splits = set(), []
    for i in range(1, len(commits)):
        start, end = commits[i - 1][0], commits[i][0]
        if {at for at, data in writes[start:end] if data[:4] == b"TREE"} - seen:
            splits.append(i)
        seen |= {at for at, data in writes[:end] if data[:4] == b"TREE"}
    assert len(splits) >= 3, splits  # the root's split, and leaves'
    closing = range(commits[-1][0], len(writes) + 1)
    points = [k for i in splits for k in range(commits[i - 1][0], commits[i][0])]
    disk, done = bytearray(max(at + len(data) for at, data in writes)), 0
    image = tmp_path / "killed.h5"
    for n, k in enumerate([*points, *closing]):
        for at, data in writes[done:k] if k > done else ():
            disk[at : at + len(data)] = data
        if k < done:  # back to an earlier point: rebuilt
            disk[:] = bytes(len(disk))
            for at, data in writes[:k]:
                disk[at : at + len(data)] = data
        done = k
        image.write_bytes(disk)
        _read_all(image)
        if n % 5 and k not in closing:
            continue
        assert validate(image) == [], k
        frames = read_meta(image)["frames"]
        assert frames in {n for _, n in commits}, k
        with h5py.File(image, "r") as f:
            np.testing.assert_array_equal(f["observation"][:, : frames // 8], obs[:, : frames // 8])


TRAJ = "collector/traj_ids"


@pytest.fixture(scope="module")
def pendulum():
    with SyncCollector(env_factory("Pendulum-v1", 8), frames_per_batch=200, total_frames=2400) as c:
        return list(c)


@pytest.mark.skipif(not hdf5_file.OFD_LOCKS, reason="no F_OFD_SETLK here")
def test_an_open_is_no_snapshot_and_each_live_read_is_of_one_commit(tmp_path, pendulum):
    """Durability D22. HDF5 reads the superblock's end of allocation when it opens a
    file and the chunk index when a read first needs it, so a reader that opened
    the file before a commit reads index nodes that point past its end ("addr
    overflow"); so does a new open while the older one is open (HDF5 shares the
    older one's). A LiveFile opened before the commit reads it whole: the commit
    clock moved, so it opens the file again, through a file object of its own."""
    path = tmp_path / "live.h5"
    w = make_writer("hdf5", path, metadata=META, chunk_frames=16).open()  # many chunks
    w.append(pendulum[0])
    w.commit()
    stale = fresh = 0
    for batch in pendulum[1:]:
        plain = h5py.File(path, "r", locking=False)
        assert plain[TRAJ].shape[0] == 8  # the superblock and the dataset's header read
        live = LiveFile(path)
        live.read(lambda f: f[TRAJ].shape)
        w.append(batch)
        w.commit()  # new chunks, index nodes rewritten (some split)
        try:
            plain[TRAJ][()]
        except OSError as exc:
            assert "addr overflow" in str(exc)
            stale += 1
        try:
            with h5py.File(path, "r", locking=False) as again:
                again[TRAJ][()]
        except OSError:
            fresh += 1
        plain.close()
        with live:
            np.testing.assert_array_equal(LiveArray(live, TRAJ)[()], w._read(TRAJ))
            assert live.read(lambda f: file_meta(f.attrs)[0]["frames"]) == w.frames
    w.close()
    assert stale and fresh, (stale, fresh)  # the cause, seen


def test_a_read_that_a_commit_raced_is_read_again_from_a_new_open(tmp_path, pendulum):
    path = tmp_path / "live.h5"
    w = make_writer("hdf5", path, metadata=META, chunk_frames=16).open()
    w.append(pendulum[0])
    w.commit()
    opens = []

    def read(f):
        opens.append(f)
        if len(opens) == 1:  # a commit while the first read goes on
            w.append(pendulum[1])
            w.commit()
        return f[TRAJ][()], file_meta(f.attrs)[0]["frames"]

    with LiveFile(path) as live:
        traj, frames = live.read(read)
    if hdf5_file.OFD_LOCKS:
        assert len(opens) == 2 and opens[0] is not opens[1]
        assert frames == w.frames == 400
        np.testing.assert_array_equal(traj, w._read(TRAJ))
    w.close()
    np.testing.assert_array_equal(read_array(path, TRAJ), np.asarray(traj)[:, : w.steps])


def test_live_arrays_slice_like_h5py_in_pieces_of_one_commit(tmp_path, monkeypatch):
    path = tmp_path / "x.h5"
    data = np.arange(5 * 37 * 3, dtype=np.float32).reshape(5, 37, 3)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(2, 4, 3), maxshape=(None, None, 3))
    monkeypatch.setattr(hdf5, "PIECE_BYTES", 100)  # many pieces
    indexes = [
        (),
        (slice(None),),
        (2,),
        (-1, slice(3, 20)),
        (slice(1, 4), slice(None), 1),
        (Ellipsis, 0),
        (slice(None), 36),
        (slice(3, 3),),
        ([0, 2],),  # not a box: one read
        (slice(None, None, 2),),
    ]
    with LiveFile(path) as live:
        array = LiveArray(live, "x")
        assert (array.shape, array.dtype, array.ndim, len(array)) == ((5, 37, 3), data.dtype, 3, 5)
        for index in indexes:
            np.testing.assert_array_equal(array[index], data[index], err_msg=str(index))
        np.testing.assert_array_equal(np.asarray(array), data)
        live.reopen()  # (HDF5 opens a file for writing only where no open reads it)
        with h5py.File(path, "r+") as f:
            f["x"].resize(20, axis=1)  # cut, as closing cuts the steps allocated ahead
        tail = array[:, 15:]  # the extent it was got with; past the dataset's now: fill
        np.testing.assert_array_equal(tail[:, :5], data[:, 15:20])
        assert not tail[:, 5:].any()
    np.testing.assert_array_equal(read_array(path, "x"), data[:, :20])


def test_pieces_cover_the_box_once_within_the_limit():
    rng = np.random.default_rng(0)
    for _ in range(200):
        shape = tuple(int(n) for n in rng.integers(1, 9, size=rng.integers(1, 4)))
        index = tuple(slice(int(rng.integers(0, n)), None) for n in shape)
        box, _ = basic_box(index, shape)
        limit = int(rng.integers(1, 64))
        chunks = tuple(int(rng.integers(1, 4)) for _ in shape)
        seen = np.zeros(shape, np.int64)
        for piece in pieces(box, 1, chunks, limit):
            size = math.prod(b - a for a, b in piece)
            assert size <= limit or size == 1
            seen[tuple(slice(a, b) for a, b in piece)] += 1
        expected = np.zeros(shape, np.int64)
        expected[index] = 1
        np.testing.assert_array_equal(seen, expected)
    assert basic_box((1, [0, 1]), (3, 3)) is None and basic_box((5,), (3,)) is None


def test_a_merge_s_virtual_datasets_read_through_the_same_readers(tmp_path, batches):
    """A file no run writes is opened by its name (HDF5 opens the shards a merge's
    virtual datasets read with the driver that opened the merge: a file object
    opened none, and crashed)."""
    from collect_cli.ops.merge import merge

    shards = []
    for name in ("a", "b"):
        w = make_writer("hdf5", tmp_path / f"{name}.h5", metadata=META).open()
        for batch in batches:
            w.append(batch)
        w.close()
        shards.append(tmp_path / f"{name}.h5")
    merged = tmp_path / "merged.h5"
    merge(shards, merged)
    with h5py.File(merged, "r") as f:
        assert f["observation"].is_virtual
        expected = f["observation"][()]
    assert validate(merged) == []
    np.testing.assert_array_equal(read_array(merged, "observation"), expected)
