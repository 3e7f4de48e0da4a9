"""policy=sb3 with real Stable-Baselines3 models trained for a few steps, policy=export,
and the provenance recorded with the dataset."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections import OrderedDict
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch
import yaml

from collect_cli import config
from collect_cli.dataformat import ACTION_LOG_PROB, Q_VALUES, VALUE
from collect_cli.errors import PolicyError, UsageError
from collect_cli.policies import loaders, provenance
from collect_cli.policies.build import build_policy
from collect_cli.policies.sb3.locate import resolve
from collect_cli.policies.sb3.options import Sb3PolicyConfig
from collect_cli.run import run
from tests.support.cli_runner import run_cli

sb3 = pytest.importorskip("stable_baselines3")
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

SMALL = {"net_arch": [16]}  # SB3 adds to policy_kwargs: each model gets a copy


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny models (a few gradient steps: the tests check plumbing, not skill)."""
    from stable_baselines3 import DQN, PPO, SAC

    root = tmp_path_factory.mktemp("sb3")
    out = {}
    ppo = PPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=32,
        batch_size=32,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(SMALL),
        device="cpu",
    )
    ppo.learn(64)
    ppo.save(root / "ppo.zip")
    out["ppo"] = root / "ppo.zip"
    sac = SAC(
        "MlpPolicy",
        "Pendulum-v1",
        learning_starts=16,
        batch_size=16,
        seed=0,
        policy_kwargs=dict(SMALL),
        device="cpu",
    )
    sac.learn(32)
    sac.save(root / "sac.zip")
    out["sac"] = root / "sac.zip"
    dqn = DQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_starts=16,
        batch_size=16,
        seed=0,
        policy_kwargs=dict(SMALL),
        device="cpu",
    )
    dqn.learn(32)
    dqn.save(root / "dqn.zip")
    out["dqn"] = root / "dqn.zip"
    ppo.learn(64)  # a later checkpoint of the same run (the "expert" of a D4RL-style mix)
    ppo.save(root / "ppo_later.zip")
    out["ppo_later"] = root / "ppo_later.zip"
    norm_dir = root / "normalized"
    norm_dir.mkdir()
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), clip_obs=1.5)
    normed = PPO(
        "MlpPolicy",
        venv,
        n_steps=32,
        batch_size=32,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(SMALL),
        device="cpu",
    )
    normed.learn(64)
    normed.save(norm_dir / "ppo.zip")
    venv.save(norm_dir / "vecnormalize.pkl")
    out["normalized"] = norm_dir / "ppo.zip"
    return out


def collect(tmp_path: Path, name: str, *overrides: str) -> Path:
    out = tmp_path / f"{name}.h5"
    cfg = config.compose(
        [
            "frames_per_batch=64",
            "total_frames=128",
            "env.num_envs=4",
            "progress=none",
            f"out={out}",
            *overrides,
        ]
    )
    result = run(config.load(cfg))
    assert result.status == "complete"
    return out


def frames(path: Path, *keys: str) -> list[np.ndarray]:
    """The valid frames of ``keys`` in lane-then-time order."""
    with h5py.File(path) as f:
        mask = f["collector/mask"][:]
        return [f[k][:][mask] for k in keys]


def test_ppo_actions_log_probs_values_match_sb3(models, tmp_path):
    from stable_baselines3 import PPO

    path = collect(tmp_path, "ppo", "env=CartPole", "policy=sb3", f"policy.path={models['ppo']}")
    obs, action, log_prob, value = frames(path, "observation", "action", ACTION_LOG_PROB, VALUE)
    model = PPO.load(models["ppo"], device="cpu")
    expected, _ = model.predict(obs, deterministic=True)
    np.testing.assert_array_equal(action, expected)
    obs_t, act_t = torch.as_tensor(obs), torch.as_tensor(action)
    with torch.no_grad():
        values, sb3_log_prob, _ = model.policy.evaluate_actions(obs_t, act_t)
    np.testing.assert_allclose(log_prob, sb3_log_prob.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, values.numpy().ravel(), rtol=1e-5, atol=1e-6)
    assert np.ptp(value) > 0 and np.ptp(log_prob) > 0  # they follow the observations
    bare = collect(tmp_path, "bare", "env=CartPole", "policy=sb3",
                   f"policy.path={models['ppo']}", "policy.extras=false")  # fmt: skip
    with h5py.File(bare) as f:
        assert ACTION_LOG_PROB not in f and VALUE not in f
    obs, action = frames(bare, "observation", "action")
    np.testing.assert_array_equal(action, model.predict(obs, deterministic=True)[0])


