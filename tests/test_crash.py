"""Crash safety with real processes: SIGKILL of the whole process tree at a random moment."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from collect_cli.dataset import open_dataset
from collect_cli.errors import EXIT_RUNTIME
from tests.helpers import assert_consistent, assert_split_on_done, kill_group
from tests.support.cli_runner import SUPPORT, ForkServer, out_path, start_run

# more kills for a local soak: RLCOLLECT_CRASH_RUNS=40 pytest tests/test_crash.py
RUNS_PER_BACKEND = int(os.environ.get("RLCOLLECT_CRASH_RUNS", "10"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hdf5", "memmap"])
def test_sigkill_at_random_moments_leaves_valid_datasets(tmp_path, backend):
    rng = random.Random(1234)
    common = ["frames_per_batch=200", f"writer={backend}", "progress=none"]
    with ForkServer(tmp_path, [*common, "collector=multisync"]) as server:
        for i in range(RUNS_PER_BACKEND):
            out = out_path(tmp_path, backend, f"run{i}")
            collector = ("sync", "multisync", "multiasync")[i % 3]
            args = [*common, f"collector={collector}", f"out={out}"]
            pid = server.start([*args, "total_frames=-1"], tmp_path / f"run{i}.log")
            deadline = time.monotonic() + 60
            while not out.exists() and time.monotonic() < deadline:
                assert server.poll(pid) is None, (tmp_path / f"run{i}.log").read_text()
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 1.5))
            kill_group(pid)
            assert server.wait(pid) == -signal.SIGKILL
            meta = assert_consistent(out)  # rlcollect validate's checks
            assert meta["status"] == "running"  # killed: never marked complete
            td = open_dataset(out).load()  # the standard loaders still open it
            if ("collector", "mask") in td.keys(True):  # killed after the first batch was written
                assert td["collector", "mask"].shape[0] == meta["lanes"]
                assert int(td["collector", "mask"].sum()) >= meta["frames"]
            if backend == "hdf5":
                td.close()  # PersistentTensorDict keeps the file open
            # resume=true continues it to a complete dataset
            target = meta["frames"] + 2000
            log = tmp_path / f"resume{i}.log"
            resumed = server.start([*args, f"total_frames={target}", "resume=true"], log)
            assert server.wait(resumed) == 0, log.read_text()
            final = assert_consistent(out)
            assert final["status"] == "complete" and final["frames"] >= target
            assert assert_split_on_done(out) == final["episodes"]


def test_a_run_killed_before_its_first_commit_saved_nothing_and_says_so(tmp_path, cli):
    """Killed while its first (big) batch is collected: ``out`` does not exist,
    ``validate`` says why (exit 2), and the next run to ``out`` clears the staging
    dataset. The staging is the Writer base class's, the same for both backends."""
    out = out_path(tmp_path, "hdf5")
    args = ["env=Pendulum", "collector=sync", f"out={out}", "progress=none"]
    proc = start_run(
        [*args, "frames_per_batch=100000", "total_frames=100000"],
        tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    staging = tmp_path / f".{out.name}.creating-{proc.pid}"
    deadline = time.monotonic() + 60
    while not staging.exists() and time.monotonic() < deadline:
        assert proc.poll() is None
        time.sleep(0.01)
    assert staging.exists()
    kill_group(proc.pid)
    proc.wait()
    assert not out.exists() and staging.exists()
    res = cli("validate", str(out))
    assert res.code == 2
    assert f"the run with pid {proc.pid} was killed before its first commit" in res.stderr
    res = cli("run", *args, "frames_per_batch=200", "total_frames=400")
    assert res.code == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if "ds" in p.name) == [out.name]
    assert assert_consistent(out)["status"] == "complete"


def _strace() -> str | None:
    """strace, if it is installed and may trace here (ptrace can be forbidden)."""
    exe = shutil.which("strace")
    if exe is None:
        return None
    probe = subprocess.run([exe, "-o", os.devnull, "true"], capture_output=True)
    return exe if probe.returncode == 0 else None


STRACE = _strace()
needs_strace = pytest.mark.skipif(STRACE is None, reason="needs strace, with ptrace allowed")


# how a run whose K-th write was cut ends: killed, where it writes itself, or exit 1
# where its writer process was (the run says so, and keeps what was committed)
CUT = (-signal.SIGKILL, EXIT_RUNTIME)


