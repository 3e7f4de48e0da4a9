"""Shared fixtures: run the real CLI in a subprocess, over every writer backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout=300) -> Result:
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
