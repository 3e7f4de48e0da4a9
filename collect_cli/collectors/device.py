"""The collector's device path: a whole batch collected where the env runs.

For envs that step as torch tensors on a device (``env.backend=native``), the
:class:`SyncCollector` keeps everything there: observations, the policy's
outputs, rewards, flags and trajectory ids are written into a time-major batch
buffer on the device, with no host round trip per step (no ``.cpu()``, no sync).
At the end of the batch the buffer is copied to the host once, into one of the
collector's (pinned, on CUDA) host buffers used in turn, and the host view is
yielded: while the writer thread stores it, the next batch is collected.

Semantics are the host path's: the same keys, dtypes and trajectory ids (new ids
for done lanes in lane order), ``init_random_frames``, ``reset_when_done``,
``exploration_type`` and preemption (``stop``). ``max_frames_per_traj`` never
applies here: native envs have their own time limit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict

from collect_cli import dataformat as fmt
from collect_cli.collectors.base import batch_views, env_errors, pad_steps
from collect_cli.errors import CollectionError


def steps_on_device(env: Any) -> bool:
    """Whether ``env`` can be stepped with tensors on its device (the device path)."""
    return callable(getattr(env, "step_tensors", None))


class DeviceBuffers:
    """One time-major batch buffer on the device, and ``count`` host buffers it is
    copied into in turn (pinned on CUDA, so the copy runs at full bus speed).
    On CPU the device buffer is the host buffer of the turn: nothing is copied."""

    def __init__(self, template: TensorDict, device: torch.device, count: int, shared: bool):
        self.device = device
        on_cpu = device.type == "cpu"
        self.hosts = [template] + [template.clone() for _ in range(max(1, count) - 1)]
        if shared:  # worker processes: the main process reads these
            for host in self.hosts:
                host.share_memory_()
        elif not on_cpu:
            self.hosts = [host.pin_memory() for host in self.hosts]
        self.work = None if on_cpu else template.to(device)

    def turn(self, index: int) -> tuple[TensorDict, TensorDict]:
        """``(device buffer, host buffer)`` of batch number ``index``."""
        host = self.hosts[index % len(self.hosts)]
        return (host if self.work is None else self.work), host

    def download(self, work: TensorDict, host: TensorDict) -> None:
        """Copy a filled device buffer to its host buffer; wait until it is there."""
        if work is host:
            return
        host.copy_(work, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()


class DevicePathMixin:
    """:class:`SyncCollector`'s rollout on the env's device (see the module docstring)."""

    def _device_fill(self, stop: Callable[[], bool] | None) -> TensorDict:
        work, host = self._device_buffers.turn(self._batches - 1)
        v = {(k if isinstance(k, tuple) else (k,)): x for k, x in work.items(True, True)}
        n, steps, env = self.num_envs, self.steps_per_batch, self.env
        dev = self._device_buffers.device
        bv = batch_views(v, self._obs_keys, self._policy_keys, self._act_keys)
        obs_views, next_views, policy_views = bv.obs, bv.next_obs, bv.policy
        act_idx, extra_views, reward, traj_view = bv.act_idx, bv.extras, bv.reward, bv.traj
        n_done, n_term, n_trunc = bv.done, bv.terminated, bv.truncated
        v[fmt.MASK_KEY].fill_(True)  # this buffer may hold an earlier padded batch
        stride = self._stride
        traj = torch.from_numpy(self._traj_ids).to(dev)
        next_id = torch.tensor(self._next_id, dtype=torch.int64, device=dev)
        obs = env.obs_tensors()
        filled = steps
        for t in range(steps):
            for dst, src in zip(obs_views, obs, strict=True):
                dst[t] = src
            traj_view[t] = traj
            if self._env_frames < self.init_random_frames:
                actions = self._random_policy.sample(n)
                for i, src in zip(act_idx, actions, strict=True):
                    policy_views[i][1][t] = src
                for dst in extra_views:
                    dst[t] = 0
            elif self._act is not None:  # the policy on the observation tensor
                action = self._act(obs[0])
                policy_views[0][1][t] = action
                actions = [action]
            else:
                td = TensorDict(dict(zip(self._obs_keys, obs, strict=True)), batch_size=[n])
                out = self.policy(td)
                for key, dst in policy_views:
                    dst[t] = out.get(key)
                actions = [out.get(k) for k in self._act_keys]
            self._env_frames += n
            step = self._device_step(actions)
            for dst in next_views:
                dst[t] = step.next_obs
            reward[t, :, 0] = step.reward
            n_term[t, :, 0] = step.terminated
            n_trunc[t, :, 0] = step.truncated
            done = step.terminated | step.truncated
            n_done[t, :, 0] = done
            obs = [step.obs]
            if self.reset_when_done:  # fresh ids for the lanes that ended, in lane order
                rank = torch.cumsum(done, 0)
                traj = torch.where(done, next_id + (rank - 1) * stride, traj)
                next_id = next_id + rank[-1] * stride
            if stop is not None and t + 1 < steps and stop():
                filled = t + 1
                break
        if filled < steps:
            pad_steps(v, filled)
        self._traj_ids = traj.cpu().numpy()  # waits for the batch (no sync before this)
        self._next_id = int(next_id)
        self._check_actions(v, filled)
        self._device_buffers.download(work, host)
        return host.transpose(0, 1)

    def _device_step(self, actions: list[torch.Tensor]):
        with env_errors(self.env.env_id):
            return self.env.step_tensors(actions)

    def _check_actions(self, v: dict[tuple[str, ...], torch.Tensor], filled: int) -> None:
        """Discrete actions out of range, checked once per batch (a sync per step
        would stall the device); the host path checks every step."""
        count = getattr(self.env.dynamics, "discrete", 0)
        if not count:
            return
        actions = v[self._act_keys[0]][:filled]
        bad = (actions < 0) | (actions >= count)
        if bool(bad.any()):
            value = int(actions[bad][0])
            raise CollectionError(f"{self.env.env_id} takes actions 0..{count - 1}, got {value}")