def test_sac_deterministic_matches_predict(models, tmp_path):
    from stable_baselines3 import SAC

    path = collect(tmp_path, "sac", "env=Pendulum", "policy=sb3", f"policy.path={models['sac']}")
    obs, action = frames(path, "observation", "action")
    expected, _ = SAC.load(models["sac"], device="cpu").predict(obs, deterministic=True)
    np.testing.assert_allclose(action, expected, rtol=1e-6, atol=1e-6)
    assert action.dtype == np.float32


def test_sac_sampling_is_reproducible_with_sb3_log_probs(models, tmp_path):
    from stable_baselines3 import SAC

    args = (
        "env=Pendulum",
        "policy=sb3",
        f"policy.path={models['sac']}",
        "policy.deterministic=false",
    )
    a = frames(collect(tmp_path, "a", *args, "seed=3"), "observation", "action", ACTION_LOG_PROB)
    b = frames(collect(tmp_path, "b", *args, "seed=3"), "action")[0]
    c = frames(collect(tmp_path, "c", *args, "seed=4"), "action")[0]
    np.testing.assert_array_equal(a[1], b)
    assert not np.array_equal(a[1], c)
    obs, action, log_prob = a
    model = SAC.load(models["sac"], device="cpu")
    deterministic, _ = model.predict(obs, deterministic=True)
    assert not np.allclose(action, deterministic)  # sampled, not the mode
    actor = model.policy.actor
    with torch.no_grad():  # the log-prob of the recorded action in the policy's [-1, 1] space
        mean, log_std, kwargs = actor.get_action_dist_params(torch.as_tensor(obs))
        dist = actor.action_dist.proba_distribution(mean, log_std, **kwargs)
        scaled = torch.as_tensor(model.policy.scale_action(action))
        expected = dist.log_prob(scaled).numpy()
    np.testing.assert_allclose(log_prob, expected, rtol=1e-3, atol=1e-3)


def test_dqn_actions_and_q_values(models, tmp_path):
    from stable_baselines3 import DQN

    path = collect(tmp_path, "dqn", "env=CartPole", "policy=sb3", f"policy.path={models['dqn']}")
    obs, action, q_values = frames(path, "observation", "action", Q_VALUES)
    model = DQN.load(models["dqn"], device="cpu")
    expected, _ = model.predict(obs, deterministic=True)
    np.testing.assert_array_equal(action, expected)
    with torch.no_grad():
        np.testing.assert_allclose(q_values, model.q_net(torch.as_tensor(obs)).numpy(), rtol=1e-5)
    assert q_values.shape == (len(obs), 2)


