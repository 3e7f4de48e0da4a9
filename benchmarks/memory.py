"""Peak RSS of ``rlcollect run`` as the run grows: data must stream to disk.

Runs the real CLI in a subprocess for each ``--frames`` value (Pendulum, random
policy, HDF5; the envpool backend with 256 envs when installed, so 1e7 frames
take about a minute here, else gymnasium with 8) and reads the child's peak
resident set size from ``wait4``. Appends a dated record to RESULTS.md.

    python benchmarks/memory.py                     # 1e6 and 1e7 frames
    python benchmarks/memory.py --frames 1e5 1e6 --no-record
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record


def peak_rss(args: list[str]) -> tuple[int, float, str]:
    """(peak RSS in bytes, wall seconds, last stdout line) of ``rlcollect run ARGS``."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "collect_cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"rlcollect run {' '.join(args)} exited {proc.returncode}")
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return usage.ru_maxrss * 1024, time.perf_counter() - start, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", nargs="+", type=float, default=[1e6, 1e7])
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    envpool = importlib.util.find_spec("envpool") is not None
    backend = (
        ["env.backend=envpool", "env.num_envs=256", "frames_per_batch=25600"]
        if envpool
        else ["env.num_envs=8"]
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlcollect-mem-") as tmp:
        for frames in args.frames:
            out = Path(tmp) / "mem.h5"
            run_args = [
                "env=Pendulum",
                *backend,
                f"total_frames={int(frames)}",
                f"out={out}",
                "overwrite=true",
                "progress=none",
            ]
            rss, seconds, summary = peak_rss(run_args)
            size = out.stat().st_size
            rows.append((int(frames), rss, seconds, size))
            print(
                f"{int(frames):>12,d} frames: peak RSS {rss / 2**20:8.1f} MiB, "
                f"{seconds:6.1f} s, file {size / 2**20:8.1f} MiB  {summary}",
                flush=True,
            )
            out.unlink()
    first = rows[0][1]
    for frames, rss, _, _ in rows[1:]:
        print(f"{frames:,d} frames: peak RSS {rss / first:.3f}x the {rows[0][0]:,d}-frame run")
    if args.no_record:
        return
    lines = [
        *record.header("peak RSS"),
        f"Work: `rlcollect run env=Pendulum {' '.join(backend)}` (random policy, hdf5)\n",
        "| frames | peak RSS (MiB) | vs first | wall s | file (MiB) |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {f:,d} | {r / 2**20:.1f} | {r / first:.3f}x | {s:.1f} | {z / 2**20:.1f} |"
        for f, r, s, z in rows
    ]
    record.append(lines)


if __name__ == "__main__":
    main()
