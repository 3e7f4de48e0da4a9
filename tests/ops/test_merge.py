"""``rlcollect merge``: shards collected in process, merged through the CLI (in process)."""

from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import pytest
from tensordict import PersistentTensorDict, TensorDict
from typer.testing import CliRunner

from collect_cli import config
from collect_cli.cli import app
from collect_cli.collectors import SyncCollector
from collect_cli.collectors.postproc import MultiStep
from collect_cli.dataset import make_writer, open_dataset
from collect_cli.envs import env_factory
from collect_cli.ops.merge import merge
from collect_cli.run import run
from tests.helpers import assert_consistent
from tests.support.cli_runner import BACKENDS, out_path

SMALL = ("progress=none", "env.num_envs=2", "frames_per_batch=100")
TARGET = "policy.target=toypolicies"


def collect(out, *overrides: str):
    settings = config.load(config.compose([f"out={out}", *SMALL, *overrides]))
    return run(settings)


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def load(path, backend):
    if backend == "hdf5":
        td = PersistentTensorDict.from_h5(str(path))
        try:
            return td.to_tensordict()
        finally:
            td.close()
    return TensorDict.load_memmap(path)


def retyped(src, dest, backend, key=("next", "reward")):
    """A copy of the dataset at ``src`` whose ``key`` is float64 (else identical)."""
    if backend == "hdf5":
        shutil.copy(src, dest)
        with h5py.File(dest, "r+") as f:
            data = f["/".join(key)][()]
            del f["/".join(key)]
            f.create_dataset("/".join(key), data=data.astype(np.float64))
        return dest
    td = TensorDict.load_memmap(src).clone()
    td[key] = td[key].double()
    td.memmap_(dest)
    shutil.copy(src / "rlcollect.json", dest / "rlcollect.json")
    return dest


@pytest.fixture(scope="module", params=BACKENDS)
def made(request, tmp_path_factory):
    """Shards of each backend, collected once per module: (backend, name -> path)."""
    backend = request.param
    root = tmp_path_factory.mktemp(backend)
    made = {}
    specs = {
        "a": ("env=CartPole", "seed=0", "total_frames=400"),
        "b": ("env=CartPole", "seed=1", "total_frames=600"),  # longer: time is padded
        "pend": ("env=Pendulum", "total_frames=200"),
        "gauss": ("env=Pendulum", "total_frames=200", "policy=python", f"{TARGET}:gaussian"),
        "capped": (
            "env=gym",
            "env.id=sweepenvs:WideObs-v0",
            "total_frames=200",
            "max_frames_per_traj=50",
        ),
        "narrow": ("env=gym", "env.id=sweepenvs:WideObs-v0", "total_frames=200"),
        "wide": (
            "env=gym",
            "env.id=sweepenvs:WideObs-v0",
            "total_frames=200",
            "+env.kwargs.width=3",
        ),
    }
    for name, overrides in specs.items():
        made[name] = out_path(root, backend, name)
        collect(made[name], f"writer={backend}", *overrides)
    made["f64"] = retyped(made["a"], out_path(root, backend, "f64"), backend)
    return backend, made


