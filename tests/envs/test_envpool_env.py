"""The envpool backend against gymnasium's semantics, with the real envpool.

Skipped where envpool is not installed (CI installs it through the ``dev`` extra).
"""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("envpool")

from collect_cli.collectors import SyncCollector
from collect_cli.envs import env_factory
from collect_cli.errors import UsageError
from tests.helpers import assert_consistent
from tests.support.cli_runner import out_path

CLASSIC = ("Pendulum-v1", "CartPole-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Acrobot-v1")


def collect(env_id, lanes, frames, seed=0, **kw):
    """One batch of ``frames`` frames through the real SyncCollector, as numpy arrays."""
    make = env_factory(env_id, lanes, backend="envpool", **kw)
    collector = SyncCollector(make, frames_per_batch=frames, total_frames=frames, seed=seed)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    return {(k if isinstance(k, tuple) else (k,)): v.numpy() for k, v in batch.items(True, True)}


def squeeze(b, key):
    return b[key][..., 0]


@pytest.mark.parametrize("env_id", CLASSIC)
def test_spaces_and_limits_equal_gymnasium(env_id):
    env = env_factory(env_id, 2, backend="envpool")()
    ref = gym.make(env_id)
    assert env.observation_space == ref.observation_space
    assert env.action_space == ref.action_space
    assert env.observation_space.dtype == ref.observation_space.dtype
    assert env.max_episode_steps == ref.spec.max_episode_steps
    obs = env.reset([5, 6])
    assert obs[0].shape == (2, *ref.observation_space.shape)
    assert obs[0].dtype == ref.observation_space.dtype
    env.close()


def test_cartpole_boundaries_and_true_final_observations():
    b = collect("CartPole-v1", 8, 8 * 150)
    traj, done = b[("collector", "traj_ids")], squeeze(b, ("next", "done"))
    assert done.sum() > 30
    # a new trajectory id exactly after each episode end, and nowhere else
    np.testing.assert_array_equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])
    obs, nxt = b[("observation",)], b[("next", "observation")]
    inside = ~done[:, :-1]
    np.testing.assert_array_equal(nxt[:, :-1][inside], obs[:, 1:][inside])
    # the final observation of a terminated episode is outside the bounds (not a reset
    # state) and the next observation is a reset state (all |x| <= 0.05)
    term = squeeze(b, ("next", "terminated"))
    assert term.sum() > 30 and not squeeze(b, ("next", "truncated")).any()
    final = nxt[term]
    assert ((np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 0.2094)).all()
    after = obs[:, 1:][done[:, :-1]]
    assert (np.abs(after) <= 0.05).all()
    # envpool's dummy transition after a done (reward 0) never reaches the data
    assert (squeeze(b, ("next", "reward")) == 1.0).all()


def test_pendulum_truncated_at_200_and_dynamics_match_gymnasium():
    b = collect("Pendulum-v1", 4, 4 * 450, info_keys=["elapsed_step"])
    done, trunc = squeeze(b, ("next", "done")), squeeze(b, ("next", "truncated"))
    assert not squeeze(b, ("next", "terminated")).any()
    for lane in range(4):
        assert np.flatnonzero(done[lane]).tolist() == [199, 399]
        assert np.flatnonzero(trunc[lane]).tolist() == [199, 399]
    traj = b[("collector", "traj_ids")]
    assert [len(np.unique(traj[lane])) for lane in range(4)] == [3, 3, 3, 3]
    # the info of a transition, not of the reset that follows it
    elapsed = b[("info", "elapsed_step")]
    np.testing.assert_array_equal(elapsed[:, 199], 200)
    np.testing.assert_array_equal(elapsed[:, 200], 1)

    obs = b[("observation",)].reshape(-1, 3).astype(np.float64)
    nxt = b[("next", "observation")].reshape(-1, 3)
    action = b[("action",)].reshape(-1, 1)
    reward = b[("next", "reward")].reshape(-1)
    env = gym.make("Pendulum-v1").unwrapped
    env.reset(seed=0)
    for i in range(len(obs)):
        cos, sin, thetadot = obs[i]
        env.state = np.array([np.arctan2(sin, cos), thetadot])
        expected, r, *_ = env.step(action[i])
        assert r == pytest.approx(reward[i], rel=1e-4, abs=1e-4)
        # envpool integrates the angle with the unclipped velocity: where the speed
        # saturates (|thetadot| = 8) its next angle differs from gymnasium's
        if abs(expected[2]) < 8.0:
            np.testing.assert_allclose(nxt[i], expected, atol=1e-4)
    # the final observations (steps 199, 399) were checked above: they are real
    assert (np.abs(nxt.reshape(4, 450, 3)[:, 199, 2]) <= 8.0).all()


