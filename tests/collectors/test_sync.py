"""SyncCollector semantics: shapes, frame accounting, traj_ids, seeding, lifecycle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

from collect_cli.collectors import SyncCollector
from collect_cli.envs import env_factory
from collect_cli.errors import CollectionError, PolicyError


def collect(env_id="CartPole-v1", lanes=4, **kw):
    kw.setdefault("frames_per_batch", 100)
    kw.setdefault("total_frames", 400)
    with SyncCollector(env_factory(env_id, lanes), **kw) as c:
        return list(c)


def test_batch_shape_and_frame_accounting():
    batches = collect(lanes=3, frames_per_batch=100, total_frames=250)
    # 3 lanes * ceil(100/3)=34 steps -> 102 frames per batch; 3 batches reach >= 250
    assert len(batches) == 3
    assert all(b.batch_size == (3, 34) for b in batches)
    assert batches[0]["next", "reward"].shape == (3, 34, 1)
    assert batches[0]["collector", "mask"].all()


def test_traj_ids_new_at_every_reset_and_unique():
    batches = collect(lanes=4, frames_per_batch=200, total_frames=2000)
    traj = torch.cat([b["collector", "traj_ids"] for b in batches], 1).numpy()
    done = torch.cat([b["next", "done"] for b in batches], 1).numpy()[..., 0]
    np.testing.assert_array_equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])
    # an id never appears in two lanes
    for i in np.unique(traj):
        assert len(np.unique(np.nonzero(traj == i)[0])) == 1
    assert traj[:, 0].tolist() == [0, 1, 2, 3]


def test_traj_id_start_and_stride_interleave():
    batches = collect(lanes=2, total_frames=600, traj_id_start=1, traj_id_stride=3)
    ids = np.unique(torch.cat([b["collector", "traj_ids"] for b in batches], 1).numpy())
    assert (ids % 3 == 1).all() and len(ids) > 2


def test_seed_reproducible_and_distinct():
    a = collect(seed=5)
    b = collect(seed=5)
    c = collect(seed=6)
    for x, y in zip(a, b, strict=True):
        assert (x == y).all()
    assert not (a[0]["observation"] == c[0]["observation"]).all()
    # lanes get distinct env seeds
    first = a[0]["observation"][:, 0]
    assert len({tuple(row.tolist()) for row in first}) == 4


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_random_actions_drawn_per_batch_equal_those_drawn_per_step(env_id):
    """The random policy draws a whole batch's actions at once; a policy that is
    not the RandomPolicy class itself is called every step. Same generator, same seed:
    the same dataset."""
    from collect_cli.collectors import derive_seeds
    from collect_cli.policies.nets import RandomPolicy

    per_batch = collect(env_id, seed=5)
    space = env_factory(env_id, 1)().action_space
    drawn = RandomPolicy(space, "cpu", derive_seeds(5, 1, 1)[0])
    per_step = collect(env_id, seed=5, policy=lambda td: drawn(td))
    for x, y in zip(per_batch, per_step, strict=True):
        assert (x == y).all()
    assert not (per_batch[0]["action"] == per_batch[1]["action"]).all()


def test_batches_are_independent_copies_unless_same_td():
    a, b = collect(total_frames=200)
    assert a["observation"].data_ptr() != b["observation"].data_ptr()
    with SyncCollector(
        env_factory("CartPole-v1", 2), frames_per_batch=10, total_frames=20, return_same_td=True
    ) as c:
        x, y = list(c)
    assert x["observation"].data_ptr() == y["observation"].data_ptr()


def test_copies_are_contiguous_lane_major():
    (batch,) = collect(lanes=3, frames_per_batch=30, total_frames=30)
    for key, value in batch.items(True, True):
        assert value.is_contiguous(), key
        assert value.shape[:2] == (3, 10), key


@pytest.mark.parametrize("lanes", [1, 3])
def test_batch_buffers_rotate_and_keep_each_batch_until_reused(lanes):
    """With two buffers, batch k is intact while k+1 is collected; k+2 reuses k's storage."""
    reference = collect(lanes=lanes, frames_per_batch=30, total_frames=150, seed=3)
    with SyncCollector(
        env_factory("CartPole-v1", lanes),
        frames_per_batch=30,
        total_frames=150,
        seed=3,
        return_same_td=True,
        batch_buffers=2,
    ) as c:
        it = iter(c)
        previous = next(it)
        assert (previous == reference[0]).all()
        snapshot = previous.clone()
        ptrs = [previous["observation"].data_ptr()]
        for k in range(1, len(reference)):
            batch = next(it)
            assert (previous == snapshot).all(), f"batch {k - 1} changed while {k} was collected"
            assert (batch == reference[k]).all()
            ptrs.append(batch["observation"].data_ptr())
            previous, snapshot = batch, batch.clone()
    assert ptrs[0] == ptrs[2] == ptrs[4] and ptrs[1] == ptrs[3] and ptrs[0] != ptrs[1]


