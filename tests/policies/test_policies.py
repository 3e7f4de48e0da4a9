"""Policies: batched random sampling inside every space, the MLP, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from collect_cli import specs
from collect_cli.errors import PolicyError
from collect_cli.policies.build import build_policy
from collect_cli.policies.mlp import MlpPolicyConfig
from collect_cli.policies.nets import MlpPolicy, RandomPolicy
from collect_cli.policies.random import RandomPolicyConfig

SPACES = [
    spaces.Box(-2, 3, (4,), np.float32),
    spaces.Box(np.array([-np.inf, 0, -np.inf]), np.array([np.inf, np.inf, 5]), dtype=np.float64),
    spaces.Box(0, 255, (2, 2), np.uint8),
    spaces.Discrete(5, start=-2),
    spaces.MultiDiscrete([3, 7], start=[1, 0]),
    spaces.MultiBinary(6),
    spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(0, 1, (2,))}),
    spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_random_samples_inside_space(space):
    policy = RandomPolicy(space, torch.device("cpu"), seed=1)
    values = policy.sample(2000)
    leaves = specs.leaves(space)
    for leaf, value in zip(leaves, values, strict=True):
        assert tuple(value.shape) == (2000, *leaf.shape)
        assert value.numpy().dtype == leaf.dtype
    arrays = [v.numpy() for v in values]
    for i in range(0, 2000, 50):
        single = specs.join([a[i] for a in arrays], space)
        assert space.contains(single), single
    if isinstance(space, spaces.Discrete):
        assert set(np.unique(arrays[0])) == set(range(-2, 3))


def test_random_is_seeded():
    space = spaces.Box(-1, 1, (3,))
    a = RandomPolicy(space, "cpu", seed=3).sample(10)[0]
    b = RandomPolicy(space, "cpu", seed=3).sample(10)[0]
    c = RandomPolicy(space, "cpu", seed=4).sample(10)[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "action_space",
    [
        spaces.Box(-2, 2, (2,)),
        spaces.Discrete(3),
        spaces.MultiDiscrete([2, 4]),
        spaces.MultiBinary(3),
    ],
    ids=lambda s: type(s).__name__,
)
def test_mlp_actions_are_valid(action_space):
    obs_space = spaces.Dict({"x": spaces.Box(-1, 1, (3,)), "k": spaces.Discrete(4)})
    policy = MlpPolicy(obs_space, action_space, [16, 16], torch.nn.ReLU)
    td = TensorDict(
        {
            ("observation", "x"): torch.randn(32, 3),
            ("observation", "k"): torch.randint(0, 4, (32,)),
        },
        batch_size=[32],
    )
    with torch.no_grad():
        action = policy(td)["action"].numpy()
    assert action.shape == (32, *action_space.shape)
    assert all(action_space.contains(a) for a in action)


def test_mlp_refuses_nested_actions():
    with pytest.raises(PolicyError, match="single action leaf"):
        MlpPolicy(spaces.Box(-1, 1, (2,)), spaces.Tuple((spaces.Discrete(2),)), [4])


def test_checkpoint_roundtrip_and_errors(tmp_path):
    obs, act = spaces.Box(-1, 1, (3,)), spaces.Box(-2, 2, (1,))
    cfg = MlpPolicyConfig(hidden=[8])
    trained = build_policy(cfg, obs, act, torch.device("cpu"), seed=11)
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    cfg.checkpoint = str(tmp_path / "w.pt")
    loaded = build_policy(cfg, obs, act, torch.device("cpu"), seed=99)
    for (k, v), (_, w) in zip(
        trained.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(v, w), k

    torch.save(torch.nn.Linear(3, 2).state_dict(), tmp_path / "other.pt")
    cfg.checkpoint = str(tmp_path / "other.pt")
    with pytest.raises(PolicyError, match="does not match the MLP"):
        build_policy(cfg, obs, act, torch.device("cpu"), seed=0)

    (tmp_path / "corrupt.pt").write_bytes(b"\x00garbage")
    cfg.checkpoint = str(tmp_path / "corrupt.pt")
    with pytest.raises(PolicyError, match="not a readable state_dict"):
        build_policy(cfg, obs, act, torch.device("cpu"), seed=0)


def test_seeded_init_is_reproducible():
    obs, act = spaces.Box(-1, 1, (3,)), spaces.Discrete(2)
    a = build_policy(MlpPolicyConfig(), obs, act, torch.device("cpu"), seed=1)
    b = build_policy(MlpPolicyConfig(), obs, act, torch.device("cpu"), seed=1)
    assert torch.equal(a.net[0].weight, b.net[0].weight)
    assert isinstance(build_policy(RandomPolicyConfig(), obs, act, "cpu", 0), RandomPolicy)


def test_python_policy_kinds():
    from collect_cli.policies.user import PythonPolicyConfig

    obs, act = spaces.Box(-1, 1, (3,)), spaces.Box(-2, 2, (1,))
    td = TensorDict({"observation": torch.randn(5, 3)}, batch_size=[5])
    const = build_policy(PythonPolicyConfig(target="toypolicies:constant"), obs, act, "cpu", 0)
    assert torch.equal(const(td.clone())["action"], torch.zeros(5, 1))
    lin = build_policy(PythonPolicyConfig(target="toypolicies:linear"), obs, act, "cpu", 0)
    assert "fn.0.weight" in lin.state_dict()
    with torch.no_grad():
        assert lin(td.clone())["action"].shape == (5, 1)
    gauss = build_policy(PythonPolicyConfig(target="toypolicies:gaussian"), obs, act, "cpu", 0)
    with torch.no_grad():
        out = gauss(td.clone())
    assert {"loc", "scale", "action", "action_log_prob"} <= set(out.keys())
    expected = torch.distributions.Normal(out["loc"], out["scale"]).log_prob(out["action"])
    logp = out["action_log_prob"]
    torch.testing.assert_close(logp, expected.reshape(logp.shape))


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("toypolicies", "must look like 'pkg.module:factory'"),
        ("nomodule:x", "No module named 'nomodule'"),
        ("badpolicymodule:x", "this module cannot be imported"),
        ("toypolicies:nothere", "has no 'nothere'"),
        ("toypolicies:broken", "raised RuntimeError: factory exploded"),
    ],
)
def test_python_policy_errors(target, message):
    from collect_cli.policies.user import PythonPolicyConfig

    obs, act = spaces.Box(-1, 1, (3,)), spaces.Box(-2, 2, (1,))
    with pytest.raises(PolicyError, match=message):
        build_policy(PythonPolicyConfig(target=target), obs, act, "cpu", 0)


def test_torchscript_policy(tmp_path):
    from collect_cli.policies.user import TorchScriptPolicyConfig

    net = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Tanh()))
    net.save(str(tmp_path / "p.pt"))
    obs, act = spaces.Box(-1, 1, (3,)), spaces.Box(-2, 2, (1,))
    policy = build_policy(TorchScriptPolicyConfig(path=str(tmp_path / "p.pt")), obs, act, "cpu", 0)
    x = torch.randn(4, 3)
    with torch.no_grad():
        got = policy(TensorDict({"observation": x}, batch_size=[4]))["action"]
        torch.testing.assert_close(got, net(x))
    (tmp_path / "bad.pt").write_bytes(b"junk")
    with pytest.raises(PolicyError, match="is not a TorchScript file"):
        build_policy(TorchScriptPolicyConfig(path=str(tmp_path / "bad.pt")), obs, act, "cpu", 0)
