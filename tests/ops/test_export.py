"""``rlcollect export``: D4RL and Minari files read back against the native dataset."""

from __future__ import annotations

import json
import os
import signal

import gymnasium as gym
import h5py
import minari
import numpy as np
import pytest

from collect_cli.dataset import open_dataset
from tests.helpers import assert_split_on_done, wait_for_frames, write_preempted
from tests.support.cli_runner import out_path as dataset_path
from tests.support.cli_runner import run_cli, start_run


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``made(backend, *overrides)``: a dataset from a real ``rlcollect run``, made once."""
    cache = {}

    def make(backend: str, *overrides: str):
        key = (backend, *overrides)
        if key not in cache:
            out = dataset_path(tmp_path_factory.mktemp("src"), backend)
            given = {o.split("=")[0] for o in overrides}
            defaults = [
                d for d in ("total_frames=2000", "env.num_envs=3") if d.split("=")[0] not in given
            ]
            args = (*defaults, f"writer={backend}", "progress=none")
            res = run_cli("run", *args, *overrides, f"out={out}")
            assert res.code == 0, res.stderr
            cache[key] = out
        return cache[key]

    return make


def native_episodes(path) -> list[dict]:
    """The dataset's episodes, read back independently of the exporter: each
    ``episodes/`` row's frames (its lane, its traj_id, mask True), by lane then start."""
    ds = open_dataset(path)
    steps, count = ds.meta["steps"], ds.meta["episodes"]
    arrays = {k: ds.array(k)[:, :steps] for k, _, _ in ds.describe() if "episodes/" not in k}
    rows = {k: v[:count] for k, v in ds.episodes().items()}
    out = []
    for i in np.lexsort((rows["start"], rows["lane"])):
        lane, tid = rows["lane"][i], rows["traj_id"][i]
        t = np.flatnonzero(
            (arrays["collector/traj_ids"][lane] == tid) & arrays["collector/mask"][lane]
        )
        assert len(t) == rows["length"][i] and t[0] == rows["start"][i]
        ep = {k: v[lane, t] for k, v in arrays.items()}
        ep.update({c: rows[c][i] for c in ("traj_id", "complete", "terminated", "truncated")})
        out.append(ep)
    return out


def expected_timeouts(ep: dict) -> np.ndarray:
    """True exactly at the last step of a truncated or incomplete episode."""
    flags = np.zeros(len(ep["collector/traj_ids"]), bool)
    flags[-1] = bool(ep["truncated"]) or not ep["complete"]
    return flags


def export(source, fmt, out, *extra, env=None):
    return run_cli("export", str(source), "--format", fmt, "--out", str(out), *extra, env=env)


ENVS = {"CartPole": "CartPole-v1", "Pendulum": "Pendulum-v1"}


@pytest.mark.parametrize("env", list(ENVS))
def test_d4rl_matches_native_episodes(made, tmp_path, backend, env):
    source = made(backend, f"env={env}")
    out = tmp_path / "sub" / "d4rl.hdf5"  # parent created
    res = export(source, "d4rl", out)
    assert res.code == 0, res.stderr
    summary = res.summary
    episodes = native_episodes(source)
    frames = sum(len(ep["collector/traj_ids"]) for ep in episodes)
    assert frames == open_dataset(source).meta["frames"] >= 2000  # all valid frames
    assert summary["frames"] == frames and summary["episodes"] == len(episodes)
    incomplete = sum(not ep["complete"] for ep in episodes)
    assert summary["incomplete_episodes"] == incomplete > 0
    with h5py.File(out, "r") as f:
        cat = np.concatenate
        np.testing.assert_array_equal(
            f["observations"][:], cat([e["observation"] for e in episodes])
        )
        np.testing.assert_array_equal(
            f["next_observations"][:], cat([e["next/observation"] for e in episodes])
        )
        np.testing.assert_array_equal(f["actions"][:], cat([e["action"] for e in episodes]))
        np.testing.assert_array_equal(
            f["rewards"][:], cat([e["next/reward"][:, 0] for e in episodes])
        )
        np.testing.assert_array_equal(
            f["terminals"][:], cat([e["next/terminated"][:, 0] for e in episodes])
        )
        np.testing.assert_array_equal(
            f["timeouts"][:], cat([expected_timeouts(e) for e in episodes])
        )
        np.testing.assert_array_equal(
            f["infos/traj_id"][:], cat([e["collector/traj_ids"] for e in episodes])
        )
        ends = np.flatnonzero(f["terminals"][:] | f["timeouts"][:])
        np.testing.assert_array_equal(ends, np.cumsum([len(e["action"]) for e in episodes]) - 1)
        meta = f["metadata"]
        assert meta["env_id"].asstr()[()] == ENVS[env]
        assert meta["seed"][()] == 0 and meta["incomplete_episodes"][()] == incomplete
        assert "total_frames: 2000" in meta["config"].asstr()[()]
        assert meta["source"].asstr()[()] == str(source.absolute())
        assert json.loads(meta["observation_space"].asstr()[()])["shape"] == list(
            gym.make(ENVS[env]).observation_space.shape
        )
        timeouts, terminals = f["timeouts"][:], f["terminals"][:]
    if env == "Pendulum":  # truncated at 200 steps, never terminated
        assert not terminals.any()
        assert all(len(e["action"]) == 200 for e in episodes if e["complete"])
        assert timeouts.sum() == len(episodes)
    else:
        assert terminals.sum() == sum(bool(e["terminated"]) for e in episodes) > 10
        assert timeouts.sum() == incomplete