def test_merge_concatenates_lanes_pads_time_offsets_ids(made, tmp_path):
    backend, shards = made
    dest = out_path(tmp_path, backend, "merged")
    code, stdout, stderr = invoke("merge", str(shards["a"]), str(shards["b"]), "--out", str(dest))
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["mode"] == ("virtual" if backend == "hdf5" else "copy")
    meta = assert_consistent(dest)
    a, b = open_dataset(shards["a"]), open_dataset(shards["b"])
    assert (meta["frames"], meta["lanes"]) == (1000, 4)
    assert meta["episodes"] == a.meta["episodes"] + b.meta["episodes"] == summary["episodes"]
    assert meta["steps"] == 300 and meta["lane_steps"] == [200, 200, 300, 300]
    assert [s["seed"] for s in meta["shards"]] == [0, 1]
    assert [s["frames"] for s in meta["shards"]] == [400, 600]

    td = load(dest, backend)
    mask, traj = td["collector", "mask"].numpy(), td["collector", "traj_ids"].numpy()
    assert not mask[:2, 200:].any() and (traj[:2, 200:] == -1).all()  # padding
    offset = meta["shards"][1]["traj_id_offset"]
    assert offset == a.episodes()["traj_id"].max() + 1
    np.testing.assert_array_equal(traj[:2, :200], a.array("collector/traj_ids"))
    b_traj = b.array("collector/traj_ids")
    np.testing.assert_array_equal(traj[2:], np.where(b_traj >= 0, b_traj + offset, -1))
    np.testing.assert_array_equal(td["observation"][2:].numpy(), b.array("observation"))
    np.testing.assert_array_equal(td["next", "reward"][:2, :200].numpy(), a.array("next/reward"))
    ep = td["episodes"]
    assert len(np.unique(ep["traj_id"].numpy())) == meta["episodes"]
    np.testing.assert_array_equal(
        ep["lane"].numpy(), np.concatenate([a.episodes()["lane"], b.episodes()["lane"] + 2])
    )
    if backend == "hdf5":
        with h5py.File(dest) as f:
            assert f["observation"].is_virtual and not f["collector/traj_ids"].is_virtual
            names = {s.file_name for s in f["observation"].virtual_sources()}
        # relative to the merged file's directory
        assert names == {os.path.relpath(shards[n], tmp_path) for n in ("a", "b")}
        copied = tmp_path / "copied.h5"
        merge([shards["a"], shards["b"]], copied, copy=True)
        assert_consistent(copied)
        with h5py.File(copied) as f:
            assert not f["observation"].is_virtual
        assert (load(copied, backend) == td).all()


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("a", "pend"), "shards differ in env: "),
        (("narrow", "wide"), "shards differ in observation space: "),
        (("narrow", "capped"), "shards differ in keys: "),  # step_count: not a policy output
        (("a", "f64"), "shards differ in the dtype of 'next/reward': float32 in "),
        (("a", "missing"), "no dataset at "),
        (("a", "a"), "is named twice"),
        (("a", "exists"), "already exists: pass --overwrite"),
    ],
)
def test_merge_usage_errors_exit_2_one_line_nothing_written(made, tmp_path, names, message):
    backend, shards = made
    dest = out_path(tmp_path, backend, "merged")
    paths = [str(shards.get(n, tmp_path / "missing.h5")) for n in names if n != "exists"]
    if "exists" in names:
        paths.append(str(shards["b"]))
        dest.mkdir() if backend == "memmap" else dest.write_text("precious")
    code, stdout, stderr = invoke("merge", *paths, "--out", str(dest))
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], stderr
    assert "Traceback" not in stderr and stdout == ""
    if "exists" in names:
        assert dest.is_dir() if backend == "memmap" else dest.read_text() == "precious"
    else:
        assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if "merging" in p.name]


def test_merge_refuses_more_hdf5_lanes_than_its_attributes_hold(tmp_path):
    wide = ("env.backend=native", "env.num_envs=4001", "frames_per_batch=4001")
    for name in ("a.h5", "b.h5"):
        collect(tmp_path / name, *wide, "total_frames=4001")
    shards = [str(tmp_path / "a.h5"), str(tmp_path / "b.h5")]
    code, _, stderr = invoke("merge", *shards, "-o", str(tmp_path / "x.h5"))
    assert code == 2
    assert "writer=hdf5 records at most 8000 lanes" in stderr and "not 8002" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5", "b.h5"]


def test_merge_refuses_mixed_backends(tmp_path):
    collect(tmp_path / "h.h5", "env=CartPole", "total_frames=200")
    collect(tmp_path / "m", "env=CartPole", "total_frames=200", "writer=memmap")
    code, _, stderr = invoke("merge", str(tmp_path / "h.h5"), str(tmp_path / "m"), "-o", "x.h5")
    assert code == 2 and "shards differ in backend" in stderr


def test_overwrite_replaces_the_destination(made, tmp_path):
    backend, shards = made
    dest = out_path(tmp_path, backend, "merged")
    merge([shards["a"]], dest)
    code, _, stderr = invoke(
        "merge", str(shards["a"]), str(shards["b"]), "--out", str(dest), "--overwrite"
    )
    assert code == 0, stderr
    assert assert_consistent(dest)["frames"] == 1000
    assert not [p for p in tmp_path.iterdir() if "merging" in p.name]


def killed_shard(path, backend, snapshot, like, n_step=0, seed=0):
    """A shard as ``kill -9`` leaves it: 2 batches committed, a third appended, not
    committed, and episodes still running (status ``running``); copied to ``snapshot``.
    Its metadata is that of the dataset at ``like``; ``n_step``: written through
    ``postproc=multistep`` with that n."""
    keep = ("env_id", "observation_space", "action_space", "config", "seed")
    meta = {k: v for k, v in open_dataset(like).meta.items() if k in keep}
    step = None
    if n_step:
        meta["postproc"] = {"name": "multistep", "n": n_step, "gamma": 0.9}
        step = MultiStep(n_step, 0.9)
    make_env = env_factory("CartPole-v1", 2)
    with SyncCollector(make_env, frames_per_batch=100, total_frames=300, seed=seed) as c:
        writer = make_writer(backend, path, metadata=meta).open()
        for i, (lane_start, batch) in enumerate(c.iter_with_lanes()):
            if step is not None:
                batch = step(batch, lane_start)
            writer.append(batch, lane_start)
            if i < 2:
                writer.commit()
    if backend == "hdf5":
        writer._file.flush()
        shutil.copy(path, snapshot)
    else:
        shutil.copytree(path, snapshot)
    writer.close()
    return snapshot


