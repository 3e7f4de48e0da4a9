"""Crash safety with real processes: SIGKILL of the whole process tree at a random moment."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from collect_cli.writers import open_dataset
from tests.conftest import out_path
from tests.helpers import assert_consistent, start_run

# more kills for a local soak: RLCOLLECT_CRASH_RUNS=40 pytest tests/test_crash.py
RUNS_PER_BACKEND = int(os.environ.get("RLCOLLECT_CRASH_RUNS", "10"))


@pytest.mark.parametrize("backend", ["hdf5", "memmap"])
def test_sigkill_at_random_moments_leaves_valid_datasets(tmp_path, backend):
    rng = random.Random(1234)
    for i in range(RUNS_PER_BACKEND):
        out = out_path(tmp_path, backend, f"run{i}")
        collector = ("sync", "multisync", "multiasync")[i % 3]
        proc = start_run(
            [
                "total_frames=-1",
                "frames_per_batch=200",
                f"collector={collector}",
                f"writer={backend}",
                f"out={out}",
                "progress=none",
            ],
            tmp_path,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
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
        resumed = start_run(
            [
                f"total_frames={target}",
                "frames_per_batch=200",
                f"collector={collector}",
                f"writer={backend}",
                f"out={out}",
                "progress=none",
                "resume=true",
            ],
            tmp_path,
        )
        _, stderr = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, stderr
        final = assert_consistent(out)
        assert final["status"] == "complete" and final["frames"] >= target
