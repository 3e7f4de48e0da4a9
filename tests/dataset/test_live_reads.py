"""Readers of a dataset that a run is writing: each read is of one commit (durability D22).

A real ``rlcollect run`` writes an HDF5 dataset while real ``rlcollect validate``
and ``rlcollect export`` processes read it (forked from the warmed process of
``conftest.run_cli``: real processes running the real CLI, without the seconds a
new interpreter spends importing torch). Each must find the dataset sound, or,
before the run's first commit, say that there is no dataset yet: never
"unreadable" (an HDF5 open is not a snapshot: the superblock's end of allocation
is read at open, the chunk index later, after a commit may have changed it).
"""

from __future__ import annotations

import json
import os
import signal
import time

import h5py
import pytest

from tests.support.cli_runner import run_cli, server

VALIDATIONS = 50
RUN = ["env=Pendulum", "total_frames=1e6", "progress=none"]


def _verdict(result, existed: bool) -> str | None:
    """What is wrong with one ``validate``'s answer (None: nothing)."""
    if result.code == 0 and "is sound" in result.stdout:
        return None
    if not existed and result.code == 2 and "no dataset at" in result.stderr:
        return None  # before the first commit: the run is creating it
    return f"exit {result.code}: {(result.stdout + result.stderr).strip()[:300]}"


@pytest.mark.slow
def test_validate_and_export_of_a_live_hdf5_run_read_its_last_commit(tmp_path):
    """Before the fix, 2 to 5 of the 50 validations said "unreadable data: ... (addr
    overflow ...)" (7 runs of 7 failed)."""
    out, dest = tmp_path / "live.h5", tmp_path / "live-d4rl.hdf5"
    forks = server()
    run = forks.start([*RUN, f"out={out}"], tmp_path / "run.log")
    answers: list[tuple[bool, bool, str | None]] = []  # (file there, run live, what is wrong)
    exported, code = None, None
    try:
        deadline = time.monotonic() + 120
        while len(answers) < VALIDATIONS and time.monotonic() < deadline:
            existed = out.exists()
            result = run_cli("validate", str(out), cwd=tmp_path)
            live = forks.poll(run) is None
            answers.append((existed, live, _verdict(result, existed)))
            if exported is None and existed and live and len(answers) >= VALIDATIONS // 2:
                exported = run_cli("export", str(out), "--format", "d4rl", "--out", str(dest))
        code = forks.wait(run, timeout=120)
    finally:
        if code is None:
            os.killpg(run, signal.SIGKILL)
            forks.wait(run)
    assert code == 0, (tmp_path / "run.log").read_text()
    wrong = [what for _, _, what in answers if what is not None]
    assert not wrong, f"{len(wrong)} of {len(answers)} validations failed: {wrong[:3]}"
    read_live = sum(existed and live for existed, live, _ in answers)
    assert len(answers) == VALIDATIONS and read_live >= 30, read_live  # 46 of 50 here

    assert exported is not None and exported.code == 0, exported and exported.stderr
    summary = json.loads(exported.stdout.strip().splitlines()[-1])
    # the committed frames of a running dataset, episodes cut where the commit ends
    assert 0 < summary["frames"] < 1_000_000 and summary["source_status"] == "running"
    with h5py.File(dest, "r") as f:
        assert len(f["observations"]) == len(f["rewards"]) == summary["frames"]
