"""The writing half of a run (inline, on a thread, in a process): batches written in
order, never overwritten before they are on disk, errors raised where the run loop
sees them; and the threads torch collects with."""

from __future__ import annotations

import os
import threading
import time

import h5py
import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

from collect_cli import config, stream, writer_process
from collect_cli.collectors import SyncCollector
from collect_cli.dataset import open_dataset
from collect_cli.envs import env_factory
from collect_cli.stream import Joiner, Stream, WriteBehind, WriterSpec, joins, pump
from collect_cli.threads import SERIAL_ELEMENTS
from tests.helpers import CAN_PIN, assert_consistent, on_two_cpus
from tests.support.cli_runner import out_path

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


def read_all(path) -> dict[str, np.ndarray]:
    ds = open_dataset(path)
    return {key: ds.array(key) for key, _, _ in ds.describe()}


SINKS = ["inline", "thread", "process"]


def make_sink(kind: str, backend: str, path):
    """One of the three implementations of the writing half's contract."""
    s = settings(backend, path)
    if kind == "process":
        if not writer_process.available():
            pytest.skip("a writer process needs Linux and two cores")
        return writer_process.WriterProcess(s, depth=2)
    return WriteBehind(s, depth=2, background=kind == "thread")


def spec(backend: str, path, **options) -> WriterSpec:
    meta = {"env_id": "CartPole-v1", "config": "env: CartPole"}
    return WriterSpec(backend, path, {"metadata": meta, "overwrite": True, "lanes": 3, **options})


def drive(sink, c, on_commit=lambda returns: None) -> None:
    """The run loop of run.py, over collector ``c``."""
    sink.start(c, on_commit)
    pump(sink, c.iter_with_lanes())


@pytest.mark.parametrize("kind", SINKS)
def test_the_writing_half_writes_what_direct_writing_writes(tmp_path, backend, kind, monkeypatch):
    """Collector ahead of a slow writer: with two buffers in turn, every batch reaches
    the disk exactly as collected (a buffer reused too early would show here), and
    the commits are reported with the episodes they ended. Inline writing runs the
    same calls in the calling thread; the writer process sees the same code (it
    is forked after the patch below)."""
    direct, behind = out_path(tmp_path, backend, "direct"), out_path(tmp_path, backend, "behind")
    writer = spec(backend, direct).open()
    stream = Stream(settings(backend, direct), writer)
    with collector() as c:
        for lane_start, batch in c.iter_with_lanes():
            stream.push(lane_start, batch)
            writer.commit()
    writer.close()

    push = Stream.push

    def slow_push(self, lane_start, batch):  # a slow disk: the collector waits in reserve()
        time.sleep(0.02)
        return push(self, lane_start, batch)

    monkeypatch.setattr(Stream, "push", slow_push)
    sink = make_sink(kind, backend, behind)
    sink.open(spec(backend, behind))
    submitted, committed, peak, returns = [0], [0], [0], []

    def on_commit(ended):
        committed[0] += 1
        returns.extend(ended)

    submit = sink.submit

    def counted(*item):
        submitted[0] += 1
        peak[0] = max(peak[0], submitted[0] - committed[0])
        submit(*item)

    sink.submit = counted
    with collector(return_same_td=True, batch_buffers=2) as c:
        drive(sink, c, on_commit)
        assert sink.flush() == []
        sink.close("complete")
    assert committed[0] == submitted[0] == FRAMES // PER_BATCH
    assert peak[0] == (1 if kind == "inline" else 2)  # ahead of the writer by one buffer at most
    meta = assert_consistent(behind)
    assert (sink.frames, sink.episodes) == (meta["frames"], meta["episodes"])
    # the commits reported the episodes they ended; closing adds the ones it cut
    assert len(returns) == open_dataset(behind).episodes()["complete"].sum() > 0
    a, b = read_all(direct), read_all(behind)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert meta["frames"] == FRAMES


