"""What a tired user or an overlapping cron job does to an output, with real processes:
a second writer on a live output, overwrite of the wrong path, a merge onto its own
inputs, a stop signal at any moment, a full disk (docs/durability.md, D9, D17-D21)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent
from tests.support.cli_runner import out_path, start_run

SLOW = [
    "env=gym",
    "env.id=toyenvs:Slow-v0",
    "+env.kwargs.delay=0.002",
    "env.num_envs=2",
    "frames_per_batch=50",
]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def one_error(res, code: int, text: str) -> None:
    assert res.code == code, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0] and "Traceback" not in res.stderr, res.stderr


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# -- one writer per output (D17) ------------------------------------------------------


@pytest.mark.slow
def test_second_writers_on_a_live_output_exit_2_and_the_live_run_completes_whole(
    cli, tmp_path, backend
):
    out = out_path(tmp_path, backend)
    other = out_path(tmp_path, backend, "other")
    assert cli("run", "total_frames=200", f"writer={backend}", f"out={other}").code == 0
    total = 3000
    live = start_run([*SLOW, f"total_frames={total}", f"writer={backend}", f"out={out}"], tmp_path)
    wait_for(out, live)
    common = [*SLOW, "total_frames=500", f"writer={backend}", f"out={out}", "progress=none"]
    for extra in (["overwrite=true"], ["resume=true"], []):
        res = cli("run", *common, *extra)
        one_error(res, 2, f"{str(out)!r} is being written by pid {live.pid} (rlcollect run")
        assert last_json(res.stdout)["status"] == "failed"
        assert last_json(res.stdout)["exit_code"] == 2
    res = cli("merge", str(other), "--out", str(out), "--overwrite")
    one_error(res, 2, "is being written by pid")
    stdout, stderr = live.communicate(timeout=120)
    assert live.returncode == 0, stderr
    assert last_json(stdout)["status"] == "complete"
    meta = assert_consistent(out)
    assert meta["frames"] == total and meta["status"] == "complete"
    assert not list(tmp_path.glob(".*.lock")), "the lock file outlived the run"


@pytest.mark.slow
def test_two_runs_started_at_once_one_writes_the_other_is_refused(tmp_path):
    out = tmp_path / "ds.h5"
    args = [*SLOW, "total_frames=1000", f"out={out}", "progress=none"]
    procs = [start_run([*args, f"seed={seed}"], tmp_path) for seed in (0, 1)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, _, err in results if code == 2)
    assert "is being written by pid" in refused or "already exists" in refused
    winner = last_json(next(stdout for code, stdout, _ in results if code == 0))
    meta = assert_consistent(out)
    assert winner["status"] == "complete" and meta["frames"] == winner["frames"] == 1000


# -- overwrite replaces only an rlcollect dataset (D18) -------------------------------


def test_overwrite_refuses_what_rlcollect_did_not_write(cli, tmp_path):
    users = tmp_path / "u"
    users.mkdir()
    (users / "thesis.txt").write_text("four years")
    plain = tmp_path / "notes.txt"
    plain.write_text("mine")
    work = tmp_path / "work"
    work.mkdir()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    before = listing(tmp_path)
    cases = [
        (users, "is a directory with 1 entry and not an rlcollect dataset"),
        (plain, "is a file and not an rlcollect dataset"),
        (fifo, "is a FIFO: not replacing it"),
        (Path(".."), "is the working directory or one of its parents"),
        (Path("."), "is the working directory or one of its parents"),
        (tmp_path, "is the working directory or one of its parents"),
    ]
    for target, text in cases:
        res = cli("run", "total_frames=200", f"out={target}", "overwrite=true", cwd=work)
        one_error(res, 2, text)
    assert listing(tmp_path) == before
    assert (users / "thesis.txt").read_text() == "four years" and plain.read_text() == "mine"


def test_overwrite_replaces_an_rlcollect_dataset_of_either_backend(cli, tmp_path):
    out = tmp_path / "ds"
    assert cli("run", "total_frames=1000", "writer=memmap", f"out={out}").code == 0
    res = cli("run", "total_frames=2000", "writer=hdf5", f"out={out}", "overwrite=true")
    assert res.code == 0, res.stderr
    assert out.is_file() and assert_consistent(out)["frames"] == 2000


def test_cfg_job_shows_out_resolved(cli, tmp_path):
    res = cli("run", "--cfg", "job", "env=CartPole", "seed=3")
    assert res.code == 0, res.stderr
    assert "out: data/CartPole-v1_random_s3.h5" in res.stdout.splitlines()


# -- merges and exports never eat their inputs (D18) ----------------------------------


def test_merge_refuses_its_shards_folder_and_what_a_virtual_merge_reads(cli, tmp_path):
    shards = tmp_path / "sh"
    shards.mkdir()
    for seed in (0, 1):
        assert cli("run", "total_frames=200", f"seed={seed}", f"out=sh/s{seed}.h5").code == 0
    assert cli("run", "total_frames=200", "seed=5", "out=x.h5").code == 0
    res = cli("merge", "sh/s0.h5", "sh/s1.h5", "--out", "sh", "--overwrite")
    one_error(res, 2, "overlaps the source dataset")
    assert cli("merge", "sh/s0.h5", "sh/s1.h5", "--out", "c.h5").code == 0
    with h5py.File(tmp_path / "sh/s0.h5") as f:
        kept = np.asarray(f["observation"])
    res = cli("merge", "c.h5", "x.h5", "--out", "sh/s0.h5", "--overwrite")
    one_error(res, 2, "overlaps the source dataset")  # c.h5 reads sh/s0.h5
    res = cli("export", "c.h5", "--format", "d4rl", "--out", "sh/s1.h5", "--overwrite")
    one_error(res, 2, "overlaps the source dataset")
    for name in ("sh/s0.h5", "sh/s1.h5", "c.h5"):
        assert_consistent(tmp_path / name)
    with h5py.File(tmp_path / "sh/s0.h5") as f:
        np.testing.assert_array_equal(f["observation"], kept)


def test_exports_and_reports_replace_only_their_own_kind(cli, tmp_path):
    assert cli("run", "total_frames=200", "out=ds.h5").code == 0
    (tmp_path / "notes.txt").write_text("mine")
    res = cli("export", "ds.h5", "--format", "d4rl", "--out", "notes.txt", "--overwrite")
    one_error(res, 2, "is a file and not a D4RL file rlcollect exported")
    assert cli("export", "ds.h5", "--format", "d4rl", "--out", "d.hdf5").code == 0
    assert cli("export", "ds.h5", "--format", "d4rl", "--out", "d.hdf5", "--overwrite").code == 0
    res = cli("card", "ds.h5", "--out", "notes.txt", "--overwrite")
    one_error(res, 2, "is a file and not a card")
    assert cli("card", "ds.h5", "--out", "card.md").code == 0
    assert cli("card", "ds.h5", "--out", "card.md", "--overwrite").code == 0
    pngs = tmp_path / "pics"
    pngs.mkdir()
    (pngs / "holiday.png").write_bytes(b"\x89PNG")
    res = cli("report", "ds.h5", "--format", "png", "--out", "pics", "--overwrite")
    one_error(res, 2, "not a folder of report figures")
    assert (pngs / "holiday.png").read_bytes() == b"\x89PNG"
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_leftovers_of_killed_merges_and_exports_are_removed_by_the_next_one(cli, tmp_path):
    assert cli("run", "total_frames=200", "out=ds.h5").code == 0
    dead = 2**22 + 12345  # above the default pid_max: no such process
    for name in (f".m.h5.merging-{dead}", f".e.hdf5.tmp-{dead}"):
        (tmp_path / name).write_bytes(b"half")
    assert cli("merge", "ds.h5", "--out", "m.h5").code == 0
    assert cli("export", "ds.h5", "--format", "d4rl", "--out", "e.hdf5").code == 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


# -- readers: paths that are not datasets ---------------------------------------------


def test_paths_that_are_not_datasets_exit_2_with_one_line(cli, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "bare").mkdir()
    long = "x" * 5000 + ".h5"
    for path, text in (
        ("pipe", "is a FIFO, not a dataset"),
        ("loop1", "Too many levels of symbolic links"),
        ("bare", "without rlcollect.json: not a dataset"),
        (long, "File name too long"),
    ):
        for command in (["info"], ["validate"], ["card"], ["report", "--json"]):
            res = cli(*command, path, timeout=30)
            if command == ["validate"] and path == "bare":  # a folder: validate says why
                assert res.code == 1 and text in res.stdout, (res.stdout, res.stderr)
                continue
            one_error(res, 2, text)
    res = cli("run", "total_frames=200", f"out={long}")
    one_error(res, 2, "File name too long")


# -- every run prints its JSON line --------------------------------------------------


def test_a_refused_run_prints_its_json_line_and_creates_nothing(cli, tmp_path):
    res = cli("run", "total_frames=200", "env=Nope", "out=ds.h5")
    assert res.code == 2
    line = last_json(res.stdout)
    assert line["status"] == "failed" and line["exit_code"] == 2 and "Nope" in line["error"]
    assert list(tmp_path.iterdir()) == []


# -- stop signals at any moment (D21) -------------------------------------------------


def session_members(sid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    members.append(int(entry.name))
    return members


def strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not strace_works(), reason="strace is missing or may not trace here")
@pytest.mark.parametrize("collector", ["sync", "multisync"])
def test_a_stop_signal_at_the_fork_exits_130_within_5s_with_no_orphan(tmp_path, collector):
    """The first fork (``clone``) of a run is its writer process's (sync) or its first
    worker's (multisync); SIGINT is injected right there."""
    out = tmp_path / "ds.h5"
    strace = ["strace", "-f", "-o", os.devnull, "-e", "trace=clone"]
    inject = ["-e", "inject=clone:signal=SIGINT:when=1"]
    run = [str(Path(sys.executable).with_name("rlcollect")), "run", "total_frames=2e4"]
    proc = subprocess.Popen(
        [*strace, *inject, *run, f"collector={collector}", f"out={out}", "progress=none"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["rlcollect: error: interrupted"], stderr
    assert last_json(stdout)["status"] == "interrupted"
    time.sleep(0.2)
    assert session_members(proc.pid) == [], "processes outlived the run"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.8, 1.5, 2.5])