def test_vecnormalize_beside_the_model_is_applied_to_raw_observations(models, tmp_path):
    from stable_baselines3 import PPO

    model_path = models["normalized"]
    path = collect(tmp_path, "n", "env=Pendulum", "policy=sb3", f"policy.path={model_path}")
    obs, action = frames(path, "observation", "action")
    np.testing.assert_allclose(obs[:, 0] ** 2 + obs[:, 1] ** 2, 1.0, rtol=1e-5)  # raw: cos, sin
    stats = VecNormalize.load(
        str(model_path.parent / "vecnormalize.pkl"), make_vec_env("Pendulum-v1")
    )
    model = PPO.load(model_path, device="cpu")
    expected, _ = model.predict(stats.normalize_obs(obs), deterministic=True)
    np.testing.assert_array_equal(action, expected)
    unnormalised, _ = model.predict(obs, deterministic=True)
    assert not np.allclose(action, unnormalised)  # the statistics matter for this model
    off = collect(
        tmp_path,
        "off",
        "env=Pendulum",
        "policy=sb3",
        f"policy.path={model_path}",
        "policy.vecnormalize=none",
    )
    obs_off, action_off = frames(off, "observation", "action")
    np.testing.assert_array_equal(action_off, model.predict(obs_off, deterministic=True)[0])
    with h5py.File(path) as f:
        record = json.loads(f.attrs[provenance.PROVENANCE])
    assert record["vecnormalize"]["sha256"] == sha256(model_path.parent / "vecnormalize.pkl")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def zoo_folder(root: Path, models, hyper: dict | None = None) -> Path:
    """The layout ``rl_zoo3 train --algo ppo --env CartPole-v1`` writes."""
    folder = root / "logs" / "ppo" / "CartPole-v1_1"
    params = folder / "CartPole-v1"
    params.mkdir(parents=True)
    shutil.copy(models["ppo"], folder / "CartPole-v1.zip")
    shutil.copy(models["ppo"], folder / "rl_model_64_steps.zip")
    best = folder / "best_model.zip"
    shutil.copy(models["ppo"], best)
    with best.open("ab") as f:  # a different file (zips tolerate trailing bytes)
        f.write(b"best")
    saved = OrderedDict(sorted({"n_envs": 8, "policy": "MlpPolicy", **(hyper or {})}.items()))
    (params / "config.yml").write_text(yaml.dump(saved))  # !!python/object/apply tags
    (params / "args.yml").write_text(yaml.dump(OrderedDict([("algo", "ppo"), ("seed", 0)])))
    return folder


def test_rl_zoo_folder_checkpoints(models, tmp_path):
    folder = zoo_folder(tmp_path, models)
    assert (
        "python/object/apply:collections.OrderedDict"
        in (folder / "CartPole-v1" / "config.yml").read_text()
    )
    path = collect(tmp_path, "zoo", "env=CartPole", "policy=sb3", f"policy.path={folder}")
    with h5py.File(path) as f:
        record = json.loads(f.attrs[provenance.PROVENANCE])
    assert record["checkpoint"]["name"] == "best_model.zip"
    assert record["checkpoint"]["sha256"] == sha256(folder / "best_model.zip")
    assert (record["algorithm"], record["zoo_folder"]) == ("PPO", "CartPole-v1_1")
    for checkpoint, name in (("last", "CartPole-v1.zip"), ("64", "rl_model_64_steps.zip")):
        cfg = Sb3PolicyConfig(path=str(folder), checkpoint=checkpoint)
        assert resolve(cfg).model == folder / name
    with pytest.raises(
        PolicyError, match=r"no rl_model_5_steps.zip \(it has CartPole-v1.zip, best"
    ):
        resolve(Sb3PolicyConfig(path=str(folder), checkpoint="5"))


TIME_FEATURE = "sb3_contrib.common.wrappers.TimeFeatureWrapper"


