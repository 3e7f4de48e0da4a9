"""Running the real ``rlcollect`` from tests: :func:`run_cli` forks each process
from one warmed process per test worker (``forkserver.py``: a real process running
the real CLI, that does not spend 2-4 s importing torch first); ``fresh=True``
starts a new interpreter instead, for what depends on start-up. :func:`start_run`
starts a run in the background; :class:`ForkServer` starts many, for tests that
signal them. Test envs and policies (this folder) are importable in every one."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from collect_cli.dataset.backend import BACKENDS as STORAGE

SUPPORT = Path(__file__).parent
BACKENDS = tuple(STORAGE)  # every storage backend: the `backend` fixture's values
STARTUP_VARS = {"PYTHONPATH", "PYTHONHASHSEED", "OMP_NUM_THREADS"}  # read when Python starts


def out_path(tmp_path: Path, backend: str, name: str = "ds") -> Path:
    """Where a dataset of ``backend`` named ``name`` goes (its default suffix)."""
    return tmp_path / f"{name}{STORAGE[backend].suffix}"


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict:
        lines = self.stdout.strip().splitlines()
        assert lines, f"no stdout; stderr was:\n{self.stderr}"
        return json.loads(lines[-1])


def start_run(args: list[str], cwd: Path, **popen: object) -> subprocess.Popen:
    """``rlcollect run ARGS`` as a background process (test envs importable)."""
    env = dict(os.environ, PYTHONPATH=str(SUPPORT))
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-m", "collect_cli", "run", *args], cwd=cwd, env=env, text=True, **popen
    )


class ForkServer:
    """``rlcollect run`` processes forked from one warmed process
    (support/forkserver.py): none pays the 2-4 s a new interpreter spends on
    imports. Each run is in its own session: ``os.killpg(pid, sig)``."""

    started: ClassVar[list[ForkServer]] = []

    def __init__(self, cwd: Path, warm_args: list[str]):
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "forkserver.py"), *warm_args],
            cwd=cwd,
            env=dict(os.environ, PYTHONPATH=str(SUPPORT)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lock = threading.Lock()
        ForkServer.started.append(self)

    def _ask(self, **request: object) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:  # one request and its reply at a time, whichever thread asks
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        assert reply, f"the fork server exited ({self.proc.wait()})"
        return json.loads(reply)

    def start(self, args: list[str], log: Path) -> int:
        """Start ``rlcollect run ARGS`` (its output into ``log``); its pid."""
        return self._ask(run=args, log=str(log))["pid"]

    def cli(self, args: list[str], cwd: Path, env: dict, out: Path, err: Path) -> int:
        """Start ``rlcollect ARGS`` in ``cwd`` with ``env`` added; its pid."""
        return self._ask(cli=list(args), cwd=str(cwd), env=env, out=str(out), err=str(err))["pid"]

    def poll(self, pid: int) -> int | None:
        return self._ask(poll=pid)["code"]

    def wait(self, pid: int, timeout: float | None = None) -> int:
        """The run's exit status (negative: the signal that ended it); past
        ``timeout`` seconds it is killed and ``subprocess.TimeoutExpired`` raised."""
        if timeout is None:
            return self._ask(wait=pid)["code"]
        deadline = time.monotonic() + timeout
        while (code := self.poll(pid)) is None:
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                self.wait(pid)
                raise subprocess.TimeoutExpired(f"rlcollect (pid {pid})", timeout)
            time.sleep(0.02)
        return code

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SERVER: ForkServer | None = None


_SERVER_LOCK = threading.Lock()  # two threads' first run_cli would start two servers


def server() -> ForkServer:
    """This test process's fork server (started on first use)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = ForkServer(Path(tempfile.mkdtemp()), ["env=Pendulum", "progress=none"])
            atexit.register(_SERVER.close)
    return _SERVER


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout=300, fresh=False
) -> Result:
    """``rlcollect ARGS`` in ``cwd`` with ``env`` added: its exit code and output."""
    if not fresh and not STARTUP_VARS & set(env or {}):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            pid = server().cli(list(args), cwd or Path.cwd(), env or {}, out, err)
            code = server().wait(pid, timeout)
            return Result(code, out.read_text(), err.read_text())
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "collect_cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
