"""The seed's rollout options on real gymnasium envs: max_frames_per_traj,
init_random_frames, reset_at_each_iter, reset_when_done, info keys, exploration."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from collect_cli.collectors import MultiSyncCollector, SyncCollector, split_trajectories
from collect_cli.envs import env_factory
from collect_cli.errors import ConfigError, PolicyError
from collect_cli.policies.build import PolicyFactory
from collect_cli.policies.mlp import MlpPolicyConfig
from collect_cli.policies.random import RandomPolicyConfig
from collect_cli.policies.user import PythonPolicyConfig
from collect_cli.rollout import RolloutOptions


def batches(collector, count):
    out = []
    for i, batch in enumerate(collector):
        out.append(batch)
        if i + 1 == count:
            break
    collector.shutdown()
    return out


def counter(num_envs=2, length=10, **kw):
    return env_factory("toyenvs:Counter-v0", num_envs, kwargs={"length": length}, **kw)


def test_max_frames_per_traj_truncates_and_counts_steps():
    make = counter(length=10)
    with SyncCollector(make, frames_per_batch=40, total_frames=80, options=RolloutOptions(7)) as c:
        data = torch.cat(list(c), dim=1)
    count = data["step_count"][..., 0].numpy()
    obs = data["observation"][..., 0].numpy()
    trunc = data["next", "truncated"][..., 0].numpy()
    # Counter's observation is its own step index: 0..6, then a reset
    expected = np.arange(40) % 7
    assert (count == expected).all() and (obs == expected).all()
    assert (data["next", "step_count"][..., 0].numpy() == expected + 1).all()
    assert (trunc == (expected == 6)).all()
    assert not data["next", "terminated"].any()  # the env's own end (10 steps) never comes
    assert (data["next", "done"][..., 0].numpy() == trunc).all()
    ids = data["collector", "traj_ids"].numpy()
    assert (np.diff(ids, axis=1)[:, :-1] != 0).sum() == (trunc[:, :-1]).sum()


def test_max_frames_per_traj_keeps_env_terminations():
    make = counter(length=5)
    with SyncCollector(make, frames_per_batch=40, total_frames=40, options=RolloutOptions(7)) as c:
        data = next(iter(c))
    assert (data["step_count"][0, :10, 0].numpy() == [0, 1, 2, 3, 4] * 2).all()
    assert not data["next", "truncated"].any()


def test_max_frames_per_traj_refuses_an_env_time_limit():
    make = env_factory("CartPole-v1", 2)
    with pytest.raises(ConfigError, match=r"time limit of CartPole-v1 \(500 steps\)"):
        SyncCollector(make, frames_per_batch=10, options=RolloutOptions(max_frames_per_traj=50))


@pytest.mark.parametrize("init_random", [1, 30, 64, 65])
def test_init_random_frames_counts_whole_steps(init_random):
    # the policy always picks action 0; random actions are 0 or 1
    policy = PolicyFactory(PythonPolicyConfig(target="toypolicies:first_action"), "cpu", 0)
    make = env_factory("CartPole-v1", 4)
    c = SyncCollector(
        make,
        policy,
        frames_per_batch=64,
        total_frames=256,
        options=RolloutOptions(init_random_frames=init_random),
    )
    actions = torch.cat(batches(c, 4), dim=1)["action"].numpy()  # [4 lanes, 64 steps]
    random_steps = math.ceil(init_random / 4)
    assert (actions[:, random_steps:] == 0).all()
    assert actions[:, :random_steps].any()  # 4 x 8 fair coins at least (all-zero: 2**-32)
    if random_steps >= 8:
        assert 0.2 < actions[:, :random_steps].mean() < 0.8


def test_init_random_frames_split_over_workers():
    policy = PolicyFactory(PythonPolicyConfig(target="toypolicies:first_action"), "cpu", 0)
    make = env_factory("CartPole-v1", 4)
    c = MultiSyncCollector(
        make,
        policy,
        num_workers=2,
        frames_per_batch=80,
        total_frames=160,
        options=RolloutOptions(init_random_frames=80),
    )
    actions = torch.cat(batches(c, 2), dim=1)["action"].numpy()  # [8 lanes, 20 steps]
    # each worker takes half (40 frames = 10 steps of its 4 lanes)
    assert (actions[:, 10:] == 0).all()
    assert actions[:4, :10].any() and actions[4:, :10].any()


def test_reset_at_each_iter_starts_every_batch_fresh():
    make = counter(num_envs=3, length=100)
    c = SyncCollector(
        make, frames_per_batch=30, total_frames=90, options=RolloutOptions(reset_at_each_iter=True)
    )
    data = batches(c, 3)
    for batch in data:
        assert (batch["observation"][:, 0, 0] == 0).all()
        assert (batch["observation"][..., 0] == torch.arange(10)).all()
    ids = [set(b["collector", "traj_ids"].unique().tolist()) for b in data]
    assert ids[0].isdisjoint(ids[1]) and ids[1].isdisjoint(ids[2])
    assert all(len(s) == 3 for s in ids)


def test_reset_when_done_false_keeps_one_trajectory_per_lane():
    make = counter(num_envs=2, length=5)
    options = RolloutOptions(reset_when_done=False)
    c = SyncCollector(make, frames_per_batch=40, total_frames=40, options=options)
    (data,) = batches(c, 1)
    done = data["next", "done"][..., 0].numpy()
    assert (done == ((np.arange(20) % 5) == 4)).all()  # gymnasium restarts the env itself
    ids = data["collector", "traj_ids"].numpy()
    assert (ids == ids[:, :1]).all() and ids[0, 0] != ids[1, 0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_frames_per_traj": 0}, "max_frames_per_traj must be a positive integer or -1"),
        ({"max_frames_per_traj": -2}, "max_frames_per_traj must be a positive integer or -1"),
        ({"init_random_frames": -1}, "init_random_frames must be >= 0"),
        ({"exploration_type": "greedy"}, "exploration_type='greedy' is not valid"),
        (
            {"max_frames_per_traj": 5, "reset_when_done": False},
            "max_frames_per_traj needs reset_when_done=true",
        ),
    ],
)
def test_rollout_refuses_what_no_collector_can_run(options, message):
    with pytest.raises(ConfigError, match=message):
        RolloutOptions(**options)


def test_rollout_is_frozen_and_shared_over_workers():
    options = RolloutOptions(init_random_frames=81)
    with pytest.raises(AttributeError):
        options.init_random_frames = 0  # type: ignore[misc]
    assert options.share(2).init_random_frames == 41  # each worker takes its share
    assert options.after(100).init_random_frames == 0  # a resume past them takes none
    assert options.after(50) == RolloutOptions(init_random_frames=31)


def test_info_keys_recorded_with_final_step_info():
    make = env_factory("toyenvs:Info-v0", 2, info_keys=["x_position", "terms"])
    with SyncCollector(make, frames_per_batch=24, total_frames=24) as c:
        data = next(iter(c))
    next_obs = data["next", "observation"][..., 0].double()
    # the info of a step describes its result: x = 0.5 * t(next) even on the final step
    assert torch.equal(data["info", "x_position"], 0.5 * next_obs)
    assert data["info", "terms"].shape == (2, 12, 2)
    assert torch.equal(data["info", "terms"][..., 0], next_obs)
    assert torch.equal(data["info", "terms"][..., 1], -next_obs)
    assert data["next", "done"][..., 0].sum() == 4  # episode ends were covered


def test_info_keys_missing_entries_are_nan_and_text_is_refused():
    from collect_cli.errors import CollectionError

    make = env_factory("toyenvs:Info-v0", 2, info_keys=["nothing"])
    with SyncCollector(make, frames_per_batch=4, total_frames=4) as c:
        assert torch.isnan(next(iter(c))["info", "nothing"]).all()
    make = env_factory("toyenvs:Info-v0", 2, info_keys=["label"])
    with (
        pytest.raises(CollectionError, match="info\\['label'\\]"),
        SyncCollector(make, frames_per_batch=4, total_frames=4) as c,
    ):
        next(iter(c))


def mlp_collector(noise="none", exploration_type="random", env="Pendulum-v1", **noise_kw):
    cfg = MlpPolicyConfig(noise=noise, **noise_kw)
    policy = PolicyFactory(cfg, "cpu", 3)
    return SyncCollector(
        env_factory(env, 4),
        policy,
        frames_per_batch=200,
        total_frames=200,
        options=RolloutOptions(exploration_type=exploration_type),
        seed=1,
    )


def test_gaussian_noise_is_clipped_and_only_under_random():
    plain = batches(mlp_collector(), 1)[0]
    noisy = batches(mlp_collector("gaussian", noise_scale=10.0), 1)[0]
    moded = batches(mlp_collector("gaussian", "mode", noise_scale=10.0), 1)[0]
    a = noisy["action"]
    assert a.min() >= -2.0 and a.max() <= 2.0
    assert (a.abs() == 2.0).float().mean() > 0.5  # scale 10 >> bounds: mostly clipped
    assert torch.equal(moded["action"], plain["action"])  # no noise outside random
    assert not torch.equal(a, plain["action"])


def test_epsilon_greedy_rate():
    def actions(epsilon):
        cfg = PythonPolicyConfig(
            target="toypolicies:first_action", noise="epsilon", epsilon=epsilon
        )
        c = SyncCollector(
            env_factory("CartPole-v1", 8),
            PolicyFactory(cfg, "cpu", 0),
            frames_per_batch=4000,
            total_frames=4000,
        )
        return batches(c, 1)[0]["action"].float()

    assert actions(0.0).sum() == 0
    rate = actions(0.5).mean().item()  # half explore, half of those pick action 1
    assert 0.2 < rate < 0.3


def test_noise_kind_must_match_action_space():
    cfg = RandomPolicyConfig(noise="epsilon")
    with pytest.raises(PolicyError, match=r"policy\.noise=epsilon needs discrete actions"):
        SyncCollector(
            env_factory("Pendulum-v1", 2), PolicyFactory(cfg, "cpu", 0), frames_per_batch=4
        )


def test_probabilistic_policy_mode_and_log_prob():
    cfg = PythonPolicyConfig(target="toypolicies:gaussian")

    def collect(exploration_type):
        c = SyncCollector(
            env_factory("Pendulum-v1", 4),
            PolicyFactory(cfg, "cpu", 0),
            frames_per_batch=400,
            total_frames=400,
            options=RolloutOptions(exploration_type=exploration_type),
            seed=5,
        )
        return batches(c, 1)[0]

    mode = collect("mode")
    assert torch.equal(mode["action"], mode["loc"])  # the mode of a Normal is its mean
    again = collect("mode")
    assert torch.equal(again["action"], mode["action"])  # same observations, same actions
    random = collect("random")
    assert not torch.equal(random["action"], random["loc"])
    for data in (mode, random):
        log_prob_key = next(k for k in data.keys(include_nested=False) if "log_prob" in k)
        expected = torch.distributions.Normal(data["loc"], data["scale"]).log_prob(data["action"])
        recorded = data[log_prob_key]
        assert torch.allclose(
            recorded.reshape((*expected.shape[:2], -1)).sum(-1), expected.sum(-1), atol=1e-5
        )
    # identical observations give identical actions under mode, whatever the lane
    policy = PolicyFactory(cfg, "cpu", 0)(None, None)
    from collect_cli.policies.exploration import interaction

    obs = torch.randn(1, 3).expand(5, 3)
    with interaction("mode"), torch.no_grad():
        out = policy(TensorDict({"observation": obs}, batch_size=[5]))
    assert (out["action"] == out["action"][:1]).all()


def test_split_trajectories_gives_each_batch_as_trajectory_pieces():
    make = counter(num_envs=2, length=4)
    c = SyncCollector(make, frames_per_batch=12, total_frames=24)
    first, second = (split_trajectories(b) for b in batches(c, 2))
    # 6 steps per lane, episodes of 4: pieces of 4 and 2 per lane, then 2 and 4
    assert first.batch_size == (4, 4) and second.batch_size == (4, 4)
    assert first["collector", "mask"].sum(1).tolist() == [4, 2, 4, 2]
    assert second["collector", "mask"].sum(1).tolist() == [2, 4, 2, 4]
    obs = first["observation"][..., 0]
    assert obs[0].tolist() == [0, 1, 2, 3] and obs[1, :2].tolist() == [0, 1]
    assert (first["collector", "traj_ids"][~first["collector", "mask"]] == -1).all()
