"""Single-process collector: one :class:`VecEnv`, one policy, preallocated batches.

Frame accounting (as in TorchRL): each batch holds ``lanes * ceil(frames_per_batch
/ lanes)`` frames, and batches are yielded until at least ``total_frames`` frames
have been produced (``-1``: forever). ``collector/traj_ids`` gets a fresh id
at every reset; ids are ``traj_id_start + k * traj_id_stride`` for k = 0, 1, ...

Rollout options: :class:`~collect_cli.rollout.RolloutOptions` says what each does.

Batches are filled in place in preallocated buffers. By default each yielded
batch is a copy; with ``return_same_td=True`` it is the buffer itself, valid
until the collector fills that buffer again: ``batch_buffers`` buffers are used
in turn, so with two a consumer may still read batch k while batch k+1 is being
collected (it must be done with k before asking for k+2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from collect_cli import dataformat as fmt
from collect_cli.collectors.base import (
    FLAG_KEYS,
    CollectorBase,
    batch_views,
    derive_seeds,
    env_error,
    pad_steps,
)
from collect_cli.collectors.device import DeviceBuffers, DevicePathMixin, steps_on_device
from collect_cli.config_checks import check_batch_memory
from collect_cli.envs.base import StepResult, VecEnv
from collect_cli.errors import ConfigError, PolicyError, RlcollectError
from collect_cli.policies.build import PolicyFactory
from collect_cli.policies.exploration import interaction
from collect_cli.policies.nets import RandomPolicy, tensor_policy, torch_dtype
from collect_cli.rollout import RolloutOptions
from collect_cli.threads import intra_op_threads, serial


class SyncCollector(DevicePathMixin, CollectorBase):
    def __init__(
        self,
        create_env_fn: Callable[[], VecEnv],
        policy: nn.Module
        | Callable[[TensorDictBase], TensorDictBase]
        | PolicyFactory
        | None = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        device: str | torch.device = "cpu",
        storing_device: str | torch.device = "cpu",
        seed: int = 0,
        traj_id_start: int = 0,
        traj_id_stride: int = 1,
        return_same_td: bool = False,
        batch_buffers: int = 1,
        shared_memory: bool = False,
        options: RolloutOptions | None = None,
        device_path: bool | None = None,
        memory: tuple[int, int] | None = None,
    ):
        """``device_path``: collect on the env's device (envs with ``step_tensors``,
        i.e. ``env.backend=native``; see :mod:`collect_cli.collectors.device`).
        Default: on for such envs on CUDA; on CPU the host path is ~10% faster.

        ``memory``: ``(batches of this size the run holds over all its processes, the
        run's frames_per_batch)`` for the memory check (default: this collector's)."""
        self._closed = True
        self.env = create_env_fn()
        self._closed = False
        self.options = options = options or RolloutOptions()
        self.max_frames_per_traj = options.max_frames_per_traj
        limit = self.env.max_episode_steps
        if self.max_frames_per_traj > 0 and limit is not None:
            raise ConfigError(
                f"max_frames_per_traj={self.max_frames_per_traj} conflicts with the time limit "
                f"of {self.env.env_id} ({limit} steps): set +env.kwargs.max_episode_steps="
                f"{self.max_frames_per_traj} instead, or max_frames_per_traj=-1"
            )
        self.init_random_frames = options.init_random_frames
        self.reset_at_each_iter = options.reset_at_each_iter
        self.reset_when_done = options.reset_when_done
        self.exploration_type = options.exploration_type
        self.num_envs = self.lanes = self.env.num_envs
        self.busy_in_python = self.env.steps_in_python
        self.torch_on_cpu = self.env.torch_on_cpu
        self.device = torch.device(device)
        self.storing_device = torch.device(storing_device)
        if isinstance(policy, PolicyFactory):
            policy = policy(self.env.observation_space, self.env.action_space)
        self.policy = policy if policy is not None else RandomPolicy(self.env.action_space, device)
        # a small policy on this CPU, on small observations, runs on one thread
        step_elements = self.num_envs * sum(math.prod(leaf.shape) for leaf in self.env.obs_leaves)
        module = isinstance(self.policy, nn.Module)
        weights = sum(p.numel() for p in self.policy.parameters()) if module else 0
        self._serial = self.device.type == "cpu" and serial(step_elements, self.num_envs * weights)
        self.env_id = self.env.env_id
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.requested_frames_per_batch = frames_per_batch
        self.steps_per_batch = math.ceil(frames_per_batch / self.num_envs)
        self.frames_per_batch = self.steps_per_batch * self.num_envs
        self.total_frames = total_frames
        self.return_same_td = return_same_td
        self._stride = traj_id_stride
        self._traj_start = traj_id_start
        self._frames = 0
        self._env_frames = 0  # frames stepped by this collector (init_random_frames)
        self._batches = 0  # rollouts started (reset_at_each_iter)
        self._resets = 0  # lanes reset by max_frames_per_traj (their seeds)
        self._full_resets = 0  # reset() calls (their seeds)
        self._row_cache: dict[int, list[StepResult]] = {}  # per batch buffer
        self._memory = memory or (max(1, batch_buffers), frames_per_batch)
        self._obs_keys = [("observation", *leaf.key) for leaf in self.env.obs_leaves]
        self._act_keys = [("action", *leaf.key) for leaf in self.env.action_leaves]
        self._random_policy = (
            RandomPolicy(self.env.action_space, self.device, derive_seeds(seed, 1, 6)[0])
            if self.init_random_frames
            else None
        )
        self.set_seed(seed)
        # Buffers are stored time-major, [steps, lanes]: a step writes one contiguous
        # row per key (writing a column of a [lanes, steps] array costs ~10x more).
        # What is yielded is the [lanes, steps] view of it.
        first = self._allocate()
        if device_path is None:
            device_path = steps_on_device(self.env) and self.env.device.type != "cpu"
        elif device_path and not steps_on_device(self.env):
            raise ConfigError(f"device_path=True needs a native env, not {self.env.env_id}")
        self._device_buffers = None
        self._all_views: list[dict[tuple[str, ...], np.ndarray]] = []
        if device_path:  # filled on the env's device, then copied into these
            device_buffers = DeviceBuffers(first, self.env.device, batch_buffers, shared_memory)
            self._device_buffers, stores = device_buffers, device_buffers.hosts
        else:
            stores = [first] + [first.clone() for _ in range(max(1, batch_buffers) - 1)]
            if shared_memory:  # before taking views: sharing moves the storage
                for store in stores:
                    store.share_memory_()
        self._use(stores)

    def _use(self, stores: list[TensorDict]) -> None:
        if self._device_buffers is not None:
            self._device_buffers.hosts = stores
        else:
            self._all_views = [
                {(k if isinstance(k, tuple) else (k,)): v.numpy() for k, v in b.items(True, True)}
                for b in stores
            ]
        self._row_cache.clear()
        self._buffers = [store.transpose(0, 1) for store in stores]
        self._buffer = self._buffers[0]
        self._views = self._all_views[0] if self._all_views else {}

    def adopt(self, stores: list[TensorDict]) -> None:
        """Fill ``stores`` in turn from now on, instead of the buffers allocated here:
        time-major (``[steps, lanes]``) like them, of the same keys, shapes and dtypes
        (e.g. this collector's lanes of a batch buffer shared by several workers)."""
        mine = self._buffers[0].transpose(0, 1)
        for store in stores:
            if store.batch_size != mine.batch_size or any(
                (a.shape, a.dtype) != (b.shape, b.dtype)
                for a, b in zip(store.values(True, True), mine.values(True, True), strict=True)
            ):
                raise ValueError("adopted buffers must match the collector's own")
        self._use(stores)

    def share_buffers(self):
        """Move the batch buffers into one file other processes can map (a
        :class:`~collect_cli.collectors.shared.SharedStores`, which the caller removes
        once they have), before the first batch. Returns it, and the batches this
        collector lends from it with ``return_same_td`` (``[lanes, time]`` views, in
        the order of its buffers)."""
        from collect_cli.collectors.shared import SharedStores

        shared = SharedStores.create(self._buffers[0].transpose(0, 1), len(self._buffers))
        try:
            self.adopt(shared.map())
        except BaseException:
            shared.remove()
            raise
        return shared, list(self._buffers)

    # -- set-up -----------------------------------------------------------------------
    def _policy_input(self, obs: list[np.ndarray]) -> TensorDict:
        """The policy's input TensorDict. One TensorDict over persistent host arrays
        is refilled each step (building a TensorDict costs more than a step of a
        classic-control env); the policy's own outputs in it are overwritten. For a
        CUDA policy the arrays are pinned and copied to the device asynchronously
        (the step's outputs are synced before they are refilled)."""
        if getattr(self, "_input", None) is None:
            tensors = [torch.from_numpy(np.array(a)) for a in obs]
            if self.device.type == "cuda":
                tensors = [t.pin_memory() for t in tensors]
            data = dict(zip(self._obs_keys, tensors, strict=True))
            self._input = ([t.numpy() for t in tensors], TensorDict(data, [self.num_envs]))
            self._input_tensor = tensors[0]
        arrays, td = self._input
        for dst, src in zip(arrays, obs, strict=True):
            np.copyto(dst, src)
        return td if self.device.type == "cpu" else td.to(self.device, non_blocking=True)

    def _policy_tensor(self, obs: list[np.ndarray]) -> torch.Tensor:
        """The single observation leaf as the policy's input tensor (the same
        persistent array as :meth:`_policy_input`'s, refilled)."""
        np.copyto(self._input[0][0], obs[0])
        x = self._input_tensor
        return x if self.device.type == "cpu" else x.to(self.device, non_blocking=True)

    def _policy_outputs(self, out: TensorDictBase) -> list[np.ndarray]:
        """The policy's outputs (``_policy_keys`` order) as host arrays."""
        return self._host_outputs([out.get(k) for k in self._policy_keys])

    def _host_outputs(self, values: list[torch.Tensor]) -> list[np.ndarray]:
        """Policy outputs as host arrays. From a CUDA policy they are copied into
        pinned buffers asynchronously, with one sync for all of them; the arrays
        are valid until the next step's outputs."""
        if self.device.type != "cuda":  # CPU tensors: views (no grad under the rollout)
            return [
                x.numpy() if x.is_cpu and not x.requires_grad else x.detach().cpu().numpy()
                for x in values
            ]
        pinned = getattr(self, "_pinned_out", None)
        if pinned is None or any(
            p.shape != x.shape or p.dtype != x.dtype for p, x in zip(pinned, values, strict=True)
        ):
            pinned = self._pinned_out = [
                torch.empty(x.shape, dtype=x.dtype).pin_memory() for x in values
            ]
        for dst, x in zip(pinned, values, strict=True):
            dst.copy_(x.detach(), non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return [p.numpy() for p in pinned]

    def _allocate(self) -> TensorDict:
        """Dry-run the policy once to learn its outputs, check them, allocate the batch."""
        with torch.no_grad(), interaction(self.exploration_type):
            out = self.policy(self._policy_input(self._obs))
        if not isinstance(out, TensorDictBase):
            raise PolicyError(f"the policy returned {type(out).__name__}, expected a TensorDict")
        n, steps = self.num_envs, self.steps_per_batch
        for key, leaf in zip(self._act_keys, self.env.action_leaves, strict=True):
            value = out.get(key, None)
            want = (n, *leaf.shape)
            if value is None:
                raise PolicyError(f"the policy did not set {'/'.join(key)!r} (expected {want})")
            if tuple(value.shape) != want:
                got = tuple(value.shape)
                raise PolicyError(
                    f"the policy's {'/'.join(key)!r} has shape {got}, expected {want}"
                )
        # each key's (frame shape, dtype), every buffer allocated only once all are known
        layout: dict[Any, tuple[tuple[int, ...], torch.dtype]] = {}
        for key, leaf in zip(self._obs_keys, self.env.obs_leaves, strict=True):
            layout[key] = layout[(fmt.NEXT, *key)] = (tuple(leaf.shape), torch_dtype(leaf.dtype))
        obs_set = set(self._obs_keys)
        for key in out.keys(True, True):
            key = key if isinstance(key, tuple) else (key,)
            if key in obs_set or key[0] in (fmt.NEXT, fmt.COLLECTOR):
                continue
            value = out.get(key)
            dtype = torch_dtype(self._leaf_dtype(key)) if key in self._act_keys else value.dtype
            layout[key] = (tuple(value.shape[1:]), dtype)
        self._policy_keys = [k for k in layout if k[0] != fmt.NEXT and k not in obs_set]
        # rlcollect's own policies are called on the observation tensor (no TensorDict)
        self._act = tensor_policy(self.policy, len(self._obs_keys), self._policy_keys)
        self._act_idx = [self._policy_keys.index(k) for k in self._act_keys]
        for flag in FLAG_KEYS:
            layout[(flag,)] = layout[(fmt.NEXT, flag)] = ((1,), torch.bool)
        layout[fmt.REWARD_KEY] = ((1,), torch.float32)
        if self.max_frames_per_traj > 0:
            layout[("step_count",)] = layout[(fmt.NEXT, fmt.STEP_COUNT)] = ((1,), torch.int64)
        recorded = self.env.recorded_specs()  # what a step reports beside the transition
        self._step_keys = [key for key, _, _ in recorded]
        for key, shape, dt in recorded:
            layout[key] = (tuple(shape), torch_dtype(dt))
        layout[fmt.TRAJ_KEY] = ((), torch.int64)
        layout[fmt.MASK_KEY] = ((), torch.bool)
        held, run_batch = self._memory
        frame_bytes = sum(math.prod(shape) * dt.itemsize for shape, dt in layout.values())
        check_batch_memory(frame_bytes, held * self.frames_per_batch, run_batch)
        buf = {key: torch.zeros(steps, n, *shape, dtype=dt) for key, (shape, dt) in layout.items()}
        buf[fmt.MASK_KEY].fill_(True)
        return TensorDict(buf, batch_size=[steps, n])  # time-major: see __init__

    def _leaf_dtype(self, key: tuple[str, ...]) -> np.dtype:
        return self.env.action_leaves[self._act_keys.index(key)].dtype

    # -- collection ----------------------------------------------------------------------
    def iter_with_lanes(self) -> Iterator[tuple[int, TensorDictBase]]:
        while self.total_frames < 0 or self._frames < self.total_frames:
            batch = self.rollout()
            self._frames += self.frames_per_batch
            if not self.return_same_td:  # a contiguous copy, even where the view is one
                batch = batch.apply(lambda x: x.clone(memory_format=torch.contiguous_format))
            if self.storing_device.type != "cpu":
                batch = batch.to(self.storing_device, non_blocking=True)
            yield 0, batch

    @torch.no_grad()
    def rollout(self, stop: Callable[[], bool] | None = None) -> TensorDict:
        """Fill the preallocated batch buffer with ``steps_per_batch`` steps of every lane.

        ``stop`` is polled after every step; once it returns True the remaining
        steps become padding (``collector/mask`` False, ``traj_ids`` -1, zeros)
        and the envs keep their state for the next batch.
        """
        if self.reset_at_each_iter and self._batches > 0:
            self.reset()
        self._batches += 1
        threads = intra_op_threads(1) if self._serial else nullcontext()
        with interaction(self.exploration_type), threads:
            if self._device_buffers is not None:
                self._buffer = self._device_fill(stop)
                return self._buffer
            turn = (self._batches - 1) % len(self._buffers)
            self._buffer, self._views = self._buffers[turn], self._all_views[turn]
            return self._fill(stop)

    def _fill(self, stop: Callable[[], bool] | None) -> TensorDict:
        v = self._views
        mask = v[fmt.MASK_KEY]
        bv = batch_views(v, self._obs_keys, self._policy_keys, self._act_keys)
        obs_views, policy_views = bv.obs, bv.policy
        act_idx, extra_views, traj = bv.act_idx, bv.extras, bv.traj
        n_done = bv.done[..., 0]  # [steps, lanes] view of [steps, lanes, 1]: a row is an index
        out_views = [dst for _, dst in policy_views]
        step_views = [v[k] for k in self._step_keys]
        limit, act, env = self.max_frames_per_traj, self._act, self.env
        if limit > 0:
            count, next_count = v[(fmt.STEP_COUNT,)][..., 0], v[(fmt.NEXT, fmt.STEP_COUNT)][..., 0]
        drawn, rows = stop is None and self._draw_batch(out_views), self._rows(bv)
        for t in range(self.steps_per_batch):
            for dst, src in zip(obs_views, self._obs, strict=True):
                dst[t] = src
            traj[t] = self._traj_ids
            if drawn:  # the random policy's actions, drawn for the whole batch
                actions = [out_views[i][t] for i in act_idx]
            elif self._env_frames < self.init_random_frames:
                actions = [a.cpu().numpy() for a in self._random_policy.sample(self.num_envs)]
                for i, src in zip(act_idx, actions, strict=True):
                    out_views[i][t] = src
                for dst in extra_views:
                    dst[t] = 0
            else:
                if act is not None:
                    outputs = self._host_outputs([act(self._policy_tensor(self._obs))])
                else:
                    outputs = self._policy_outputs(self.policy(self._policy_input(self._obs)))
                for dst, src in zip(out_views, outputs, strict=True):
                    dst[t] = src
                actions = [outputs[i] for i in act_idx]
            self._env_frames += self.num_envs
            row = rows[t]
            try:  # env_errors, without a context manager per step
                step = env.step_into(actions, row)
            except RlcollectError:
                raise
            except Exception as exc:
                raise env_error(env.env_id, exc) from exc
            for dst, src in zip(step_views, step.recorded(), strict=True):
                dst[t] = src
            terminated, truncated = row.terminated, row.truncated
            if limit > 0:
                count[t] = self._step_count
                self._step_count += 1
                hit = (self._step_count >= limit) & ~(terminated | truncated)
                truncated |= hit
                next_count[t] = self._step_count
            done = np.logical_or(terminated, truncated, out=n_done[t])
            self._obs = step.obs
            if np.count_nonzero(done):  # 4x faster than done.any() on a few lanes
                ended = done.nonzero()[0]
                if limit > 0:
                    self._step_count[ended] = 0
                    if hit.any():
                        self._truncate(np.flatnonzero(hit))
                if self.reset_when_done:
                    self._new_trajectories(ended)
            if stop is not None and t + 1 < self.steps_per_batch and stop():
                self._pad(t + 1)
                break
        else:
            if not mask.all():
                mask[:] = True
        # the next batch starts from these; a consumer may change the yielded buffer
        self._obs = [np.array(a) for a in self._obs]
        return self._buffer

    def _draw_batch(self, out_views: list[np.ndarray]) -> bool:
        """Draw the whole batch's actions at once where the policy is the random
        policy and this gives the values a draw per step would (one leaf, CPU, no
        normal samples, no random warm-up frames in the batch, and no ``stop``: a
        batch cut short draws no more than its steps): one torch call a batch."""
        policy = self.policy
        if type(policy) is not RandomPolicy or self._env_frames < self.init_random_frames:
            return False
        if not policy.draws_in_sequence:
            return False
        steps, n = self.steps_per_batch, self.num_envs
        for i, value in zip(self._act_idx, policy.sample(steps * n), strict=True):
            out_views[i][...] = value.reshape(out_views[i].shape).numpy()
        return True

    def _rows(self, bv) -> list[StepResult]:
        """Each step's row of the batch buffer, as the env writes its results into it
        (made once per buffer)."""
        rows = self._row_cache.get(id(self._buffer))
        if rows is None:
            reward, term, trunc = bv.reward[..., 0], bv.terminated[..., 0], bv.truncated[..., 0]
            rows = self._row_cache[id(self._buffer)] = [
                StepResult([], [v[t] for v in bv.next_obs], reward[t], term[t], trunc[t])
                for t in range(self.steps_per_batch)
            ]
        return rows

    def _truncate(self, lanes: np.ndarray) -> None:
        """Reset the lanes that reached ``max_frames_per_traj`` (the env did not)."""
        seeds = derive_seeds(self.seed, len(lanes), 4, self._resets)
        self._resets += 1
        self._obs = self.env.reset_lanes(lanes, seeds)

    def _pad(self, start: int) -> None:
        pad_steps(self._views, start)

    def _new_trajectories(self, lanes: np.ndarray) -> None:
        if len(lanes) == 1:  # the usual case, without the array arithmetic
            self._traj_ids[lanes[0]] = self._next_id
        else:
            self._traj_ids[lanes] = self._next_id + self._stride * np.arange(
                len(lanes), dtype=np.int64
            )
        self._next_id += self._stride * len(lanes)

    # -- lifecycle ---------------------------------------------------------------------
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Reseed and reset every env (env i gets its own derived seed); fresh traj ids."""
        self.seed = int(seed)
        self._obs = self.env.reset(derive_seeds(seed, self.num_envs, 0))
        self._step_count = np.zeros(self.num_envs, np.int64)
        if isinstance(self.policy, RandomPolicy):
            self.policy.generator.manual_seed(derive_seeds(seed, 1, 1)[0])
        self._restart_traj_ids()
        return self.seed if static_seed else self.seed + self.num_envs

    def _restart_traj_ids(self) -> None:
        self._traj_ids = self._traj_start + self._stride * np.arange(self.num_envs, dtype=np.int64)
        self._next_id = self._traj_start + self._stride * self.num_envs

    def reset(self) -> None:
        """Reset every env to a new initial state; running trajectories are abandoned."""
        self._full_resets += 1
        self._obs = self.env.reset(derive_seeds(self.seed, self.num_envs, 0, self._full_resets))
        self._step_count = np.zeros(self.num_envs, np.int64)
        self._new_trajectories(np.arange(self.num_envs))

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"frames": self._frames, "next_traj_id": self._next_id}
        if isinstance(self.policy, nn.Module):
            state["policy_state_dict"] = {
                k: v.detach().clone() for k, v in self.policy.state_dict().items()
            }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._frames = int(state_dict.get("frames", self._frames))
        self._next_id = int(state_dict.get("next_traj_id", self._next_id))
        if "policy_state_dict" in state_dict and isinstance(self.policy, nn.Module):
            self.policy.load_state_dict(state_dict["policy_state_dict"])

    def update_policy_weights_(self, weights: dict[str, Any] | None = None) -> None:
        """Load new weights into the policy (a no-op without weights: it is local)."""
        if weights is not None and isinstance(self.policy, nn.Module):
            if isinstance(weights, TensorDictBase):
                weights = weights.flatten_keys(".").to_dict()
            self.policy.load_state_dict(dict(weights))

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.env.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(env={self.env.env_id}, lanes={self.num_envs}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames})"
        )
