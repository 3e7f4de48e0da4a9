"""Pixel observations through the HDF5 writer: write speed and size on disk.

Full ``rlcollect run``s of the toy pixel env (``tests/support/pixelenvs.py``:
flat colour bands and a moving square, uint8 ``size x size x 3``) with each
``writer.compression``; best of ``--repeat`` runs. Prints a Markdown table.
``--writer-only`` times the HDF5 writer alone (batches collected beforehand),
in CPU seconds of this process, which a busy machine disturbs less than wall time.

    python benchmarks/pixels.py                      # 64 and 84 px, none/gzip/lzf
    python benchmarks/pixels.py --sizes 84 --compressions gzip --frames 4e4
    python benchmarks/pixels.py --writer-only
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import h5py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import record


def one_run(size: int, compression: str, frames: int, num_envs: int, out: Path) -> float:
    return record.run_frames_per_s(
        [
            "env=gym",
            "env.id=pixelenvs:Pixels-v0",
            f"+env.kwargs.size={size}",
            f"env.num_envs={num_envs}",
            f"writer.compression={compression}",
            f"total_frames={frames}",
            f"out={out}",
        ]
    )


def collect(size: int, frames: int, num_envs: int) -> list:
    from collect_cli.collectors import SyncCollector
    from collect_cli.envs import env_factory

    make_env = env_factory("pixelenvs:Pixels-v0", num_envs, "gymnasium", {"size": size})
    with SyncCollector(make_env, frames_per_batch=1000, total_frames=frames, seed=0) as c:
        return list(c)


def writer_only(batches: list, compression: str, out: Path) -> tuple[float, float]:
    """CPU and wall seconds of the HDF5 writer alone: open, append + commit, close."""
    from collect_cli.writers import make_writer

    cpu, wall = time.process_time(), time.perf_counter()
    writer = make_writer(
        "hdf5", out, metadata={}, overwrite=True, compression=compression, chunk_frames=1024
    ).open()
    for batch in batches:
        writer.append(batch)
        writer.commit()
    writer.close()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, default=16000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 84])
    parser.add_argument("--compressions", nargs="+", default=["none", "gzip", "lzf"])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--writer-only", action="store_true")
    args = parser.parse_args()
    frames = int(args.frames)
    tmp = Path(tempfile.mkdtemp(prefix="rlcollect-pixels-"))
    if args.writer_only:
        print("| image | compression | writer CPU s | writer wall s | MB/CPU s | MB on disk |")
        print("|---|---|---:|---:|---:|---:|")
        try:
            for size in args.sizes:
                batches = collect(size, frames, args.num_envs)
                raw = sum(
                    b["observation"].numel() + b["next", "observation"].numel() for b in batches
                )
                for compression in args.compressions:
                    out = tmp / "w.h5"
                    cpu, wall = min(
                        writer_only(batches, compression, out) for _ in range(args.repeat)
                    )
                    print(
                        f"| {size}x{size}x3 | {compression} | {cpu:.2f} | {wall:.2f} "
                        f"| {raw / 1e6 / cpu:,.0f} | {out.stat().st_size / 1e6:,.1f} |",
                        flush=True,
                    )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    print("| image | compression | frames/s | MB on disk | raw MB | raw/disk | obs chunk |")
    print("|---|---|---:|---:|---:|---:|---|")
    try:
        for size in args.sizes:
            for compression in args.compressions:
                out = tmp / "p.h5"
                fps = max(
                    one_run(size, compression, frames, args.num_envs, out)
                    for _ in range(args.repeat)
                )
                with h5py.File(out, "r") as f:
                    raw = sum(f[k].nbytes for k in ("observation", "next/observation", "action"))
                    chunks = f["observation"].chunks
                disk = out.stat().st_size
                print(
                    f"| {size}x{size}x3 | {compression} | {fps:,.0f} | {disk / 1e6:,.1f} "
                    f"| {raw / 1e6:,.1f} | {raw / disk:.1f}x | {chunks} |",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
