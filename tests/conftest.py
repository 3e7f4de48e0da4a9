"""Shared fixtures: run the real CLI in a subprocess, over every writer backend.

``run_cli`` forks each ``rlcollect`` process from one warmed process per test
worker (tests/support/forkserver.py): a real process running the real CLI, that
does not spend 2-4 s importing torch first. ``fresh=True`` starts a new
interpreter instead, for what depends on start-up."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "support"))
BACKENDS = ("hdf5", "memmap")


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


_SERVER = None
STARTUP_VARS = {"PYTHONPATH", "PYTHONHASHSEED", "OMP_NUM_THREADS"}  # read when Python starts


def pytest_collection_modifyitems(items):
    """Tests marked ``slow`` run first: with ``-n 2`` a long test collected late
    would otherwise run alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _server():
    global _SERVER
    if _SERVER is None:
        from tests.helpers import ForkServer

        _SERVER = ForkServer(Path(tempfile.mkdtemp()), ["env=Pendulum", "progress=none"])
        atexit.register(_SERVER.close)
    return _SERVER


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout=300, fresh=False
) -> Result:
    if not fresh and not STARTUP_VARS & set(env or {}):
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            server = _server()
            pid = server.cli(list(args), cwd or Path.cwd(), env or {}, out, err)
            code = server.wait(pid, timeout)
            return Result(code, out.read_text(), err.read_text())
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "support"), full_env.get("PYTHONPATH", "")]
    )
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


@pytest.fixture
def cli(tmp_path):
    def _run(*args: str, **kw) -> Result:
        kw.setdefault("cwd", tmp_path)
        return run_cli(*args, **kw)

    return _run


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


def out_path(tmp_path: Path, backend: str, name: str = "ds") -> Path:
    return tmp_path / (f"{name}.h5" if backend == "hdf5" else name)