@pytest.mark.parametrize("env", list(ENVS))
def test_minari_matches_native_episodes(made, tmp_path, backend, env, monkeypatch):
    source = made(backend, f"env={env}")
    out = tmp_path / "minari" / "rlcollect" / f"{env.lower()}-v0"
    res = export(source, "minari", out)
    assert res.code == 0, res.stderr
    summary = res.summary
    assert summary["dataset_id"] == f"rlcollect/{env.lower()}-v0"
    assert summary["minari_datasets_path"] == str(tmp_path / "minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", summary["minari_datasets_path"])
    dataset = minari.load_dataset(summary["dataset_id"])
    reference = gym.make(ENVS[env])
    assert dataset.observation_space == reference.observation_space
    assert dataset.action_space == reference.action_space
    assert dataset.spec.env_spec.id == ENVS[env]
    assert dataset.spec.env_spec.max_episode_steps == reference.spec.max_episode_steps
    episodes = native_episodes(source)
    assert dataset.total_episodes == len(episodes)
    assert dataset.total_steps == open_dataset(source).meta["frames"]
    metadata = list(dataset.storage.get_episode_metadata(range(len(episodes))))
    for ep, got, extra in zip(episodes, dataset.iterate_episodes(), metadata, strict=True):
        assert extra["rlcollect_traj_id"] == ep["traj_id"]
        np.testing.assert_array_equal(
            got.observations, np.concatenate([ep["observation"], ep["next/observation"][-1:]])
        )
        np.testing.assert_array_equal(got.actions, ep["action"])
        np.testing.assert_array_equal(got.rewards, ep["next/reward"][:, 0])
        np.testing.assert_array_equal(got.terminations, ep["next/terminated"][:, 0])
        np.testing.assert_array_equal(got.truncations, expected_timeouts(ep))


def test_nested_spaces(made, tmp_path, backend, monkeypatch):
    """Dict observations become observations/<key> groups (D4RL), dicts (Minari)."""
    source = made(backend, "env=gym", "env.id=toyenvs:Nested-v0")
    episodes = native_episodes(source)
    assert export(source, "d4rl", tmp_path / "n.hdf5").code == 0
    with h5py.File(tmp_path / "n.hdf5", "r") as f:
        assert set(f["observations"]) == {"pos", "mode", "flags"}
        assert set(f["actions"]) == {"0", "1", "2"}
        for key in ("pos", "mode", "flags"):
            want = np.concatenate([e[f"observation/{key}"] for e in episodes])
            np.testing.assert_array_equal(f[f"observations/{key}"][:], want)
            last = np.concatenate([e[f"next/observation/{key}"] for e in episodes])
            np.testing.assert_array_equal(f[f"next_observations/{key}"][:], last)
        np.testing.assert_array_equal(
            f["actions/1"][:], np.concatenate([e["action/1"] for e in episodes])
        )
        assert f["timeouts"][:].sum() == len(episodes)  # every episode truncates after 7 steps
    res = export(source, "minari", tmp_path / "m" / "toy" / "nested-v0")
    assert res.code == 0, res.stderr
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "m"))
    dataset = minari.load_dataset("toy/nested-v0")
    import toyenvs

    assert dataset.observation_space == toyenvs.NestedEnv().observation_space
    first = next(dataset.iterate_episodes())
    np.testing.assert_array_equal(
        first.observations["pos"],
        np.concatenate([episodes[0]["observation/pos"], episodes[0]["next/observation/pos"][-1:]]),
    )
    np.testing.assert_array_equal(first.actions[2], episodes[0]["action/2"])


def counter_checks(starts_and_ends, obs, rewards, terminals, timeouts, length):
    """CounterEnv episodes: obs 0, 1, ..., reward = obs + 1, terminated at ``length``."""
    for s, e in starts_and_ends:
        n = e - s
        np.testing.assert_array_equal(obs[s:e, 0], np.arange(n))
        np.testing.assert_array_equal(rewards[s:e], np.arange(1, n + 1))
        assert terminals[e - 1] == (n == length) and not terminals[s : e - 1].any()
        assert timeouts[e - 1] == (n < length) and not timeouts[s : e - 1].any()


