"""The CLI under signals and runtime failures: exit codes, flushed data, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from collect_cli import writer_process
from collect_cli.dataset import open_dataset
from collect_cli.ops.validate import check
from tests.helpers import (
    assert_consistent,
    assert_split_on_done,
    descendants,
    processes_mentioning,
    wait_for_frames,
)
from tests.support.cli_runner import SUPPORT, out_path, start_run


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_flushes_and_exits_130(tmp_path, backend, sig):
    out = out_path(tmp_path, backend)
    proc = start_run(
        ["total_frames=-1", "frames_per_batch=200", f"writer={backend}", f"out={out}"], tmp_path
    )
    wait_for_frames(out, proc, minimum=1000)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted"
    meta = open_dataset(out).meta
    assert meta["status"] == "interrupted"
    assert meta["frames"] == summary["frames"] >= 1000
    assert meta["frames"] % 200 == 0
    td = open_dataset(out).load()
    assert int(td["collector", "mask"].sum()) == meta["frames"]
    assert sig.name in stderr


def test_a_commit_every_commit_interval_and_a_stop_commits_the_rest(tmp_path, backend):
    """``writer.commit_interval``: the first batch is committed at once, later ones
    once the interval has passed. A kill -9 within it leaves the first batch's
    frames (sound, and resume=true continues them); a SIGINT commits all written."""
    from tests.helpers import kill_group

    args = ["frames_per_batch=200", f"writer={backend}", "writer.commit_interval=3600"]
    args += ["total_frames=-1", "progress=none"]
    killed, stopped = out_path(tmp_path, backend, "killed"), out_path(tmp_path, backend, "stopped")
    proc = start_run([*args, f"out={killed}"], tmp_path, start_new_session=True)
    wait_for_frames(killed, proc, minimum=200)
    time.sleep(1.0)  # thousands of frames written meanwhile, none committed
    assert open_dataset(killed).meta["frames"] == 200
    kill_group(proc.pid)
    proc.communicate()
    meta = assert_consistent(killed)
    assert (meta["status"], meta["frames"]) == ("running", 200)
    resume = [a for a in args if a != "total_frames=-1"] + ["total_frames=1000", "resume=true"]
    resumed = start_run([*resume, f"out={killed}"], tmp_path)
    assert resumed.wait(timeout=60) == 0, resumed.communicate()
    assert assert_consistent(killed)["status"] == "complete"

    proc = start_run([*args, f"out={stopped}"], tmp_path)
    wait_for_frames(stopped, proc, minimum=200)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    meta = assert_consistent(stopped)
    assert meta["status"] == "interrupted"
    assert meta["frames"] == summary["frames"] > 1000


needs_writer_process = pytest.mark.skipif(
    not writer_process.available(), reason="a writer process needs Linux and two cores"
)


@needs_writer_process
def test_ctrl_c_reaches_the_whole_run_and_it_still_flushes(tmp_path, backend):
    """A terminal's Ctrl-C signals the run's whole process group, its writer process
    too: the writer ignores it and writes what the run hands it, the run exits 130."""
    out = out_path(tmp_path, backend)
    args = ["total_frames=-1", "frames_per_batch=200", f"writer={backend}", f"out={out}"]
    proc = start_run(args, tmp_path, start_new_session=True)
    wait_for_frames(out, proc, minimum=1000)
    assert len(descendants(proc.pid)) == 1  # the writer process
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    meta = assert_consistent(out)
    assert meta["status"] == summary["status"] == "interrupted"
    assert meta["frames"] == summary["frames"] >= 1000
    assert not processes_mentioning(str(out))


@needs_writer_process
def test_a_killed_writer_process_ends_the_run_with_exit_1(tmp_path, backend):
    """The writer process killed: the run stops within seconds with one line naming it,
    and the dataset holds what was committed, which resume=true completes."""
    out = out_path(tmp_path, backend)
    args = ["frames_per_batch=200", f"writer={backend}", f"out={out}", "progress=none"]
    proc = start_run([*args, "total_frames=-1"], tmp_path)
    wait_for_frames(out, proc, minimum=1000)
    (writer,) = descendants(proc.pid)
    os.kill(writer, signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - killed < 10
    assert proc.returncode == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr
    assert f"the writer process (pid {writer}) was killed by SIGKILL" in lines[0]
    meta = assert_consistent(out)
    assert meta["status"] == "running" and meta["frames"] >= 1000  # nobody closed it
    resumed = start_run([*args, f"total_frames={meta['frames'] + 1000}", "resume=true"], tmp_path)
    _, stderr = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, stderr
    assert assert_consistent(out)["status"] == "complete"
    assert not processes_mentioning(str(out))


def test_env_failure_mid_run_exits_1_and_keeps_committed_data(tmp_path, backend):
    out = out_path(tmp_path, backend)
    proc = start_run(
        [
            "env=gym",
            "env.id=toyenvs:Faulty-v0",
            "+env.kwargs.fail_at=45",
            "env.num_envs=2",
            "total_frames=1000",
            "frames_per_batch=20",
            f"writer={backend}",
            f"out={out}",
            "progress=none",
        ],
        tmp_path,
    )
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    line = json.loads(stdout)  # a failed run prints its JSON line too
    assert line["status"] == "failed" and line["exit_code"] == 1 and line["frames"] == 80
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr
    assert "RuntimeError: simulated failure at step 45" in lines[0]
    meta = open_dataset(out).meta
    # each lane fails on its 45th step: 4 whole batches of 10 steps were committed
    assert meta["status"] == "interrupted"
    assert meta["frames"] == 80 and meta["steps"] == 40


@pytest.mark.slow
def test_disk_full_exits_1_and_keeps_committed_data(tmp_path, backend):
    """A file-size limit (RLIMIT_FSIZE) stands in for a full disk."""
    import resource

    out = out_path(tmp_path, backend)
    limit = 6 << 20

    def cap_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = dict(os.environ, PYTHONPATH=str(SUPPORT))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "collect_cli",
            "run",
            "total_frames=-1",
            f"writer={backend}",
            f"out={out}",
            "progress=none",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap_file_size,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0], proc.stderr
    assert "readable up to the last commit" in lines[0]
    meta = assert_consistent(out)
    assert meta["frames"] > 0 and meta["frames"] % 1000 == 0


def test_resume_killed_run_to_complete(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    args = ["total_frames=40000", "frames_per_batch=400", f"writer={backend}", f"out={out}"]
    proc = start_run([*args, "progress=none"], tmp_path)
    wait_for_frames(out, proc, minimum=4000)
    proc.kill()
    proc.communicate()
    before = assert_consistent(out)
    assert before["status"] == "running" and before["frames"] < 40000
    _, notes = check(out)  # the kill's cuts are not flagged yet
    assert any("resume=true flags them" in note for note in notes) == bool(before["steps"] % 200)

    res = cli("run", *args, "resume=true", "progress=none")
    assert res.code == 0, res.stderr
    meta = assert_consistent(out)
    assert meta["status"] == "complete" and meta["frames"] == res.summary["frames"] == 40000
    assert len(meta["resumed"]) == 1
    ds = open_dataset(out)
    ep = ds.episodes()
    # each lane's episode cut by the kill is kept, marked incomplete, and so is the one the
    # end of the resumed run cuts (Pendulum episodes are 200 steps in lock-step: none is cut
    # when the kill came right after a boundary)
    cut = ep["traj_id"][~ep["complete"]]
    assert len(cut) == (16 if before["steps"] % 200 else 0)
    assert len(np.unique(ep["traj_id"])) == len(ep["traj_id"]) == meta["episodes"]
    assert assert_split_on_done(out) == meta["episodes"]  # the resume point is flagged

    again = cli("run", *args, "resume=true", "progress=none")
    assert again.code == 0 and again.summary["status"] == "complete"
    assert again.summary["frames"] == 40000 and again.summary["seconds"] == 0.0


def test_resume_refuses_another_env(cli, tmp_path):
    out = tmp_path / "r.h5"
    proc = start_run(["total_frames=-1", f"out={out}", "progress=none"], tmp_path)
    wait_for_frames(out, proc, minimum=2000)
    proc.terminate()
    proc.communicate()
    res = cli("run", "env=CartPole", f"out={out}", "resume=true")
    assert res.code == 2 and "cannot resume" in res.stderr and "env" in res.stderr
    assert assert_consistent(out)["status"] == "interrupted"
    both = cli("run", f"out={out}", "resume=true", "overwrite=true")
    assert both.code == 2 and "contradict" in both.stderr
