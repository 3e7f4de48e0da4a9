"""``rlcollect validate``: sound datasets pass, damaged ones fail with what is wrong."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from collect_cli.dataset import open_dataset
from collect_cli.ops.validate import check, validate
from tests.helpers import write_preempted
from tests.support.cli_runner import out_path, run_cli

DONE_DIFFERS = "next/done differs from next/terminated | next/truncated"


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
    assert any(p.startswith(problem) for p in validate(dataset)), validate(dataset)


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
    from collect_cli.dataset.hdf5.attrs import RootAttrs
    from collect_cli.ops.validate import check

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
    assert any(p.startswith(DONE_DIFFERS) for p in validate(dataset))
    with h5py.File(dataset, "r+") as f:
        f["next/done"][lane, t, 0], f["next/truncated"][lane, t, 0] = False, True
        t = int(np.flatnonzero(done[lane, :t, 0])[-1]) - 1  # inside an earlier episode
        assert not done[lane, t, 0]
        f["next/truncated"][lane, t, 0] = True  # as if cut: but not the lane's last trajectory
    assert any(p.startswith(DONE_DIFFERS) for p in validate(dataset))


# -- planted edits (issue 61): each makes validate fail, naming what and where -------------
@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``made(backend, *overrides)``: a pristine dataset of a real ``rlcollect run``,
    made once per module (tests edit copies: :func:`copied`)."""
    cache = {}

    def make(backend: str, *overrides: str) -> Path:
        key = (backend, *overrides)
        if key not in cache:
            out = out_path(tmp_path_factory.mktemp("made"), backend)
            given = {o.split("=")[0] for o in overrides}
            frames = () if "total_frames" in given else ("total_frames=3000",)
            args = (*frames, f"writer={backend}", "progress=none", *overrides)
            res = run_cli("run", *args, f"out={out}")
            assert res.code == 0, res.stderr
            cache[key] = out
        return cache[key]

    return make


@pytest.fixture
def copied(made, tmp_path, backend):
    """``copied(*overrides)``: a copy of ``made(backend, *overrides)`` to edit."""

    def copy(*overrides: str) -> Path:
        src, dst = made(backend, *overrides), out_path(tmp_path, backend, "edited")
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
        return dst

    return copy


@contextlib.contextmanager
def opened(dataset: Path, backend: str):
    """``get(key)``: the dataset's array ``key`` ("next/reward"), edited in place: an
    h5py dataset, or a numpy view of the memmap file. Closed (written) on exit."""
    if backend == "hdf5":
        with h5py.File(dataset, "r+") as f:
            yield lambda key: f[key]
    else:
        from tensordict import TensorDict

        td = TensorDict.load_memmap(dataset)
        yield lambda key: td.get(tuple(key.split("/"))).numpy()
        del td


def rows_of(get) -> dict[str, np.ndarray]:
    return {c: np.array(get(f"episodes/{c}")[()]) for c in ("traj_id", "lane", "start",
            "length", "complete", "terminated", "truncated")}  # fmt: skip


def starts_with(problems: list[str], text: str) -> bool:
    return any(p.startswith(text) for p in problems)


PENDULUM, CARTPOLE = ("env=Pendulum",), ("env=CartPole",)
MULTISTEP = ("env=Pendulum", "postproc=multistep")
NOISE = ("env=Pendulum", "policy.noise=gaussian")


@pytest.mark.parametrize("overrides", [PENDULUM, CARTPOLE, MULTISTEP, NOISE])
def test_unedited_datasets_pass(cli, made, backend, overrides):
    dataset = made(backend, *overrides)
    assert check(dataset) == ([], [])
    res = cli("validate", str(dataset))
    assert res.code == 0 and res.stdout.startswith("ok:") and res.stderr == ""