@pytest.mark.parametrize("kind", SINKS)
def test_the_writing_half_commits_when_due_and_finish_commits_the_rest(tmp_path, backend, kind):
    """With a commit interval longer than the run, the first batch is committed at
    once and :meth:`finish` commits the other nine; both commits are reported, with
    every episode they made durable."""
    path = out_path(tmp_path, backend)
    sink = make_sink(kind, backend, path)
    sink.open(spec(backend, path, commit_interval=3600))
    commits: list[list[float]] = []
    with collector(return_same_td=True, batch_buffers=2) as c:
        drive(sink, c, commits.append)
        assert assert_consistent(path)["frames"] == FRAMES  # finished: all committed
        sink.close("complete")
    assert len(commits) == 2
    meta = assert_consistent(path)
    assert meta["frames"] == sink.frames == FRAMES
    ended = open_dataset(path).episodes()
    assert commits[0] + commits[1] == ended["return"][ended["complete"]].tolist()


@pytest.mark.parametrize("kind", SINKS)
def test_small_batches_are_joined_and_written_as_appended_one_by_one(
    tmp_path, backend, kind, monkeypatch
):
    """With commits far apart, the nine batches after the first reach the writer as
    one [3, 540] append, and the dataset (frames, episodes, traj ids) is the one that
    appending them one by one writes."""
    direct, joined = out_path(tmp_path, backend, "direct"), out_path(tmp_path, backend, "joined")
    writer = spec(backend, direct).open()
    with collector() as c:
        for lane_start, batch in c.iter_with_lanes():
            writer.append(batch, lane_start)
            writer.commit()
    writer.close()

    appended = []
    append = type(writer).append

    def counted(self, batch, lane_start=0):
        appended.append(tuple(batch.batch_size))
        return append(self, batch, lane_start)

    monkeypatch.setattr(type(writer), "append", counted)
    sink = make_sink(kind, backend, joined)
    sink.open(spec(backend, joined, commit_interval=3600))
    with collector(return_same_td=True, batch_buffers=2) as c:
        drive(sink, c)
        sink.close("complete")
    if kind != "process":  # the process counts its own appends
        assert appended == [(3, 20), (3, 180)]
    assert assert_consistent(joined)["frames"] == FRAMES
    a, b = read_all(direct), read_all(joined)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    episodes_a, episodes_b = open_dataset(direct).episodes(), open_dataset(joined).episodes()
    for key in episodes_a:
        np.testing.assert_array_equal(episodes_a[key], episodes_b[key], err_msg=key)
    if backend == "hdf5":  # chunks sized for a full joined batch: one write a chunk
        count = stream.JOIN_FRAMES // 60
        with h5py.File(direct) as a, h5py.File(joined) as b:
            assert a["observation"].chunks[:2] == (3, 20)
            assert b["observation"].chunks[:2] == (3, 20 * count)


def small_batch(value: float, lanes: int = 2, steps: int = 3) -> TensorDict:
    obs = torch.full((lanes, steps, 4), value)
    return TensorDict({"obs": obs, ("next", "done"): obs[..., 0] > 1}, batch_size=[lanes, steps])


def test_the_joiner_copies_what_it_holds_and_stops_at_another_lane_group():
    """The collector reuses its buffers: what the joiner hands out holds each batch
    as it was added. A batch of another lane group drains it and ends joining."""
    j = Joiner()
    batch = small_batch(0.0)
    out = j.add(0, batch)
    assert out == [] and j.count == stream.JOIN_FRAMES // 6
    for value in (1.0, 2.0):
        batch["obs"].fill_(value)  # the buffer reused for the next batch
        batch["next", "done"].copy_(batch["obs"][..., 0] > 1)
        assert j.add(0, batch) == []
    lane_start, held = j.drain()
    assert lane_start == 0 and held.batch_size == (2, 9)
    assert held["obs"][:, :, 0].tolist() == [[0.0] * 3 + [1.0] * 3 + [2.0] * 3] * 2
    assert held["next", "done"].sum() == 6
    assert j.drain() is None  # it holds nothing after

    for _ in range(j.count):  # a full stage is handed out at once
        out = j.add(0, batch)
    assert [(s, b.batch_size) for s, b in out] == [(0, (2, 3 * j.count))]
    other = small_batch(5.0)
    assert j.add(0, batch) == []
    out = j.add(2, other)  # another lane group: what was held, then the batch itself
    assert [s for s, _ in out] == [0, 2] and out[0][1].batch_size == (2, 3)
    assert out[1][1] is other and j.count == 1
    assert j.add(0, batch)[0][1] is batch and j.drain() is None  # passed through from now on

    j = Joiner()
    j.add(0, batch)
    for _ in range(j.count - 2):
        j.add(0, batch)
    assert j.add(0, batch)[0][1].batch_size == (2, 3 * j.count)  # full, handed out: held 0
    assert j.add(4, other) == [(4, other)]