def kill_runs(tmp_path, points: list[int], args: list[str]) -> dict[int, int]:
    """``rlcollect run args out=<tmp_path>/k<K>.h5`` killed just before its K-th
    ``pwrite64`` (the write does not happen; the process making it is killed: the
    run, or its writer process), for each K in ``points``; each run's exit status
    (K = 0: not killed, its number of writes). See support/killpoints.py."""
    template = str(tmp_path / "k{k}.h5")

    def some(ks: list[int]) -> dict[int, int]:
        cmd = [sys.executable, str(SUPPORT / "killpoints.py"), STRACE, template]
        proc = subprocess.run(
            [*cmd, *map(str, ks), "--", *args], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr
        return {int(k): v for k, v in json.loads(proc.stdout.splitlines()[-1]).items()}

    halves = [points[0::2], points[1::2]]
    with ThreadPoolExecutor(2) as pool:
        return {k: v for part in pool.map(some, [h for h in halves if h]) for k, v in part.items()}


@needs_strace
def test_kill_at_each_write_of_hdf5_commits_leaves_a_sound_file(tmp_path):
    """Fault injection: the run is killed just before its K-th ``pwrite64``, for K
    over several commits of a running dataset, in steps coprime with a commit's
    writes so that every phase of a commit is hit."""
    from collect_cli.ops.validate import validate

    args = ["env=Pendulum", "total_frames=-1", "frames_per_batch=200", "writer=hdf5"]
    args.append("writer.commit_interval=0")  # a commit per batch: the phases below
    points = list(range(150, 250, 7))  # the first commit ends near write 110, then ~40 each
    status = kill_runs(tmp_path, points, [*args, "progress=none"])
    assert all(status[k] in CUT for k in points)  # every run was cut
    bad = {k: validate(tmp_path / f"k{k}.h5") for k in points}
    assert not {k: problems for k, problems in bad.items() if problems}


@pytest.mark.slow
@needs_strace
def test_kill_at_each_write_of_creating_and_closing_an_hdf5_file(tmp_path):
    """Fault injection where HDF5 changes the file's structure: creating it (its
    datasets, made by the first batch) and closing it (status, end time). A kill
    before the first commit leaves no file at ``out``; after it, a sound file
    whose status says whether closing finished."""
    from collect_cli.dataset.hdf5.read import read_meta
    from collect_cli.ops.validate import validate

    args = ["env=Pendulum", "total_frames=600", "frames_per_batch=200", "writer=hdf5"]
    args += ["progress=none", "writer.commit_interval=0"]
    writes = kill_runs(tmp_path, [0], args)[0]
    points = [*range(1, 120, 4), *range(writes - 40, writes + 1, 2)]  # published near 110
    status = kill_runs(tmp_path, points, args)
    published = {}
    for k in points:
        out = tmp_path / f"k{k}.h5"
        assert status[k] in CUT, k
        published[k] = out.exists()
        if not out.exists():
            continue
        assert not validate(out), (k, validate(out))
        meta = read_meta(out)
        assert meta["frames"] in (200, 400, 600), (k, meta["frames"])
        assert meta["status"] == "running" or meta["frames"] == 600, k
        published[k] = meta["status"]
    first = [bool(published[k]) for k in points[:30]]
    assert not first[0] and first[-1]  # killed before the first commit, and after it
    assert first == sorted(first)  # once there, the file stays
    assert {False, "running", "complete"} == set(published.values())


@pytest.mark.slow
@needs_strace
def test_kill_at_writes_of_a_split_trajs_hdf5_run_leaves_a_sound_file(tmp_path):
    """split_trajs: rows are whole episodes, so the datasets are made when the first
    episodes end and grow by rows at later commits (their per-row counters too)."""
    from collect_cli.dataset.hdf5.read import read_meta
    from collect_cli.ops.validate import validate

    args = ["env=Pendulum", "total_frames=3200", "frames_per_batch=200", "split_trajs=true"]
    args += ["writer=hdf5", "progress=none", "writer.commit_interval=0"]
    points = list(range(20, 240, 8))  # the whole run (its writes: about 235)
    status = kill_runs(tmp_path, points, args)
    lanes = []
    for k in points:
        out = tmp_path / f"k{k}.h5"
        if not out.exists():
            lanes.append(None)
            continue
        assert not validate(out), (k, validate(out))
        meta = read_meta(out)
        assert meta["lanes"] == len(meta["lane_steps"]) == meta["frames"] // 200, k
        assert status[k] in CUT or meta["status"] == "complete"
        lanes.append(meta["lanes"])
    assert lanes[0] is None and {8, 16} <= set(lanes)  # before the first rows; 8, then 16