@pytest.mark.parametrize("flag", ["terminated", "done", "truncated"])
@pytest.mark.parametrize("where", ["inside", "first"])
def test_a_root_flag_set_fails(cli, copied, backend, flag, where):
    """The flags of s_t itself (root ``done``/``terminated``/``truncated``) equal the
    step before's next/ flags, which are False inside a trajectory, and are False
    after a reset: the collectors write them all False."""
    dataset = copied(*PENDULUM)
    with opened(dataset, backend) as get:
        rows = rows_of(get)
        second = np.flatnonzero(rows["start"] > 0)[0]  # an episode after a reset
        lane = int(rows["lane"][second])
        t = int(rows["start"][second]) + (40 if where == "inside" else 0)
        get(flag)[lane, t, 0] = True
    expected = f"'{flag}' (the state's own flag) is True at lane {lane} step {t} (1 frame)"
    assert starts_with(validate(dataset), expected), validate(dataset)
    res = cli("validate", str(dataset))
    assert res.code == 1 and expected in res.stdout


def test_a_flipped_complete_flag_fails(copied, backend):
    """A time-limit ending (complete, truncated) flipped to a cut, or a cut flipped
    to complete: ``complete`` is True exactly for an env ending, which says which flag."""
    dataset = copied(*PENDULUM)
    with opened(dataset, backend) as get:
        rows = rows_of(get)
        row = int(np.flatnonzero(rows["complete"] & rows["truncated"])[0])
        get("episodes/complete")[row] = False
    tid, lane = rows["traj_id"][row], rows["lane"][row]
    expected = (
        f"episodes/complete disagrees with episodes/terminated|truncated (row {row}, "
        f"traj_id {tid}, lane {lane}: complete False, terminated False, truncated True)"
    )
    assert validate(dataset)[0].startswith(expected), validate(dataset)

    cut = int(np.flatnonzero(~rows["complete"])[0])
    with opened(dataset, backend) as get:
        get("episodes/complete")[row] = True
        get("episodes/complete")[cut] = True
    tid, lane = rows["traj_id"][cut], rows["lane"][cut]
    expected = (
        f"episodes/complete disagrees with episodes/terminated|truncated (row {cut}, "
        f"traj_id {tid}, lane {lane}: complete True, terminated False, truncated False)"
    )
    assert validate(dataset) == [
        f"episodes terminated/truncated disagree with the frames (row {cut}, traj_id {tid}, "
        f"lane {lane})",
        expected,
    ]


def test_an_env_ending_relabelled_as_a_cut_fails(copied, backend):
    """complete, terminated and truncated all rewritten as a cut's: a cut is never
    where the env terminated, nor (no resets between batches, no resume) before a
    lane's last trajectory."""
    dataset = copied(*PENDULUM)
    with opened(dataset, backend) as get:
        rows = rows_of(get)
        row = int(np.flatnonzero(rows["complete"])[0])
        for column in ("complete", "terminated", "truncated"):
            get(f"episodes/{column}")[row] = False
    end = rows["start"][row] + rows["length"][row] - 1
    expected = (
        f"episodes/complete is False for an episode the env ended (row {row}, traj_id "
        f"{rows['traj_id'][row]}, lane {rows['lane'][row]}: the dataset cuts only a lane's "
        f"last trajectory, and another follows this one after step {end})"
    )
    assert validate(dataset) == [expected]


def test_a_termination_relabelled_as_a_cut_fails(copied, backend):
    dataset = copied(*CARTPOLE)
    with opened(dataset, backend) as get:
        rows = rows_of(get)
        row = int(np.flatnonzero(rows["terminated"])[0])
        for column in ("complete", "terminated"):
            get(f"episodes/{column}")[row] = False
    end = rows["start"][row] + rows["length"][row] - 1
    expected = (
        f"episodes/complete is False for an episode the env ended (row {row}, traj_id "
        f"{rows['traj_id'][row]}, lane {rows['lane'][row]}: next/terminated at step {end})"
    )
    assert expected in validate(dataset), validate(dataset)


