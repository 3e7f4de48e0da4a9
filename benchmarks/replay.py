"""``validate --replay`` against the env's own step rate.

The reference is the bare loop: one unwrapped gymnasium env stepping random
actions. rlcollect's replay is timed whole (reading the sampled frames, a reset
and a state restore per transition, the step, the comparisons). Paired rounds,
medians, transitions per second.

    python benchmarks/replay.py                       # Pendulum, 10,000 transitions
    python benchmarks/replay.py --env CartPole --record
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).parent))
import record

from collect_cli.dataset import open_dataset
from collect_cli.ops.replay import LARGE, replay


def bare(env_id: str, steps: int) -> float:
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(steps)]
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, _, _ = env.step(action)
        if terminated:
            env.reset()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlcollect-replay-") as tmp:
        src = Path(tmp) / "src.h5"
        run = ["env=" + args.env, "env.num_envs=8", f"total_frames={4 * LARGE}", f"out={src}"]
        cmd = [sys.executable, "-m", "collect_cli", "run", *run, "progress=none"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        env_id = open_dataset(src).meta["env_id"]
        rates: dict[str, list[float]] = {"bare": [], "replay": []}
        for _ in range(args.repeat):
            rates["bare"].append(bare(env_id, LARGE))
            start = time.perf_counter()
            result = replay(src)
            rates["replay"].append(result.replayed / (time.perf_counter() - start))
            assert result.found == 0, result.mismatches
    bare_rate, ours = (statistics.median(rates[k]) for k in ("bare", "replay"))
    lines = [
        f"{env_id}: {LARGE:,} transitions replayed of {4 * LARGE:,}; {args.repeat} paired rounds",
        "",
        "| contender | transitions/s (median) | rounds | x bare |",
        "|---|---:|---|---:|",
        f"| bare env.step loop | {bare_rate:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in rates["bare"]) + " | 1.00 |",
        f"| validate --replay | {ours:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in rates["replay"]) + f" | {ours / bare_rate:.2f} |",
    ]  # fmt: skip
    print("\n".join(lines))
    if args.record:
        record.append([*record.header("validate --replay"), "", *lines])


if __name__ == "__main__":
    main()
