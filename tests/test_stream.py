"""The write-behind pipeline: batches written on a background thread, in order,
never overwritten before they are on disk, errors raised where the run loop sees them."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from collect_cli import config
from collect_cli.collectors import SyncCollector
from collect_cli.envs import env_factory
from collect_cli.stream import Stream, WriteBehind
from collect_cli.threads import SERIAL_ELEMENTS
from collect_cli.writers import make_writer, open_dataset
from tests.conftest import out_path
from tests.helpers import assert_consistent

FRAMES, PER_BATCH = 600, 60


def settings(backend: str, out) -> config.Settings:
    return config.load(config.compose([f"writer={backend}", f"out={out}", "env=CartPole"]))


def collector(**kw) -> SyncCollector:
    return SyncCollector(
        env_factory("CartPole-v1", 3),
        frames_per_batch=PER_BATCH,
        total_frames=FRAMES,
        seed=11,
        **kw,
    )


def new_writer(backend: str, path):
    meta = {"env_id": "CartPole-v1", "config": "env: CartPole"}
    return make_writer(backend, path, metadata=meta, overwrite=True, lanes=3).open()


def read_all(path) -> dict[str, np.ndarray]:
    ds = open_dataset(path)
    return {key: ds.array(key) for key, _, _ in ds.describe()}


@pytest.mark.parametrize("background", [True, False])
def test_write_behind_writes_what_direct_writing_writes(tmp_path, backend, background):
    """Collector ahead of a slow writer: with two buffers in turn, every batch reaches
    the disk exactly as collected (a buffer reused too early would show here).
    ``background=False`` writes in the calling thread, through the same calls."""
    direct, behind = out_path(tmp_path, backend, "direct"), out_path(tmp_path, backend, "behind")
    writer = new_writer(backend, direct)
    stream = Stream(settings(backend, direct), writer)
    with collector() as c:
        for lane_start, batch in c.iter_with_lanes():
            stream.push(lane_start, batch)
            writer.commit()
    writer.close()

    writer = new_writer(backend, behind)
    in_flight, peak, lock = [0], [0], threading.Lock()

    def committed(returns):
        time.sleep(0.02)  # a slow disk: the collector waits in reserve()
        with lock:
            in_flight[0] -= 1

    stream = Stream(settings(backend, behind), writer)
    pipe = WriteBehind(stream, committed, depth=2, background=background)
    with collector(return_same_td=True, batch_buffers=2) as c:
        batches = c.iter_with_lanes()
        while True:
            pipe.reserve()
            item = next(batches, None)
            if item is None:
                pipe.unreserve()
                break
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            pipe.submit(*item)
        pipe.finish()
    writer.close()

    assert peak[0] == (2 if background else 1)  # ahead of the writer by one buffer at most
    assert_consistent(behind)
    a, b = read_all(direct), read_all(behind)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert open_dataset(behind).meta["frames"] == FRAMES


@pytest.mark.parametrize("background", [True, False])
def test_writer_error_reaches_the_collecting_thread(tmp_path, background):
    """A failure on the writer thread stops it; the run loop gets the exception from
    reserve()/submit()/finish(), and what was committed before stays readable."""
    path = tmp_path / "ds.h5"
    writer = new_writer("hdf5", path)
    stream = Stream(settings("hdf5", path), writer)
    pipe = WriteBehind(stream, lambda returns: None, depth=2, background=background)
    with collector(return_same_td=True, batch_buffers=2) as c:
        pipe.reserve()
        pipe.submit(*next(c.iter_with_lanes()))
    other = SyncCollector(env_factory("Pendulum-v1", 3), frames_per_batch=PER_BATCH, seed=1)
    with other:  # 3 numbers per observation where the dataset holds 4: the write fails
        pipe.reserve()
        with pytest.raises(TypeError) as first:
            pipe.submit(*next(other.iter_with_lanes()))  # inline: fails here
            pipe.reserve()  # in the background: fails in one of these
            pipe.reserve()
        with pytest.raises(TypeError) as again:
            pipe.submit(*next(other.iter_with_lanes()))
        assert again.value is first.value
        with pytest.raises(TypeError):
            pipe.finish()
    writer.close("interrupted")
    meta = assert_consistent(path)
    assert (meta["frames"], meta["status"]) == (PER_BATCH, "interrupted")  # the first batch


@pytest.mark.parametrize(
    ("env", "lanes", "policy", "threads"),
    [
        # a small policy that sees fewer than SERIAL_ELEMENTS numbers a step: one thread
        (["env=Pendulum"], 4, "threads_seen", 1),
        (["env=Pendulum", "env.backend=native"], 4, "threads_seen", 1),
        # larger steps keep torch's threads, less one for the writer beside a torch env
        (["env=Acrobot", "env.backend=native"], SERIAL_ELEMENTS // 6 + 8, "threads_seen", 2),
        (["env=gym", "env.id=pixelenvs:Pixels-v0"], 4, "threads_seen", 3),  # 4 x 64 x 64 x 3
        # so does a policy with SERIAL_MACS weights or more a step, on small observations
        (["env=Pendulum"], 4, "WideThreadsSeen", 3),
    ],
)
def test_the_threads_torch_collects_with(tmp_path, env, lanes, policy, threads):
    import toypolicies

    from collect_cli.run import run

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    toypolicies.THREADS_SEEN.clear()
    try:
        result = run(
            config.load(
                config.compose(
                    [
                        *env,
                        f"env.num_envs={lanes}",
                        "policy=python",
                        f"policy.target=toypolicies:{policy}",
                        f"frames_per_batch={lanes * 10}",
                        f"total_frames={lanes * 30}",
                        "progress=none",
                        f"out={tmp_path / 'ds.h5'}",
                    ]
                )
            )
        )
        assert torch.get_num_threads() == 3  # restored
    finally:
        torch.set_num_threads(before)
    assert result.frames == lanes * 30
    # the first call is the collector's dry run, before the run loop
    assert set(toypolicies.THREADS_SEEN[1:]) == {threads}
