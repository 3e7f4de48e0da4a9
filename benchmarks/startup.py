"""Start-up time of the CLI: ``rlcollect --help`` and ``--version``, wall seconds.

Each command runs ``--runs`` times in a fresh process, in turn with a bare
``python -c pass`` (the interpreter's own start-up, the floor); medians reported.

    python benchmarks/startup.py
    python benchmarks/startup.py --runs 21 --no-record
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument(
        "--no-record", action="store_true", help="do not append to benchmarks/records/"
    )
    args = parser.parse_args()
    exe = shutil.which("rlcollect") or str(Path(sys.executable).with_name("rlcollect"))
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "rlcollect --help": [exe, "--help"],
        "rlcollect --version": [exe, "--version"],
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    loads = [os.getloadavg()[0]]
    for _ in range(args.runs):
        for name, cmd in cases.items():
            times[name].append(wall(cmd))
    loads.append(os.getloadavg()[0])
    rows = [(name, statistics.median(v), min(v), max(v)) for name, v in times.items()]
    for name, med, lo, hi in rows:
        print(f"{name:22s} median {med:.3f} s (min {lo:.3f}, max {hi:.3f})")
    load = f"1-minute load average {min(loads):.2f}-{max(loads):.2f}"
    print(load)
    if args.no_record:
        return
    lines = [
        *record.header("CLI start-up"),
        f"Work: {args.runs} runs of each command in turn, wall seconds  ",
        f"Load: {load}\n",
        "| command | median | min | max |",
        "|---|---:|---:|---:|",
        *(f"| `{n}` | {m:.3f} s | {lo:.3f} s | {hi:.3f} s |" for n, m, lo, hi in rows),
    ]
    record.append(lines)


if __name__ == "__main__":
    main()
