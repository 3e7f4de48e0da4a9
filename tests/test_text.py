"""Text observations end to end: collected, written by both backends, reopened from
disk (plain h5py, tensordict, rlcollect's reader), validated, merged and exported."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from tensordict import TensorDict

from collect_cli import specs
from collect_cli.dataset import open_dataset
from tests.support.cli_runner import out_path

TOY = ("env=gym", "env.id=toyenvs:Text-v0", "env.num_envs=2", "frames_per_batch=8")


def toy_strings(steps: int) -> tuple[list[str], list[str]]:
    """TextEnv's observations and next observations over ``steps`` steps of one lane
    (5-step episodes; the reset state follows each final one)."""
    obs, nxt = [], []
    for i in range(steps):
        t = i % 5
        obs.append("é" * (t % 4) + "ab"[t % 2])
        nxt.append("é" * ((t + 1) % 4) + "ab"[(t + 1) % 2])
    return obs, nxt


def test_text_round_trips_through_both_writers(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli("run", *TOY, "total_frames=16", f"writer={backend}", f"out={out}")
    assert res.code == 0, res.stderr
    assert cli("validate", str(out)).code == 0
    ds = open_dataset(out)
    assert ds.meta["observation_space"]["type"] == "Text"
    assert ds.meta["observation_space"]["width"] == 24  # 6 characters, non-ASCII charset
    want_obs, want_next = toy_strings(8)
    for key, want in (("observation", want_obs), ("next/observation", want_next)):
        got = ds.array(key)  # rlcollect's reader: str on both backends
        assert got.shape == (2, 8)
        assert got.tolist() == [want, want]
    if backend == "hdf5":  # plain h5py: fixed-length byte strings
        with h5py.File(out, "r") as f:
            stored = f["observation"]
            assert stored.dtype == np.dtype("S24") and stored.shape == (2, 8)
            assert [b.decode() for b in stored[0]] == want_obs
    else:  # load_memmap: the UTF-8 bytes, zero padded
        td = TensorDict.load_memmap(out)
        raw = td["observation"].numpy()
        assert raw.shape == (2, 8, 24) and raw.dtype == np.uint8
        assert bytes(raw[1, 1]).rstrip(b"\0").decode() == want_obs[1]
        assert specs.decode_text(raw[0]).tolist() == want_obs


def test_text_merges_and_exports(cli, tmp_path, backend, monkeypatch):
    minari = pytest.importorskip("minari")
    shards = [out_path(tmp_path, backend, f"s{seed}") for seed in (0, 1)]
    for seed, shard in enumerate(shards):
        args = ("total_frames=16", f"seed={seed}", f"writer={backend}", f"out={shard}")
        res = cli("run", *TOY, *args)
        assert res.code == 0, res.stderr
    merged = out_path(tmp_path, backend, "merged")
    res = cli("merge", *map(str, shards), "--out", str(merged))
    assert res.code == 0, res.stderr
    assert cli("validate", str(merged)).code == 0
    want_obs, want_next = toy_strings(8)
    assert open_dataset(merged).array("observation").tolist() == [want_obs] * 4

    # D4RL: byte strings; every frame is exported, lane after lane
    assert cli("export", str(merged), "--format", "d4rl", "--out", "d.hdf5").code == 0
    with h5py.File(tmp_path / "d.hdf5", "r") as f:
        assert f["observations"].dtype == np.dtype("S24")
        assert [b.decode() for b in f["observations"][:8]] == want_obs
        assert [b.decode() for b in f["next_observations"][:8]] == want_next
    # Minari: its Text space, str values
    res = cli("export", str(merged), "--format", "minari", "--out", "m/toy/text-v0")
    assert res.code == 0, res.stderr
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "m"))
    dataset = minari.load_dataset("toy/text-v0")
    space = specs.rebuild(open_dataset(merged).meta["observation_space"])
    assert dataset.observation_space == space
    first = next(dataset.iterate_episodes())
    assert list(first.observations) == [*want_obs[:5], want_next[4]]


def test_minigrid_collects_end_to_end(cli, tmp_path, backend):
    """MiniGrid's Dict observation (image Box, direction, mission) with a random policy
    over its Discrete actions."""
    pytest.importorskip("minigrid")
    out = out_path(tmp_path, backend)
    env = ("env=gym", "env.id=minigrid:MiniGrid-Empty-5x5-v0", "env.num_envs=2")
    env += ("frames_per_batch=20",)
    res = cli("run", *env, "total_frames=20", f"writer={backend}", f"out={out}")
    assert res.code == 0, res.stderr
    assert cli("validate", str(out)).code == 0
    ds = open_dataset(out)
    image = ds.array("observation/image")
    assert image.shape == (2, 10, 7, 7, 3) and image.dtype == np.uint8
    assert (ds.array("next/observation/mission") == "get to the green goal square").all()
    assert set(np.unique(ds.array("action"))) <= set(range(7))
    assert cli("export", str(out), "--format", "d4rl", "--out", "d.hdf5").code == 0
    with h5py.File(tmp_path / "d.hdf5", "r") as f:
        assert f["observations/image"].shape == (20, 7, 7, 3)
        assert f["next_observations/mission"].dtype == np.dtype("S256")
        assert set(f["observations/mission"][:]) == {b"get to the green goal square"}


def test_babyai_level_collects_end_to_end(cli, tmp_path):
    pytest.importorskip("minigrid")
    env = ("env=gym", "env.id=minigrid:BabyAI-GoToObj-v0", "env.num_envs=2", "frames_per_batch=20")
    res = cli("run", *env, "total_frames=20", "out=b.h5")
    assert res.code == 0, res.stderr
    assert cli("validate", "b.h5").code == 0
    missions = open_dataset(tmp_path / "b.h5").array("observation/mission")
    assert all(m.startswith("go to the ") for m in missions.ravel())


def test_overlong_text_is_a_runtime_error(cli, tmp_path):
    """An env whose string outgrows its own Text space fails the run (exit 1, one
    line); the batches committed before it stay readable."""
    args = ("total_frames=16", "+env.kwargs.overlong=true", "out=o.h5", "progress=none")
    res = cli("run", *TOY, *args)
    assert res.code == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        "rlcollect: error: text observation 'éééééééééééééééééééééééééééééééééééééééé' is 80 "
        "bytes in UTF-8, more than the 24 its Text space allows"
    ]
    assert cli("validate", "o.h5").code == 0
    ds = open_dataset(tmp_path / "o.h5")
    assert ds.meta["frames"] == 8 and ds.meta["status"] == "interrupted"
    assert ds.array("observation")[0, :4].tolist() == toy_strings(4)[0]
    # resumed (HDF5 reopens its byte-string datasets): the new episodes start at reset
    res = cli("run", *TOY, "total_frames=16", "resume=true", "out=o.h5", "progress=none")
    assert res.code == 0, res.stderr
    assert cli("validate", "o.h5").code == 0
    assert (
        open_dataset(tmp_path / "o.h5").array("observation").tolist() == [toy_strings(4)[0] * 2] * 2
    )
