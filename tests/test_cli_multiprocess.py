"""End-to-end: multi-process collectors through the CLI, failures and process hygiene."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent, descendants, processes_mentioning, wait_for_frames
from tests.support.cli_runner import out_path, start_run


@pytest.mark.parametrize("collector", ["multisync", "multiasync"])
@pytest.mark.parametrize("env", ["Pendulum", "CartPole"])
def test_two_workers_write_valid_dataset(cli, tmp_path, backend, collector, env):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        f"env={env}",
        f"collector={collector}",
        "collector.workers=2",
        "env.num_envs=3",
        "total_frames=3000",
        "frames_per_batch=300",
        f"writer={backend}",
        f"out={out}",
        "progress=none",
    )
    assert res.code == 0, res.stderr
    meta = assert_consistent(out)
    assert meta["lanes"] == 6 and meta["status"] == "complete"
    # multisync: 2 workers x 3 lanes x ceil(150/3)=50 steps = 300 per batch, 10 batches;
    # multiasync: batches of one worker's 3 lanes x 100 steps = 300 frames each.
    assert meta["frames"] == res.summary["frames"] == 3000
    if collector == "multisync":
        assert meta["steps"] == 500


def test_multisync_reproducible_from_seed_cli(cli, tmp_path):
    arrays = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.h5"
        args = ("run", "collector=multisync", "policy=mlp", "seed=9", "total_frames=2000")
        assert cli(*args, f"out={out}", "progress=none").code == 0
        ds = open_dataset(out)
        arrays.append([ds.array(k) for k in ("observation", "action", "collector/traj_ids")])
    for x, y in zip(*arrays, strict=True):
        np.testing.assert_array_equal(x, y)


def test_worker_exception_exits_1_with_clear_message(tmp_path, backend):
    out = out_path(tmp_path, backend)
    proc = start_run(
        [
            "collector=multisync",
            "env=gym",
            "env.id=toyenvs:Faulty-v0",
            "+env.kwargs.fail_at=95",
            "env.num_envs=2",
            "total_frames=100000",
            "frames_per_batch=40",
            f"writer={backend}",
            f"out={out}",
            "progress=none",
        ],
        tmp_path,
    )
    _, stderr = proc.communicate(timeout=120)  # a failed worker must not leave the run hanging
    assert proc.returncode == 1
    line = stderr.strip().splitlines()[-1]
    assert "worker 0" in line or "worker 1" in line
    assert "simulated failure at step 95" in line and "Traceback" not in stderr
    meta = assert_consistent(out)
    assert meta["status"] == "interrupted" and meta["frames"] == 9 * 40  # 9 whole batches
    assert not processes_mentioning(str(out))

    debug = start_run(
        [
            "collector=multisync",
            "env=gym",
            "env.id=toyenvs:Faulty-v0",
            "+env.kwargs.fail_at=5",
            "env.num_envs=2",
            "total_frames=1000",
            "frames_per_batch=40",
            f"writer={backend}",
            f"out={out_path(tmp_path, backend, 'debug')}",
            "progress=none",
            "debug=true",
        ],
        tmp_path,
    )
    _, debug_err = debug.communicate(timeout=60)
    assert debug.returncode == 1
    assert "in the worker process:" in debug_err and "RuntimeError: simulated failure" in debug_err


def test_killed_worker_exits_1_within_10s_no_orphans(tmp_path, backend):
    out = out_path(tmp_path, backend)
    proc = start_run(
        [
            "collector=multisync",
            "total_frames=-1",
            "frames_per_batch=400",
            f"writer={backend}",
            f"out={out}",
            "progress=none",
        ],
        tmp_path,
    )
    wait_for_frames(out, proc, minimum=800)
    workers = sorted(descendants(proc.pid))
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - killed < 10
    assert proc.returncode == 1
    assert f"(pid {workers[1]}) was killed by SIGKILL" in stderr.strip().splitlines()[-1]
    meta = assert_consistent(out)
    assert meta["status"] == "interrupted" and meta["frames"] >= 800
    assert not processes_mentioning(str(out))


@pytest.mark.parametrize("collector", ["multisync", "multiasync"])
def test_sigterm_stops_workers_cleanly(tmp_path, collector):
    out = tmp_path / "t.h5"
    proc = start_run(
        [f"collector={collector}", "total_frames=-1", "frames_per_batch=200", f"out={out}"],
        tmp_path,
    )
    wait_for_frames(out, proc, minimum=400)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    meta = assert_consistent(out)
    assert meta["status"] == "interrupted"
    assert not processes_mentioning(str(out))