def test_allow_incomplete_merges_what_a_killed_shard_committed(tmp_path, backend):
    done = out_path(tmp_path, backend, "done")
    collect(done, "env=CartPole", "total_frames=200", f"writer={backend}")
    killed = killed_shard(
        out_path(tmp_path, backend, "live"), backend, out_path(tmp_path, backend, "killed"), done
    )
    assert open_dataset(killed).meta["status"] == "running"
    dest = out_path(tmp_path, backend, "merged")
    code, _, stderr = invoke("merge", str(done), str(killed), "--out", str(dest))
    assert code == 2 and "is not complete (status running)" in stderr
    code, _, stderr = invoke(
        "merge", str(done), str(killed), "--out", str(dest), "--allow-incomplete"
    )
    assert code == 0, stderr
    meta = assert_consistent(dest)
    assert meta["status"] == "interrupted" and meta["frames"] == 200 + 200
    td = load(dest, backend)
    assert not td["collector", "mask"][2:, 100:].any()  # the uncommitted third batch
    # a row for each episode the kill cut: the killed shard's lanes not ending in done
    ended = open_dataset(killed).array("next/done")[:, 99, 0]
    ep = td["episodes"]
    tails = ep[ep["traj_id"] >= meta["shards"][1]["traj_id_offset"]]
    assert int((~tails["complete"]).sum()) == int((~ended).sum()) > 0
    assert tails["lane"][~tails["complete"]].tolist() == (np.flatnonzero(~ended) + 2).tolist()


def test_killed_multistep_shards_merge_with_their_own_returns(tmp_path, backend):
    """Regression: the rows merge makes for the episodes a kill cut summed the n-step
    ``next/reward`` (about n times too much); a frame's own reward is the original."""
    like = out_path(tmp_path, backend, "like")
    collect(like, "env=CartPole", "total_frames=200", f"writer={backend}")
    shards = [
        killed_shard(
            out_path(tmp_path, backend, f"live{i}"),
            backend,
            out_path(tmp_path, backend, f"killed{i}"),
            like,
            n_step=3,
            seed=i,
        )
        for i in range(2)
    ]
    dest = out_path(tmp_path, backend, "merged")
    code, _, stderr = invoke("merge", *map(str, shards), "--out", str(dest), "--allow-incomplete")
    assert code == 0, stderr
    assert_consistent(dest)
    ds = open_dataset(dest)
    ep, meta = ds.episodes(), ds.meta
    traj, own = ds.array("collector/traj_ids"), ds.array("next/original_reward")[..., 0]
    mask = ds.array("collector/mask")
    cut = np.flatnonzero(~ep["complete"])
    assert len(cut) > 0
    for row in cut:
        frames = mask & (traj == ep["traj_id"][row])
        assert ep["return"][row] == pytest.approx(own[frames].sum())
        assert ep["return"][row] < ds.array("next/reward")[..., 0][frames].sum()
    # the kill's cut frames are flagged; they keep the n-step lookahead their run
    # computed from frames the kill lost (docs/dataset.md)
    last = np.asarray([np.flatnonzero(mask[lane])[-1] for lane in ep["lane"][cut]])
    flags = ds.array("next/truncated")[..., 0] & ds.array("next/done")[..., 0]
    assert flags[ep["lane"][cut], last].all()
    assert meta["episodes"] == len(ep["traj_id"])


def test_stream_keys_are_what_a_run_records():
    from collect_cli import dataformat as fmt
    from collect_cli.run import _stream_options

    settings = config.load(config.compose(["out=x.h5"]))
    assert set(_stream_options(settings)) == set(fmt.STREAM_KEYS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_merge_keeps_what_its_frames_mean_and_refuses_shards_that_differ(tmp_path, backend):
    from collect_cli.errors import MergeError, UsageError
    from collect_cli.ops.export import export

    shards = [out_path(tmp_path, backend, f"s{seed}") for seed in (0, 1)]
    for seed, shard in enumerate(shards):
        multistep = ("postproc=multistep", "postproc.n=3")
        collect(shard, "total_frames=400", f"writer={backend}", f"seed={seed}", *multistep)
    merged = out_path(tmp_path, backend, "m")
    merge(shards, merged)
    meta = assert_consistent(merged)
    assert meta["postproc"] == open_dataset(shards[0]).meta["postproc"]
    assert meta["postproc"]["n"] == 3 and meta["reset_when_done"] is True
    with pytest.raises(UsageError, match="holds multistep transitions"):
        export(merged, "d4rl", tmp_path / "d.hdf5")  # n-step frames never pass as 1-step
    plain = out_path(tmp_path, backend, "plain")
    collect(plain, "total_frames=400", f"writer={backend}")
    with pytest.raises(MergeError, match="shards differ in postproc"):
        merge([shards[0], plain], out_path(tmp_path, backend, "mix"))
