"""Recording a training run: ``Recorder`` fed by hand from gymnasium vector envs, and
``RecordCallback`` inside real Stable-Baselines3 training (PPO, SAC), compared with
what SB3 stored in its own buffers; a training process killed with SIGKILL."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from collect_cli import dataformat as fmt
from collect_cli.dataset import open_dataset
from collect_cli.errors import OutputError, RlcollectError, SpaceError, UsageError
from collect_cli.ops.export import export
from collect_cli.ops.merge import merge
from collect_cli.ops.summary import summarize
from collect_cli.ops.validate import validate
from collect_cli.record import Recorder
from collect_cli.record.recorder import signals_held
from tests.helpers import assert_consistent, assert_split_on_done, wait_for_frames
from tests.support.cli_runner import out_path

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"net_arch": [16]}


def cartpole_loop(
    path: Path, *, lanes: int = 3, steps: int = 300, mode=AutoresetMode.SAME_STEP, **kwargs
) -> dict[str, list]:
    """A random-action CartPole loop recorded by hand; what the env really gave: each
    lane's final observations and episode returns, in order."""
    envs = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * lanes, autoreset_mode=mode)
    obs, _ = envs.reset(seed=0)
    envs.action_space.seed(0)
    finals: list[list] = [[] for _ in range(lanes)]
    returns: list[list] = [[] for _ in range(lanes)]
    running = np.zeros(lanes)
    resetting = np.zeros(lanes, bool)
    space = envs.single_observation_space
    with Recorder(
        path, space, envs.single_action_space, num_envs=lanes, env_id="CartPole-v1", **kwargs
    ) as rec:
        for _ in range(steps):
            actions = envs.action_space.sample()
            nxt, rewards, terminated, truncated, infos = envs.step(actions)
            rec.step(obs, actions, rewards, nxt, terminated, truncated, infos)
            ended = (terminated | truncated) & ~resetting
            running += np.where(resetting, 0.0, rewards.astype(np.float32))
            for lane in np.flatnonzero(ended):
                final = infos["final_obs"][lane] if mode == AutoresetMode.SAME_STEP else nxt[lane]
                finals[lane].append(final)
                returns[lane].append(running[lane])
                running[lane] = 0.0
            if mode == AutoresetMode.NEXT_STEP:
                resetting = ended
            obs = nxt
    envs.close()
    return {"finals": finals, "returns": returns}


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_a_gymnasium_loop_records_true_final_observations_and_returns(tmp_path, backend, mode):
    path = out_path(tmp_path, backend)
    truth = cartpole_loop(path, mode=mode, writer=backend, steps_per_commit=40, autoreset=mode)
    meta = assert_consistent(path)
    assert meta["status"] == fmt.COMPLETE and meta["collector"] == "recorder"
    assert meta["env_lanes"] == 3 and meta["env_id"] == "CartPole-v1"
    assert assert_split_on_done(path) == meta["episodes"]
    ds = open_dataset(path)
    mask, traj = ds.array(fmt.MASK), ds.array(fmt.TRAJ)
    done = ds.array(fmt.path(fmt.DONE_KEY))[..., 0]
    ended = done & ~ds.array(fmt.path(fmt.TRUNCATED_KEY))[..., 0]  # by the env, not a cut
    nxt = ds.array(fmt.path(fmt.next_key((fmt.OBSERVATION,))))
    reward = ds.array(fmt.path(fmt.REWARD_KEY))[..., 0]
    rows = ds.episodes()
    for lane in range(3):
        # every episode the env ended: its frame's next observation is the env's final one
        got = nxt[lane][ended[lane] & mask[lane]]
        assert np.array_equal(got, np.asarray(truth["finals"][lane])), lane
        mine = rows["lane"] == lane
        order = np.argsort(rows["start"][mine])
        done = rows["complete"][mine][order]
        assert np.allclose(rows["return"][mine][order][done], truth["returns"][lane])
        for tid, ret in zip(rows["traj_id"][mine], rows["return"][mine], strict=True):
            frames = mask[lane] & (traj[lane] == tid)
            assert ret == reward[lane][frames].sum(dtype=np.float64)
    if mode == AutoresetMode.NEXT_STEP:  # the env's reset steps are not transitions
        assert int(meta["frames"]) == 3 * 300 - sum(len(f) for f in truth["finals"])


