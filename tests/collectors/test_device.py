"""The collector's device path (native envs): the batches the host path collects,
without a host round trip per step; on every available device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from collect_cli import config
from collect_cli.collectors import MultiSyncCollector, SyncCollector
from collect_cli.envs import env_factory
from collect_cli.errors import CollectionError, ConfigError
from collect_cli.policies.build import PolicyFactory
from collect_cli.rollout import RolloutOptions

CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param(
        "cuda:0",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")],
    ),
]


def policy(name: str, device: str = "cpu") -> PolicyFactory:
    return PolicyFactory(config.load(config.compose([f"policy={name}"])).policy, device, 0)


def batches(env_id, device_path, *, lanes=5, device="cpu", policy_name="random", **kw):
    kw["options"] = RolloutOptions(**kw.pop("options", {}))
    kw.setdefault("frames_per_batch", 5 * 17)
    kw.setdefault("total_frames", 5 * 17 * 4)
    # short episodes: several resets (new traj ids) inside every batch
    make = env_factory(env_id, lanes, "native", {"max_episode_steps": 13}, device=device)
    with SyncCollector(
        make,
        policy(policy_name, device),
        device=device,
        seed=4,
        device_path=device_path,
        **kw,
    ) as c:
        return list(c)


@pytest.mark.parametrize(
    "env_id",
    ["Pendulum-v1", "CartPole-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Acrobot-v1"],
)
@pytest.mark.parametrize("policy_name", ["random", "mlp"])
def test_device_path_collects_what_the_host_path_collects(env_id, policy_name):
    host = batches(env_id, False, policy_name=policy_name, options={"init_random_frames": 30})
    dev = batches(env_id, True, policy_name=policy_name, options={"init_random_frames": 30})
    assert len(host) == len(dev) == 4
    for a, b in zip(host, dev, strict=True):
        assert a.batch_size == b.batch_size == (5, 17)
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert a.get(key).dtype == b.get(key).dtype, key
            torch.testing.assert_close(a.get(key), b.get(key), rtol=0, atol=0, msg=str(key))
    traj = torch.cat([b["collector", "traj_ids"] for b in dev], 1).numpy()
    done = torch.cat([b["next", "done"] for b in dev], 1).numpy()[..., 0]
    np.testing.assert_array_equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])
    assert done.sum() >= 5  # the test saw episode ends


def test_device_path_without_reset_when_done_keeps_ids():
    host = batches("CartPole-v1", False, options={"reset_when_done": False})
    dev = batches("CartPole-v1", True, options={"reset_when_done": False})
    for a, b in zip(host, dev, strict=True):
        assert (a == b).all()
    assert (dev[-1]["collector", "traj_ids"][:, -1] == torch.arange(5)).all()


def test_device_path_preemption_pads_like_the_host_path():
    out = []
    for device_path in (False, True):
        make = env_factory("Pendulum-v1", 3, "native")
        with SyncCollector(make, frames_per_batch=30, seed=1, device_path=device_path) as c:
            calls = iter(range(100))
            first = c.rollout(stop=lambda calls=calls: next(calls) >= 3).clone()  # 4 steps
            second = c.rollout().clone()  # a full batch in the other buffer
            third = c.rollout().clone()  # the padded buffer again: whole
            out.append((first, second, third))
    (h1, h2, h3), (d1, d2, d3) = out
    assert h1["collector", "mask"].sum() == 12 and (h1 == d1).all()
    assert (d1["collector", "traj_ids"][:, 4:] == -1).all()
    assert (h2 == d2).all() and (h3 == d3).all() and d3["collector", "mask"].all()


def test_device_path_refuses_out_of_range_discrete_actions():
    def five(td):
        td.set("action", torch.full((td.batch_size[0],), 5))
        return td

    make = env_factory("CartPole-v1", 2, "native")
    with (
        SyncCollector(make, five, frames_per_batch=10, total_frames=10) as c,
        pytest.raises(CollectionError, match=r"takes actions 0\.\.1, got 5"),
    ):
        next(iter(c))


def test_device_path_needs_a_native_env():
    with pytest.raises(ConfigError, match="needs a native env"):
        SyncCollector(env_factory("CartPole-v1", 2), frames_per_batch=10, device_path=True)


def test_workers_use_the_device_path_in_shared_memory():
    make = env_factory("CartPole-v1", 3, "native", {"max_episode_steps": 13})
    with MultiSyncCollector(
        make, num_workers=2, frames_per_batch=60, total_frames=180, seed=2, device_path=True
    ) as c:
        got = list(c)
    assert [b.batch_size for b in got] == [(6, 10)] * 3
    traj = torch.cat([b["collector", "traj_ids"] for b in got], 1).numpy()
    done = torch.cat([b["next", "done"] for b in got], 1).numpy()[..., 0]
    np.testing.assert_array_equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])
    assert len(np.unique(traj[:, 0])) == 6 and done.sum() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_batches_reach_the_host_on_every_device(device):
    got = batches("Pendulum-v1", None, device=device, policy_name="mlp")
    for b in got:
        assert all(x.device.type == "cpu" for x in b.values(True, True))
        assert b["collector", "mask"].all()
        assert torch.isfinite(b["next", "reward"]).all()
    obs = torch.cat([b["observation"] for b in got], 1)
    nxt = torch.cat([b["next", "observation"] for b in got], 1)
    done = torch.cat([b["next", "done"] for b in got], 1)[..., 0]
    # where no episode ended, the next step starts from this step's next observation
    same = ~done[:, :-1]
    torch.testing.assert_close(obs[:, 1:][same], nxt[:, :-1][same])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_policy_over_a_host_env_records_its_actions():
    """gymnasium env on the host, MLP policy on CUDA (pinned, asynchronous copies both
    ways): every recorded action is the policy's output for the recorded observation."""
    with SyncCollector(
        env_factory("Pendulum-v1", 4),
        policy("mlp", "cuda:0"),
        device="cuda:0",
        frames_per_batch=40,
        total_frames=120,
        seed=5,
    ) as c:
        got = list(c)
        net = c.policy.to("cpu")
    for batch in got:
        obs = batch["observation"].reshape(-1, 3)
        with torch.no_grad():
            want = net(TensorDict({"observation": obs}, [obs.shape[0]]))["action"]
        torch.testing.assert_close(batch["action"].reshape(-1, 1), want, rtol=1e-5, atol=1e-5)
        # the next step starts from this step's next observation (no stale pinned input)
        same = ~batch["next", "done"][:, :-1, 0]
        assert torch.equal(
            batch["observation"][:, 1:][same], batch["next", "observation"][:, :-1][same]
        )
