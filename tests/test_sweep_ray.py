"""``rlcollect run -m hydra/launcher=ray_cluster`` on a real Ray cluster.

The module starts one with ``ray start --head`` (every server on 127.0.0.1, free
ports, its own temporary directory) and kills every process of it at the end. The
first test runs the commands of docs/cli.md's "Ray cluster" block as written (the
shared folder and the sizes made small); the second kills a job's process in the
middle of a sweep, then completes the sweep with ``resume=true``.

One node only: Ray binds its servers to 127.0.0.1 only in its single-node mode
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), where ``ray start --address`` refuses to
add a node; a second node would listen on the machine's network address.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent, kill_group, processes_mentioning
from tests.support.cli_runner import SUPPORT, Result

pytest.importorskip(
    "hydra_plugins.hydra_ray_launcher",
    reason="the Ray launcher is not installed: pip install 'rlcollect[sweep]'",
)
pytest.importorskip("ray", reason="Ray is not installed: pip install 'rlcollect[sweep]'")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # rlcollect and ray of this environment
SHARED = "/shared/data"  # docs/cli.md's shared folder, made a temporary one here
HANG = ("env=gym", "env.id=rayenvs:HangOnce-v0", "+env.kwargs.run_seed=${seed}")
FRAMES = 2000  # a doc job: 2 batches of Pendulum's 8 lanes (as tests/test_docs.py shrinks it)
TINY = ("total_frames=600", "env.num_envs=2", "frames_per_batch=200", "progress=plain")


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """A one-node Ray cluster; the environment that joins it (``address=auto`` reads
    RAY_ADDRESS)."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths
    gcs, client, dash, agent, agent_grpc, env_agent, metrics, auto, dash_metrics = free_ports(9)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # node address 127.0.0.1: loopback only
        "RAY_USAGE_STATS_ENABLED": "0",
        "AUTOSCALER_METRIC_PORT": str(auto),
        "DASHBOARD_METRIC_PORT": str(dash_metrics),
    }
    command = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--num-cpus=2",
        f"--temp-dir={temp}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--ray-client-server-port={client}",
        f"--dashboard-port={dash}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={env_agent}",
        f"--metrics-export-port={metrics}",
        "--log-style=record",
    ]
    log = temp / "ray-start.log"
    with log.open("w") as out:  # the daemons it starts stay in its new process group
        start = subprocess.Popen(command, env=env, stdout=out, stderr=out, start_new_session=True)
    try:
        code = start.wait(timeout=120)
        assert code == 0, log.read_text()
        yield {**env, "RAY_ADDRESS": f"127.0.0.1:{gcs}"}
    finally:
        _stop(start.pid, temp)