def test_a_new_sources_row_only_where_an_episode_starts_under_a_new_training_step(tmp_path):
    envs = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode="SameStep")
    obs, _ = envs.reset(seed=1)
    envs.action_space.seed(1)
    starts_at = {0}  # the steps at which some episode starts
    space = envs.single_observation_space
    with Recorder(
        tmp_path / "r.h5", space, envs.single_action_space, num_envs=2, env_id="CartPole-v1",
        algorithm="mine", seed=7, config={"lr": np.float32(0.5), "layers": (4, 4)},
    ) as rec:  # fmt: skip
        for i in range(200):
            actions = torch.as_tensor(envs.action_space.sample())  # torch in, as a loop has
            nxt, rewards, term, trunc, infos = envs.step(actions.numpy())
            rec.step(obs, actions, rewards, nxt, term, trunc, infos, policy_step=10 * i)
            if (term | trunc).any():
                starts_at.add(i + 1)
            obs = nxt
    starts_at.discard(200)
    meta = assert_consistent(tmp_path / "r.h5")
    table = meta[fmt.SOURCES]
    assert [row["training_step"] for row in table] == [10 * i for i in sorted(starts_at)]
    assert {row["algorithm"] for row in table} == {"mine"} and table[0]["seed"] == 7
    assert "lr: 0.5" in table[0][fmt.SOURCE_CONFIG] and "- 4" in table[0][fmt.SOURCE_CONFIG]
    rows = open_dataset(tmp_path / "r.h5").episodes()
    steps = np.array([table[s]["training_step"] for s in rows[fmt.SOURCE]])
    assert np.array_equal(steps, 10 * rows["start"])  # the policy at each episode's first step


def test_an_exception_inside_with_keeps_the_data_as_interrupted(tmp_path):
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    with (
        pytest.raises(RuntimeError, match="training blew up"),
        Recorder(
            tmp_path / "r", space, gym.spaces.Discrete(3), num_envs=4, env_id="Toy-v0",
            writer="memmap", steps_per_commit=8,
        ) as rec,
    ):  # fmt: skip
        for i in range(13):
            obs = np.full((4, 2), i / 20, np.float32)
            nxt = np.full((4, 2), (i + 1) / 20, np.float32)
            done = np.array([False, False, False, i == 6])
            extras = {"value": torch.full((4,), float(i)), ("aux", "x"): np.ones((4, 3))}
            rec.step(obs, np.ones(4, int), np.ones(4), nxt, done, np.zeros(4, bool), extras=extras)
        raise RuntimeError("training blew up")
    meta = assert_consistent(tmp_path / "r")
    assert meta["status"] == fmt.INTERRUPTED and meta["frames"] == 4 * 13
    ds = open_dataset(tmp_path / "r")
    # (an interrupted memmap dataset keeps its capacity: steps past 13 are padding)
    assert np.array_equal(ds.array("value")[0, :13], np.arange(13, dtype=np.float32))
    assert ds.array("aux/x")[:, :13].shape == (4, 13, 3)
    with pytest.raises(UsageError, match="is closed"):
        rec.step(obs, np.ones(4, int), np.ones(4), nxt, done, done)


def test_a_recording_reads_like_any_dataset(tmp_path):
    for name in ("a.h5", "b.h5"):
        cartpole_loop(tmp_path / name, lanes=2, steps=60, policy="mine")
    summary = summarize(open_dataset(tmp_path / "a.h5"))
    assert summary["policy"] == "mine" and summary[fmt.SOURCES][0]["episodes"] > 0
    merged = merge([tmp_path / "a.h5", tmp_path / "b.h5"], tmp_path / "m.h5")
    assert merged["frames"] == 240 and validate(tmp_path / "m.h5") == []
    assert len(open_dataset(tmp_path / "m.h5").meta[fmt.SOURCES]) == 2
    export(tmp_path / "a.h5", "d4rl", tmp_path / "a-d4rl.h5")
    assert (tmp_path / "a-d4rl.h5").exists()


