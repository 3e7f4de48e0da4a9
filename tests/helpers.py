"""Dataset checks and process-tree helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from collect_cli.dataset import open_dataset
from collect_cli.ops.validate import validate
from tests.support.cli_runner import ForkServer


def assert_consistent(path: Path | str) -> dict:
    """The dataset reopened from disk passes ``rlcollect validate``; return its metadata."""
    problems = validate(path)
    assert not problems, problems
    return open_dataset(path).meta


def assert_split_on_done(path: Path | str) -> int:
    """Splitting each lane's valid frames after every ``next/done`` frame gives exactly
    the trajectories of ``collector/traj_ids``, as a D4RL-style reader sees them;
    return how many trajectories were checked. After multistep a frame's own step
    ended where ``steps_to_next_obs`` is 1."""
    ds = open_dataset(path)
    lanes, steps = ds.meta["lanes"], ds.meta["steps"]
    counts = ds.meta.get("lane_steps") or [steps] * lanes
    keys = {key for key, _, _ in ds.describe()}

    def frames(key: str) -> np.ndarray:
        return np.asarray(ds.array(key))[:lanes, :steps].reshape(lanes, steps, -1)[..., 0]

    traj, mask, done = frames("collector/traj_ids"), frames("collector/mask"), frames("next/done")
    if "steps_to_next_obs" in keys:
        done = done & (frames("steps_to_next_obs") == 1)
    checked = 0
    for lane in range(lanes):
        valid = np.flatnonzero(mask[lane, : counts[lane]])
        ids, ends = traj[lane, valid], done[lane, valid]
        pieces = np.split(ids, np.flatnonzero(ends[:-1]) + 1) if len(ids) else []
        for piece in pieces:
            assert (piece == piece[0]).all(), f"lane {lane}: ids {set(piece.tolist())} in one piece"
        firsts = [int(p[0]) for p in pieces]
        assert len(set(firsts)) == len(firsts), f"lane {lane}: a trajectory split in two"
        assert len(ids) == 0 or bool(ends[-1]), f"lane {lane}: its last trajectory is unflagged"
        checked += len(pieces)
    return checked


def write_preempted(
    path: Path,
    backend: str,
    metadata: dict,
    length: int,
    frames_per_batch: int,
    total_frames: int,
    status: str = "complete",
) -> Path:
    """A dataset with padding: two workers (one slow) of episodes ``length`` steps
    long, the slow one preempted (``preemptive_threshold=0.5``) once the fast one
    is done with each batch, so its lane pads its batches' ends. ``metadata`` is
    added to the env's id and spaces."""
    from collect_cli import specs
    from collect_cli.collectors import MultiSyncCollector
    from collect_cli.dataset import make_writer
    from collect_cli.envs import env_factory

    fast = env_factory("toyenvs:Slow-v0", 1, kwargs={"delay": 0.0, "length": length})
    slow = env_factory("toyenvs:Slow-v0", 1, kwargs={"delay": 0.01, "length": length})
    with MultiSyncCollector(
        [fast, slow],
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        preemptive_threshold=0.5,
    ) as collector:
        env = {
            "env_id": "toyenvs:Slow-v0",
            "observation_space": specs.describe(collector.observation_space),
            "action_space": specs.describe(collector.action_space),
        }
        writer = make_writer(backend, path, metadata={**env, **metadata}).open()
        for batch in collector:
            writer.append(batch)
            writer.commit()
    writer.close(status)
    return path


def resident_pages(path: Path | str) -> np.ndarray:
    """Which pages of the file are in the OS's page cache (``mincore`` over a
    read-only shared mapping; mapping a page does not read it)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pages = -(-size // mmap.PAGESIZE)
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return np.frombuffer(vec.raw, np.uint8) & 1 == 1
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def wait_for_frames(path: Path, proc: subprocess.Popen, minimum: int = 1, timeout=60.0) -> None:
    """Wait until the running dataset at ``path`` has committed ``minimum`` frames."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if open_dataset(path).meta.get("frames", 0) >= minimum:
                return
        except Exception:
            pass  # not created yet, or caught mid-write by this reader
        time.sleep(0.1)
    raise AssertionError(f"the run committed fewer than {minimum} frames in {timeout} s")


CAN_PIN = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


@contextlib.contextmanager
def on_two_cpus() -> Iterator[list[int]]:
    """This thread (and the threads and processes it starts) on two CPUs only, as on
    CI's machine; its CPUs given back on the way out."""
    cpus = os.sched_getaffinity(0)
    two = sorted(cpus)[:2]
    os.sched_setaffinity(0, set(two))
    try:
        yield two
    finally:
        os.sched_setaffinity(0, cpus)


def descendants(pid: int) -> set[int]:
    """Live descendant pids of ``pid`` (from /proc), leaving out the fork server's
    tree: the pytest worker keeps it for later CLI runs (cli_runner.run_cli)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child in _fork_servers():
                continue
            out.add(child)
            stack.append(child)
    return out


def kill_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGKILL every process of group ``pgid`` (a run in its own session: the run, its
    workers, its writer process), then wait until none of them is left alive: a
    process killed in the middle of a write finishes that write first."""
    os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                alive.append(int(entry.name))
        if not alive:
            return
        time.sleep(0.005)
    raise AssertionError(f"processes of group {pgid} outlived SIGKILL: {alive}")


def _fork_servers() -> set[int]:
    return {server.proc.pid for server in ForkServer.started}


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line contains ``text`` (leftover workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
