"""Other tools on the same job as ``bench.py``: a dataset on disk of the same
frames, env and policy. Each in its fastest configuration here:

- TorchRL: ``Collector`` / ``MultiSyncCollector`` (2 workers; ``SyncDataCollector``
  and ``MultiSyncDataCollector`` before 0.11) over
  ``GymEnv(id, num_envs=N)`` (gymnasium's vector env inside), every batch
  extended into a ``ReplayBuffer`` on a ``LazyMemmapStorage`` (files on disk);
- Minari: ``DataCollector`` around one env (it records a single env), the
  policy called per step, then ``create_dataset`` (HDF5 on disk).

Both are optional (``pip install torchrl minari``); a missing one is skipped.
The policies are the same MLP shape (64x64, tanh, actions squashed like
rlcollect's) or uniform random actions.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def available(name: str) -> bool:
    """Whether contender ``name`` can run here. Minari's DataCollector needs jax
    (``minari[create]``): plain ``minari`` (rlcollect's export extra) is not enough."""
    needs = {"minari": ("minari", "jax")}.get(name, (name,))
    return all(importlib.util.find_spec(module) is not None for module in needs)


def _mlp(obs_dim: int, out_dim: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out_dim)
    )


class _Act(nn.Module):
    """MLP logits -> the env's action: tanh-squashed Box, argmax for Discrete."""

    def __init__(self, space: gym.Space, obs_dim: int):
        super().__init__()
        self.discrete = isinstance(space, gym.spaces.Discrete)
        out = int(space.n) if self.discrete else int(np.prod(space.shape))
        self.net = _mlp(obs_dim, out)
        if not self.discrete:
            self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        y = self.net(obs.float())
        if self.discrete:
            return y.argmax(-1)
        return self.low + (torch.tanh(y) + 1) * 0.5 * (self.high - self.low)


def mlp_actor(space: gym.Space, obs_dim: int) -> nn.Module:
    """The 64x64 tanh MLP a user writes for ``space`` (bench.py's bare loop)."""
    return _Act(space, obs_dim).eval()


def torchrl_run(
    env_id: str, num_envs: int, policy: str, frames: int, out: Path, workers: int = 0
) -> float:
    """frames/s of TorchRL's collector writing a memmap replay buffer."""
    from tensordict.nn import TensorDictModule

    try:
        from torchrl.collectors import Collector as SyncDataCollector
        from torchrl.collectors import MultiSyncCollector as MultiSyncDataCollector
    except ImportError:  # TorchRL before 0.11 named them *DataCollector
        from torchrl.collectors import MultiSyncDataCollector, SyncDataCollector
    from torchrl.data import LazyMemmapStorage, ReplayBuffer
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import RandomPolicy

    def make_env():
        return GymEnv(env_id, num_envs=num_envs, categorical_action_encoding=True)

    probe = gym.make(env_id)
    obs_dim = int(np.prod(probe.observation_space.shape))
    if policy == "random":
        actor = RandomPolicy(make_env().action_spec)
    else:
        actor = TensorDictModule(
            _Act(probe.action_space, obs_dim), in_keys=["observation"], out_keys=["action"]
        )
    probe.close()
    per_batch = 1000
    if workers:
        collector = MultiSyncDataCollector(
            [make_env] * workers, actor, frames_per_batch=per_batch, total_frames=frames
        )
    else:
        collector = SyncDataCollector(
            make_env, actor, frames_per_batch=per_batch, total_frames=frames
        )
    buffer = ReplayBuffer(storage=LazyMemmapStorage(frames, scratch_dir=str(out)))
    start = time.perf_counter()
    written = 0
    for batch in collector:
        flat = batch.reshape(-1)
        buffer.extend(flat)
        written += flat.numel()
    seconds = time.perf_counter() - start
    collector.shutdown()
    return written / seconds


def minari_run(env_id: str, policy: str, frames: int, out: Path) -> float:
    """frames/s of Minari's DataCollector, dataset written at the end."""
    os.environ["MINARI_DATASETS_PATH"] = str(out)
    from minari import DataCollector

    env = DataCollector(gym.make(env_id))
    obs_dim = int(np.prod(env.observation_space.shape))
    act = _Act(env.action_space, obs_dim)
    obs, _ = env.reset(seed=0)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(frames):
            if policy == "random":
                action = env.action_space.sample()
            else:
                action = act(torch.as_tensor(obs).unsqueeze(0))[0].numpy()
                if isinstance(env.action_space, gym.spaces.Discrete):
                    action = int(action)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
    name = env_id.split("-")[0].lower()
    env.create_dataset(dataset_id=f"bench/{name}-{policy}-v0", algorithm_name=policy)
    seconds = time.perf_counter() - start
    env.close()
    return frames / seconds