def episode_spans(terminals, timeouts):
    ends = np.flatnonzero(terminals | timeouts) + 1
    return list(zip(np.r_[0, ends[:-1]], ends, strict=True))


def test_preempted_padding_inside_episodes(tmp_path, backend, monkeypatch):
    """A slow worker preempted mid-episode leaves padding inside an episode's time
    span; the export skips it and keeps each episode whole and contiguous."""
    source = dataset_path(tmp_path, backend)
    meta = {"config": "env:\n  kwargs:\n    length: 7\n"}
    write_preempted(source, backend, meta, 7, 60, 300, status="interrupted")
    rows = open_dataset(source).episodes()
    mask = open_dataset(source).array("collector/mask")
    spans = [
        mask[lane, start : start + length]
        for lane, start, length in zip(rows["lane"], rows["start"], rows["length"], strict=True)
    ]
    assert any(not span.all() for span in spans), "no padding inside an episode: test is void"
    # preemption's padding sits inside trajectories that go on: not a cut
    assert assert_split_on_done(source) == len(rows["traj_id"])

    res = export(source, "d4rl", tmp_path / "p.hdf5")
    assert res.code == 0, res.stderr
    assert "is interrupted: exported its committed frames" in res.stderr
    assert res.summary["source_status"] == "interrupted"
    with h5py.File(tmp_path / "p.hdf5", "r") as f:
        obs, rewards = f["observations"][:], f["rewards"][:]
        terminals, timeouts = f["terminals"][:], f["timeouts"][:]
        assert len(obs) == int(mask.sum()) == res.summary["frames"]
        spans = episode_spans(terminals, timeouts)
        assert len(spans) == res.summary["episodes"] == len(rows["traj_id"])
        counter_checks(spans, obs, rewards, terminals, timeouts, 7)
        np.testing.assert_array_equal(f["next_observations"][:, 0], obs[:, 0] + 1)

    res = export(source, "minari", tmp_path / "m" / "toy" / "slow-v0")
    assert res.code == 0, res.stderr
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "m"))
    for ep in minari.load_dataset("toy/slow-v0").iterate_episodes():
        n = len(ep.actions)
        np.testing.assert_array_equal(ep.observations[:, 0], np.arange(n + 1))
        assert ep.terminations[-1] == (n == 7) and ep.truncations[-1] == (n < 7)


def test_multiasync_lanes_of_different_lengths(made, tmp_path, backend):
    source = made(
        backend,
        "env=gym",
        "env.id=toyenvs:Counter-v0",
        "+env.kwargs.length=7",
        "collector=multiasync",
        "collector.workers=2",
        "env.num_envs=2",
        "frames_per_batch=100",
        "total_frames=700",  # 7 batches of one worker's lanes: the workers' lanes differ
    )
    lane_steps = open_dataset(source).meta["lane_steps"]
    assert len(set(lane_steps)) == 2
    res = export(source, "d4rl", tmp_path / "a.hdf5", "--drop-incomplete")
    assert res.code == 0, res.stderr
    # which worker delivers each batch is a race: a lane's last episode is cut unless
    # its step count is a multiple of the episode length
    cut = sum(steps % 7 != 0 for steps in lane_steps)
    assert res.summary["incomplete"] == "dropped" and res.summary["incomplete_episodes"] == cut
    with h5py.File(tmp_path / "a.hdf5", "r") as f:
        terminals, timeouts = f["terminals"][:], f["timeouts"][:]
        assert not timeouts.any() and terminals.sum() == res.summary["episodes"]
        assert len(terminals) == 7 * res.summary["episodes"]  # only whole 7-step episodes
        spans = episode_spans(terminals, timeouts)
        counter_checks(spans, f["observations"][:], f["rewards"][:], terminals, timeouts, 7)
        assert f["metadata/incomplete"].asstr()[()] == "dropped"


