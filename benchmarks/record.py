"""Shared by the benchmark scripts: the machine line and dated RESULTS.md records."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    python = platform.python_version()
    return f"{os.cpu_count()} cores, {cpu}, Python {python}, torch {torch.__version__}"


def header(title: str = "", machine_line: str | None = None) -> list[str]:
    """Heading (date, commit, title), the command that ran and the machine
    (``machine_line``, default :func:`machine`)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    script = Path(sys.argv[0]).name
    suffix = f": {title}" if title else ""
    return [
        f"\n## {dt.date.today().isoformat()} ({commit or 'uncommitted'}){suffix}\n",
        f"Command: `python benchmarks/{script} {' '.join(sys.argv[1:])}`".rstrip() + "  ",
        f"Machine: {machine_line or machine()}  ",
    ]


def append(lines: list[str]) -> None:
    with RESULTS.open("a") as fh:
        if fh.tell() == 0:
            fh.write("# Benchmark results\n\nAppended by `make bench`; figures as measured.\n")
        fh.write("\n".join(lines) + "\n")
    print(f"recorded in {RESULTS}")


def run_frames_per_s(overrides: list[str]) -> float:
    """Frames per second of a whole ``rlcollect run OVERRIDES`` in this process
    (collector, episodes table, writer, commits, close's fsync), progress off,
    ``out`` replaced. The disk starts idle: what earlier runs wrote is synced first,
    or a run would also wait for their pages at its own fsync."""
    from collect_cli import config
    from collect_cli.run import run

    os.sync()
    result = run(config.load(config.compose([*overrides, "overwrite=true", "progress=none"])))
    return result.frames / result.seconds
