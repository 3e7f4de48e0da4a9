"""How much two busy processes slow each other on this machine (no rlcollect in the load).

Two questions behind issue 23's multi-process and native targets:

- ``gymnasium``: two bare gymnasium loops (bench.py's, random actions) in two
  processes at once, against one alone: the most any two-worker collector can
  gain here;
- ``native``: the native env stepped by hand (native.py's reference loop), then
  rlcollect's SyncCollector over it (no writer), each alone, beside another
  process running a pure-Python loop, and beside one running a numpy copy loop:
  what a busy other CPU (a writer) costs the stepping one.

    python benchmarks/contention.py
    python benchmarks/contention.py --repeat 3 --no-record
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record


def _bare(env_id: str, frames: int, out) -> None:
    import bench

    out.put(bench.bare_loop(env_id, 8, "random", frames))


def _burn(kind: str, stop) -> None:
    import numpy as np

    frames = np.random.rand(100, 4096, 3).astype(np.float32).transpose(1, 0, 2)
    while not stop.is_set():
        if kind == "numpy copy":
            np.ascontiguousarray(frames)
        else:
            total = 0
            for i in range(100_000):
                total += i


def gymnasium_scaling(ctx, env_id: str, frames: int) -> float:
    """Frames/s of two bare loops at once, summed, over one loop alone."""
    out = ctx.Queue()
    alone = ctx.Process(target=_bare, args=(env_id, frames, out))
    alone.start()
    alone.join()
    one = out.get()
    pair = [ctx.Process(target=_bare, args=(env_id, frames, out)) for _ in range(2)]
    for p in pair:
        p.start()
    for p in pair:
        p.join()
    return (out.get() + out.get()) / one


def native_seconds(steps: int, collector: bool) -> float:
    """Seconds for ``steps`` steps of 4096 native Pendulum lanes with random actions:
    the env stepped by hand, or rlcollect's SyncCollector (batches of 100 steps on the
    host, no writer)."""
    import torch

    from collect_cli.collectors import SyncCollector
    from collect_cli.envs import env_factory

    make = env_factory("Pendulum-v1", 4096, "native")
    if collector:
        with SyncCollector(make, frames_per_batch=409_600, return_same_td=True) as c:
            batches = iter(c)
            next(batches)  # warm-up
            start = time.perf_counter()
            for _ in range(steps // 100):
                next(batches)
            return time.perf_counter() - start
    env = make()
    env.reset(list(range(4096)))
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(steps):
            env.step_tensors([torch.rand(4096, 1) * 4 - 2])
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--frames", type=int, default=100_000, help="of each gymnasium loop")
    parser.add_argument("--steps", type=int, default=800, help="native steps a measurement")
    parser.add_argument(
        "--no-record", action="store_true", help="do not append to benchmarks/records/"
    )
    args = parser.parse_args()
    ctx = mp.get_context("fork")
    loads = [os.getloadavg()[0]]
    rows: list[tuple[str, str, list[float]]] = []
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        ratios = [gymnasium_scaling(ctx, env_id, args.frames) for _ in range(args.repeat)]
        rows.append((f"two bare {env_id} loops at once / one alone", "x", ratios))
        loads.append(os.getloadavg()[0])
    native_seconds(50, collector=False)  # warm-up
    alone: dict[str, float] = {}
    for what in ("env stepped by hand", "SyncCollector"):
        for beside in ("nothing", "pure-Python loop", "numpy copy"):
            times = []
            for _ in range(args.repeat):
                stop = ctx.Event()
                burner = None
                if beside != "nothing":
                    burner = ctx.Process(target=_burn, args=(beside, stop))
                    burner.start()
                    time.sleep(0.5)
                times.append(native_seconds(args.steps, collector=what == "SyncCollector"))
                stop.set()
                if burner is not None:
                    burner.join()
            name = f"native {what}, {args.steps} steps; another process: {beside}"
            rows.append((name, "s", times))
            alone.setdefault(what, statistics.median(times))
            loads.append(os.getloadavg()[0])
    lines = [
        "| measurement | median | rounds | vs alone |",
        "|---|---:|---|---:|",
    ]
    for name, unit, values in rows:
        median = statistics.median(values)
        base = next((v for k, v in alone.items() if f" {k}," in name), None)
        versus = f"{median / base:.2f}x" if base else ""
        shown = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {name} | {median:.2f} {unit} | {shown} | {versus} |")
    print("\n".join(lines))
    if not args.no_record:
        record.append(
            [
                *record.header("two busy processes on this machine"),
                f"Work: {args.repeat} rounds; gymnasium loops of {args.frames} frames, 8 envs, "
                f"random actions; native Pendulum, 4096 lanes, {args.steps} steps  ",
                f"Load: 1-minute load average {min(loads):.2f}-{max(loads):.2f}\n",
                *lines,
            ]
        )


if __name__ == "__main__":
    main()