def test_bad_requests_raise_one_line_errors(tmp_path):
    box, act = gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2)
    env = {"num_envs": 2, "env_id": "Toy-v0"}
    refused = [
        (lambda: Recorder(tmp_path / "x.h5", box, act, num_envs=0, env_id="T"), "num_envs"),
        (lambda: Recorder(tmp_path / "x.h5", box, act, num_envs=2, env_id=""), "env_id"),
        (lambda: Recorder(tmp_path / "x.h5", "Box", act, **env), "gymnasium space"),
        (lambda: Recorder(tmp_path / "x.h5", box, gym.spaces.Text(4), **env), "unsupported"),
        (lambda: Recorder(tmp_path / "x.h5", box, act, writer="zip", **env), "unknown writer"),
        (lambda: Recorder(tmp_path / "x.h5", box, act, autoreset="later", **env), "autoreset"),
        (lambda: Recorder(tmp_path / "x.h5", box, act, steps_per_commit=0, **env), "steps_per"),
        (lambda: Recorder(tmp_path / "x.h5", box, act, config="a: [", **env), "valid YAML"),
        (lambda: Recorder(tmp_path / "x.h5", box, act, total_frames=-5, **env), "total_fr"),
        (lambda: Recorder(tmp_path / "x.h5", box, act, commit_interval="1", **env), "commit_in"),
        (
            lambda: Recorder(tmp_path / "x.h5", box, act, writer_options={"zip": 1}, **env),
            "writer_options",
        ),
    ]
    for make, words in refused:
        with pytest.raises(UsageError, match=words) as info:
            make()
        assert "\n" not in str(info.value)
    assert not (tmp_path / "x.h5").exists()
    (tmp_path / "taken.h5").write_bytes(b"")
    with pytest.raises(OutputError, match="overwrite"):
        Recorder(tmp_path / "taken.h5", box, act, **env)

    obs, acts, ones = np.zeros((2, 3), np.float32), np.zeros(2, np.int64), np.ones(2)
    no = np.zeros(2, bool)
    rec = Recorder(tmp_path / "r.h5", box, act, **env, steps_per_commit=4)
    bad_steps = [
        ((np.zeros((3, 3)), acts, ones, obs, no, no), {}, r"obs has shape \(3, 3\)"),
        ((obs, np.zeros((2, 1)), ones, obs, no, no), {}, "actions has shape"),
        ((obs, acts + 0.5, ones, obs, no, no), {}, "float64 values that are not int64"),
        ((obs, acts, np.ones(3), obs, no, no), {}, r"rewards has shape \(3,\)"),
        ((obs, acts, ones, obs[:1], no, no), {}, "next_obs has shape"),
        ((obs, acts, ones, obs, np.zeros(5, bool), no), {}, "terminated has shape"),
        ((obs, acts, ones, obs, no, no), {"extras": {"action": ones}}, "dataset's own"),
        ((obs, acts, ones, obs, no, no), {"extras": {"v": np.ones(3)}}, "num_envs=2"),
        ((obs, acts, ones, obs, no, no), {"extras": [1]}, "dict"),
    ]
    for args, kw, words in bad_steps:
        with pytest.raises(UsageError, match=words) as info:
            rec.step(*args, **kw)
        assert "\n" not in str(info.value)
    rec.step(obs, acts, ones, obs, no, no, extras={"v": ones})
    with pytest.raises(UsageError, match="same keys at every step"):
        rec.step(obs, acts, ones, obs, no, no)
    with pytest.raises(UsageError, match="status must be"):
        rec.close("running")
    rec.close()
    assert assert_consistent(tmp_path / "r.h5")["frames"] == 2
    with pytest.raises(SpaceError):  # every one of them is rlcollect's (exit 2 in a CLI)
        Recorder(tmp_path / "y.h5", box, gym.spaces.Text(4), **env)
    assert issubclass(SpaceError, RlcollectError)


