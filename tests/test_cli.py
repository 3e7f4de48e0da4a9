"""End-to-end: the real ``rlcollect`` CLI in a subprocess, on every writer backend."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import gymnasium as gym
import h5py
import numpy as np
import pytest
from tensordict import PersistentTensorDict, TensorDict

from collect_cli.dataset import open_dataset
from tests.support.cli_runner import out_path


def documented_frames(total: int, per_batch: int, lanes: int) -> int:
    """README rule: batches of lanes*ceil(per_batch/lanes) frames until >= total."""
    batch = lanes * math.ceil(per_batch / lanes)
    return math.ceil(total / batch) * batch


def load(path, backend):
    if backend == "hdf5":
        return PersistentTensorDict.from_h5(str(path)).to_tensordict()
    return TensorDict.load_memmap(path)


@pytest.mark.parametrize(
    ("env", "lanes", "per_batch"),
    [("Pendulum", 8, 1000), ("CartPole", 3, 1000), ("Pendulum", 7, 1000)],
)
def test_run_writes_documented_frames(cli, tmp_path, backend, env, lanes, per_batch):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        f"env={env}",
        "total_frames=20000",
        f"env.num_envs={lanes}",
        f"frames_per_batch={per_batch}",
        f"writer={backend}",
        f"out={out}",
    )
    assert res.code == 0, res.stderr
    expected = documented_frames(20000, per_batch, lanes)
    summary = res.summary
    assert summary["frames"] == expected
    assert summary["status"] == "complete"
    assert set(summary) == {"path", "frames", "episodes", "seconds", "frames_per_s", "status"}

    td = load(out, backend)
    assert td["collector", "mask"].sum().item() == expected
    assert td["observation"].shape[:2] == (lanes, expected // lanes)
    ds = open_dataset(out)
    assert ds.meta["frames"] == expected
    assert ds.meta["status"] == "complete"
    assert "total_frames: 20000" in ds.meta["config"]
    assert td["episodes"].batch_size[0] == summary["episodes"] == ds.meta["episodes"]


def test_hdf5_is_plain_h5py(cli, tmp_path):
    out = tmp_path / "p.h5"
    assert cli("run", "total_frames=2000", f"out={out}").code == 0
    with h5py.File(out, "r") as f:
        for key in (
            "observation",
            "action",
            "done",
            "terminated",
            "truncated",
            "next/observation",
            "next/reward",
            "next/done",
            "next/terminated",
            "next/truncated",
            "collector/traj_ids",
            "collector/mask",
            "episodes/traj_id",
            "episodes/return",
            "episodes/complete",
        ):
            assert key in f, key
        assert f["next/reward"].shape == (8, 250, 1)
        assert f["collector/traj_ids"].dtype == np.int64
        assert f.attrs["status"] == "complete"
        assert json.loads(f.attrs["observation_space"])["type"] == "Box"


def test_pendulum_episodes_truncated_and_rewards_match_gymnasium(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli("run", "env=Pendulum", "total_frames=4000", f"writer={backend}", f"out={out}")
    assert res.code == 0, res.stderr
    ds = open_dataset(out)
    ep = ds.episodes()
    done = ep["complete"]
    assert (ep["length"][done] == 200).all() and done.sum() == 16
    assert ep["truncated"][done].all() and not ep["terminated"].any()

    td = load(out, backend)
    obs = td["observation"].numpy().reshape(-1, 3)
    action = td["action"].numpy().reshape(-1, 1)
    reward = td["next", "reward"].numpy().reshape(-1)
    env = gym.make("Pendulum-v1").unwrapped
    env.reset(seed=0)
    for i in range(0, len(obs), 97):
        cos, sin, thetadot = obs[i]
        env.state = np.array([np.arctan2(sin, cos), thetadot], dtype=np.float64)
        _, r, *_ = env.step(action[i])
        assert r == pytest.approx(reward[i], rel=1e-4, abs=1e-4)


def test_traj_ids_and_transitions_consistent(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        "env=CartPole",
        "env.num_envs=4",
        "total_frames=6000",
        "frames_per_batch=400",
        f"writer={backend}",
        f"out={out}",
    )
    assert res.code == 0, res.stderr
    td = load(out, backend)
    traj = td["collector", "traj_ids"].numpy()
    done = td["next", "done"].numpy()[..., 0]
    obs, nxt = td["observation"].numpy(), td["next", "observation"].numpy()
    changes = traj[:, 1:] != traj[:, :-1]
    np.testing.assert_array_equal(changes, done[:, :-1])
    inside = ~done[:, :-1]
    np.testing.assert_array_equal(nxt[:, :-1][inside], obs[:, 1:][inside])
    # the final observation of a terminated CartPole episode is outside the bounds
    term = td["next", "terminated"].numpy()[..., 0]
    final = nxt[term]
    assert ((np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 0.2094)).all()
    ids = np.unique(traj)
    assert len(ids) == len(np.unique(td["episodes", "traj_id"].numpy()))
    # episodes table agrees with the frames
    ep = {k: td["episodes", k].numpy() for k in ("traj_id", "lane", "start", "length", "return")}
    rew = td["next", "reward"].numpy()[..., 0]
    for i in range(len(ep["traj_id"])):
        lane, s, n = ep["lane"][i], ep["start"][i], ep["length"][i]
        assert (traj[lane, s : s + n] == ep["traj_id"][i]).all()
        assert rew[lane, s : s + n].sum() == pytest.approx(ep["return"][i])


def test_same_seed_same_arrays_other_seed_differs(cli, tmp_path, backend):
    outs = {}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        outs[name] = out_path(tmp_path, backend, name)
        args = ("run", "policy=mlp", f"seed={seed}", "total_frames=3000", f"writer={backend}")
        assert cli(*args, f"out={outs[name]}").code == 0
    a, b, c = (load(outs[k], backend) for k in "abc")
    for key in (("observation",), ("action",), ("next", "reward"), ("collector", "traj_ids")):
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    assert not np.array_equal(a["observation"].numpy(), c["observation"].numpy())
    assert not np.array_equal(a["action"].numpy(), c["action"].numpy())


def test_nested_spaces_become_nested_keys(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        "env=gym",
        "env.id=toyenvs:Nested-v0",
        "env.num_envs=2",
        "total_frames=40",
        "frames_per_batch=10",
        f"writer={backend}",
        f"out={out}",
    )
    assert res.code == 0, res.stderr
    td = load(out, backend)
    assert td["observation", "pos"].shape == (2, 20, 2)
    assert td["observation", "mode"].dtype.is_floating_point is False
    assert td["next", "observation", "flags"].shape == (2, 20, 4)
    assert td["action", "0"].shape == (2, 20)
    assert td["action", "1"].shape == (2, 20, 3)
    assert td["action", "2"].shape == (2, 20, 2)
    assert (td["action", "1"].abs() <= 2).all()


def test_info_json(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    assert cli("run", "total_frames=1000", f"writer={backend}", f"out={out}").code == 0
    res = cli("info", str(out), "--json")
    assert res.code == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["frames"] == 1000 and info["status"] == "complete"
    assert info["backend"] == backend and info["env_id"] == "Pendulum-v1"
    keys = {k["key"]: k for k in info["keys"]}
    assert keys["next/reward"]["shape"] == [8, 125, 1]
    assert info["size_bytes"] > 0 and info["return"] is None  # no episode completed
    table = cli("info", str(out))
    assert table.code == 0 and "Pendulum-v1" in table.stdout


def test_default_out_under_data(cli, tmp_path):
    res = cli("run", "total_frames=500", "progress=none")
    assert res.code == 0, res.stderr
    assert (tmp_path / "data" / "Pendulum-v1_random_s0.h5").is_file()
    assert res.stderr == ""
    again = cli("run", "total_frames=500", "progress=none")
    assert again.code == 2 and "already exists" in again.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("total_frames=1.5",), "total_frames must be integral"),
        (("total_frames=abc",), "total_frames must be a number"),
        (("total_frames=0",), "total_frames must be a positive integer"),
        (("frames_per_batch=-3",), "frames_per_batch must be a positive integer"),
        (("env=Nope",), "Nope"),
        (("env=gym", "env.id=Pendulm-v1"), "did you mean Pendulum-v1"),
        (("env=gym",), "env.id"),
        (("writer=zarr",), "hdf5"),
        (("bogus_key=1",), "bogus_key"),
        (("device=gpu:x",), "is not a device"),
        (("device=cuda:0",), "CUDA"),
        (("env=gym", "env.id=toyenvs:TextAction-v0"), "unsupported action space Text"),
        (("policy=mlp", "policy.checkpoint=missing.pt"), "does not exist"),
        (("policy=mlp", "policy.checkpoint=corrupt.pt"), "not a readable state_dict"),
        (("frames_per_batch=2.5",), "frames_per_batch must be integral"),
        (("total_frames=-5",), "or -1 to run until interrupted"),
        (("out=blocker/ds.h5",), "is not writable"),
        (("out=/proc/x/y.h5",), "'/proc' is not writable"),  # root passes os.access there
        (("collector=multisync", "collector.workers=0"), "collector.workers must be at least 1"),
        (("collector=multisync", "collector.preemptive_threshold=1.5"), "preemptive_threshold"),
        (("collector=multisync", "env=gym", "env.id=Nope-v3"), "unknown env id 'Nope-v3'"),
        (("policy=python", "policy.target=nomodule:make"), "No module named 'nomodule'"),
        (("policy=python", "policy.target=badpolicymodule:make"), "cannot be imported"),
        (("policy=python",), "policy=python needs policy.target"),
        (("policy=torchscript", "policy.path=missing.pt"), "does not exist"),
        (("policy=torchscript", "policy.path=corrupt.pt"), "is not a TorchScript file"),
        (("postproc=multistep", "postproc.n=0"), "postproc.n must be at least 1"),
        (
            ("postproc=multistep", "collector=multisync", "collector.preemptive_threshold=0.5"),
            "postproc=multistep needs whole batches",
        ),
        (("split_trajs=true", "reset_when_done=false"), "split_trajs=true needs reset_when_done"),
        (("max_frames_per_traj=0",), "max_frames_per_traj must be a positive integer or -1"),
        (("max_frames_per_traj=50",), "conflicts with the time limit of Pendulum-v1 (200 steps)"),
        (
            ("collector=multisync", "max_frames_per_traj=50"),
            "conflicts with the time limit of Pendulum-v1",
        ),
        (("exploration_type=greedy",), "exploration_type='greedy' is not valid"),
        (("policy.noise=ou",), "policy.noise='ou' is not valid: choose from none, gaussian"),
        (("policy.noise=epsilon",), "policy.noise=epsilon needs discrete actions"),
        (
            ("env.backend=native", "env.num_envs=8001"),
            "writer=hdf5 records at most 8000 env lanes",
        ),
    ],
)
def test_usage_errors_exit_2_one_line(cli, tmp_path, args, message):
    if "device=cuda:0" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is present")
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "blocker").write_text("a file where a directory should be")
    args = ("out=ds.h5", *args) if not any(a.startswith("out=") for a in args) else args
    res = cli("run", "total_frames=100", *args)
    assert res.code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert message in lines[0]
    assert "Traceback" not in res.stderr
    line = json.loads(res.stdout)  # one JSON line, for pipelines, also when refused
    assert line["status"] == "failed" and line["exit_code"] == 2 and message in line["error"]
    assert not (tmp_path / "ds.h5").exists()


def test_python_and_torchscript_policies_drive_runs(cli, tmp_path):
    import torch

    out = tmp_path / "g.h5"
    res = cli(
        "run",
        "policy=python",
        "policy.target=toypolicies:gaussian",
        "total_frames=1000",
        f"out={out}",
        "collector=multisync",
    )
    assert res.code == 0, res.stderr
    ds = open_dataset(out)
    loc, scale = ds.array("loc"), ds.array("scale")
    action, logp = ds.array("action"), ds.array("action_log_prob")
    expected = torch.distributions.Normal(torch.as_tensor(loc), torch.as_tensor(scale)).log_prob(
        torch.as_tensor(action)
    )
    np.testing.assert_allclose(logp, expected.numpy().reshape(logp.shape), rtol=1e-5, atol=1e-5)

    net = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Tanh()))
    net.save(str(tmp_path / "p.pt"))
    out = tmp_path / "ts.h5"
    res = cli(
        "run",
        "policy=torchscript",
        f"policy.path={tmp_path / 'p.pt'}",
        "total_frames=1000",
        f"out={out}",
    )
    assert res.code == 0, res.stderr
    ds = open_dataset(out)
    obs = torch.as_tensor(ds.array("observation"))
    with torch.no_grad():
        np.testing.assert_allclose(ds.array("action"), net(obs).numpy(), rtol=1e-5, atol=1e-6)


def test_debug_true_prints_traceback(cli):
    res = cli("run", "total_frames=1.5", "debug=true")
    assert res.code == 2 and "Traceback" in res.stderr


def test_plain_progress_is_ansi_free(cli, tmp_path):
    res = cli("run", "total_frames=2000", "progress=plain", f"out={tmp_path / 'p.h5'}")
    assert res.code == 0
    assert "\x1b" not in res.stderr
    assert "frames 2000/2000 (100%)" in res.stderr
    json.loads(res.stdout.strip().splitlines()[-1])


def test_help_and_version_do_not_import_torch():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from collect_cli.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0 and 'run' in r.output, r.output\n"
        "r = CliRunner().invoke(app, ['--version'])\n"
        "assert r.exit_code == 0 and 'rlcollect' in r.output\n"
        "r = CliRunner().invoke(app, ['run', '--help'])\n"
        "assert r.exit_code == 0 and 'writer=hdf5|memmap' in r.output, r.output\n"
        "heavy = ('torch', 'hydra', 'tensordict', 'gymnasium')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_envs_json_and_cfg_job(cli):
    res = cli("envs", "--json")
    assert res.code == 0, res.stderr
    data = json.loads(res.stdout)
    presets = {p["name"]: p["id"] for p in data["presets"]}
    assert presets["CartPole"] == "CartPole-v1" and presets["gym"] is None
    assert {"name": "gymnasium", "available": True}.items() <= data["backends"][0].items()
    assert isinstance(data["cuda"]["available"], bool)
    cfg = cli("run", "--cfg", "job", "env=CartPole", "total_frames=1e4")
    assert cfg.code == 0, cfg.stderr
    assert "id: CartPole-v1" in cfg.stdout and "total_frames: 10000.0" in cfg.stdout
    bad = cli("run", "--cfg", "job", "total_frames=1.5")
    assert bad.code == 2 and "integral" in bad.stderr


@pytest.mark.parametrize("collector", ["sync", "multisync"])
def test_stdout_carries_the_result_only(cli, tmp_path, collector):
    """An env that prints (from Python and from C, in the main process or in a
    worker) prints to stderr: stdout is the one JSON line a pipeline reads."""
    res = cli(
        "run",
        "env=gym",
        "env.id=toyenvs:Chatty-v0",
        "env.num_envs=2",
        f"collector={collector}",
        "total_frames=40",
        "frames_per_batch=20",
        f"out={tmp_path / 'chatty.h5'}",
    )
    assert res.code == 0, res.stderr
    (line,) = res.stdout.splitlines()
    assert json.loads(line)["frames"] == 40
    assert "chatty: reset\n" in res.stderr and "chatty: reset from C\n" in res.stderr