def test_after_a_drain_the_joiner_lines_up_with_the_writers_time_again(monkeypatch):
    """A commit drains what is held: the next joined batch stops where the writer's
    time reaches a multiple of a full one, so the later ones fill whole HDF5 chunks.
    Where the writer's time is off that grid from the start, stages are handed out full."""
    monkeypatch.setattr(stream, "JOIN_FRAMES", 24)  # 4 batches of [2, 3]
    j = Joiner()
    assert j.add(0, small_batch(0.0), at=0) == [] and (j.count, j.steps) == (4, 12)
    assert j.drain()[1].batch_size == (2, 3)  # the commit: steps 0..3 written
    assert j.add(0, small_batch(1.0), at=3) == [] and j.add(0, small_batch(2.0), at=3) == []
    [(lane_start, held)] = j.add(0, small_batch(3.0), at=3)
    assert lane_start == 0 and held.batch_size == (2, 9)  # 3 + 9: on the grid
    assert held["obs"][0, :, 0].tolist() == [1.0] * 3 + [2.0] * 3 + [3.0] * 3
    for _ in range(3):
        assert j.add(0, small_batch(4.0), at=12) == []
    assert j.add(0, small_batch(5.0), at=12)[0][1].batch_size == (2, 12)

    j = Joiner()
    for _ in range(3):
        assert j.add(0, small_batch(0.0), at=1) == []
    assert j.add(0, small_batch(0.0), at=1)[0][1].batch_size == (2, 12)