def test_same_seed_same_arrays_other_seed_differs():
    runs = [collect("CartPole-v1", 4, 4 * 100, seed=s) for s in (3, 3, 4)]
    assert squeeze(runs[0], ("next", "done")).any()  # resets happened inside the run
    for key in runs[0]:
        np.testing.assert_array_equal(runs[0][key], runs[1][key])
    for key in (("observation",), ("action",)):
        assert not np.array_equal(runs[0][key], runs[2][key])


def test_dict_observations_become_leaves():
    b = collect("MiniGrid-Empty-5x5-v0", 3, 3 * 120)
    assert b[("observation", "image")].shape == (3, 120, 7, 7, 3)
    assert b[("next", "observation", "direction")].shape == (3, 120)
    done = squeeze(b, ("next", "done"))
    assert done[:, :-1].any()
    inside = ~done[:, :-1]
    for key in ("image", "direction", "mission"):
        nxt, obs = b[("next", "observation", key)], b[("observation", key)]
        np.testing.assert_array_equal(nxt[:, :-1][inside], obs[:, 1:][inside])


def test_reset_lanes_resets_only_those_lanes():
    env = env_factory("Pendulum-v1", 3, backend="envpool", info_keys=["elapsed_step"])()
    env.reset([1, 2, 3])
    action = [np.zeros((3, 1), np.float32)]
    for _ in range(5):
        before = env.step(action).obs
    obs = env.reset_lanes(np.array([1]), [9])
    np.testing.assert_array_equal(obs[0][[0, 2]], before[0][[0, 2]])
    assert not np.array_equal(obs[0][1], before[0][1])
    step = env.step(action)
    assert step.info[0].tolist() == [6.0, 1.0, 6.0]
    env.close()


def test_kwargs_reach_envpool():
    kwargs = {"max_episode_steps": 7, "num_threads": 1}
    env = env_factory("Pendulum-v1", 2, backend="envpool", kwargs=kwargs)()
    assert env.max_episode_steps == 7
    env.reset([0, 1])
    steps = [env.step([np.zeros((2, 1), np.float32)]) for _ in range(8)]
    assert [bool(s.truncated.all()) for s in steps] == [False] * 6 + [True, False]
    assert not any(s.terminated.any() for s in steps)
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "info_keys", "message"),
    [
        ({"foo": 1}, (), "env.kwargs.foo is not an option of envpool's Pendulum-v1: choose from"),
        ({"max_episode_steps": "x"}, (), "max_episode_steps must be an integer"),
        ({"max_episode_steps": 0}, (), "max_episode_steps must be at least 1"),
        ({"num_threads": -1}, (), "num_threads must be >= 0"),
        ({"seed": 3}, (), "seeded from rlcollect's `seed`"),
        ({"batch_size": 1}, (), "steps all lanes together"),
        ({}, ("lives",), "reports no 'lives' in its info: choose from elapsed_step"),
    ],
)
def test_refused_options(kwargs, info_keys, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        env_factory("Pendulum-v1", 2, backend="envpool", kwargs=kwargs, info_keys=info_keys)()


def test_missing_envpool_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # what `import envpool` sees uninstalled
    with pytest.raises(UsageError, match=r"pip install 'rlcollect\[envpool\]'"):
        env_factory("Pendulum-v1", 2, backend="envpool")()


def test_envs_lists_envpool_with_its_version():
    import envpool

    from collect_cli.cli.datasets import _envs_dict

    backends = {b["name"]: b for b in _envs_dict()["backends"]}
    assert backends["envpool"] == {
        "name": "envpool",
        "available": True,
        "detail": envpool.__version__,
    }


def test_cli_run_on_both_writers(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        "env=CartPole",
        "env.backend=envpool",
        "env.num_envs=4",
        "+env.kwargs.max_episode_steps=40",
        "total_frames=2000",
        "frames_per_batch=400",
        f"writer={backend}",
        f"out={out}",
        "progress=none",
    )
    assert res.code == 0, res.stderr
    assert res.stderr == ""
    meta = assert_consistent(out)
    assert meta["frames"] == res.summary["frames"] == 2000
    assert meta["env_backend"] == "envpool" and meta["env_id"] == "CartPole-v1"
    from collect_cli.dataset import open_dataset

    ep = open_dataset(out).episodes()
    complete = ep["complete"]
    assert (ep["length"][complete] <= 40).all() and ep["truncated"][complete].any()
    assert (ep["length"][ep["truncated"] & complete] == 40).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("env=gym", "env.id=Pendulm-v1"), "envpool 1.2"),
        (("+env.kwargs.bogus=1",), "env.kwargs.bogus is not an option of envpool's Pendulum-v1"),
    ],
    ids=["unknown_id", "unknown_kwarg"],
)
def test_cli_usage_errors_exit_2_one_line(cli, tmp_path, args, message):
    res = cli("run", "env.backend=envpool", "total_frames=100", "out=ds.h5", *args)
    assert res.code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert message in lines[0]
    if "env.id=Pendulm-v1" in args:
        assert "did you mean Pendulum-v1" in lines[0]
    assert "Traceback" not in res.stderr and json.loads(res.stdout)["status"] == "failed"
    assert not (tmp_path / "ds.h5").exists()


