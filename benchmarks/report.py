"""Time and peak RSS of ``rlcollect report`` on big datasets: it must read in bounded memory.

For each ``--frames`` value and writer, collects a Pendulum dataset with the
native backend (4096 batched torch envs: millions of frames a second), then
runs ``rlcollect report`` on it in a subprocess and reads the child's wall time
and peak resident set size from ``wait4``. The datasets are deleted afterwards.
Target (issue 21): 1e7 frames in <= 30 s and <= 1 GiB peak RSS. Appends a dated
record to the month's file, ``benchmarks/records/YYYY-MM.md``.

    python benchmarks/report.py                     # 1e6 and 1e7 frames, hdf5 and memmap
    python benchmarks/report.py --frames 1e6 --writers memmap --no-record
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record

TARGET_S, TARGET_RSS = 30.0, 1 << 30
ENVS = 4096


def rlcollect(args: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of ``rlcollect ARGS`` in a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "collect_cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"rlcollect {' '.join(args)} failed:\n{err}")
    return seconds, usage.ru_maxrss * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", nargs="+", default=["1e6", "1e7"])
    parser.add_argument("--writers", nargs="+", default=["hdf5", "memmap"])
    parser.add_argument(
        "--no-record", action="store_true", help="do not append to benchmarks/records/"
    )
    args = parser.parse_args()

    rows = []
    work = Path(tempfile.mkdtemp(prefix="rlcollect-report-bench-"))
    try:
        for frames in args.frames:
            for writer in args.writers:
                data = work / (f"pendulum-{frames}.h5" if writer == "hdf5" else f"pend-{frames}")
                run_args = [
                    "run", "env=Pendulum", "env.backend=native", f"env.num_envs={ENVS}",
                    f"total_frames={frames}", f"frames_per_batch={ENVS * 100}",
                    f"writer={writer}", f"out={data}", "progress=none",
                ]  # fmt: skip
                collect_s, _ = rlcollect(run_args)
                size = sum(p.stat().st_size for p in [data, *data.rglob("*")] if p.is_file())
                page = work / f"report-{writer}-{frames}.html"
                seconds, rss = rlcollect(["report", str(data), "--out", str(page)])
                ok = seconds <= TARGET_S and rss <= TARGET_RSS
                rows.append(
                    f"| {float(frames):.0e} | {writer} | {size / 2**20:,.0f} MiB | "
                    f"{collect_s:.1f} | **{seconds:.1f}** | **{rss / 2**20:,.0f} MiB** | "
                    f"{page.stat().st_size / 2**10:,.0f} KiB | {'yes' if ok else 'NO'} |"
                )
                print(rows[-1], flush=True)
                shutil.rmtree(data) if data.is_dir() else data.unlink()
    finally:
        shutil.rmtree(work)
    lines = [
        *record.header("rlcollect report: time and peak RSS"),
        "",
        f"Pendulum, native backend, {ENVS} envs, random policy, page cache warm (just "
        "written); report = the whole `rlcollect report PATH --out page.html` process "
        "(imports included), peak RSS from wait4. Target: 1e7 frames in <= 30 s, <= 1 GiB.",
        "",
        "| frames | writer | dataset | collect s | report s | report peak RSS | page | target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]
    print("\n".join(lines))
    if not args.no_record:
        record.append(lines)


if __name__ == "__main__":
    main()