def _stop(pgid: int, temp: Path) -> None:
    """Kill what ``ray start`` started: its process group, and anything naming its
    temporary directory (a process that left the group); then remove the directory."""
    with contextlib.suppress(ProcessLookupError):  # none left
        kill_group(pgid)
    for pid in processes_mentioning(str(temp)):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes_mentioning(str(temp)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = processes_mentioning(str(temp))
    shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"Ray processes left running: {left}"


def doc_commands(shared: Path) -> list[str]:
    """The ``rlcollect`` lines of docs/cli.md's Ray block (``\\`` continuations
    joined), on ``shared`` instead of /shared/data, with 2000 frames a job."""
    text = (ROOT / "docs" / "cli.md").read_text()
    block = re.search(r"```bash norun\n((?:(?!```).)*hydra/launcher=ray_cluster.*?)```", text, re.S)
    assert block, "docs/cli.md has no Ray cluster block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    commands = [" ".join(line.split()) for line in lines if line.startswith("rlcollect ")]
    commands = [c.replace(SHARED, str(shared)) for c in commands]
    return [re.sub(r"\btotal_frames=\S+", f"total_frames={FRAMES}", c) for c in commands]


def sh(command: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> Result:
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_doc_recipe_runs_a_sweep_on_a_ray_cluster_and_merges_it(cluster, tmp_path):
    shared = tmp_path / "shared"
    commands = doc_commands(shared)
    assert [c.split()[1] for c in commands] == ["run", "run", "merge", "validate"]
    sweep, resume, merge, validate = commands
    assert "hydra/launcher=ray_cluster" in sweep and "out=" in sweep
    assert resume == sweep.replace(" > ", " resume=true > ")  # the same command, resumed

    res = sh(sweep, tmp_path, cluster)
    assert res.code == 0, res.stderr
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert (summary["status"], summary["jobs"], summary["failed"]) == ("complete", 3, 0)
    assert summary["frames"] == 3 * FRAMES
    shards = [shared / f"pend_s{n}.h5" for n in range(3)]
    assert [s["path"] for s in summary["shards"]] == list(map(str, shards))
    actions = []
    for n, (entry, path) in enumerate(zip(summary["shards"], shards, strict=True)):
        assert (entry["exit_code"], entry["status"], entry["frames"]) == (0, "complete", FRAMES)
        meta = assert_consistent(path)
        assert (meta["seed"], meta["frames"], meta["status"]) == (n, FRAMES, "complete")
        assert (meta["sweep"]["id"], meta["sweep"]["job"]) == (summary["sweep"], n)
        assert f"seed={n}" in meta["sweep"]["job_overrides"]
        actions.append(open_dataset(path).array("action"))
    assert not np.array_equal(actions[0], actions[1])  # each job got its seed
    # per-job progress, plain, through Ray's log lines (the last ones may come after the
    # driver has left); nothing from the jobs on stdout
    for n in range(3):
        assert re.search(rf"\(_run_job pid=\d+\) job {n}: frames \d+/{FRAMES}", res.stderr)
    assert "\x1b" not in res.stderr and res.stdout == ""

    res = sh(merge, tmp_path, cluster)
    assert res.code == 0, res.stderr
    merged = json.loads(res.stdout)
    assert (merged["frames"], merged["lanes"]) == (3 * FRAMES, 24)
    meta = open_dataset(shared / "pend.h5").meta
    assert [s["seed"] for s in meta["shards"]] == [0, 1, 2]
    assert meta["episodes"] == sum(open_dataset(p).meta["episodes"] for p in shards)
    res = sh(validate, tmp_path, cluster)
    assert res.code == 0 and "is sound" in res.stdout, res.stdout + res.stderr


def test_killed_job_is_reported_and_resume_completes_it(cluster, tmp_path):
    pid_file = tmp_path / "hung.pid"
    shards = [tmp_path / "shards" / f"hang_s{n}.h5" for n in range(3)]
    args = [
        "run",
        "-m",
        "seed=0,1,2",
        *HANG,
        f"+env.kwargs.pid_file={pid_file}",  # the seed=1 job hangs at its 150th step, once
        *TINY,
        "hydra/launcher=ray_cluster",
        f"out={tmp_path}/shards/hang_s${{seed}}.h5",
    ]
    command = [sys.executable, "-m", "collect_cli", *args]
    sweep = subprocess.Popen(
        command, cwd=tmp_path, env=cluster, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
            time.sleep(0.1)
        _wait_for_frames(shards[1], 200)
        # a shard a live job writes is never merged
        refused = sh(f"rlcollect merge {shards[1]} --out {tmp_path}/m.h5", tmp_path, cluster)
        assert refused.code == 2 and "not complete" in refused.stderr, refused.stderr
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the job's process (Ray's worker)
        out, err = sweep.communicate(timeout=180)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    res = Result(sweep.returncode, out.decode(), err.decode())
    assert res.code == 1, res.stderr
    summary = res.summary
    assert (summary["status"], summary["jobs"], summary["failed"]) == ("failed", 3, 1)
    lost = summary["shards"][1]
    assert (lost["job"], lost["exit_code"], lost["status"]) == (1, 1, "failed")
    assert lost["path"] == str(shards[1]) and "seed=1" in lost["overrides"]
    assert "its Ray task failed (WorkerCrashedError" in lost["error"], lost["error"]
    assert "resume=true" in lost["error"]
    errors = [line for line in res.stderr.splitlines() if line.startswith("rlcollect: error:")]
    assert len(errors) == 1 and errors[0].startswith("rlcollect: error: job 1 (seed=1 ")
    assert errors[0].endswith(f"shard {shards[1]}")
    for n in (0, 2):
        assert summary["shards"][n]["exit_code"] == 0
        assert assert_consistent(shards[n])["frames"] == 600
    killed = assert_consistent(shards[1])  # what it committed before the kill is sound
    assert killed["status"] != "complete" and 200 <= killed["frames"] < 600
    before = {n: shards[n].stat().st_mtime_ns for n in (0, 2)}

    res = _run([*command, "resume=true"], tmp_path, cluster)
    assert res.code == 0, res.stderr
    summary = res.summary
    assert (summary["status"], summary["failed"], summary["frames"]) == ("complete", 0, 1800)
    for n, path in enumerate(shards):
        meta = assert_consistent(path)
        assert (meta["seed"], meta["frames"], meta["status"]) == (n, 600, "complete")
    # only the killed job collected anything: the complete shards were left as they were
    assert [summary["shards"][n]["seconds"] for n in (0, 2)] == [0.0, 0.0]
    assert {n: shards[n].stat().st_mtime_ns for n in (0, 2)} == before
    assert summary["shards"][1]["seconds"] > 0


def _wait_for_frames(path: Path, minimum: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if open_dataset(path).meta.get("frames", 0) >= minimum:
                return
        except Exception:
            pass  # not there yet, or caught mid-write
        time.sleep(0.1)
    raise AssertionError(f"{path} holds fewer than {minimum} frames after {timeout} s")


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> Result:
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return Result(proc.returncode, proc.stdout, proc.stderr)
