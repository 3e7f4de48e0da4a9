"""The gymnasium backend: autoreset without fake transitions, nested spaces, errors."""

from __future__ import annotations

import numpy as np
import pytest

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
    with pytest.raises(SpaceError, match="unsupported observation space Text"):
        env_factory("toyenvs:Text-v0", 1)()


def test_unknown_id_suggests_close_matches():
    with pytest.raises(UsageError, match="did you mean CartPole-v1"):
        env_factory("CartPol-v1", 1)()


def test_unknown_backend():
    with pytest.raises(UsageError, match="choose from gymnasium"):
        env_factory("CartPole-v1", 1, backend="nope")