def test_killed_run_exports_committed_frames(tmp_path, backend):
    """A killed run (status running): its committed frames, the episodes it left
    running included (no episodes row yet), ending with a timeout."""
    source = dataset_path(tmp_path, backend)
    args = ["env=gym", "env.id=toyenvs:Counter-v0", "+env.kwargs.length=9", "env.num_envs=3"]
    proc = start_run(
        [*args, "total_frames=-1", "frames_per_batch=300", f"writer={backend}", f"out={source}"],
        tmp_path,
    )
    wait_for_frames(source, proc, minimum=1500)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    ds = open_dataset(source)
    meta = ds.meta
    assert meta["status"] == "running"
    lane_done = ds.array("next/done")[:, :, 0]
    tails = sum(not lane_done[lane, n - 1] for lane, n in enumerate(meta["lane_steps"]))
    res = export(source, "d4rl", tmp_path / "k.hdf5")
    assert res.code == 0, res.stderr
    assert "is running" in res.stderr
    assert res.summary["frames"] == meta["frames"]
    with h5py.File(tmp_path / "k.hdf5", "r") as f:
        terminals, timeouts = f["terminals"][:], f["timeouts"][:]
        spans = episode_spans(terminals, timeouts)
        assert len(spans) == res.summary["episodes"] == meta["episodes"] + tails  # + running
        assert timeouts.sum() == res.summary["incomplete_episodes"] == tails
        counter_checks(spans, f["observations"][:], f["rewards"][:], terminals, timeouts, 9)


def listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def assert_usage_error(res, text):
    assert res.code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not res.stdout


def test_usage_errors(made, tmp_path):
    source = made("hdf5", "env=CartPole")
    before = listing(tmp_path)
    assert_usage_error(export(tmp_path / "nope.h5", "d4rl", tmp_path / "x.hdf5"), "no dataset at")
    assert_usage_error(
        export(source, "parquet", tmp_path / "x.hdf5"),
        "unknown export format 'parquet': choose from d4rl, minari",
    )
    assert_usage_error(export(source, "d4rl", source), "overlaps the source dataset")
    nstep = made("hdf5", "env=CartPole", "postproc=multistep", "total_frames=200")
    assert_usage_error(export(nstep, "d4rl", tmp_path / "x.hdf5"), "d4rl holds 1-step transitions")
    assert_usage_error(export(source, "minari", tmp_path / "plain"), "is not a Minari dataset id")
    blocker = tmp_path / "nominari" / "minari"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named minari')\n")
    res = export(
        source,
        "minari",
        tmp_path / "m" / "ns" / "x-v0",
        env={"PYTHONPATH": f"{blocker.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert_usage_error(res, "pip install 'rlcollect[export]'")
    (tmp_path / "nominari" / "minari" / "__init__.py").unlink()
    blocker.rmdir()
    blocker.parent.rmdir()
    assert listing(tmp_path) == before  # nothing left behind


def test_existing_out_needs_overwrite(made, tmp_path):
    source = made("memmap", "env=CartPole")
    out = tmp_path / "d.hdf5"
    out.write_text("keep me")
    res = export(source, "d4rl", out)
    assert_usage_error(res, "already exists: pass --overwrite")
    assert out.read_text() == "keep me" and listing(tmp_path) == ["d.hdf5"]
    res = export(source, "d4rl", out, "--overwrite")  # not an export: the user's file
    assert_usage_error(res, "is a file and not a D4RL file rlcollect exported")
    assert out.read_text() == "keep me"
    out.unlink()
    assert export(source, "d4rl", out).code == 0
    res = export(source, "d4rl", out, "--overwrite", "--compression", "gzip")
    assert res.code == 0, res.stderr
    with h5py.File(out, "r") as f:
        assert f["observations"].compression == "gzip"
        assert len(f["rewards"]) == res.summary["frames"] > 2000
    assert listing(tmp_path) == ["d.hdf5"]  # no temporary sibling left

    mdir = tmp_path / "m" / "ns" / "cp-v0"
    assert export(source, "minari", mdir).code == 0
    assert_usage_error(export(source, "minari", mdir), "already exists")
    res = export(source, "minari", mdir, "--overwrite", "--drop-incomplete")
    assert res.code == 0, res.stderr
    data = minari.MinariDataset(mdir / "data")
    dropped = res.summary["incomplete_episodes"]
    assert data.total_episodes == res.summary["episodes"] == len(native_episodes(source)) - dropped
    assert dropped > 0 and not any(ep.truncations.any() for ep in data.iterate_episodes())
    assert sorted(p.name for p in mdir.parent.iterdir()) == ["cp-v0"]


def test_unreadable_or_unsound_source_refused(made, tmp_path):
    junk = tmp_path / "junk.h5"
    junk.write_text("not hdf5")
    assert_usage_error(export(junk, "d4rl", tmp_path / "j.hdf5"), "not a readable HDF5")
    source = tmp_path / "bad.h5"
    source.write_bytes(made("hdf5", "env=CartPole").read_bytes())
    with h5py.File(source, "r+") as f:
        f["episodes/return"][0] += 1.0
    res = export(source, "d4rl", tmp_path / "b.hdf5")
    assert res.code == 1 and "fails validation: episodes/return disagrees" in res.stderr
    assert not (tmp_path / "b.hdf5").exists()