# -- Atari: envpool's options through env.kwargs ----------------------------------------
SMALL = {"img_height": 42, "img_width": 42, "stack_num": 1}  # one 42x42 frame a step


def needs_atari(env_id: str) -> None:
    import envpool

    if env_id not in envpool.list_all_envs():
        pytest.skip(f"this envpool has no {env_id} (Atari)")


def test_atari_kwargs_reach_envpool(cli, tmp_path):
    needs_atari("Pong-v5")
    kwargs = [f"+env.kwargs.{k}={v}" for k, v in SMALL.items()]
    env = ("env=gym", "env.id=Pong-v5", "env.backend=envpool", "env.num_envs=2")
    res = cli("run", *env, *kwargs, "total_frames=16", "frames_per_batch=8", "out=p.h5")
    assert res.code == 0, res.stderr
    meta = assert_consistent(tmp_path / "p.h5")
    assert meta["observation_space"]["shape"] == [1, 42, 42]
    from collect_cli.dataset import open_dataset

    obs = open_dataset(tmp_path / "p.h5").array("next/observation")
    assert obs.shape == (2, 8, 1, 42, 42) and obs.dtype == np.uint8


def test_atari_unknown_kwarg_is_one_line_exit_2(cli, tmp_path):
    needs_atari("Pong-v5")
    env = ("env=gym", "env.id=Pong-v5", "env.backend=envpool")
    res = cli("run", *env, "+env.kwargs.stack_nm=1", "total_frames=16", "out=p.h5")
    assert res.code == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "env.kwargs.stack_nm is not an option of envpool's Pong-v5: choose from" in line
    assert "stack_num" in line and json.loads(res.stdout)["exit_code"] == 2
    assert not (tmp_path / "p.h5").exists()


def test_episodic_life_makes_each_life_a_trajectory_of_one_game():
    """A lost life ends a trajectory (next/terminated) and the next one continues the
    same game with one life less, as envpool's own autoreset does: not a new game."""
    needs_atari("Breakout-v5")
    b = collect(
        "Breakout-v5",
        2,
        2 * 100,
        kwargs={**SMALL, "episodic_life": True},
        info_keys=["lives", "terminated"],
    )
    done, term = squeeze(b, ("next", "done")), squeeze(b, ("next", "terminated"))
    lives, game_over = b[("info", "lives")], b[("info", "terminated")]
    np.testing.assert_array_equal(done, term)  # a life's end is the env's, not a cut
    lanes, times = np.nonzero(done[:, :-1])
    assert len(lanes) >= 2
    for lane, t in zip(lanes, times, strict=True):
        if not game_over[lane, t]:  # the game goes on: no life comes back
            assert lives[lane, t + 1] == lives[lane, t] < 5


def test_reward_clip_records_the_sign_and_the_raw_reward_in_info():
    needs_atari("SpaceInvaders-v5")
    b = collect(
        "SpaceInvaders-v5", 2, 2 * 100, kwargs={**SMALL, "reward_clip": True}, info_keys=["reward"]
    )
    reward, raw = squeeze(b, ("next", "reward")), b[("info", "reward")]
    assert raw.max() > 1  # aliens are worth 5 to 30 points
    np.testing.assert_array_equal(reward, np.sign(raw))