def test_rl_zoo_env_wrapper_is_applied_around_each_env(tmp_path):
    """A zoo run trained inside TimeFeatureWrapper: the envs get the same wrapper, so
    the recorded observation is the one the model saw (the time feature appended)."""
    from sb3_contrib.common.wrappers import TimeFeatureWrapper
    from stable_baselines3 import SAC

    sac = SAC(
        "MlpPolicy",
        TimeFeatureWrapper(gym.make("Pendulum-v1")),
        learning_starts=16,
        batch_size=16,
        seed=0,
        policy_kwargs=dict(SMALL),
        device="cpu",
    )
    sac.learn(32)
    folder = tmp_path / "logs" / "sac" / "Pendulum-v1_1"
    (folder / "Pendulum-v1").mkdir(parents=True)
    sac.save(folder / "Pendulum-v1.zip")
    hyper = OrderedDict([("env_wrapper", [{TIME_FEATURE: {"max_steps": 200}}]), ("policy", "Mlp")])
    (folder / "Pendulum-v1" / "config.yml").write_text(yaml.dump(hyper))
    (folder / "Pendulum-v1" / "args.yml").write_text(yaml.dump(OrderedDict([("algo", "sac")])))

    path = collect(tmp_path, "tf", "env=Pendulum", "policy=sb3", f"policy.path={folder}")
    obs, action = frames(path, "observation", "action")
    with h5py.File(path) as f:
        first = f["observation"][:, 0]
    assert obs.shape[1] == 4 and np.allclose(first[:, 3], 1.0)  # 1 - t / max_steps at t=0
    want, _ = SAC.load(folder / "Pendulum-v1.zip", device="cpu").predict(obs, deterministic=True)
    np.testing.assert_allclose(action, want, atol=1e-5)
    with pytest.raises(UsageError, match=r"use env\.backend=gymnasium, not native"):
        collect(tmp_path, "n", "env=Pendulum", "env.backend=native", "policy=sb3",
                f"policy.path={folder}")  # fmt: skip


def test_rl_zoo_wrappers_and_python_tags_are_refused(models, tmp_path):
    vectorised = zoo_folder(tmp_path / "a", models, {"vec_env_wrapper": [TIME_FEATURE]})
    with pytest.raises(PolicyError, match=r"vec_env_wrapper sb3_contrib\.common\.wrappers"):
        resolve(Sb3PolicyConfig(path=str(vectorised)))
    unknown = zoo_folder(tmp_path / "d", models, {"env_wrapper": "nowhere.Wrapper"})
    res = run_cli(
        "run", "env=CartPole", "policy=sb3", f"policy.path={unknown}", "total_frames=64",
        f"out={tmp_path / 'u.h5'}", "progress=none", cwd=tmp_path,
    )  # fmt: skip
    assert res.code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "env wrapper 'nowhere.Wrapper' cannot be imported" in res.stderr
    assert not (tmp_path / "u.h5").exists()
    stacked = zoo_folder(tmp_path / "b", models, {"frame_stack": 4})
    with pytest.raises(PolicyError, match="frame_stack=4"):
        resolve(Sb3PolicyConfig(path=str(stacked)))
    hostile = zoo_folder(tmp_path / "c", models)
    marker = tmp_path / "ran"
    (hostile / "CartPole-v1" / "config.yml").write_text(
        f"!!python/object/apply:os.system ['touch {marker}']\n"
    )
    with pytest.raises(PolicyError, match="cannot read RL Zoo file"):
        resolve(Sb3PolicyConfig(path=str(hostile)))
    assert not marker.exists()


def test_mismatched_model_is_a_usage_error_naming_both_spaces(models, tmp_path):
    out = tmp_path / "x.h5"
    res = run_cli(
        "run",
        "env=Pendulum",
        "policy=sb3",
        f"policy.path={models['dqn']}",
        "total_frames=64",
        f"out={out}",
        "progress=none",
        cwd=tmp_path,
    )
    assert res.code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rlcollect: error: policy.path dqn.zip: the model's observation")
    assert "(4,)" in lines[0] and "(3,)" in lines[0]
    assert not out.exists()
    obs_space, act_space = gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(3)
    cfg = Sb3PolicyConfig(path=str(models["ppo"]))
    with pytest.raises(
        PolicyError, match=r"action space Discrete\(2\) does not match.*Discrete\(3\)"
    ):
        build_policy(cfg, obs_space, act_space, torch.device("cpu"), 0)


