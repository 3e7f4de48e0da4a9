"""Peak RSS of ``rlcollect run`` as the run grows: data must stream to disk.

Runs the real CLI in a subprocess for each ``--frames`` value and writer
(Pendulum, random policy, hdf5 and memmap; the envpool backend with 256 envs
when installed, so 1e7 frames take about 30 s here, else gymnasium with 8) and
reads the child's peak resident set size from ``wait4``. Appends a dated record
to the month's file, ``benchmarks/records/YYYY-MM.md``.

    python benchmarks/memory.py                     # 1e6 and 1e7 frames, both writers
    python benchmarks/memory.py --frames 1e5 1e6 --writers memmap --no-record
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
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
    parser.add_argument("--writers", nargs="+", default=["hdf5", "memmap"])
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
        for writer in args.writers:
            for frames in args.frames:
                out = Path(tmp) / f"mem.{writer}"
                run_args = [
                    "env=Pendulum",
                    *backend,
                    f"total_frames={int(frames)}",
                    f"writer={writer}",
                    f"out={out}",
                    "overwrite=true",
                    "progress=none",
                ]
                rss, seconds, summary = peak_rss(run_args)
                files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file()]
                size = sum(p.stat().st_size for p in files)
                rows.append((writer, int(frames), rss, seconds, size))
                print(
                    f"{writer:>6} {int(frames):>12,d} frames: peak RSS {rss / 2**20:8.1f} MiB, "
                    f"{seconds:6.1f} s, data {size / 2**20:8.1f} MiB  {summary}",
                    flush=True,
                )
                shutil.rmtree(out) if out.is_dir() else out.unlink()
    first = {}
    for writer, frames, rss, _, _ in rows:
        first.setdefault(writer, (frames, rss))
        base_frames, base = first[writer]
        if frames != base_frames:
            print(
                f"{writer}: {frames:,d} frames: peak RSS {rss / base:.3f}x "
                f"the {base_frames:,d}-frame run"
            )
    if args.no_record:
        return
    lines = [
        *record.header("peak RSS"),
        f"Work: `rlcollect run env=Pendulum {' '.join(backend)} writer=W` (random policy)\n",
        "| writer | frames | peak RSS (MiB) | vs first | wall s | data (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {w} | {f:,d} | {r / 2**20:.1f} | {r / first[w][1]:.3f}x | {s:.1f} | {z / 2**20:.1f} |"
        for w, f, r, s, z in rows
    ]
    record.append(lines)


if __name__ == "__main__":
    main()
