"""The native (batched torch) backend against gymnasium itself, the reference semantics.

Each check sets gymnasium's env to the same state as the native lanes (its
``unwrapped.state``) and compares what the two do. The native envs keep their
state in gymnasium's dtype (float64; float32 for MountainCarContinuous), so on
CPU a step is expected to agree to float32 rounding of the observations:
``ATOL`` below, far inside the issue's 1e-5.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from collect_cli import envs
from collect_cli.cli.datasets import _envs_dict
from collect_cli.collectors import SyncCollector
from collect_cli.envs import env_factory
from collect_cli.envs.native import NativeVecEnv
from collect_cli.errors import CollectionError, DeviceError, UsageError
from tests.helpers import assert_consistent
from tests.support.cli_runner import out_path

CLASSIC = ("Pendulum-v1", "CartPole-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Acrobot-v1")
ATOL = 1e-6  # observations (float32) and float32 rewards
STATE_RTOL = 1e-12  # internal float64 states: equal up to libm rounding
N = 2000  # random states per env
CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def native(env_id, lanes, seeds=None, device="cpu", **kwargs) -> NativeVecEnv:
    env = env_factory(env_id, lanes, backend="native", kwargs=kwargs, device=device)()
    env.reset(list(range(lanes)) if seeds is None else seeds)
    return env


def sample_states(env_id: str, n: int, rng: np.random.Generator):
    """``n`` states inside gymnasium's ranges (many near the termination bounds) and actions."""

    def u(lo, hi, size=n):
        return rng.uniform(lo, hi, size)

    def near(bound, width, size):  # within ``width`` of +-bound, on both sides
        return rng.choice([-1.0, 1.0], size) * (bound + u(-width, width, size))

    k = n // 4
    if env_id == "Pendulum-v1":  # gymnasium lets theta grow; |theta_dot| <= 8
        s = np.stack([u(-3 * math.pi, 3 * math.pi), u(-8, 8)], 1)
        s[:k, 1] = np.clip(near(8, 0.3, k), -8, 8)  # the speed clip
        return s, u(-2.5, 2.5)[:, None].astype(np.float32)  # beyond the torque bounds too
    if env_id == "CartPole-v1":
        s = np.stack([u(-2.4, 2.4), u(-2, 2), u(-0.2095, 0.2095), u(-3, 3)], 1)
        s[:k, 0] = near(2.4, 0.05, k)
        s[k : 2 * k, 2] = near(12 * 2 * math.pi / 360, 0.01, k)
        return s, rng.integers(0, 2, n)
    if env_id.startswith("MountainCar"):
        s = np.stack([u(-1.2, 0.6), u(-0.07, 0.07)], 1)
        s[:k, 0] = u(-1.2, -1.1, k)
        s[: k // 2, 0] = -1.2  # at the left wall
        goal = 0.5 if env_id == "MountainCar-v0" else 0.45
        s[k : 2 * k, 0] = goal + u(-0.08, 0.05, k)
        if env_id == "MountainCar-v0":
            return s, rng.integers(0, 3, n)
        return s.astype(np.float32), u(-1.5, 1.5)[:, None].astype(np.float32)
    assert env_id == "Acrobot-v1"
    s = np.stack(
        [u(-math.pi, math.pi), u(-math.pi, math.pi), u(-4 * math.pi, 4 * math.pi), u(-9, 9) * 3]
    ).T
    # near the goal line: -cos(t1) - cos(t1 + t2) close to 1, slow
    t1 = u(0.6 * math.pi, math.pi, 2 * k) * rng.choice([-1.0, 1.0], 2 * k)
    height = 1 + u(-0.05, 0.05, 2 * k)
    t2 = np.arccos(np.clip(-np.cos(t1) - height, -1, 1)) - t1
    s[: 2 * k, 0], s[: 2 * k, 1] = t1, (t2 + math.pi) % (2 * math.pi) - math.pi
    s[: 2 * k, 2:] = u(-0.5, 0.5, (2 * k, 2))
    return s, rng.integers(0, 3, n)


def gymnasium_step(env_id: str, states: np.ndarray, actions: np.ndarray):
    """gymnasium's own step from each state: observations, rewards, terminated, states."""
    ref = gym.make(env_id).unwrapped
    ref.reset(seed=0)
    obs, rewards, terminated, after = [], [], [], []
    for state, action in zip(states, actions, strict=True):
        ref.state = state.copy()
        if env_id == "CartPole-v1":
            ref.steps_beyond_terminated = None  # a fresh step, not one after the end
        o, r, term, trunc, _ = ref.step(action if action.ndim else int(action))
        assert not trunc
        obs.append(o)
        rewards.append(r)
        terminated.append(term)
        after.append(np.asarray(ref.state, dtype=np.float64))
    return np.array(obs), np.array(rewards), np.array(terminated), np.array(after)


# -- spaces, dynamics ------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", CLASSIC)
def test_spaces_and_time_limits_equal_gymnasium(env_id):
    env = native(env_id, 3)
    ref = gym.make(env_id)
    assert env.observation_space == ref.observation_space
    assert env.action_space == ref.action_space
    assert env.observation_space.dtype == ref.observation_space.dtype
    assert env.max_episode_steps == ref.spec.max_episode_steps
    obs = env.reset([1, 2, 3])
    assert obs[0].shape == (3, *ref.observation_space.shape)
    assert obs[0].dtype == np.float32
    assert env.observation_space.contains(obs[0][0])


@pytest.mark.parametrize("env_id", CLASSIC)
def test_one_step_from_random_states_equals_gymnasium(env_id):
    rng = np.random.default_rng(7)
    states, actions = sample_states(env_id, N, rng)
    obs, rewards, terminated, after = gymnasium_step(env_id, states, actions)
    env = native(env_id, N)
    env.set_state(states)
    out = env.step([actions])
    np.testing.assert_allclose(out.next_obs[0], obs, rtol=0, atol=ATOL)
    np.testing.assert_allclose(out.reward, rewards, rtol=1e-6, atol=ATOL)
    np.testing.assert_array_equal(out.terminated, terminated)
    assert not out.truncated.any()
    if env_id != "Pendulum-v1":  # the bounds were exercised from both sides
        assert 0.02 * N < terminated.sum() < 0.98 * N
    # the internal states agree too (lanes that ended were reset)
    live = ~terminated
    rtol = STATE_RTOL if env_id != "MountainCarContinuous-v0" else 1e-6
    np.testing.assert_allclose(env.get_state().numpy()[live], after[live], rtol=rtol, atol=1e-9)


@pytest.mark.parametrize("env_id", CLASSIC)
def test_whole_episodes_follow_gymnasium(env_id):
    """From the native reset states, gymnasium and native stay together step by step."""
    lanes, rng = 6, np.random.default_rng(3)
    env = native(env_id, lanes)
    refs = [gym.make(env_id).unwrapped for _ in range(lanes)]
    for ref, state in zip(refs, env.get_state().numpy(), strict=True):
        ref.reset(seed=0)
        ref.state = state.copy()
    running = np.ones(lanes, bool)
    steps = 0
    while running.any() and steps < env.max_episode_steps:
        if isinstance(env.action_space, gym.spaces.Discrete):
            actions = rng.integers(0, env.action_space.n, lanes)
        else:
            actions = rng.uniform(-1, 1, (lanes, 1)).astype(np.float32)
        out = env.step([actions])
        steps += 1
        for lane in np.flatnonzero(running):
            action = actions[lane] if actions.ndim > 1 else int(actions[lane])
            o, r, term, _, _ = refs[lane].step(action)
            np.testing.assert_allclose(out.next_obs[0][lane], o, rtol=0, atol=1e-5)
            assert out.reward[lane] == pytest.approx(r, abs=1e-5)
            assert out.terminated[lane] == term
            if out.terminated[lane] or out.truncated[lane]:
                running[lane] = False
    assert steps > 5


def episode_lengths(env_id: str, lanes: int, steps: int, seed: int = 0):
    """Lengths and end flags of the episodes that end within ``steps`` random-action steps."""
    env = native(env_id, lanes, seeds=[seed * lanes + i for i in range(lanes)])
    gen = torch.Generator().manual_seed(seed)
    count = np.zeros(lanes, np.int64)
    lengths, truncated = [], []
    for _ in range(steps):
        if isinstance(env.action_space, gym.spaces.Discrete):
            actions = torch.randint(0, int(env.action_space.n), (lanes,), generator=gen).numpy()
        else:
            actions = (torch.rand((lanes, 1), generator=gen) * 2 - 1).numpy()
        out = env.step([actions])
        count += 1
        ended = out.terminated | out.truncated
        lengths.extend(count[ended])
        truncated.extend(out.truncated[ended])
        count[ended] = 0
    return np.array(lengths), np.array(truncated)


def test_cartpole_random_policy_episode_lengths_match_gymnasium():
    lengths, truncated = episode_lengths("CartPole-v1", 1024, 250)
    assert len(lengths) > 8000 and not truncated.any()
    ref = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    ref_lengths = []
    for episode in range(3000):
        ref.reset(seed=episode)
        done, n = False, 0
        while not done:
            _, _, term, trunc, _ = ref.step(int(rng.integers(0, 2)))
            done, n = term or trunc, n + 1
        ref_lengths.append(n)
    ref_lengths = np.array(ref_lengths)
    assert lengths.mean() == pytest.approx(ref_lengths.mean(), rel=0.05)
    assert lengths.std() == pytest.approx(ref_lengths.std(), rel=0.1)


@pytest.mark.parametrize(
    ("env_id", "lanes", "steps"),
    [("MountainCar-v0", 256, 450), ("Pendulum-v1", 64, 450), ("MountainCarContinuous-v0", 64, 999)],
)
def test_random_policy_episodes_end_at_the_time_limit(env_id, lanes, steps):
    lengths, truncated = episode_lengths(env_id, lanes, steps)
    limit = gym.make(env_id).spec.max_episode_steps
    assert len(lengths) >= lanes
    if env_id == "MountainCarContinuous-v0":  # a random walk reaches the goal at times
        assert truncated.mean() > 0.9
        assert (lengths[truncated] == limit).all()
        assert (lengths <= limit).all()
    else:
        assert truncated.all() and (lengths == limit).all()


INITIAL = {  # gymnasium's reset ranges, per state dimension
    "Pendulum-v1": [(-math.pi, math.pi), (-1, 1)],
    "CartPole-v1": [(-0.05, 0.05)] * 4,
    "MountainCar-v0": [(-0.6, -0.4), (0, 0)],
    "MountainCarContinuous-v0": [(-0.6, -0.4), (0, 0)],
    "Acrobot-v1": [(-0.1, 0.1)] * 4,
}


@pytest.mark.parametrize("env_id", CLASSIC)
def test_initial_states_match_gymnasium_distribution(env_id):
    ours = native(env_id, 20000).get_state().numpy()
    ref = gym.make(env_id)
    theirs = []
    for seed in range(2000):
        ref.reset(seed=seed)
        theirs.append(np.asarray(ref.unwrapped.state, dtype=np.float64))
    theirs = np.array(theirs)
    for dim, (lo, hi) in enumerate(INITIAL[env_id]):
        assert lo - 1e-7 <= ours[:, dim].min() and ours[:, dim].max() <= hi + 1e-7
        if lo == hi:
            assert (ours[:, dim] == lo).all() and (theirs[:, dim] == lo).all()
            continue
        sd = theirs[:, dim].std()
        assert abs(ours[:, dim].mean() - theirs[:, dim].mean()) < 4 * sd * math.sqrt(
            1 / 20000 + 1 / 2000
        )
        assert ours[:, dim].std() == pytest.approx(sd, rel=0.06)
        assert ours[:, dim].std() == pytest.approx((hi - lo) / math.sqrt(12), rel=0.02)


# -- autoreset, time limits, seeding -------------------------------------------------------


def test_autoreset_gives_true_final_and_reset_observations():
    env, rng = native("CartPole-v1", 64), np.random.default_rng(0)
    ended_seen = 0
    for _ in range(120):
        out = env.step([rng.integers(0, 2, 64)])
        ended = out.terminated | out.truncated
        assert not out.truncated.any()
        np.testing.assert_array_equal(out.obs[0][~ended], out.next_obs[0][~ended])
        if ended.any():
            ended_seen += ended.sum()
            final, fresh = out.next_obs[0][ended], out.obs[0][ended]
            # the final observation is past a bound, the new one a reset state
            assert ((np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 0.2094)).all()
            assert (np.abs(fresh) <= 0.05).all()
            np.testing.assert_array_equal(env.get_state().numpy()[ended].astype(np.float32), fresh)
    assert ended_seen > 50


def test_time_limit_truncates_and_reset_continues():
    env, ref = native("Pendulum-v1", 4, max_episode_steps=5), gym.make("Pendulum-v1").unwrapped
    ref.reset(seed=0)
    assert env.max_episode_steps == 5
    actions = [np.full((4, 1), 0.5, np.float32)]
    for t in range(1, 13):
        before = env.get_state().numpy()
        out = env.step(actions)
        assert not out.terminated.any()
        assert out.truncated.all() == (t % 5 == 0) and out.truncated.any() == (t % 5 == 0)
        for lane in range(4):  # next_obs is gymnasium's step from the state before
            ref.state = before[lane].copy()
            o, *_ = ref.step(actions[0][lane])
            np.testing.assert_allclose(out.next_obs[0][lane], o, atol=ATOL)
        if t % 5 == 0:
            assert (np.abs(out.obs[0][:, 2]) <= 1).all()  # a reset state: |theta_dot| <= 1
            assert not np.allclose(out.obs[0], out.next_obs[0])


def test_terminated_and_truncated_together_on_the_last_step_like_gymnasium():
    env = native("CartPole-v1", 2, max_episode_steps=1)
    state = np.array([[2.399, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    env.set_state(state)
    out = env.step([np.array([1, 1])])
    ref = gym.make("CartPole-v1", max_episode_steps=1)
    flags = []
    for s in state:
        ref.reset(seed=0)
        ref.unwrapped.state = s.copy()
        flags.append(ref.step(1)[2:4])
    np.testing.assert_array_equal(out.terminated, [f[0] for f in flags])
    np.testing.assert_array_equal(out.truncated, [f[1] for f in flags])
    assert out.terminated.tolist() == [True, False] and out.truncated.all()


def rollout(env, steps, seed=0):
    rng = np.random.default_rng(seed)
    obs = []
    for _ in range(steps):
        out = env.step([rng.integers(0, 2, env.num_envs)])
        obs.append((out.obs[0].copy(), out.next_obs[0].copy(), out.terminated.copy()))
    return obs


def test_same_seeds_same_data_other_seeds_other_data():
    a, b = native("CartPole-v1", 32, seeds=list(range(100, 132))), native("CartPole-v1", 32)
    c = native("CartPole-v1", 32, seeds=list(range(100, 132)))
    ra, rc = rollout(a, 100), rollout(c, 100)
    assert sum(t.sum() for *_, t in ra) > 20  # autoresets drew from the generator
    for (oa, na, ta), (oc, nc, tc) in zip(ra, rc, strict=True):
        np.testing.assert_array_equal(oa, oc)
        np.testing.assert_array_equal(na, nc)
        np.testing.assert_array_equal(ta, tc)
    first = b.reset(list(range(32)))[0]
    assert not np.array_equal(a.reset(list(range(100, 132)))[0], first)
    np.testing.assert_array_equal(b.reset(list(range(32)))[0], first)


def test_reset_lanes_resets_only_those_lanes_and_their_clock():
    env = native("Pendulum-v1", 6, max_episode_steps=5)
    other = native("Pendulum-v1", 6, max_episode_steps=5)
    actions = [np.zeros((6, 1), np.float32)]
    for _ in range(3):
        env.step(actions)
    before = env.step(actions).obs[0].copy()  # 4 steps done
    after = env.reset_lanes(np.array([1, 4]), [11, 44])[0]
    np.testing.assert_array_equal(np.delete(after, [1, 4], 0), np.delete(before, [1, 4], 0))
    assert not np.allclose(after[[1, 4]], before[[1, 4]])
    assert (np.abs(after[[1, 4], 2]) <= 1).all()
    # the same seeds give the same reset states
    np.testing.assert_array_equal(
        other.reset_lanes(np.array([1, 4]), [11, 44])[0][[1, 4]], after[[1, 4]]
    )
    # lanes 1 and 4 start a new 5-step episode; the others truncate on the next step
    assert env.step(actions).truncated.tolist() == [True, False, True, True, False, True]
    for _ in range(3):
        assert not env.step(actions).truncated.any()
    assert env.step(actions).truncated.tolist() == [False, True, False, False, True, False]


def test_cpu_arrays_are_views_of_the_tensors():
    env = native("CartPole-v1", 8)
    out = env.step([np.ones(8, np.int64)])
    assert out.next_obs[0].base is not None and not out.next_obs[0].flags.owndata
    assert not out.reward.flags.owndata


# -- env.kwargs, errors ---------------------------------------------------------------------


def test_kwargs_reach_the_dynamics_like_gymnasium():
    rng = np.random.default_rng(1)
    for env_id, kwargs in (
        ("Pendulum-v1", {"g": 2.5}),
        ("CartPole-v1", {"sutton_barto_reward": True}),
        ("MountainCar-v0", {"goal_velocity": 0.01}),
        ("MountainCarContinuous-v0", {"goal_velocity": 0.01}),
    ):
        states, actions = sample_states(env_id, 400, rng)
        env = native(env_id, 400, max_episode_steps=7, **kwargs)
        assert env.max_episode_steps == 7
        env.set_state(states)
        out = env.step([actions])
        ref = gym.make(env_id, **kwargs).unwrapped
        ref.reset(seed=0)
        for i in range(0, 400, 7):
            ref.state = states[i].copy()
            if env_id == "CartPole-v1":
                ref.steps_beyond_terminated = None
            o, r, term, _, _ = ref.step(actions[i] if actions.ndim > 1 else int(actions[i]))
            np.testing.assert_allclose(out.next_obs[0][i], o, atol=ATOL)
            assert out.reward[i] == pytest.approx(r, abs=1e-5)
            assert out.terminated[i] == term


@pytest.mark.parametrize(
    ("env_id", "kwargs", "info_keys", "message"),
    [
        ("HalfCheetah-v5", {}, (), "Pendulum-v1, CartPole-v1, MountainCar-v0"),
        ("Pendulum-v0", {}, (), "did you mean Pendulum-v1?"),
        ("Pendulum-v1", {"gravity": 9.8}, (), "choose from g, max_episode_steps"),
        ("Acrobot-v1", {"g": 9.8}, (), "choose from max_episode_steps"),
        ("Pendulum-v1", {"g": "strong"}, (), "env.kwargs.g must be a number"),
        ("CartPole-v1", {"sutton_barto_reward": 1}, (), "must be true or false"),
        ("Pendulum-v1", {"max_episode_steps": 0}, (), "positive integer"),
        ("Pendulum-v1", {"render_mode": "human"}, (), "do not render"),
        ("Pendulum-v1", {}, ("elapsed_step",), "native envs report no info"),
    ],
)
def test_usage_errors(env_id, kwargs, info_keys, message):
    with pytest.raises(UsageError, match=message.replace("?", r"\?")):
        env_factory(env_id, 2, backend="native", kwargs=kwargs, info_keys=info_keys)()


def test_bad_devices_and_actions_are_refused():
    with pytest.raises(DeviceError, match="use cpu, cuda or cuda:N"):
        env_factory("Pendulum-v1", 2, backend="native", device="meta")()
    if not CUDA:
        with pytest.raises(DeviceError, match="CUDA"):
            env_factory("Pendulum-v1", 2, backend="native", device="cuda:0")()
    env = native("MountainCar-v0", 3)
    with pytest.raises(CollectionError, match=r"actions 0..2, got 3"):
        env.step([np.array([0, 3, 1])])
    with pytest.raises(UsageError, match="before reset"):
        env_factory("MountainCar-v0", 3, backend="native")().step([np.zeros(3, np.int64)])


def test_backend_is_registered_and_listed():
    assert "native" in envs.BACKENDS
    listed = {b["name"]: b for b in _envs_dict()["backends"]}
    assert listed["native"]["available"] and listed["native"]["detail"].startswith("torch")


# -- through the collector and the CLI --------------------------------------------------------


def test_sync_collector_batches_from_native_envs():
    make = env_factory("CartPole-v1", 8, backend="native")
    with SyncCollector(make, frames_per_batch=8 * 150, total_frames=8 * 150, seed=3) as c:
        b = next(iter(c))
    traj, done = b["collector", "traj_ids"].numpy(), b["next", "done"][..., 0].numpy()
    assert done.sum() > 30
    np.testing.assert_array_equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])
    obs, nxt = b["observation"].numpy(), b["next", "observation"].numpy()
    inside = ~done[:, :-1]
    np.testing.assert_array_equal(nxt[:, :-1][inside], obs[:, 1:][inside])
    assert (b["next", "reward"] == 1).all()


def test_cli_run_on_every_writer(cli, backend, tmp_path):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        "env=CartPole",
        "env.backend=native",
        "env.num_envs=16",
        "frames_per_batch=800",
        "total_frames=3200",
        f"writer={backend}",
        "progress=none",
        f"out={out}",
    )
    assert res.code == 0, res.stderr
    summary = res.summary
    assert summary["frames"] == 3200 and summary["status"] == "complete"
    assert summary["episodes"] > 50
    meta = assert_consistent(out)
    assert meta["frames"] == 3200


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env=gym", "env.id=HalfCheetah-v5"], "env.backend=native has no env 'HalfCheetah-v5'"),
        (["+env.kwargs.gravity=3"], "env.kwargs.gravity is not a parameter of native Pendulum-v1"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(cli, tmp_path, overrides, message):
    res = cli("run", "env.backend=native", *overrides, "progress=none", f"out={tmp_path / 'x.h5'}")
    assert res.code == 2, res.stderr
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr


# -- CUDA ------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", CLASSIC)
@pytest.mark.gpu
@requires_cuda
def test_cuda_step_equals_cpu_step(env_id):
    rng = np.random.default_rng(11)
    states, actions = sample_states(env_id, N, rng)
    outs = []
    for device in ("cpu", "cuda:0"):
        env = native(env_id, N, device=device)
        assert env.get_state().device.type == torch.device(device).type
        env.set_state(states)
        outs.append(env.step([actions]))
    cpu, cuda = outs
    np.testing.assert_allclose(cuda.next_obs[0], cpu.next_obs[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(cuda.reward, cpu.reward, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(cuda.terminated, cpu.terminated)
    np.testing.assert_array_equal(cuda.truncated, cpu.truncated)


@pytest.mark.gpu
@requires_cuda
def test_cuda_runs_are_reproducible_and_reset_in_place():
    a, b = (native("CartPole-v1", 256, device="cuda:0") for _ in range(2))
    for (oa, na, ta), (ob, nb, tb) in zip(rollout(a, 60), rollout(b, 60), strict=True):
        np.testing.assert_array_equal(oa, ob)
        np.testing.assert_array_equal(na, nb)
        np.testing.assert_array_equal(ta, tb)
    fresh = a.reset_lanes(np.array([3]), [5])[0]
    assert (np.abs(fresh[3]) <= 0.05).all()


@pytest.mark.gpu
@requires_cuda
def test_cli_run_on_cuda(cli, backend, tmp_path):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        "env=Pendulum",
        "env.backend=native",
        "env.num_envs=64",
        "policy=mlp",
        "device=cuda:0",
        "frames_per_batch=6400",
        "total_frames=12800",
        f"writer={backend}",
        "progress=none",
        f"out={out}",
    )
    assert res.code == 0, res.stderr
    assert res.summary["frames"] == 12800
    assert_consistent(out)