def test_without_sb3_the_error_says_what_to_install(models, tmp_path):
    code = (
        "import sys; sys.modules['stable_baselines3'] = None; "  # as if it were not installed
        "from collect_cli.cli import main; "
        f"sys.argv = ['rlcollect', 'run', 'env=CartPole', 'policy=sb3', "
        f"'policy.path={models['ppo']}', 'out={tmp_path / 'y.h5'}', 'progress=none']; main()"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "rlcollect: error: policy=sb3 needs Stable-Baselines3: pip install 'rlcollect[sb3]'"
    )


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.net(obs)
        return {"action": 2 * torch.tanh(y), "score": y.squeeze(-1)}


def test_export_program_drives_a_run(tmp_path):
    module = TwoHeads()
    program = torch.export.export(
        module, (torch.zeros(4, 3),), dynamic_shapes=({0: torch.export.Dim("lanes")},)
    )
    torch.export.save(program, tmp_path / "policy.pt2")
    path = collect(
        tmp_path,
        "ex",
        "env=Pendulum",
        "policy=export",
        f"policy.path={tmp_path / 'policy.pt2'}",
        "dataset.author=Ada",
    )
    obs, action, score = frames(path, "observation", "action", "score")
    with torch.no_grad():
        expected = program.module()(torch.as_tensor(obs))
    np.testing.assert_allclose(action, expected["action"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(score, expected["score"].numpy(), rtol=1e-6)
    with h5py.File(path) as f:
        record = json.loads(f.attrs[provenance.PROVENANCE])
        assert json.loads(f.attrs[provenance.DATASET]) == {"author": "Ada"}
    assert record["checkpoint"]["sha256"] == sha256(tmp_path / "policy.pt2")
    (tmp_path / "junk.pt2").write_bytes(b"junk")
    with pytest.raises(PolicyError, match=r"is not a torch\.export program"):
        loaders.load_export_policy(str(tmp_path / "junk.pt2"))


def test_torchscript_says_once_that_it_is_deprecated(tmp_path, caplog, monkeypatch):
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 1)), tmp_path / "p.pt")
    monkeypatch.setattr(loaders, "_torchscript_noted", False)
    with caplog.at_level(logging.WARNING, logger="rlcollect"):
        loaders.load_torchscript_policy(str(tmp_path / "p.pt"))
        loaders.load_torchscript_policy(str(tmp_path / "p.pt"))
    notes = [r for r in caplog.records if "TorchScript is deprecated" in r.getMessage()]
    assert len(notes) == 1
    assert "policy=export" in notes[0].getMessage()


