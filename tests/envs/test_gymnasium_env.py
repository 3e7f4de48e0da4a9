"""The gymnasium backend: autoreset without fake transitions, nested spaces, errors."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from collect_cli import specs
from collect_cli.envs import env_factory
from collect_cli.errors import SpaceError, UsageError


def test_final_observation_is_true_last_state():
    env = env_factory("toyenvs:Counter-v0", 2, kwargs={"length": 3})()
    obs = env.reset([1, 2])
    assert obs[0][:, 0].tolist() == [0, 0]
    seen = []
    for _ in range(4):
        step = env.step([np.zeros(2, np.int64)])
        seen.append((step.next_obs[0][0, 0], step.obs[0][0, 0], step.terminated[0]))
    # step 3 ends the episode: next_obs is the final state 3, obs is the reset state 0
    assert seen == [(1, 1, False), (2, 2, False), (3, 0, True), (1, 1, False)]
    env.close()


def test_nested_spaces_flatten_in_order():
    env = env_factory("toyenvs:Nested-v0", 3)()
    # gymnasium's Dict sorts its keys; Tuple keeps its order
    assert [leaf.key for leaf in env.obs_leaves] == [("flags",), ("mode",), ("pos",)]
    assert [leaf.key for leaf in env.action_leaves] == [("0",), ("1",), ("2",)]
    obs = env.reset([0, 1, 2])
    assert [a.shape for a in obs] == [(3, 4), (3,), (3, 2)]
    step = env.step([np.array([1, 2, 3]), np.zeros((3, 3), np.float32), np.array([[1, 4]] * 3)])
    assert step.reward.tolist() == [1.0, 2.0, 3.0]
    env.close()


def test_unsupported_space_is_a_usage_error():
    with pytest.raises(SpaceError, match="unsupported action space Text"):
        env_factory("toyenvs:TextAction-v0", 1)()


def test_text_observations_travel_as_padded_utf8():
    """A Text leaf is [lanes, width] uint8: UTF-8 bytes, zero padded (4 bytes a
    character for a non-ASCII charset), and decodes back to the env's strings."""
    env = env_factory("toyenvs:Text-v0", 2)()
    (leaf,) = env.obs_leaves
    assert (leaf.shape, leaf.dtype) == ((24,), np.uint8)
    obs = env.reset([0, 1])
    assert specs.decode_text(obs[0]).tolist() == ["a", "a"]
    step = env.step([np.zeros(2, np.int64)])
    assert bytes(step.obs[0][0]).rstrip(b"\0") == "éb".encode()
    assert specs.decode_text(step.next_obs[0]).tolist() == ["éb", "éb"]
    env.close()


def test_a_mission_space_is_recorded_as_text():
    """MiniGrid's MissionSpace (strings, no length bound) becomes printable ASCII Text."""
    pytest.importorskip("minigrid")
    env = env_factory("minigrid:MiniGrid-Empty-5x5-v0", 1)()
    mission = env.observation_space["mission"]
    assert isinstance(mission, gym.spaces.Text)
    assert mission.max_length == specs.STRING_SPACE_LENGTH
    assert [(leaf.key, leaf.shape, leaf.dtype) for leaf in env.obs_leaves] == [
        (("direction",), (), np.int64),
        (("image",), (7, 7, 3), np.uint8),
        (("mission",), (specs.STRING_SPACE_LENGTH,), np.uint8),
    ]
    obs = env.reset([0])
    assert specs.decode_text(obs[2]).tolist() == ["get to the green goal square"]
    env.close()


def test_unknown_id_suggests_close_matches():
    with pytest.raises(UsageError, match="did you mean CartPole-v1"):
        env_factory("CartPol-v1", 1)()


def test_unknown_backend():
    with pytest.raises(UsageError, match="choose from gymnasium"):
        env_factory("CartPole-v1", 1, backend="nope")


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_steps_like_gymnasiums_same_step_vector_env(env_id):
    """The hand-written loop is gymnasium's SyncVectorEnv in same-step autoreset
    mode, step for step: observations, final observations, rewards and flags."""
    n, seeds = 4, [11, 12, 13, 14]
    ours = env_factory(env_id, n, kwargs={"max_episode_steps": 25})()
    ref = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, max_episode_steps=25)] * n,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs, _ = ref.reset(seed=seeds)
    assert np.array_equal(ours.reset(seeds)[0], obs)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(120):
        action = rng.integers(0, ref.single_action_space.n, n)
        step = ours.step([action])
        obs, reward, terminated, truncated, info = ref.step(action)
        final = obs.copy()
        for lane in np.flatnonzero(info.get("_final_obs", np.zeros(n, bool))):
            final[lane] = info["final_obs"][lane]
        ends += int((terminated | truncated).sum())
        assert np.array_equal(step.obs[0], obs)
        assert np.array_equal(step.next_obs[0], final)
        assert np.array_equal(step.reward, reward.astype(np.float32))
        assert np.array_equal(step.terminated, terminated)
        assert np.array_equal(step.truncated, truncated)
    assert ends >= n  # episodes ended (and were reset) along the way
    ours.close()
    ref.close()