def test_adopted_buffers_are_filled_in_turn_and_must_match():
    """A worker fills its lanes of buffers the main process shares (``adopt``)."""
    reference = collect(lanes=2, frames_per_batch=20, total_frames=60, seed=4)
    with SyncCollector(
        env_factory("CartPole-v1", 2), frames_per_batch=20, seed=4, return_same_td=True
    ) as c:
        mine = c._buffers[0].transpose(0, 1)  # time-major, [steps, lanes]
        wide = [torch.cat([mine, mine], 1).zero_() for _ in range(2)]  # 4 lanes
        with pytest.raises(ValueError, match="must match"):
            c.adopt([w[:, :3] for w in wide])
        c.adopt([w[:, 2:] for w in wide])
        for k in range(3):
            batch = c.rollout()
            assert (batch == reference[k]).all()
            assert (wide[k % 2][:, 2:].transpose(0, 1) == reference[k]).all()
            assert not wide[k % 2][:, :2].any()  # the other lanes are not touched


def test_iterable_dataset_next_and_endless():
    c = SyncCollector(env_factory("Pendulum-v1", 2), frames_per_batch=20, total_frames=-1)
    assert isinstance(c, IterableDataset)
    for _ in range(5):
        assert c.next().batch_size == (2, 10)
    c.shutdown()
    c.shutdown()  # idempotent


def test_state_dict_and_weights_roundtrip():
    from collect_cli.policies.nets import MlpPolicy

    env = env_factory("Pendulum-v1", 2)()
    policy = MlpPolicy(env.observation_space, env.action_space, [8])
    c = SyncCollector(lambda: env, policy, frames_per_batch=10, total_frames=20)
    state = c.state_dict()
    assert set(state) >= {"frames", "next_traj_id", "policy_state_dict"}
    new = {k: torch.zeros_like(v) for k, v in policy.state_dict().items()}
    c.update_policy_weights_(new)
    batch = c.next()
    assert torch.allclose(batch["action"], torch.zeros(()))  # zero net -> tanh(0) -> mid-range 0
    c.load_state_dict(state)
    assert not torch.allclose(policy.net[0].weight, torch.zeros(()))
    c.shutdown()


def test_reset_starts_new_trajectories():
    c = SyncCollector(env_factory("Pendulum-v1", 2), frames_per_batch=10, total_frames=-1)
    first = c.next()["collector", "traj_ids"][:, -1]
    c.reset()
    after = c.next()["collector", "traj_ids"][:, 0]
    assert set(after.tolist()).isdisjoint(first.tolist())
    c.shutdown()


def test_policy_output_is_checked_before_collecting():
    def bad_policy(td):
        return td.set("action", torch.zeros(td.batch_size[0], 5))

    with pytest.raises(PolicyError, match=r"expected \(2, 1\)"):
        SyncCollector(env_factory("Pendulum-v1", 2), bad_policy, frames_per_batch=10)

    with pytest.raises(PolicyError, match="did not set 'action'"):
        SyncCollector(env_factory("Pendulum-v1", 2), lambda td: td, frames_per_batch=10)


def test_policy_extras_are_recorded():
    def policy(td):
        n = td.batch_size[0]
        td.set("action", torch.full((n, 1), 0.5))
        td.set("sample_log_prob", torch.full((n,), -1.25))
        return td

    (batch,) = collect("Pendulum-v1", 2, policy=policy, frames_per_batch=10, total_frames=10)
    assert (batch["sample_log_prob"] == -1.25).all()
    assert (batch["action"] == 0.5).all()


def test_env_exception_becomes_collection_error():
    from collect_cli.envs.base import VecEnv

    class Exploding(VecEnv):
        def __init__(self):
            inner = env_factory("CartPole-v1", 2)()
            self.__dict__.update(inner.__dict__)
            self._inner = inner
            self.steps = 0

        def reset(self, seeds):
            return self._inner.reset(seeds)

        def reset_lanes(self, lanes, seeds):
            return self._inner.reset_lanes(lanes, seeds)

        def step(self, actions):
            self.steps += 1
            if self.steps == 7:
                raise ValueError("boom at step 7")
            return self._inner.step(actions)

        def close(self):
            self._inner.close()

    c = SyncCollector(Exploding, frames_per_batch=4, total_frames=100)
    with pytest.raises(CollectionError, match="raised ValueError: boom at step 7"):
        list(c)
    c.shutdown()
