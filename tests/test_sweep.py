"""``rlcollect run -m``: sweeps through real Hydra launchers, shards, then ``merge``."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from tensordict import PersistentTensorDict, TensorDict
from typer.testing import CliRunner

from collect_cli.cli import app
from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent
from tests.support.cli_runner import Result, out_path

TINY = ("env=CartPole", "total_frames=600", "env.num_envs=2", "frames_per_batch=200")
EPISODE_KEYS = ("observation", "action", "next/reward", "next/observation", "next/done")


def load(path: Path, backend: str) -> TensorDict:
    if backend == "hdf5":
        td = PersistentTensorDict.from_h5(str(path))
        try:
            return td.to_tensordict()
        finally:
            td.close()
    return TensorDict.load_memmap(path)


def leftovers(sweep_id: str) -> list[Path]:
    """Temporary sweep directories a sweep left behind."""
    return list(Path(tempfile.gettempdir()).glob(f"rlcollect-{sweep_id}-*"))


def assert_same_episodes(merged: Path, shards: list[Path], backend: str) -> None:
    """Every episode of every shard is in the merged dataset, frame for frame."""
    td = load(merged, backend)
    meta = open_dataset(merged).meta
    ep = {k: td["episodes", k].numpy() for k in ("traj_id", "lane", "start", "length", "return")}
    row_of = {int(t): i for i, t in enumerate(ep["traj_id"])}
    assert len(row_of) == len(ep["traj_id"]), "episodes/traj_id not unique"
    valid = td["collector", "mask"].numpy()
    frame_ids = td["collector", "traj_ids"].numpy()
    assert set(np.unique(frame_ids[valid]).tolist()) == set(row_of)
    checked = 0
    for entry, path in zip(meta["shards"], shards, strict=True):
        shard = open_dataset(path)
        assert (entry["seed"], entry["frames"]) == (shard.meta["seed"], shard.meta["frames"])
        rows = {k: v[: shard.meta["episodes"]] for k, v in shard.episodes().items()}
        arrays = {k: shard.array(k) for k in EPISODE_KEYS}
        for j, traj in enumerate(rows["traj_id"]):
            i = row_of[int(traj) + entry["traj_id_offset"]]
            lane, start, length = (int(rows[k][j]) for k in ("lane", "start", "length"))
            assert ep["lane"][i] == lane + entry["lane_offset"]
            assert (ep["start"][i], ep["length"][i]) == (start, length)
            assert ep["return"][i] == rows["return"][j]
            for key in EPISODE_KEYS:
                got = td[tuple(key.split("/"))][lane + entry["lane_offset"], start : start + length]
                np.testing.assert_array_equal(
                    got.numpy(), arrays[key][lane, start : start + length]
                )
            checked += 1
    assert checked == meta["episodes"] > 0


def invoke(*args: str):
    """The CLI in this process (the real app; Hydra launchers still start their processes)."""
    res = CliRunner().invoke(app, list(args))
    return Result(res.exit_code, res.stdout, res.stderr)


@pytest.mark.slow
def test_submitit_sweep_shards_merge_into_one_sound_dataset(cli, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    res = cli(
        "run",
        "-m",
        "seed=0,1,2",
        *TINY,
        "hydra/launcher=submitit_local",
        "progress=none",
    )
    assert res.code == 0, res.stderr
    summary = res.summary
    assert (summary["status"], summary["jobs"], summary["failed"]) == ("complete", 3, 0)
    sweep_id = summary["sweep"]
    shards = [tmp_path / s["path"] for s in summary["shards"]]
    assert [s["path"] for s in summary["shards"]] == [
        f"data/{sweep_id}/CartPole-v1_random_s{n}_job{n}.h5" for n in range(3)
    ]
    for n, (entry, path) in enumerate(zip(summary["shards"], shards, strict=True)):
        meta = assert_consistent(path)
        assert (entry["frames"], entry["exit_code"], entry["status"]) == (600, 0, "complete")
        assert meta["frames"] == 600 and meta["seed"] == n
        assert meta["sweep"]["id"] == sweep_id
        assert (meta["sweep"]["job"], meta["sweep"]["jobs"]) == (n, 3)
        assert "seed=0,1,2" in meta["sweep"]["overrides"]
        assert f"seed={n}" in meta["sweep"]["job_overrides"]
    # nothing but the shards: no outputs/, multirun/, .hydra/, .submitit/ anywhere here
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert [p.name for p in (tmp_path / "data").iterdir()] == [sweep_id]
    assert set((tmp_path / "data" / sweep_id).iterdir()) == set(shards)
    assert not leftovers(sweep_id)

    assert_merges(tmp_path, shards, "hdf5", sweep_id)  # memmap: the joblib test


def assert_merges(tmp_path: Path, shards: list[Path], backend: str, sweep_id: str) -> None:
    """``merge`` makes one sound dataset of the shards, holding each of their episodes."""
    merged = out_path(tmp_path, backend, "merged")
    res = invoke("merge", *map(str, shards), "--out", str(merged))
    assert res.code == 0, res.stderr
    frames = 600 * len(shards)
    assert res.summary["frames"] == frames
    meta = assert_consistent(merged)
    episodes = sum(open_dataset(p).meta["episodes"] for p in shards)
    assert (meta["frames"], meta["episodes"], meta["lanes"]) == (frames, episodes, 2 * len(shards))
    assert meta["sweep"]["id"] == sweep_id
    assert [s["sweep_job"] for s in meta["shards"]] == list(range(len(shards)))
    assert_same_episodes(merged, shards, backend)
    info = invoke("info", str(merged), "--json")
    assert info.code == 0 and json.loads(info.stdout)["frames"] == frames


def test_joblib_sweep_with_interpolated_out_merges_memmap(tmp_path, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    monkeypatch.chdir(tmp_path)
    res = invoke(
        "run",
        "--multirun",
        "seed=3,4",
        *TINY,
        "writer=memmap",
        "out=shards/cp_s${seed}",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "progress=plain",
    )
    assert res.code == 0, res.stderr
    assert [s["path"] for s in res.summary["shards"]] == ["shards/cp_s3", "shards/cp_s4"]
    shards = [tmp_path / "shards" / f"cp_s{n}" for n in (3, 4)]
    metas = [assert_consistent(p) for p in shards]
    assert [m["seed"] for m in metas] == [3, 4] and [m["frames"] for m in metas] == [600, 600]
    a, b = (open_dataset(p).array("action") for p in shards)
    assert not np.array_equal(a, b)  # the seed reached each job
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]
    assert not leftovers(res.summary["sweep"])
    assert_merges(tmp_path, shards, "memmap", res.summary["sweep"])


def test_failed_job_is_reported_others_stay_valid_merge_refuses_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the basic launcher: jobs run one after the other, here
    res = invoke(
        "run",
        "-m",
        "seed=0,1,2",
        "env=gym",
        "env.id=sweepenvs:SeedFail-v0",
        "+env.kwargs.run_seed=${seed}",  # the env copy of the seed=1 job raises at step 150
        "total_frames=600",
        "env.num_envs=2",
        "frames_per_batch=200",
        "progress=plain",
    )
    assert res.code == 1, res.stderr
    summary = res.summary
    assert (summary["status"], summary["failed"]) == ("failed", 1)
    failed = summary["shards"][1]
    assert (failed["exit_code"], failed["status"]) == (1, "failed")
    assert "simulated failure at step 150" in failed["error"]
    # plain progress, labelled by job, never a Rich bar; then one line for the failure
    assert "job 0: frames 600/600" in res.stderr and "job 2: frames 600/600" in res.stderr
    assert "\x1b" not in res.stderr and "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("rlcollect:")]
    assert len(errors) == 1
    assert errors[0].startswith("rlcollect: error: job 1 (seed=1 ")
    assert "exited 1" in errors[0] and errors[0].endswith(f"shard {failed['path']}")
    shards = [tmp_path / s["path"] for s in summary["shards"]]
    for n in (0, 2):
        assert summary["shards"][n]["exit_code"] == 0
        assert assert_consistent(shards[n])["status"] == "complete"
    broken = assert_consistent(shards[1])  # what the failed job committed is sound
    assert broken["status"] == "interrupted" and broken["frames"] == 200

    dest = tmp_path / "merged.h5"
    refused = invoke("merge", *map(str, shards), "--out", str(dest))
    assert refused.code == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "is not complete (status interrupted)" in refused.stderr
    assert not dest.exists()
    assert invoke("merge", str(shards[0]), str(shards[2]), "--out", str(dest)).code == 0
    assert assert_consistent(dest)["frames"] == 1200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("seed=0,1", "env=Nope"), "job 0 (total_frames=100 seed=0 env=Nope): unknown env 'Nope'"),
        (("seed=0,1", "total_frames=1.5"), "total_frames must be integral"),
        (("seed=0,1", "out=same.h5"), "jobs 0 and 1 would both write 'same.h5'"),
        (("seed=0,1", "hydra/launcher=nope"), "unknown hydra/launcher 'nope'"),
        (("seed=0,[1",), "seed=0,[1"),
        (("seed=0,1", "hydra/sweeper=optuna"), "basic sweeper only"),
        (("seed=0,1", "hydra.job.chdir=true,false"), "cannot be swept"),
        (("seed=0,1", "resume=true"), "resume=true in a sweep needs out naming each job's"),
    ],
)
def test_sweep_usage_errors_exit_2_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", "-m", "total_frames=100", *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_plain_run_leaves_no_hydra_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("run", *TINY, "progress=none")
    assert res.code == 0, res.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "data",
        "data/CartPole-v1_random_s0.h5",
    ]
    assert json.loads(res.stdout)["path"] == "data/CartPole-v1_random_s0.h5"


def test_merge_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from collect_cli.cli import app\n"
        "r = CliRunner().invoke(app, ['merge', '--help'])\n"
        "assert r.exit_code == 0 and '--allow-incomplete' in r.output, r.output\n"
        "r = CliRunner().invoke(app, ['run', '--help'])\n"
        "assert r.exit_code == 0 and '--multirun' in r.output, r.output\n"
        "print(sorted(m for m in ('torch', 'hydra', 'h5py') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_slurm_example_config_composes():
    """The README's SLURM recipe: its launcher config composes (nothing is submitted)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir

    from collect_cli import config

    config.register()
    examples = Path(__file__).parents[1] / "examples" / "launchers"
    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base=None):
        cfg = compose(
            "config",
            overrides=[f"hydra.searchpath=[file://{examples}]", "hydra/launcher=slurm"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.timeout_min, launcher.cpus_per_task) == ("cpu", 240, 8)


def test_ray_cluster_launcher_joins_a_running_cluster_without_a_searchpath():
    """docs/cli.md's Ray recipe: ``hydra/launcher=ray_cluster`` (in rlcollect's conf/)
    joins the cluster ``ray start`` made, as a client may (nothing is started here)."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    from hydra import compose, initialize_config_dir

    from collect_cli import config

    config.register()
    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base=None):
        cfg = compose("config", overrides=["hydra/launcher=ray_cluster"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    assert dict(launcher.ray.init) == {"address": "auto", "object_store_memory": None}
    assert (launcher.ray.remote.num_cpus, launcher.ray.remote.max_retries) == (1, 0)


def test_ray_launcher_missing_says_what_to_install(monkeypatch):
    from collect_cli import sweep

    monkeypatch.setattr(sweep.importlib.util, "find_spec", lambda name: None)
    error = sweep._missing_ray(["hydra/launcher=ray_cluster"])
    assert "hydra/launcher=ray_cluster: the Ray launcher is not installed" in str(error)
    assert "pip install 'rlcollect[sweep]'" in str(error)
    assert sweep._missing_ray(["hydra/launcher=joblib"]) is None


def test_a_ray_job_whose_process_died_is_a_failed_job_of_the_summary():
    """On Ray, ``ray.get`` of a job whose worker died returns its failure (exit 1,
    named, with its shard) instead of ending the whole sweep (tests/test_sweep_ray.py
    kills a job on a real cluster)."""
    from types import SimpleNamespace

    from collect_cli import sweep

    class WorkerCrashedError(Exception):
        pass

    def get(ref):
        if ref == 1:
            raise WorkerCrashedError("The worker died unexpectedly while executing this task.")
        return SimpleNamespace(return_value={"job": ref, "exit_code": 0})

    ray = SimpleNamespace(get=get, exceptions=SimpleNamespace(RayError=WorkerCrashedError))
    jobs = sweep._RayJobs(ray)
    plan = sweep.Plan("s", [], [], [["seed=0"], ["seed=1"]], [Path("a.h5"), Path("b.h5")])
    assert sweep._result(jobs.get(0), 0, plan) == {"job": 0, "exit_code": 0}
    lost = sweep._result(jobs.get(1), 1, plan)
    assert (lost["job"], lost["overrides"], lost["path"]) == (1, ["seed=1"], "b.h5")
    assert (lost["status"], lost["exit_code"]) == ("failed", 1)
    assert lost["error"].startswith("its Ray task failed (WorkerCrashedError: The worker died")
    assert jobs.exceptions is ray.exceptions  # the rest of ray as it is