@pytest.mark.parametrize("overrides", [PENDULUM, MULTISTEP])
def test_a_next_observation_unlike_the_next_frame_fails(copied, backend, overrides):
    """Full layout: inside a trajectory, next/observation is a copy of the observation
    the next frame holds (``steps_to_next_obs`` frames on after multistep), bit for bit."""
    dataset = copied(*overrides)
    with opened(dataset, backend) as get:
        rows = rows_of(get)
        lane, start = int(rows["lane"][0]), int(rows["start"][0])
        t = start + 20
        nxt = get("next/observation")
        value = np.array(nxt[lane, t])
        value[0] = np.nextafter(value[0], np.float32(np.inf))  # one unit in the last place
        nxt[lane, t] = value
    expected = (
        f"'next/observation' differs from the next frame's 'observation' inside a trajectory "
        f"at lane {lane} step {t} (traj_id {rows['traj_id'][0]}; 1 frame)"
    )
    assert validate(dataset) == [expected]


def test_a_final_observation_is_not_compared(copied, backend):
    """At an episode's last step next/observation is its true final observation,
    which no frame holds (the next is a reset state): nothing to compare it with."""
    dataset = copied(*PENDULUM)
    with opened(dataset, backend) as get:
        rows = rows_of(get)
        row = int(np.flatnonzero(rows["complete"])[0])
        lane, end = int(rows["lane"][row]), int(rows["start"][row] + rows["length"][row] - 1)
        get("next/observation")[lane, end, 0] = 0.5
    assert validate(dataset) == []


@pytest.mark.parametrize("key", ["next/reward", "observation", "next/observation"])
def test_nan_fails(copied, backend, key):
    dataset = copied(*PENDULUM)
    with opened(dataset, backend) as get:
        get(key)[3, 7, 0] = np.nan
    assert starts_with(validate(dataset), f"NaN in {key!r} at lane 3 step 7 (1 frame)")


def test_a_reward_edited_by_a_thousandth_fails(copied, backend):
    """The return is the float64 sum of the stored rewards: it matches them to float64
    rounding (1e-8 of the sum of |reward|), not to 1e-5 of the return."""
    dataset = copied(*PENDULUM)
    with opened(dataset, backend) as get:
        rows = rows_of(get)
        lane, t = int(rows["lane"][0]), int(rows["start"][0]) + 3
        get("next/reward")[lane, t, 0] += 1e-3
    expected = "episodes/return disagrees with the frames' rewards (row 0, traj_id "
    assert validate(dataset)[0].startswith(f"{expected}{rows['traj_id'][0]}, lane {lane}: ")


@pytest.mark.parametrize(
    ("overrides", "value", "shown"), [(PENDULUM, 2.5, "[2.5]"), (CARTPOLE, 2, "2.0")]
)
def test_an_action_outside_the_action_space_fails(cli, copied, backend, overrides, value, shown):
    dataset = copied(*overrides)
    with opened(dataset, backend) as get:
        action = get("action")
        index = (0, 9) + (0,) * (len(action.shape) - 2)
        action[index] = value
    expected = f"'action' outside the action space at lane 0 step 9: {shown} (1 frame)"
    assert validate(dataset) == [expected]
    res = cli("validate", str(dataset))
    assert res.code == 1 and expected in res.stdout


def test_an_action_outside_the_action_space_is_a_note_under_exploration_noise(cli, copied, backend):
    dataset = copied(*NOISE)
    with opened(dataset, backend) as get:
        get("action")[0, 9, 0] = 2.5
    problems, notes = check(dataset)
    expected = "'action' outside the action space at lane 0 step 9: [2.5] (1 frame)"
    assert problems == [] and notes == [f"{expected}; policy.noise=gaussian was on"]
    res = cli("validate", str(dataset))
    assert res.code == 0 and expected in res.stderr


