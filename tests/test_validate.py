"""``rlcollect validate``: sound datasets pass, damaged ones fail with what is wrong."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from collect_cli.validate import validate
from tests.conftest import out_path


@pytest.fixture
def dataset(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli("run", "env=CartPole", "total_frames=3000", f"writer={backend}", f"out={out}")
    assert res.code == 0, res.stderr
    return out


def test_sound_dataset_passes(cli, dataset):
    assert validate(dataset) == []
    res = cli("validate", str(dataset))
    assert res.code == 0 and res.stdout.startswith("ok:")


def test_truncated_file_fails(cli, tmp_path):
    out = tmp_path / "t.h5"
    assert cli("run", "total_frames=20000", f"out={out}").code == 0
    size = out.stat().st_size
    with open(out, "r+b") as f:
        f.truncate(size // 2)
    res = cli("validate", str(out))
    assert res.code == 1
    assert "unreadable" in res.stdout or "truncated" in res.stdout


def test_missing_key_fails(cli, dataset, backend):
    if backend == "hdf5":
        with h5py.File(dataset, "r+") as f:
            del f["next/reward"]
    else:
        (dataset / "next" / "reward.memmap").unlink()
        meta_file = dataset / "next" / "meta.json"
        meta = json.loads(meta_file.read_text())
        del meta["reward"]
        meta_file.write_text(json.dumps(meta))
    res = cli("validate", str(dataset))
    assert res.code == 1
    assert "missing key 'next/reward'" in res.stdout


def test_inconsistent_traj_ids_fail(cli, dataset, backend):
    if backend == "hdf5":
        with h5py.File(dataset, "r+") as f:
            traj = f["collector/traj_ids"]
            row = traj[0]
            done = f["next/done"][0, :, 0]
            t = int(np.flatnonzero(~done)[3])  # inside an episode
            row[t + 1] = row[t] + 1000
            traj[0] = row
    else:
        from tensordict import TensorDict

        td = TensorDict.load_memmap(dataset)
        done = td["next", "done"][0, :, 0].numpy()
        t = int(np.flatnonzero(~done)[3])
        td["collector", "traj_ids"][0, t + 1] += 1000
    res = cli("validate", str(dataset))
    assert res.code == 1
    assert "traj_ids out of order in lane 0" in res.stdout


@pytest.mark.parametrize(
    ("column", "problem"),
    [("return", "episodes/return disagrees with the frames' rewards"),
     ("start", "episodes/start disagrees with the frames")],
)  # fmt: skip
def test_episode_table_mismatch_fails(dataset, backend, column, problem):
    assert validate(dataset) == []
    if backend == "hdf5":
        with h5py.File(dataset, "r+") as f:
            f[f"episodes/{column}"][0] += 1
    else:
        from tensordict import TensorDict

        TensorDict.load_memmap(dataset)["episodes", column][0] += 1
    assert problem in validate(dataset)


def test_missing_path_is_usage_error(cli, tmp_path):
    res = cli("validate", str(tmp_path / "nope.h5"))
    assert res.code == 2 and "no dataset" in res.stderr


def unflag_cuts(dataset, backend, version: int) -> int:
    """Clear next/done and next/truncated at the end of the cut trajectories, as
    rlcollect wrote them before format version 2, and record ``version``."""
    from tensordict import TensorDict

    if backend == "hdf5":
        f = h5py.File(dataset, "r+")
        ep = {k: f[f"episodes/{k}"][()] for k in ("lane", "start", "length", "complete")}
        done, trunc = f["next/done"], f["next/truncated"]
    else:
        td = TensorDict.load_memmap(dataset)
        ep = {k: td["episodes", k].numpy() for k in ("lane", "start", "length", "complete")}
        done, trunc = td["next", "done"], td["next", "truncated"]
    cut = np.flatnonzero(~ep["complete"])
    for row in cut:
        lane, last = int(ep["lane"][row]), int(ep["start"][row] + ep["length"][row] - 1)
        assert bool(trunc[lane, last, 0]) and bool(done[lane, last, 0])  # flagged as written
        done[lane, last, 0] = False
        trunc[lane, last, 0] = False
    if backend == "hdf5":
        f.attrs["format_version"] = version
        f.close()
    else:
        meta_file = dataset / "rlcollect.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "format_version": version}))
    return len(cut)


def test_unflagged_cuts_fail_from_format_version_2(dataset, backend):
    """Every trajectory the dataset cut ends with next/truncated and next/done;
    datasets of format version 1, written before that rule, are read as sound."""
    assert unflag_cuts(dataset, backend, 2) > 0
    problems = validate(dataset)
    assert any("cut by the dataset end without next/truncated" in p for p in problems), problems


def test_format_version_1_datasets_keep_their_rules(dataset, backend):
    assert unflag_cuts(dataset, backend, 1) > 0
    assert validate(dataset) == []


def test_text_stored_as_numbers_fails(cli, dataset, backend):
    """The metadata says which keys are Text: their arrays must hold bytes."""
    text = {"type": "Text", "max_length": 4, "min_length": 1, "charset": "ab", "width": 4}
    if backend == "hdf5":
        with h5py.File(dataset, "r+") as f:
            f.attrs["observation_space"] = json.dumps(text)
    else:
        meta_file = dataset / "rlcollect.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "observation_space": text}))
    res = cli("validate", str(dataset))
    assert res.code == 1
    assert "'observation' is Text in the observation space but stored as float32" in res.stdout


@pytest.mark.parametrize("backend", ["hdf5"])
def test_a_cut_half_flagged_by_a_killed_close_passes_only_as_truncated_at_a_lane_end(dataset):
    """Closing flags each lane's cut trajectory, next/truncated first, then next/done:
    a kill between the two leaves a running dataset whose lane ends have the first
    alone, which resume=true completes. Nothing else half-flagged passes."""
    from collect_cli.validate import check
    from collect_cli.writers.hdf5 import RootAttrs

    with h5py.File(dataset, "r+") as f:
        RootAttrs(f).store({"status": "running"})
        ep = {k: f[f"episodes/{k}"][()] for k in ("lane", "start", "length", "complete")}
        cut = np.flatnonzero(~ep["complete"])
        ends = [(int(ep["lane"][r]), int(ep["start"][r] + ep["length"][r] - 1)) for r in cut]
        for lane, t in ends:
            f["next/done"][lane, t, 0] = False  # next/truncated written, next/done not yet
        done = f["next/done"][()]
    problems, notes = check(dataset)
    assert problems == [] and any(f"{len(cut)} trajectories cut by the kill" in n for n in notes)

    lane, t = ends[0]
    with h5py.File(dataset, "r+") as f:  # done without truncated: never written so
        f["next/done"][lane, t, 0], f["next/truncated"][lane, t, 0] = True, False
    assert "next/done differs from next/terminated | next/truncated" in validate(dataset)
    with h5py.File(dataset, "r+") as f:
        f["next/done"][lane, t, 0], f["next/truncated"][lane, t, 0] = False, True
        t = int(np.flatnonzero(done[lane, :t, 0])[-1]) - 1  # inside an earlier episode
        assert not done[lane, t, 0]
        f["next/truncated"][lane, t, 0] = True  # as if cut: but not the lane's last trajectory
    assert "next/done differs from next/terminated | next/truncated" in validate(dataset)