def test_provenance_through_info_merge_and_exports(models, tmp_path, monkeypatch):
    import minari
    from typer.testing import CliRunner

    from collect_cli.cli import app
    from collect_cli.ops.export import export
    from collect_cli.ops.merge import merge

    user = (
        "dataset.author=Ada",
        "dataset.author_email=ada@example.org",
        "dataset.ref_min_score=0",
        "dataset.ref_max_score=500",
    )
    shards = [
        collect(tmp_path, name, "env=CartPole", "policy=sb3", f"policy.path={model}", *user)
        for name, model in (("medium", models["ppo"]), ("expert", models["ppo_later"]))
    ]
    res = CliRunner().invoke(app, ["info", str(shards[0]), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["provenance"]["checkpoint"] == {
        "name": "ppo.zip",
        "size": models["ppo"].stat().st_size,
        "sha256": sha256(models["ppo"]),
    }
    assert shown["provenance"]["algorithm"] == "PPO"
    assert shown["provenance"]["library_versions"]["stable-baselines3"] == sb3.__version__
    assert shown["dataset"]["author"] == "Ada"
    mean = shown["return"]["mean"]
    assert shown["normalized_score"] == pytest.approx(100 * mean / 500)

    merged = tmp_path / "medium-expert.h5"
    merge(shards, merged)
    with h5py.File(merged) as f:
        meta = {k: f.attrs[k] for k in ("shards", provenance.DATASET)}
    entries = json.loads(meta["shards"])
    assert [e["provenance"]["checkpoint"]["name"] for e in entries] == ["ppo.zip", "ppo_later.zip"]
    assert json.loads(meta[provenance.DATASET])["ref_max_score"] == 500

    d4rl = tmp_path / "d4rl.hdf5"
    export(shards[0], "d4rl", d4rl)
    with h5py.File(d4rl) as f:
        assert f["metadata/checkpoint_sha256"].asstr()[()] == sha256(models["ppo"])
        assert f["metadata/author"].asstr()[()] == "Ada"
        assert f["metadata/ref_max_score"][()] == 500
    out = tmp_path / "minari" / "rlcollect" / "cartpole-v0"
    export(shards[0], "minari", out)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    saved = minari.load_dataset("rlcollect/cartpole-v0").storage.metadata
    assert (saved["author"], saved["author_email"]) == ({"Ada"}, {"ada@example.org"})
    assert (saved["ref_min_score"], saved["ref_max_score"]) == (0, 500)
    assert saved["algorithm_name"].startswith("PPO (ppo.zip)")


def test_resume_refuses_another_checkpoint(tmp_path):
    from collect_cli.errors import ConfigError
    from tests.helpers import wait_for_frames
    from tests.support.cli_runner import start_run

    for name, seed in (("a.pt2", 0), ("b.pt2", 1)):
        torch.manual_seed(seed)
        net = torch.nn.Linear(3, 1)
        lanes = torch.export.Dim("lanes")
        program = torch.export.export(net, (torch.zeros(4, 3),), dynamic_shapes=({0: lanes},))
        torch.export.save(program, tmp_path / name)
    out = tmp_path / "r.h5"
    common = ["env=Pendulum", "policy=export", f"out={out}", "progress=none"]
    proc = start_run([*common, f"policy.path={tmp_path / 'a.pt2'}", "total_frames=-1"], tmp_path)
    wait_for_frames(out, proc, minimum=2000)
    proc.terminate()
    proc.communicate()
    resume = [*common, "resume=true", "total_frames=1e6"]
    other = config.load(config.compose([*resume, f"policy.path={tmp_path / 'b.pt2'}"]))
    with pytest.raises(ConfigError, match="its policy checkpoint differ"):
        run(other)
    same = [*resume, f"policy.path={tmp_path / 'a.pt2'}", "total_frames=4000"]
    assert run(config.load(config.compose(same))).status == "complete"


@pytest.mark.parametrize(
    ("algo", "preset", "extra"),
    [("A2C", "CartPole", VALUE), ("TD3", "Pendulum", None), ("QRDQN", "CartPole", Q_VALUES),
     ("TQC", "Pendulum", ACTION_LOG_PROB)],
)  # fmt: skip
def test_more_algorithms_match_predict(tmp_path, algo, preset, extra):
    import sb3_contrib
    import stable_baselines3

    cls = getattr(stable_baselines3, algo, None) or getattr(sb3_contrib, algo)
    env_id = {"CartPole": "CartPole-v1", "Pendulum": "Pendulum-v1"}[preset]
    kwargs = {"n_steps": 8} if algo == "A2C" else {"learning_starts": 8, "batch_size": 8}
    model = cls("MlpPolicy", env_id, seed=0, device="cpu", policy_kwargs=dict(SMALL), **kwargs)
    model.learn(16)
    model.save(tmp_path / "m.zip")
    assert resolve(Sb3PolicyConfig(path=str(tmp_path / "m.zip"))).algo == algo
    path = collect(
        tmp_path, "m", f"env={preset}", "policy=sb3", f"policy.path={tmp_path / 'm.zip'}"
    )
    obs, action = frames(path, "observation", "action")
    expected, _ = cls.load(tmp_path / "m.zip", device="cpu").predict(obs, deterministic=True)
    np.testing.assert_allclose(action, expected, rtol=1e-6, atol=1e-6)
    with h5py.File(path) as f:
        recorded = {k for k in (ACTION_LOG_PROB, VALUE, Q_VALUES) if k in f}
    assert recorded == ({extra} if extra else set()) | (
        {ACTION_LOG_PROB} if algo == "A2C" else set()
    )
