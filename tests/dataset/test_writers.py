"""The Writer contract, checked identically on every backend."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from collect_cli import dataformat as fmt
from collect_cli.collectors import SyncCollector
from collect_cli.dataformat import FORMAT_VERSION, MASK_KEY
from collect_cli.dataset import check_output, make_writer, open_dataset
from collect_cli.envs import env_factory
from collect_cli.errors import OutputError
from tests.helpers import assert_consistent, assert_split_on_done, write_preempted
from tests.support.cli_runner import out_path


def write(path, backend, batches, planned=None, status="complete", **kw):
    w = make_writer(backend, path, metadata={"env_id": "X"}, planned_steps=planned, **kw).open()
    for b in batches:
        w.append(b)
        w.commit()
    w.close(status)
    return w


@pytest.fixture(scope="module")
def batches():
    with SyncCollector(env_factory("CartPole-v1", 3), frames_per_batch=60, total_frames=600) as c:
        return [b for b in c]


@pytest.mark.parametrize("planned", [200, None, 50])
def test_roundtrip_values(tmp_path, backend, batches, planned):
    path = out_path(tmp_path, backend)
    write(path, backend, batches, planned=planned)
    td = open_dataset(path).load()
    whole = torch.cat(batches, dim=1)
    # the end of the run cuts each lane's running trajectory: flagged like a truncation
    cut = ~whole["next", "done"][:, -1, 0]
    assert cut.any()
    for flag in ("done", "truncated"):
        whole["next", flag][cut, -1] = True
    for key in whole.keys(True, True):
        got = td.get(key)
        assert got.shape == whole.get(key).shape, key
        assert torch.equal(torch.as_tensor(np.asarray(got)), whole.get(key)), key


def test_episodes_match_frames(tmp_path, backend, batches):
    path = out_path(tmp_path, backend)
    write(path, backend, batches)
    ds = open_dataset(path)
    ep = ds.episodes()
    traj, rew = ds.array("collector/traj_ids"), ds.array("next/reward")[..., 0]
    assert len(np.unique(ep["traj_id"])) == len(ep["traj_id"]) == len(np.unique(traj))
    assert ep["length"].sum() == traj.size
    for i in range(len(ep["traj_id"])):
        lane, s, n = ep["lane"][i], ep["start"][i], ep["length"][i]
        assert (traj[lane, s : s + n] == ep["traj_id"][i]).all()
        assert np.isclose(rew[lane, s : s + n].sum(), ep["return"][i])
    # incomplete episodes are the running tails: one per lane not ending on a done frame
    last_done = torch.cat(batches, dim=1)["next", "done"][:, -1, 0].numpy()
    assert (~ep["complete"]).sum() == (~last_done).sum() > 0
    assert assert_split_on_done(path) == len(ep["traj_id"])
    assert not ep["terminated"][~ep["complete"]].any()
    assert ds.meta["episodes"] == len(ep["traj_id"])


def test_metadata_and_status(tmp_path, backend, batches):
    path = out_path(tmp_path, backend)
    write(path, backend, batches[:2], status="interrupted")
    meta = open_dataset(path).meta
    assert meta["status"] == "interrupted"
    assert meta["frames"] == 2 * batches[0].numel()
    assert meta["env_id"] == "X" and meta["format_version"] == FORMAT_VERSION == 3
    assert meta["start_time"] and meta["end_time"]


def test_commit_makes_data_visible_while_running(tmp_path, backend, batches):
    path = out_path(tmp_path, backend)
    w = make_writer(backend, path, metadata={}, planned_steps=500).open()
    w.append(batches[0])
    w.commit()
    meta = open_dataset(path).meta
    assert meta["status"] == "running" and meta["frames"] == batches[0].numel()
    w.close()


def test_a_commit_when_due_waits_for_the_commit_interval(tmp_path, backend, batches):
    """``commit(when_due=True)`` commits the first batch at once (publishing the
    dataset), then only once ``commit_interval`` seconds have passed; a plain
    ``commit()`` and ``close`` commit whatever was appended."""
    path = out_path(tmp_path, backend)
    meta = {"env_id": "CartPole-v1", "config": "env: CartPole"}
    w = make_writer(backend, path, metadata=meta, commit_interval=3600).open()
    w.append(batches[0])
    assert w.commit(when_due=True)
    for batch in batches[1:3]:
        w.append(batch)
        assert not w.commit(when_due=True)
    assert open_dataset(path).meta["frames"] == batches[0].numel()  # on disk: the first
    assert w.commit()
    assert open_dataset(path).meta["frames"] == 3 * batches[0].numel()
    w.commit_interval = 0.0
    w.append(batches[3])
    assert w.commit(when_due=True)
    w.append(batches[4])
    w.commit_interval = 3600
    assert not w.commit(when_due=True)
    w.close()
    meta = assert_consistent(path)
    assert (meta["status"], meta["frames"]) == ("complete", 5 * batches[0].numel())


@pytest.mark.parametrize("planned", [None, 500])
def test_a_running_dataset_may_hold_steps_ahead_and_a_complete_one_holds_its_own(
    tmp_path, backend, batches, planned
):
    path = out_path(tmp_path, backend)
    w = make_writer(backend, path, metadata={}, planned_steps=planned).open()
    for batch in batches[:3]:
        w.append(batch)
        w.commit()
        ds = open_dataset(path)
        steps = ds.meta["steps"]
        mask, traj = ds.array("collector/mask"), ds.array("collector/traj_ids")
        assert mask.shape[1] == traj.shape[1] >= max(steps, planned or 0)
        assert mask[:, :steps].all() and not mask[:, steps:].any()  # allocated, not written
        assert (traj[:, steps:] == -1).all()
    w.close("complete")
    ds = open_dataset(path)
    assert ds.meta["steps"] == 3 * batches[0].shape[1]
    frames = {shape[1] for key, shape, _ in ds.stored() if not fmt.is_episodes(key)}
    assert frames == {ds.meta["steps"]}


def test_an_episode_after_padding_starts_at_its_first_frame(tmp_path, backend):
    # a preempted worker pads its lanes' ends: the next batch starts after the padding
    path = write_preempted(out_path(tmp_path, backend), backend, {}, 5, 40, 400)
    ds = open_dataset(path)
    rows, traj, mask = ds.episodes(), ds.array("collector/traj_ids"), ds.array("collector/mask")
    after_padding = 0
    for traj_id, lane, start in zip(rows["traj_id"], rows["lane"], rows["start"], strict=True):
        assert start == np.flatnonzero(traj[lane] == traj_id)[0]  # its first frame
        after_padding += bool(start > 0 and not mask[lane, start - 1])
    assert after_padding > 0  # the case happened


def test_overwrite_protection(tmp_path, backend, batches):
    path = out_path(tmp_path, backend)
    write(path, backend, batches[:1])
    with pytest.raises(OutputError, match="already exists"):
        make_writer(backend, path, metadata={}).open()
    write(path, backend, batches[:2], overwrite=True)
    assert open_dataset(path).meta["frames"] == 2 * batches[0].numel()


def test_unwritable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputError, match="not writable"):
        check_output(blocker / "sub" / "ds.h5", overwrite=False)


def test_hdf5_compression(tmp_path, batches):
    import h5py

    path = tmp_path / "c.h5"
    write(path, "hdf5", batches, compression="gzip", chunk_frames=64)
    with h5py.File(path) as f:
        assert f["observation"].compression == "gzip"
        assert f["observation"].chunks == (3, 20, 4)  # a whole batch: 3 lanes x 20 steps <= 64
    stored = open_dataset(path).array("observation")
    np.testing.assert_array_equal(stored, torch.cat(batches, 1)["observation"].numpy())


def test_not_a_dataset(tmp_path):
    with pytest.raises(OutputError, match="no dataset"):
        open_dataset(tmp_path / "missing.h5")
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputError, match="not a dataset"):
        open_dataset(tmp_path / "d")
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(OutputError, match="not a readable HDF5"):
        open_dataset(tmp_path / "junk.h5")


def test_dataset_appears_at_its_first_commit(tmp_path, backend, batches):
    """Built under ``.<name>.creating-<pid>`` until the first commit renames it into
    place: a kill before then leaves nothing half-made at ``path``."""
    path = out_path(tmp_path, backend)
    w = make_writer(backend, path, metadata={}, planned_steps=500).open()
    staging = tmp_path / f".{path.name}.creating-{os.getpid()}"
    assert not path.exists() and staging.exists()
    w.append(batches[0])
    assert not path.exists()
    w.commit()
    assert path.exists() and not staging.exists()
    assert open_dataset(path).meta["frames"] == batches[0].numel()
    w.append(batches[1])
    w.commit()
    w.close()
    assert open_dataset(path).meta["frames"] == 2 * batches[0].numel()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_closing_an_empty_dataset_publishes_it(tmp_path, backend):
    path = out_path(tmp_path, backend)
    make_writer(backend, path, metadata={}).open().close("interrupted")
    meta = open_dataset(path).meta
    assert meta["status"] == "interrupted" and meta["frames"] == 0 and meta["end_time"]


def test_a_missing_dataset_names_the_run_that_has_not_committed_it(tmp_path, backend):
    path = out_path(tmp_path, backend)
    with pytest.raises(OutputError, match=r"^no dataset at '[^']*'$"):
        open_dataset(path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = tmp_path / f".{path.name}.creating-{dead.pid}"
    leftover.write_bytes(b"half a dataset")
    with pytest.raises(OutputError) as killed:
        open_dataset(path)
    assert str(killed.value) == (
        f"no dataset at {str(path)!r}: the run with pid {dead.pid} was killed before its "
        f"first commit, so nothing was saved (the next run to it removes {leftover.name})"
    )
    leftover.rename(tmp_path / f".{path.name}.creating-{os.getppid()}")
    with pytest.raises(OutputError, match=f"yet: the run with pid {os.getppid()} is creating it"):
        open_dataset(path)


def test_open_removes_what_dead_runs_left_before_their_first_commit(tmp_path, backend):
    path = out_path(tmp_path, backend)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftovers = {
        "dead": tmp_path / f".{path.name}.creating-{dead.pid}",
        "dead_resize": tmp_path / f".{path.name}.creating-{dead.pid}.resize",
        "alive": tmp_path / f".{path.name}.creating-{os.getppid()}",
        "other": tmp_path / f".other.creating-{dead.pid}",
    }
    for name, leftover in leftovers.items():
        if name.endswith("resize"):
            leftover.mkdir()
            (leftover / "x.memmap").write_bytes(b"x")
        else:
            leftover.write_bytes(b"half a dataset")
    make_writer(backend, path, metadata={}).open().close()
    left = {name for name, p in leftovers.items() if p.exists()}
    assert left == {"alive", "other"}  # a live run's own, and another dataset's
    assert open_dataset(path).meta["status"] == "complete"


def test_write_back_starts_writing_committed_frames_and_keeps_the_dataset(
    tmp_path, backend, batches, monkeypatch
):
    """A writer on its own thread calls ``write_back`` after each commit: once
    ``WRITE_BACK_BYTES`` were appended it asks the kernel to write them out (the
    syscall really runs: on a closed descriptor it fails), and the dataset is intact."""
    from collect_cli.dataset import fsio
    from collect_cli.dataset import writer as base

    r, w_fd = os.pipe()
    fsio.start_write_back(r)  # not a file: nothing to write, no error
    os.close(r)
    os.close(w_fd)
    with pytest.raises(OSError):
        fsio.start_write_back(r)

    monkeypatch.setattr(base, "WRITE_BACK_BYTES", batches[0].bytes() + 1)
    path = out_path(tmp_path, backend)
    w = make_writer(backend, path, metadata={}, planned_steps=500).open()
    unsynced = []
    for b in batches[:4]:
        w.append(b)
        w.commit()
        w.write_back()
        unsynced.append(w._unsynced)
    w.close()
    assert unsynced[0] > 0 and unsynced[1] == 0 and unsynced[2] > 0 and unsynced[3] == 0
    td = open_dataset(path).load()
    assert torch.equal(td["observation"][:, :60], torch.cat(batches[:4], 1)["observation"][:, :60])


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((125, 8), torch.int64),  # tiny: numpy's copy
        ((100, 1024, 3), torch.float32),  # small frames, a large leaf: torch's copy
        ((100, 256, 1), torch.bool),
        ((100, 1024, 1), torch.bool),  # torch's copy, as a 2-d transpose
        ((100, 1024, 1, 1), torch.float32),
        ((4, 3, 96, 96, 3), torch.uint8),  # frames of 27 KiB: numpy's copy
        ((100, 1024, 2), torch.uint32),  # numpy's copy (torch has few uint32 kernels)
    ],
)
def test_lane_major_copies_time_major_buffers_exactly(shape, dtype):
    """The writers' leaves are C-contiguous [lanes, time] copies of the collectors'
    time-major buffers, whichever library copies them: whole (``lane_major``), a
    chunk's lanes at a time (HDF5: ``contiguous``) or into a file's map (memmap:
    ``copy_into``)."""
    from collect_cli.dataset.arrays import contiguous, copy_into, lane_major

    g = torch.Generator().manual_seed(0)
    buffer = (torch.rand(shape, generator=g) * 200).to(dtype)  # [time, lanes, ...]
    view = buffer.transpose(0, 1)
    got = lane_major(view)
    assert got.flags["C_CONTIGUOUS"] and got.shape == tuple(view.shape)
    np.testing.assert_array_equal(got, view.numpy())
    assert not np.shares_memory(got, buffer.numpy())
    assert np.shares_memory(lane_major(buffer), buffer.numpy())  # contiguous: no copy
    half = view.numpy()[: len(view) // 2]
    piece = contiguous(half)
    assert piece.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(piece, half)
    into = np.zeros((len(view) + 2, *view.shape[1:]), view.numpy().dtype)
    copy_into(into[1:-1], view.numpy())
    np.testing.assert_array_equal(into[1:-1], view.numpy())
    assert not into[0].any() and not into[-1].any()


def test_contiguous_copies_text_with_numpy():
    from collect_cli.dataset.arrays import contiguous

    text = np.array([[b"ab", b"c"], [b"", b"def"]] * 8192, "S3").T  # 96 KiB, not contiguous
    got = contiguous(text)
    assert got.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(got, text)


def test_leaf_items_give_every_leaf_lane_major_and_the_tracked_ones_contiguous():
    from collect_cli.dataset.arrays import leaf_items
    from collect_cli.dataset.episodes import TRACKED_KEYS

    with SyncCollector(
        env_factory("Pendulum-v1", 3), frames_per_batch=30, return_same_td=True
    ) as collector:
        batch = collector.rollout()  # a [lanes, time] view of the time-major buffer
    items = leaf_items(batch)
    assert items[-1][0] == MASK_KEY  # the mask last (durability D5)
    assert {key for key, _ in items} == {
        k if isinstance(k, tuple) else (k,) for k in batch.keys(True, True)
    }
    for key, array in items:
        np.testing.assert_array_equal(array, batch.get(key).numpy())
        assert array.shape[:2] == (3, 10)
        if key in TRACKED_KEYS:
            assert array.flags["C_CONTIGUOUS"], key
        else:  # a view: the backends copy it piece by piece
            assert np.shares_memory(array, batch.get(key).numpy()), key
