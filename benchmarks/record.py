"""Shared by the benchmark scripts: the machine line and the dated records.

Each record is appended to the month's file, ``benchmarks/records/YYYY-MM.md``
(created when missing). ``benchmarks/RESULTS.md`` holds only the current figure
of each target, kept by hand from these records.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")  # the current figures, by hand
RECORDS = Path(__file__).with_name("records")  # the dated records, a file a month
_DATED = re.compile(r"^\s*## (\d{4}-\d{2})-\d{2}\b")


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


def records_file(lines: Iterable[str] = ()) -> Path:
    """The month's records file: the month of the record's ``## YYYY-MM-DD``
    heading (see :func:`header`), else this month."""
    month = next((m.group(1) for line in lines if (m := _DATED.match(line))), None)
    return RECORDS / f"{month or dt.date.today().strftime('%Y-%m')}.md"


def append(lines: list[str]) -> Path:
    """Append a dated record (``lines``, from :func:`header` on) to the month's
    file in ``benchmarks/records/``, creating the file when missing."""
    path = records_file(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        if fh.tell() == 0:
            fh.write(
                f"# Benchmark records, {path.stem}\n\n"
                "Dated records, appended by the scripts in `benchmarks/` (`record.py`);\n"
                "figures as measured. The current figure of each target: `../RESULTS.md`.\n"
            )
        fh.write("\n".join(lines) + "\n")
    print(f"recorded in {path}")
    return path


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
