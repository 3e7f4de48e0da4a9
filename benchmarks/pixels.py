"""Pixel observations through the HDF5 writer: write speed and size on disk.

Full ``rlcollect run``s of the toy pixel env (``tests/support/pixelenvs.py``:
flat colour bands and a moving square, uint8 ``size x size x 3``) with each
``writer.compression``; best of ``--repeat`` runs. Prints a Markdown table.
``--writer-only`` times the HDF5 writer alone (batches collected beforehand),
in CPU seconds of this process, which a busy machine disturbs less than wall time.

    python benchmarks/pixels.py                      # 64 and 84 px, none/gzip/lzf
    python benchmarks/pixels.py --sizes 84 --compressions gzip --frames 4e4
    python benchmarks/pixels.py --writer-only

Atari Pong (issue 19), paired rounds in this process, medians: the bare loop a
user writes (gymnasium ``SyncVectorEnv`` of ``ALE/Pong-v5``, or envpool's
``Pong-v5`` 4x84x84 stacks, random actions, storing nothing), then ``rlcollect
run`` with each codec (``codec`` or ``codec@level``); bytes on disk per frame
and the ratio to one observation. ``--rss`` instead runs ``rlcollect run`` in a
subprocess per ``--frames`` value and reports its peak RSS.

    python benchmarks/pixels.py --pong --frames 8000 --compressions none zstd@1 lz4
    python benchmarks/pixels.py --pong --envpool --num-envs 8 --compressions zstd@1
    python benchmarks/pixels.py --pong --rss --frames 5e4 1.5e5 --compressions zstd@1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

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
    from collect_cli.dataset import make_writer

    cpu, wall = time.process_time(), time.perf_counter()
    writer = make_writer(
        "hdf5", out, metadata={}, overwrite=True, compression=compression, chunk_frames=1024
    ).open()
    for batch in batches:
        writer.append(batch)
        writer.commit()
    writer.close()
    return time.process_time() - cpu, time.perf_counter() - wall


def pong_overrides(envpool: bool, num_envs: int, codec: str, frames: int, out: Path) -> list:
    name, _, level = codec.partition("@")
    env = ["env.id=Pong-v5", "env.backend=envpool"] if envpool else ["env.id=ale_py:ALE/Pong-v5"]
    return [
        "env=gym",
        *env,
        f"env.num_envs={num_envs}",
        f"writer.compression={name}",
        *([f"writer.compression_level={level}"] if level else []),
        f"total_frames={frames}",
        f"out={out}",
    ]


def bare_pong(envpool: bool, num_envs: int, frames: int) -> float:
    """Frames/s of the loop a user writes by hand: random actions, nothing stored."""
    import gymnasium as gym

    if envpool:
        import envpool as ep

        env = ep.make("Pong-v5", env_type="gymnasium", num_envs=num_envs, seed=0)
        env.reset()
    else:
        import ale_py

        gym.register_envs(ale_py)
        env = gym.make_vec("ALE/Pong-v5", num_envs=num_envs, vectorization_mode="sync")
        env.reset(seed=0)
    n = int(env.action_space.n if envpool else env.single_action_space.n)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(frames // num_envs):
        env.step(rng.integers(0, n, num_envs, dtype=np.int32))  # envpool takes int32
    seconds = time.perf_counter() - start
    env.close()
    return frames // num_envs * num_envs / seconds


def pong(args) -> None:
    import statistics

    frames = int(args.frames[0])
    tmp = Path(tempfile.mkdtemp(prefix="rlcollect-pong-"))
    kind = "envpool Pong-v5" if args.envpool else "gymnasium ALE/Pong-v5"
    fps: dict[str, list[float]] = {"bare": []}
    size: dict[str, float] = {}
    try:
        for _ in range(args.repeat):  # paired: every contender once a round
            fps["bare"].append(bare_pong(args.envpool, args.num_envs, frames))
            for codec in args.compressions:
                out = tmp / "p.h5"
                fps.setdefault(codec, []).append(
                    record.run_frames_per_s(
                        pong_overrides(args.envpool, args.num_envs, codec, frames, out)
                    )
                )
                with h5py.File(out, "r") as f:
                    obs = int(np.prod(f["observation"].shape[2:]))
                size[codec] = out.stat().st_size / frames
        bare = statistics.median(fps["bare"])
        print(f"{kind}, {args.num_envs} envs, random, {frames} frames, {args.repeat} rounds")
        print("| contender | frames/s (median) | rounds | x bare | bytes/frame | x one obs |")
        print("|---|---:|---|---:|---:|---:|")
        rounds = ", ".join(f"{v:.0f}" for v in fps["bare"])
        print(f"| bare loop | {bare:,.0f} | {rounds} | 1.00 | | |")
        for codec in args.compressions:
            med = statistics.median(fps[codec])
            rounds = ", ".join(f"{v:.0f}" for v in fps[codec])
            print(
                f"| rlcollect {codec} | {med:,.0f} | {rounds} | {med / bare:.2f} "
                f"| {size[codec]:,.0f} | {size[codec] / obs:.3f} |",
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pong_rss(args) -> None:
    from memory import peak_rss

    tmp = Path(tempfile.mkdtemp(prefix="rlcollect-pong-"))
    print("| frames | codec | peak RSS MiB | seconds | bytes/frame |")
    print("|---:|---|---:|---:|---:|")
    try:
        for codec in args.compressions:
            for frames in (int(f) for f in args.frames):
                out = tmp / "p.h5"
                run_args = pong_overrides(args.envpool, args.num_envs, codec, frames, out)
                rss, seconds, _ = peak_rss([*run_args, "progress=none"])
                print(
                    f"| {frames:,} | {codec} | {rss / 2**20:,.0f} | {seconds:.0f} "
                    f"| {out.stat().st_size / frames:,.0f} |",
                    flush=True,
                )
                out.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, nargs="+", default=[16000])
    parser.add_argument("--pong", action="store_true", help="Atari Pong against the bare loop")
    parser.add_argument("--envpool", action="store_true", help="--pong on envpool's Pong-v5")
    parser.add_argument("--rss", action="store_true", help="--pong: peak RSS per --frames")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 84])
    parser.add_argument("--compressions", nargs="+", default=["none", "gzip", "lzf"])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--writer-only", action="store_true")
    args = parser.parse_args()
    if args.pong:
        if args.num_envs == parser.get_default("num_envs") and not args.envpool:
            args.num_envs = 4
        return pong_rss(args) if args.rss else pong(args)
    frames = int(args.frames[0])
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