@pytest.mark.parametrize(
    ("batch", "count"),
    [
        (small_batch(0.0), stream.JOIN_FRAMES // 6),
        (small_batch(0.0, lanes=16, steps=63), stream.JOIN_FRAMES // 1008),
        (small_batch(0.0, lanes=4096, steps=1), 1),  # frames enough already
        (TensorDict({"obs": torch.zeros(2, 3, 20_000)}, batch_size=[2, 3]), 2),  # bytes
        (TensorDict({"obs": torch.zeros(6, 4)}, batch_size=[6]), 1),  # not [lanes, time]
        (
            TensorDict(
                {"obs": torch.zeros(2, 3), "text": NonTensorData("a", batch_size=[2, 3])},
                batch_size=[2, 3],
            ),
            1,
        ),
    ],
    ids=["small", "multisync", "wide", "bytes", "one-dim", "text"],
)
def test_how_many_batches_are_joined(batch, count):
    j = Joiner()
    out = j.add(0, batch)
    assert j.count == count
    assert (out == [(0, batch)]) if count == 1 else (out == [])


@pytest.mark.parametrize(
    ("overrides", "interval", "joined"),
    [
        ([], 0.1, True),
        ([], 0.0, False),  # every batch committed: nothing to join
        (["postproc=multistep"], 0.1, False),
        (["split_trajs=true"], 0.1, False),
        (["reset_at_each_iter=true"], 0.1, False),
    ],
)
def test_which_streams_join_batches(tmp_path, overrides, interval, joined):
    s = config.load(config.compose(["env=CartPole", *overrides]))
    assert joins(s) == (joined or interval == 0.0)
    writer = spec("memmap", tmp_path / "ds", commit_interval=interval).open()
    assert (Stream(s, writer).joiner is not None) == joined
    writer.close()


@pytest.mark.parametrize("kind", SINKS)
def test_a_writer_error_reaches_the_run_loop(tmp_path, kind, monkeypatch):
    """A failure while writing stops the writer; the run loop gets the same exception
    (its class and message: they make the exit code and the one-line error) from
    reserve()/submit()/finish(), and abort() keeps what was committed before, closed
    as interrupted."""
    from collect_cli.dataset.hdf5.write import Hdf5Writer
    from collect_cli.errors import WriteError

    append = Hdf5Writer.append

    def failing(self, batch, lane_start=0):
        if self.frames:  # the second batch
            raise WriteError("no space left on the device (simulated)")
        return append(self, batch, lane_start)

    monkeypatch.setattr(Hdf5Writer, "append", failing)
    path = tmp_path / "ds.h5"
    sink = make_sink(kind, "hdf5", path)
    sink.open(spec("hdf5", path))
    with collector(return_same_td=True, batch_buffers=2) as c:
        with pytest.raises(WriteError, match="no space left on the device") as failed:
            drive(sink, c)
        with pytest.raises(WriteError) as again:
            sink.reserve()
        assert str(again.value) == str(failed.value)
        sink.abort()
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


def _run_in_pool_worker(out: str) -> int:
    from collect_cli.run import run

    overrides = ["env=CartPole", "frames_per_batch=200", "total_frames=600", f"out={out}"]
    return run(config.load(config.compose(overrides))).frames


def test_a_run_in_a_daemonic_process_writes_from_a_thread(tmp_path):
    """multiprocessing's pool workers may not have children: a run there writes from
    this process (a thread, or inline) instead of a writer process."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:  # its worker is daemonic
        frames = pool.apply(_run_in_pool_worker, (str(tmp_path / "ds.h5"),))
    assert frames == 600
    assert assert_consistent(tmp_path / "ds.h5")["frames"] == 600


@pytest.mark.skipif(not CAN_PIN, reason="needs Linux's CPU affinity and two CPUs")
def test_a_multisync_runs_writer_thread_follows_the_workers_with_one_worker_a_cpu(tmp_path):
    """Two workers on two CPUs: the writer thread shares one worker's core, and is
    moved at each batch to the core of the worker ahead (``threads.CpuFollower``)."""
    from collect_cli.run import run

    seen: list[set[int]] = []  # the writer thread's CPUs, at each of its commits

    def progress(state) -> None:
        if threading.current_thread() is not threading.main_thread():
            seen.append(os.sched_getaffinity(0))

    out = tmp_path / "ds.h5"
    overrides = ["env=CartPole", "env.num_envs=4", "collector=multisync", "collector.workers=2"]
    overrides += ["frames_per_batch=200", "total_frames=4000", f"out={out}"]
    overrides.append("writer.commit_interval=0")  # a commit, and its report, per batch
    with on_two_cpus() as two:
        result = run(config.load(config.compose(overrides)), progress=progress)
    assert result.frames == 4000
    assert len(seen) >= 19  # every commit's report but the first came from that thread
    assert all(len(cpus) == 1 and cpus <= set(two) for cpus in seen[1:])
    assert_consistent(out)


@pytest.mark.parametrize("device_path", [False, True], ids=["host-path", "device-path"])
def test_the_writer_process_takes_the_batches_of_either_rollout_path(tmp_path, device_path):
    """A native env's batches come from the host path or the device path (here on the
    CPU: how CUDA runs fill them); both lend the shared buffers the writer maps."""
    if not writer_process.available():
        pytest.skip("a writer process needs Linux and two cores")

    def native(**kw) -> SyncCollector:
        make = env_factory("Pendulum-v1", 16, "native")
        return SyncCollector(make, frames_per_batch=160, total_frames=800, seed=3, **kw)

    direct, behind = tmp_path / "direct.h5", tmp_path / "behind.h5"
    with native() as c:
        rows = [b.clone() for b in c]
    sink = writer_process.WriterProcess(settings("hdf5", behind), depth=2)
    meta = {"env_id": "Pendulum-v1", "config": "env: Pendulum"}
    sink.open(WriterSpec("hdf5", behind, {"metadata": meta, "lanes": 16}))
    with native(return_same_td=True, batch_buffers=2, device_path=device_path) as c:
        drive(sink, c)
    sink.close("complete")
    writer = WriterSpec("hdf5", direct, {"metadata": meta, "lanes": 16}).open()
    for batch in rows:
        writer.append(batch)
        writer.commit()
    writer.close()
    a, b = read_all(direct), read_all(behind)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert assert_consistent(behind)["frames"] == 800


@pytest.mark.parametrize(
    ("overrides", "device", "storing", "process"),
    [
        ([], "cpu", "cpu", True),
        (["env.backend=native"], "cpu", "cpu", True),
        (["collector=multisync"], "cpu", "cpu", False),  # its main process only writes
        ([], "cuda", "cpu", False),  # pinned host buffers: the writer thread
        ([], "cpu", "cuda", False),  # batches on the device
    ],
)
def test_which_runs_write_from_a_process(overrides, device, storing, process):
    from collect_cli.run import writes_from_a_process

    s = config.load(config.compose(overrides))
    got = writes_from_a_process(s, torch.device(device), torch.device(storing))
    assert got == (process and writer_process.available())