def test_sigterm_during_start_up_exits_130_with_one_line(tmp_path, delay):
    # endless: the signal comes in start-up or in collection, never after the end
    proc = start_run(["total_frames=-1", "out=ds.h5", "progress=none"], tmp_path)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["rlcollect: error: interrupted"] or (
        "SIGTERM received" in stderr
    ), stderr
    assert last_json(stdout)["status"] == "interrupted"


# -- a full disk (D9) -----------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where it cannot be mounted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_export_and_merge_onto_a_full_disk_exit_1_and_leave_nothing(cli, tmp_path, full_disk):
    for name, writer in (("a.h5", "hdf5"), ("b.h5", "hdf5"), ("ma", "memmap"), ("mb", "memmap")):
        seed = len(name)
        args = ["total_frames=2e4", f"writer={writer}", f"seed={seed}", f"out={name}"]
        assert cli("run", *args).code == 0
    before = {p: open_dataset(tmp_path / p).meta["frames"] for p in ("a.h5", "ma")}
    for command in (
        ["export", "a.h5", "--format", "d4rl", "--out", f"{full_disk}/e.hdf5"],
        ["merge", "a.h5", "b.h5", "--copy", "--out", f"{full_disk}/m.h5"],
        ["merge", "ma", "mb", "--out", f"{full_disk}/mm"],
    ):
        res = cli(*command)
        one_error(res, 1, "No space left on device")
        assert "nothing was written" in res.stderr
        assert os.listdir(full_disk) == [], os.listdir(full_disk)
    for name, frames in before.items():
        assert assert_consistent(tmp_path / name)["frames"] == frames


# -- resume continues only what validates (D20) ---------------------------------------


def test_resume_refuses_a_dataset_that_fails_validation(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    args = [*SLOW, f"writer={backend}", f"out={out}", "progress=none"]
    run = start_run([*args, "total_frames=-1"], tmp_path)
    wait_for(out, run)
    time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 130
    meta = assert_consistent(out)
    if backend == "memmap":  # the metadata claims more frames than the files hold
        path = out / "rlcollect.json"
        data = json.loads(path.read_text())
        data["frames"] += 1000
        path.write_text(json.dumps(data))
    else:  # an episode's `complete` flag flipped
        with h5py.File(out, "r+", locking=False) as f:
            f["episodes/complete"][0] = not f["episodes/complete"][0]
    assert cli("validate", str(out)).code == 1
    res = cli("run", *args, "total_frames=5000", "resume=true")
    one_error(res, 2, "cannot resume")
    assert "fails validation" in res.stderr
    assert open_dataset(out).meta["status"] == meta["status"] == "interrupted"