def test_importing_the_package_imports_neither_torch_nor_sb3():
    code = (
        "import sys, collect_cli.record; "
        "assert not {'torch', 'stable_baselines3'} & set(sys.modules), sys.modules.keys()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_without_sb3_the_callback_says_how_to_install_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "collect_cli.record.sb3", raising=False)
    for name in [m for m in list(sys.modules) if m.split(".")[0] == "stable_baselines3"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    with pytest.raises(UsageError, match=r"pip install 'rlcollect\[sb3\]'"):
        importlib.import_module("collect_cli.record.sb3")


# -- Stable-Baselines3 -------------------------------------------------------------------
sb3 = pytest.importorskip("stable_baselines3")
from stable_baselines3 import PPO, SAC  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

from collect_cli.record.sb3 import RecordCallback  # noqa: E402


def lane_of(buffer, name: str, lane: int) -> np.ndarray:
    """One lane's steps of a rollout buffer's array: ``[steps, envs, ...]``, or after
    training (``get`` flattens some in place) ``[envs * steps, ...]``, lane-major."""
    array = getattr(buffer, name)
    steps, envs = buffer.buffer_size, buffer.n_envs
    if array.shape[0] == steps * envs and envs > 1:
        return array[lane * steps : (lane + 1) * steps]
    return array[:, lane]


def test_a_ppo_run_is_recorded_as_sb3_stored_it(tmp_path):
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = PPO(
        "MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu",
        policy_kwargs=dict(SMALL),
    )  # fmt: skip
    model.learn(256, callback=RecordCallback(tmp_path / "ppo.h5"))
    meta = assert_consistent(tmp_path / "ppo.h5")
    assert meta["status"] == fmt.COMPLETE and meta["frames"] == 256 and meta["lanes"] == 2
    assert meta["total_frames"] == 256 and meta["collector"] == "recorder"
    assert meta["env_id"] == "CartPole-v1" and meta[fmt.PROVENANCE]["algorithm"] == "PPO"
    assert assert_split_on_done(tmp_path / "ppo.h5") == meta["episodes"]
    ds = open_dataset(tmp_path / "ppo.h5")
    keys = ("observation", "action", fmt.path(fmt.REWARD_KEY), fmt.VALUE, fmt.ACTION_LOG_PROB)
    get = {key: ds.array(key) for key in keys}
    buffer = model.rollout_buffer  # the last rollout: the last 64 steps of each lane
    for lane in range(2):
        last = slice(-64, None)
        assert np.array_equal(get["observation"][lane, last], lane_of(buffer, "observations", lane))
        assert np.array_equal(get["action"][lane, last], lane_of(buffer, "actions", lane)[:, 0])
        reward = get[fmt.path(fmt.REWARD_KEY)][lane, last, 0]
        assert np.array_equal(reward, lane_of(buffer, "rewards", lane))  # no time limit hit
        assert np.array_equal(get[fmt.VALUE][lane, last], lane_of(buffer, "values", lane)[:, 0])
        logp = lane_of(buffer, "log_probs", lane)[:, 0]
        assert np.array_equal(get[fmt.ACTION_LOG_PROB][lane, last], logp)
    # a row per rollout, at the training step it started at; each episode the first's
    table = meta[fmt.SOURCES]
    assert [row["training_step"] for row in table] == [0, 128]
    rows = ds.episodes()
    steps = [table[s]["training_step"] for s in rows[fmt.SOURCE]]
    assert steps == [128 * (start // 64) for start in rows["start"]]
    assert "n_steps: 64" in table[0][fmt.SOURCE_CONFIG] and table[0]["seed"] == 0


def test_a_sac_run_is_recorded_as_its_replay_buffer_holds_it(tmp_path):
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    model = SAC(
        "MlpPolicy", env, learning_starts=50, buffer_size=1000, batch_size=32, seed=0,
        device="cpu", policy_kwargs=dict(SMALL), optimize_memory_usage=False,
    )  # fmt: skip
    model.learn(300, callback=RecordCallback(tmp_path / "sac", writer="memmap"))
    meta = assert_consistent(tmp_path / "sac")
    assert meta["frames"] == 300 and meta["backend"] == "memmap"
    ds = open_dataset(tmp_path / "sac")
    buffer, n = model.replay_buffer, model.replay_buffer.pos
    assert n == 300
    pairs = {
        "observation": buffer.observations,
        fmt.path(fmt.next_key((fmt.OBSERVATION,))): buffer.next_observations,
        fmt.path(fmt.REWARD_KEY): buffer.rewards[..., None],
    }
    for key, stored in pairs.items():
        assert np.array_equal(ds.array(key)[0], stored[:n, 0]), key
    # SAC stores actions scaled to [-1, 1]; the dataset holds what the env received
    assert np.array_equal(ds.array("action")[0], model.policy.unscale_action(buffer.actions[:n, 0]))
    done = ds.array(fmt.path(fmt.DONE_KEY))[0, :, 0]
    truncated = ds.array(fmt.path(fmt.TRUNCATED_KEY))[0, :, 0]
    assert np.array_equal(done[:-1], buffer.dones[: n - 1, 0] == 1) and done[199]
    assert np.array_equal(truncated[:-1], buffer.timeouts[: n - 1, 0] == 1)
    assert done[-1] and truncated[-1]  # the end of training cut the episode running
    # SAC starts a rollout (of train_freq=1 step) at every step: a row per episode
    table = meta[fmt.SOURCES]
    rows = ds.episodes()
    assert [table[s]["training_step"] for s in rows[fmt.SOURCE]] == rows["start"].tolist()
    assert [row["training_step"] for row in table] == [0, 200]


def test_vecnormalize_training_is_recorded_raw(tmp_path):
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=0))
    model = PPO(
        "MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=1, seed=0, device="cpu",
        policy_kwargs=dict(SMALL),
    )  # fmt: skip
    model.learn(128, callback=RecordCallback(tmp_path / "vn.h5", extras=False))
    assert_consistent(tmp_path / "vn.h5")
    ds = open_dataset(tmp_path / "vn.h5")
    assert set(np.unique(ds.array(fmt.path(fmt.REWARD_KEY))).tolist()) == {1.0}  # CartPole's
    last = ds.array(fmt.path(fmt.next_key((fmt.OBSERVATION,))))[:, -1]
    done = ds.array(fmt.path(fmt.DONE_KEY))[:, -1, 0]
    assert np.array_equal(last[~done], env.get_original_obs()[~done])
    assert fmt.VALUE not in {k for k, _, _ in ds.describe()}


KILLED = """
import sys
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from collect_cli.record.sb3 import RecordCallback

env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, device="cpu")
model.learn(10**8, callback=RecordCallback(sys.argv[1], steps_per_commit=16))
"""


@pytest.mark.parametrize(
    ("sig", "status"),
    [(signal.SIGKILL, fmt.RUNNING), (signal.SIGINT, fmt.INTERRUPTED)],
    ids=["SIGKILL", "SIGINT"],
)
def test_a_training_process_stopped_by_a_signal_leaves_a_valid_dataset(tmp_path, sig, status):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(KILLED))
    path = tmp_path / "killed.h5"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path)], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_frames(path, proc, minimum=300, timeout=120)  # past the first rollout
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert validate(path) == []
    meta = open_dataset(path).meta
    # SIGKILL: the process writes nothing more, its dataset keeps status running (D12);
    # SIGINT: KeyboardInterrupt ends the script, and the recorder is closed at exit
    assert meta["status"] == status and meta["frames"] >= 300, err[-2000:]
    assert [row["training_step"] for row in meta[fmt.SOURCES]][:2] == [0, 128]


def test_a_ctrl_c_during_a_write_comes_right_after_it():
    finished = []
    with pytest.raises(KeyboardInterrupt), signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs: here it only notes the signal
        finished.append(True)
    assert finished == [True]