def test_actions_a_user_policy_returned_outside_the_space_are_a_note(cli, made, backend):
    """policy=python (torchscript, export): the user's code acts, and its actions are
    recorded as it returned them; the env clips them. Not damage: resume goes on."""
    dataset = made(backend, "env=Pendulum", "policy=python", "policy.target=toypolicies:beyond")
    problems, notes = check(dataset)
    assert problems == [] and len(notes) == 1
    assert "outside the action space" in notes[0] and "the policy's own code" in notes[0]
    res = cli("validate", str(dataset))
    assert res.code == 0 and "the policy's own code returned it" in res.stderr


def test_metadata_claiming_more_frames_than_held_fails(copied, backend):
    dataset = copied(*PENDULUM)
    if backend == "hdf5":
        from collect_cli.dataset.hdf5.attrs import COMMIT_SLOTS, commit_record, file_meta

        with h5py.File(dataset, "r+") as f:  # a whole commit record, as a commit writes it
            meta, seq = file_meta(f.attrs)
            record = commit_record(seq + 1, {**meta, "frames": meta["frames"] + 100})
            f.attrs[COMMIT_SLOTS[(seq + 1) % 2]] = record
    else:
        meta_file = dataset / "rlcollect.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "frames": meta["frames"] + 100}))
    assert validate(dataset) == ["3000 valid frames, metadata says 3100"]


def test_a_merged_dataset_of_runs_without_resets_at_episode_ends_passes(cli, tmp_path, backend):
    """A merge's metadata lacks reset_when_done: validate reads it from the config."""
    shards = [out_path(tmp_path, backend, f"s{i}") for i in range(2)]
    for i, shard in enumerate(shards):
        args = ("env=CartPole", "total_frames=2000", "reset_when_done=false", f"seed={i}")
        assert cli("run", *args, f"writer={backend}", f"out={shard}").code == 0
    merged = out_path(tmp_path, backend, "merged")
    assert cli("merge", *map(str, shards), "--out", str(merged)).code == 0
    assert validate(merged) == []


EDITS = {
    "root flag": lambda get, rows: get("terminated").__setitem__((2, 150, 0), True),
    "next observation": lambda get, rows: get("next/observation").__setitem__((5, 190, 1), 9.0),
    "traj order": lambda get, rows: get("collector/traj_ids").__setitem__((1, 120), 10**6),
    "reward": lambda get, rows: get("next/reward").__setitem__((6, 300, 0), 5.0),
}


@pytest.mark.parametrize("edit", [None, *EDITS])
def test_windows_of_one_step_find_the_same(copied, backend, monkeypatch, edit):
    """validate streams: the smallest windows (one lane, one step; HDF5: one chunk)
    carry what crosses their edges, and find what whole arrays show."""
    import collect_cli.ops.validate as module

    dataset = copied(*PENDULUM)
    if edit is not None:
        with opened(dataset, backend) as get:
            EDITS[edit](get, rows_of(get))
    whole = check(dataset)
    assert (whole[0] == []) == (edit is None)
    monkeypatch.setattr(module, "WINDOW_BYTES", 1)
    assert check(dataset) == whole


def test_reads_are_bounded_by_the_window(made, backend, monkeypatch):
    """No read takes a whole frame array: each is a window of WINDOW_BYTES or so."""
    import collect_cli.ops.validate as module
    from collect_cli.dataset import Dataset

    dataset = made(backend, *PENDULUM, "total_frames=20000")  # HDF5: 5 chunks a lane
    sizes: dict[str, int] = {}
    real = Dataset.reader

    class Traced:
        def __init__(self, key, array):
            self.key, self.array = key, array

        def __getattr__(self, name):
            return getattr(self.array, name)

        def __getitem__(self, index):
            out = np.asarray(self.array[index])
            sizes[self.key] = max(sizes.get(self.key, 0), out.nbytes)
            return out

    @contextlib.contextmanager
    def reader(self, by_lane=False):
        with real(self, by_lane) as read:
            yield lambda key: Traced(key, read(key))

    monkeypatch.setattr(Dataset, "reader", reader)
    monkeypatch.setattr(module, "WINDOW_BYTES", 4096)
    assert validate(dataset) == []
    whole = 20000 * 3 * 4  # the observation array's bytes
    assert sizes["observation"] and max(sizes.values()) <= whole // 4, sizes


