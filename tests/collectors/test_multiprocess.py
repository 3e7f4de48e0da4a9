"""Multi-process collectors with real gymnasium envs and real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from collect_cli.collectors import AsyncCollector, MultiAsyncCollector, MultiSyncCollector
from collect_cli.envs import env_factory
from collect_cli.errors import CollectionError, UsageError
from tests.helpers import CAN_PIN, descendants, on_two_cpus


def gather(collector):
    with collector:
        return [(lane, batch) for lane, batch in collector.iter_with_lanes()]


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_multisync_concatenates_workers_lanes(env_id):
    c = MultiSyncCollector(
        env_factory(env_id, 3), num_workers=2, frames_per_batch=120, total_frames=1200
    )
    out = gather(c)
    assert all(lane == 0 for lane, _ in out)
    # each worker: ceil(120 / 2) = 60 frames over 3 lanes = 20 steps -> batches of [6, 20]
    assert [b.batch_size for _, b in out] == [torch.Size([6, 20])] * 10
    traj = torch.cat([b["collector", "traj_ids"] for _, b in out], 1).numpy()
    done = torch.cat([b["next", "done"] for _, b in out], 1).numpy()[..., 0]
    np.testing.assert_array_equal(traj[:, 1:] != traj[:, :-1], done[:, :-1])
    # worker w numbers its trajectories w, w + 2, ...: lanes 0-2 even, 3-5 odd
    assert (traj[:3] % 2 == 0).all() and (traj[3:] % 2 == 1).all()
    assert not descendants(os.getpid())


def test_multisync_reproducible_from_seed():
    def run(seed):
        c = MultiSyncCollector(
            env_factory("Pendulum-v1", 2),
            num_workers=2,
            frames_per_batch=80,
            total_frames=320,
            seed=seed,
        )
        return torch.cat([b for _, b in gather(c)], 1)

    a, b, c = run(7), run(7), run(8)
    assert (a == b).all()
    assert not torch.equal(a["observation"], c["observation"])
    # the two workers' lanes differ from each other
    assert not torch.equal(a["observation"][:2], a["observation"][2:])


def test_multiasync_yields_each_workers_lanes():
    c = MultiAsyncCollector(
        env_factory("CartPole-v1", 2), num_workers=2, frames_per_batch=40, total_frames=800
    )
    out = gather(c)
    assert {lane for lane, _ in out} == {0, 2}
    assert all(b.batch_size == (2, 20) for _, b in out)
    assert sum(b.numel() for _, b in out) == 800
    for lane, batch in out:
        ids = batch["collector", "traj_ids"]
        assert (ids % 2 == lane // 2).all()


def test_async_single_background_worker():
    c = AsyncCollector(env_factory("Pendulum-v1", 2), frames_per_batch=20, total_frames=100)
    out = gather(c)
    assert len(out) == 5 and all(lane == 0 for lane, _ in out)


def test_preemption_pads_slow_worker():
    fast = env_factory("toyenvs:Slow-v0", 1, kwargs={"delay": 0.0})
    slow = env_factory("toyenvs:Slow-v0", 1, kwargs={"delay": 0.02})
    c = MultiSyncCollector(
        [fast, slow], frames_per_batch=100, total_frames=300, preemptive_threshold=0.5
    )
    out = [b for _, b in gather(c)]
    mask = torch.cat([b["collector", "mask"] for b in out], 1)
    traj = torch.cat([b["collector", "traj_ids"] for b in out], 1)
    assert mask[0].all()  # the fast worker is never cut
    assert not mask[1].all()  # the slow one was preempted
    assert (traj[~mask] == -1).all() and (traj[mask] >= 0).all()
    # valid frames, padding excluded, reach total_frames
    assert int(mask.sum()) >= 300


def test_worker_exception_names_worker_and_cause():
    bad = env_factory("toyenvs:Faulty-v0", 2, kwargs={"fail_at": 30})
    c = MultiSyncCollector(bad, num_workers=2, frames_per_batch=40, total_frames=1000)
    start = time.monotonic()
    with pytest.raises(CollectionError, match=r"worker \d \(pid \d+\) failed: CollectionError"):
        gather(c)
    assert time.monotonic() - start < 10
    assert not descendants(os.getpid())


def test_worker_usage_error_stays_usage_error():
    with pytest.raises(UsageError, match="unknown env id"):
        MultiSyncCollector(env_factory("Nope-v9", 1), num_workers=2, frames_per_batch=10)
    assert not descendants(os.getpid())


def test_killed_worker_is_noticed_fast():
    c = MultiAsyncCollector(
        env_factory("Pendulum-v1", 2), num_workers=2, frames_per_batch=20, total_frames=-1
    )
    it = c.iter_with_lanes()
    next(it)
    victim = c._procs[1].pid
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(CollectionError, match=rf"worker 1 \(pid {victim}\) was killed by SIGKILL"):
        for _ in it:
            pass
    assert time.monotonic() - start < 10
    c.shutdown()
    assert not descendants(os.getpid())


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_worker_killed_after_its_batches_are_sent_is_named(cls):
    # The worker finishes the batches queued for it (their messages wait unread in
    # its pipe), then dies: the next request to it meets a broken pipe, and the
    # error must still be the worker's death, not that BrokenPipeError.
    c = cls(
        env_factory("CartPole-v1", 2),
        num_workers=2,
        frames_per_batch=8,
        total_frames=-1,
        prefetch=2,
    )
    it = c.iter_with_lanes()
    next(it)
    victim = c._procs[1].pid
    deadline = time.monotonic() + 10
    while c._conns[1].poll() is False and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # its second queued batch (a few ms of work) is sent too
    os.kill(victim, signal.SIGKILL)
    c._procs[1].join(10)
    with pytest.raises(CollectionError, match=rf"worker 1 \(pid {victim}\) was killed by SIGKILL"):
        for _ in range(10):
            next(it)
    c.shutdown()
    assert not descendants(os.getpid())


LEFT_RUNNING = """
from collect_cli.collectors import {cls}
from collect_cli.envs import env_factory
c = {cls}(env_factory("CartPole-v1", 2), num_workers=2, frames_per_batch=40, total_frames=-1)
it = c.iter_with_lanes()
next(it)
print(c._procs[0].pid, c._procs[1].pid, flush=True)
{end}
"""


@pytest.mark.parametrize("cls", ["MultiSyncCollector", "MultiAsyncCollector"])
@pytest.mark.parametrize("end", ["pass", "raise RuntimeError('script failed')"])
def test_script_that_never_shuts_down_still_exits(cls, end):
    # The workers ignore SIGTERM (signals are the main process's to handle), so
    # multiprocessing's exit hook alone, which terminates and joins them, would
    # wait for ever: a script must still end when it forgets shutdown().
    code = LEFT_RUNNING.format(cls=cls, end=end)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail("the script did not exit")
    assert proc.returncode == (0 if end == "pass" else 1), err
    if end != "pass":
        assert "RuntimeError: script failed" in err
    for pid in map(int, out.split()):
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived its script"


def test_api_parity_weights_seed_state_reset():
    from collect_cli.policies.nets import MlpPolicy

    env = env_factory("Pendulum-v1", 2)
    probe = env()
    policy = MlpPolicy(probe.observation_space, probe.action_space, [8])
    probe.close()
    c = MultiSyncCollector(env, policy, num_workers=2, frames_per_batch=40, total_frames=-1)
    first = c.next()
    assert not torch.allclose(first["action"], torch.zeros(()))
    c.update_policy_weights_({k: torch.zeros_like(v) for k, v in policy.state_dict().items()})
    c.next()  # collected while the update was queued
    assert torch.allclose(c.next()["action"], torch.zeros(()))
    state = c.state_dict()
    assert set(state) == {"worker0", "worker1"}
    assert "policy_state_dict" in state["worker0"]
    assert c.set_seed(3) == 3 + c.lanes
    c.reset()
    assert c.next().batch_size == (4, 10)
    c.shutdown()
    c.shutdown()
    assert not descendants(os.getpid())


@pytest.mark.parametrize("prefetch", [2, 3])
def test_prefetch_yields_the_same_batches(prefetch):
    def run(ahead):
        c = MultiSyncCollector(
            env_factory("CartPole-v1", 2),
            num_workers=2,
            frames_per_batch=40,
            total_frames=400,
            seed=5,
            prefetch=ahead,
        )
        return [b for _, b in gather(c)]

    one, ahead = run(1), run(prefetch)
    assert len(one) == len(ahead) == 10  # no extra batch past total_frames
    assert (torch.cat(one, 1) == torch.cat(ahead, 1)).all()


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_lent_batches_stay_intact_while_held_and_equal_the_copies(cls):
    def make(hold, frames):
        return cls(
            env_factory("CartPole-v1", 2),
            num_workers=2,
            frames_per_batch=40,
            total_frames=frames,
            seed=3,
            prefetch=2,
            hold=hold,
        )

    # per lane start (a worker's, or 0): its batches in turn (MultiAsync: how many
    # each worker gives depends on timing, so the reference runs twice as long)
    copies: dict[int, list] = {}
    for lane, batch in gather(make(0, 960)):
        copies.setdefault(lane, []).append(batch)
    held: list = []  # the last `hold` batches, as lent: not copied
    storage: dict[int, list[int]] = {}  # per lane start: each batch's buffer
    frames = 0
    with make(2, 480) as lent:
        for lane, batch in lent.iter_with_lanes():
            storage.setdefault(lane, []).append(batch["observation"].data_ptr())
            held = [*held[-1:], (copies[lane][len(storage[lane]) - 1], batch)]
            for copy, old in held:  # the one before is still as it was yielded
                assert (old == copy).all()
            frames += batch.numel()
    assert frames == 480
    # a buffer comes back only prefetch + hold = 4 batches (of its worker) later
    for ptrs in storage.values():
        assert len(set(ptrs[:4])) == min(4, len(ptrs)) and ptrs[4:] == ptrs[: max(0, len(ptrs) - 4)]
    if cls is MultiSyncCollector:  # lent straight from the shared buffers: no copy
        assert not batch["observation"].is_contiguous()


def test_hold_must_not_be_negative():
    with pytest.raises(ValueError, match="hold must be >= 0"):
        MultiSyncCollector(
            env_factory("CartPole-v1", 1), num_workers=2, frames_per_batch=10, hold=-1
        )


def test_multiasync_prefetch_counts_frames_exactly():
    c = MultiAsyncCollector(
        env_factory("CartPole-v1", 2),
        num_workers=2,
        frames_per_batch=40,
        total_frames=800,
        prefetch=2,
    )
    out = gather(c)
    assert sum(b.numel() for _, b in out) == 800
    for lane in (0, 2):  # each worker's batches continue its own trajectories
        traj = torch.cat([b["collector", "traj_ids"] for start, b in out if start == lane], 1)
        done = torch.cat([b["next", "done"] for start, b in out if start == lane], 1)[..., 0]
        assert ((traj[:, 1:] != traj[:, :-1]) == done[:, :-1]).all()


def test_prefetch_reaches_weights_after_the_queued_batches():
    from collect_cli.policies.nets import MlpPolicy

    env = env_factory("Pendulum-v1", 2)
    probe = env()
    policy = MlpPolicy(probe.observation_space, probe.action_space, [8])
    probe.close()
    c = MultiSyncCollector(
        env, policy, num_workers=2, frames_per_batch=40, total_frames=-1, prefetch=2
    )
    c.next()
    c.update_policy_weights_({k: torch.zeros_like(v) for k, v in policy.state_dict().items()})
    queued = [c.next(), c.next()]  # asked for before the update
    assert all(not torch.allclose(b["action"], torch.zeros(())) for b in queued)
    assert torch.allclose(c.next()["action"], torch.zeros(()))
    c.shutdown()


def test_preemption_needs_prefetch_one():
    with pytest.raises(ValueError, match="prefetch=1"):
        MultiSyncCollector(
            env_factory("CartPole-v1", 1),
            num_workers=2,
            frames_per_batch=10,
            preemptive_threshold=0.5,
            prefetch=2,
        )
    assert not descendants(os.getpid())


@pytest.mark.skipif(not CAN_PIN, reason="needs Linux's CPU affinity and two CPUs")
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_multisync_places_a_helper_thread_only_where_each_cpu_has_one_worker(workers):
    stop = threading.Event()
    with on_two_cpus() as two:
        helper = threading.Thread(target=stop.wait)
        helper.start()
        try:
            c = MultiSyncCollector(
                env_factory("CartPole-v1", 2),
                num_workers=workers,
                frames_per_batch=40,
                total_frames=800,
            )
            with c:
                c.place_helper(helper.native_id)
                seen = [os.sched_getaffinity(helper.native_id) for _ in c]
            if workers == 2:  # on one CPU at a time, a worker's
                assert all(len(cpus) == 1 and cpus <= set(two) for cpus in seen)
            else:  # a CPU to spare, or CPUs shared by the workers already: left to the OS
                assert all(cpus == set(two) for cpus in seen)
            assert os.sched_getaffinity(helper.native_id) == set(two)  # given back
        finally:
            stop.set()
            helper.join()
