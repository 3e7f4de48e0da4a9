"""``rlcollect export --format hf``: throughput against pyarrow writing the same
arrays directly, and peak RSS as the dataset grows (the export must stream).

The reference is what a user writes by hand: the episodes' observations, actions,
rewards, flags and traj ids (rlcollect's columns) in memory as numpy arrays, one
``pa.table`` of list columns (one row per episode), one ``pq.write_table``.
rlcollect's export is timed whole (validating and reading the dataset, planning,
writing). Paired rounds, medians. Peak RSS: the CLI in a subprocess per
``--rss-frames`` value, read from ``wait4``.

    python benchmarks/export.py                                  # 2e5 frames, 3 rounds
    python benchmarks/export.py --frames 1e6 --rss-frames 1e5 1e7 --record
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
import record

from collect_cli.dataset import open_dataset
from collect_cli.ops.export import export


def collect(frames: int, out: Path) -> None:
    args = ["env=Pendulum", "env.num_envs=8", f"total_frames={frames}", f"out={out}"]
    cmd = [sys.executable, "-m", "collect_cli", "run", *args, "progress=none"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def episodes_in_memory(path: Path) -> dict[str, list[np.ndarray]]:
    """The dataset's episodes as numpy arrays (what the by-hand writer starts from)."""
    ds = open_dataset(path)
    steps = ds.meta["steps"]
    keys = ("observation", "action", "next/reward", "next/terminated", "next/truncated")
    keys += ("collector/traj_ids",)
    arrays = {k: ds.array(k)[:, :steps] for k in (*keys, "collector/mask")}
    out: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for lane in range(arrays["collector/mask"].shape[0]):
        valid = arrays["collector/mask"][lane]
        ids = arrays["collector/traj_ids"][lane][valid]
        cuts = np.flatnonzero(np.diff(ids)) + 1
        for k in keys:
            out[k] += np.split(arrays[k][lane][valid], cuts)
    return out


def by_hand(episodes: dict[str, list[np.ndarray]], dest: Path) -> None:
    lengths = np.array([len(e) for e in episodes["observation"]])
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

    def column(parts: list[np.ndarray], scalar: bool = False):
        values = np.concatenate(parts)
        if scalar:  # a number a step (rewards, flags)
            return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(len(values))))
        flat = values.reshape(len(values), -1)
        steps = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
        return pa.ListArray.from_arrays(offsets, steps)

    terminals, timeouts = episodes["next/terminated"], episodes["next/truncated"]
    table = pa.table(
        {
            "observations": column(episodes["observation"]),
            "actions": column(episodes["action"]),
            "rewards": column(episodes["next/reward"], scalar=True),
            "dones": column([t | o for t, o in zip(terminals, timeouts, strict=True)], True),
            "terminals": column(terminals, scalar=True),
            "timeouts": column(timeouts, scalar=True),
            "infos.traj_id": column(episodes["collector/traj_ids"], scalar=True),
        }
    )
    pq.write_table(table, dest)


def peak_rss(args: list[str]) -> int:
    proc = subprocess.Popen(
        [sys.executable, "-m", "collect_cli", *args], stdout=subprocess.DEVNULL, stderr=None
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"rlcollect {' '.join(args)} failed")
    return usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, default=2e5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rss-frames", nargs="*", type=float, default=[1e5, 1e6])
    parser.add_argument("--record", action="store_true", help="append to benchmarks/records/")
    args = parser.parse_args()
    frames = int(args.frames)
    lines = []
    with tempfile.TemporaryDirectory(prefix="rlcollect-export-") as tmp:
        tmp = Path(tmp)
        src = tmp / "src.h5"
        collect(frames, src)
        episodes = episodes_in_memory(src)
        times: dict[str, list[float]] = {"by hand": [], "rlcollect": []}
        for _ in range(args.repeat):  # paired rounds
            start = time.perf_counter()
            by_hand(episodes, tmp / "hand.parquet")
            times["by hand"].append(time.perf_counter() - start)
            shutil.rmtree(tmp / "hf", ignore_errors=True)
            start = time.perf_counter()
            export(src, "hf", tmp / "hf")
            times["rlcollect"].append(time.perf_counter() - start)
        hand = statistics.median(times["by hand"])
        lines += [
            f"Pendulum, 8 envs, {frames:,} frames; {args.repeat} paired rounds, medians",
            "",
            "| writer | seconds (median) | rounds | frames/s | x by hand |",
            "|---|---:|---|---:|---:|",
        ]
        for name, key in (
            ("pyarrow by hand (arrays in memory)", "by hand"),
            ("rlcollect", "rlcollect"),
        ):
            value = statistics.median(times[key])
            rounds = ", ".join(f"{t:.2f}" for t in times[key])
            lines.append(
                f"| {name} | {value:.2f} | {rounds} | {frames / value:,.0f} | {hand / value:.2f} |"
            )
        if args.rss_frames:
            lines += [
                "",
                "| frames | peak RSS MiB of `rlcollect export --format hf` |",
                "|---:|---:|",
            ]
            for n in (int(f) for f in args.rss_frames):
                path = tmp / f"rss{n}.h5"
                collect(n, path)
                rss = peak_rss(["export", str(path), "--format", "hf", "--out", str(tmp / f"o{n}")])
                lines.append(f"| {n:,} | {rss / 2**20:,.0f} |")
                path.unlink()
                shutil.rmtree(tmp / f"o{n}")
    print("\n".join(lines))
    if args.record:
        record.append([*record.header("hf export"), "", *lines])


if __name__ == "__main__":
    main()