NESTED = ("env=gym", "env.id=toyenvs:Nested-v0")


@pytest.mark.parametrize(
    ("key", "index", "value", "shown"),
    [("action/0", (1, 4), 4, "4.0"),  # Discrete(4)
     ("action/1", (1, 4, 2), -2.5, "[-2.0, 0.0, -2.5]"),  # Box(-2, 2, (3,))
     ("action/2", (1, 4, 1), 5, "[0.0, 5.0]")],  # MultiDiscrete([2, 5])
)  # fmt: skip
def test_a_nested_action_outside_its_leaf_space_fails(copied, backend, key, index, value, shown):
    dataset = copied(*NESTED)
    assert validate(dataset) == []
    with opened(dataset, backend) as get:
        leaf = get(key)
        row = np.array(leaf[index[:2]])
        row[index[2:]] = value
        if key == "action/1":
            row[:] = [-2.0, 0.0, -2.5]
        elif key == "action/2":
            row[0] = 0
        leaf[index[:2]] = row
    expected = f"{key!r} outside the action space at lane 1 step 4: {shown} (1 frame)"
    assert validate(dataset) == [expected]


def test_padding_inside_trajectories_in_windows_of_one_step(tmp_path, backend, monkeypatch):
    """A preempted multisync worker pads inside its lanes' trajectories: a frame's
    frame before is the lane's last valid one, in its window or an earlier one."""
    import collect_cli.ops.validate as module

    path = write_preempted(out_path(tmp_path, backend), backend, {"config": ""}, 7, 60, 300)
    ds = open_dataset(path)
    mask, traj = ds.array("collector/mask"), ds.array("collector/traj_ids")
    lane, t = next(
        (lane, t)
        for lane, t in zip(*np.nonzero(mask[:, 1:] & ~mask[:, :-1]), strict=True)
        if traj[lane, t + 1] == traj[lane, np.flatnonzero(mask[lane, : t + 1])[-1]]
    )  # padding at step t, inside a trajectory that goes on at t + 1
    before = int(np.flatnonzero(mask[lane, : t + 1])[-1])
    assert validate(path) == []
    monkeypatch.setattr(module, "WINDOW_BYTES", 1)
    assert validate(path) == []
    with opened(path, backend) as get:
        get("collector/traj_ids")[lane, t + 1] = 10**6
    expected = f"traj_ids out of order in lane {lane} at step {before}"
    assert validate(path)[0].startswith(expected), validate(path)
    monkeypatch.setattr(module, "WINDOW_BYTES", 8 << 20)
    assert validate(path)[0].startswith(expected)


def interrupted(dataset: Path, backend: str) -> None:
    """Record ``status: interrupted``, as a run stopped by a signal leaves it."""
    if backend == "hdf5":
        from collect_cli.dataset.hdf5.attrs import RootAttrs

        with h5py.File(dataset, "r+") as f:
            RootAttrs(f).store({"status": "interrupted"})
    else:
        meta_file = dataset / "rlcollect.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "status": "interrupted"}))


@pytest.mark.parametrize("edit", ["root flag", "next observation", "reward"])
def test_resume_refuses_a_planted_edit(cli, copied, backend, edit):
    """durability D20: ``resume=true`` validates first, and does not continue (nor
    seal as complete) a dataset with a planted edit: exit 2, the problem named."""
    dataset = copied(*PENDULUM)
    with opened(dataset, backend) as get:
        EDITS[edit](get, rows_of(get))
    interrupted(dataset, backend)
    problem = validate(dataset)[0]
    args = (*PENDULUM, "total_frames=6000", f"writer={backend}", "progress=none")
    res = cli("run", *args, f"out={dataset}", "resume=true")
    assert res.code == 2 and f"fails validation: {problem}" in res.stderr, res.stderr
    assert open_dataset(dataset).meta["status"] == "interrupted"
