"""``rlcollect filter`` and ``split``: copy speed against a plain h5py copy of the
same frames.

The reference is what a user writes by hand with h5py: open the dataset, pick the
kept episodes' frames (``collector/mask`` and ``collector/traj_ids`` in the kept
set), and write each frame key's selected frames to a new file, one
``create_dataset`` a key, whole arrays in memory. It writes no episodes table,
metadata or sources (rlcollect's do). rlcollect is timed whole (validating the
input, choosing, copying through the writer, renaming into place). Paired rounds,
medians; ratio = by-hand seconds / rlcollect seconds (>= 0.5x is the target).

    python benchmarks/family.py                      # 1e6 Pendulum frames, 3 rounds
    python benchmarks/family.py --frames 1e6 --repeat 5 --record
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import record

from collect_cli.dataset import open_dataset
from collect_cli.ops.derive import filter_dataset, split_dataset
from collect_cli.ops.select import Conditions


def collect(frames: int, out: Path) -> None:
    args = ["env=Pendulum", "env.num_envs=8", f"total_frames={frames}", f"out={out}"]
    cmd = [sys.executable, "-m", "collect_cli", "run", *args, "progress=none"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def by_hand(src: Path, kept_ids: np.ndarray, out: Path) -> int:
    """The kept episodes' frames, key by key, with h5py; the frames written."""
    with h5py.File(src, "r") as f, h5py.File(out, "w") as g:
        traj, mask = f["collector/traj_ids"][()], f["collector/mask"][()]
        sel = mask & np.isin(traj, kept_ids)
        keys = []
        f.visititems(lambda n, o: keys.append(n) if isinstance(o, h5py.Dataset) else None)
        for key in keys:
            if not key.startswith("episodes/"):
                g.create_dataset(key, data=f[key][()][sel])
        return int(sel.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, default=1e6)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="append to benchmarks/records/")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    try:
        src = tmp / "src.h5"
        collect(int(args.frames), src)
        rows = open_dataset(src).episodes()
        half = Conditions(top=0.5)
        kept_top = rows["traj_id"][half.choose(rows, [{}])]
        times: dict[str, list[float]] = {k: [] for k in ("filter", "hand", "split", "hand2")}
        frames = {}
        for i in range(args.repeat):
            for name, fn, arg, out in (
                ("filter", filter_dataset, half, f"f{i}.h5"),
                ("hand", by_hand, kept_top, f"h{i}.h5"),
                ("split", lambda s, o, v: split_dataset(s, o, v), 0.1, f"s{i}"),
                ("hand2", by_hand, rows["traj_id"], f"h2{i}.h5"),
            ):
                start = time.perf_counter()
                result = fn(src, arg, tmp / out) if fn is by_hand else fn(src, tmp / out, arg)
                times[name].append(time.perf_counter() - start)
                frames[name] = result if isinstance(result, int) else result.get("frames")
            for p in tmp.glob(f"[fhs]*{i}*"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        med = {k: statistics.median(v) for k, v in times.items()}
        lines = [
            f"Source: {int(args.frames):,} Pendulum frames, 8 envs, hdf5; {args.repeat} rounds.",
            "",
            "| job | rlcollect s | h5py by hand s | frames | ratio (by hand / rlcollect) |",
            "|---|---|---|---|---|",
            f"| filter --top 0.5 | {med['filter']:.3f} | {med['hand']:.3f} | "
            f"{frames['hand']:,} | {med['hand'] / med['filter']:.2f}x |",
            f"| split --val 0.1 (both halves) | {med['split']:.3f} | {med['hand2']:.3f} | "
            f"{frames['hand2']:,} | {med['hand2'] / med['split']:.2f}x |",
        ]
        print("\n".join(lines))
        if args.record:
            record.append([*record.header("filter and split"), "", *lines])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
