"""What recording a training run costs: SB3 PPO on CartPole, with and without
``RecordCallback`` (collect_cli.record).

Each round trains a fresh model from the same seed twice, once bare and once with the
callback writing an HDF5 dataset (the order alternating from round to round); the
figure is the median of the per-round ratios of wall times. Target: the callback
adds at most 10%.

    python benchmarks/record_callback.py                 # 20,000 steps, 4 envs, 3 rounds
    python benchmarks/record_callback.py --steps 50000 --record
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record


def train(steps: int, envs: int, out: Path | None) -> float:
    """Wall seconds of ``model.learn(steps)`` (the model and envs made beforehand;
    with ``out``, the callback's opening and closing of the dataset counted)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from collect_cli.record.sb3 import RecordCallback

    env = make_vec_env("CartPole-v1", n_envs=envs, seed=0)
    model = PPO("MlpPolicy", env, seed=0, device="cpu")
    callback = RecordCallback(out, overwrite=True) if out is not None else None
    start = time.perf_counter()
    model.learn(steps, callback=callback)
    seconds = time.perf_counter() - start
    env.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlcollect-record-") as tmp:
        out = Path(tmp) / "ppo.h5"
        train(2048, args.envs, out)  # imports and first-call costs, off the clock
        times: dict[str, list[float]] = {"bare": [], "callback": []}
        for i in range(args.repeat):
            order = ("bare", "callback") if i % 2 == 0 else ("callback", "bare")
            for name in order:
                dest = out if name == "callback" else None
                times[name].append(train(args.steps, args.envs, dest))
    ratios = [c / b for b, c in zip(times["bare"], times["callback"], strict=True)]
    ratio = statistics.median(ratios)
    bare, ours = (statistics.median(times[k]) for k in ("bare", "callback"))
    lines = [
        f"SB3 PPO CartPole-v1: {args.steps:,} steps, {args.envs} envs, "
        f"{args.repeat} interleaved rounds",
        "",
        "| contender | seconds (median) | rounds | x bare |",
        "|---|---:|---|---:|",
        f"| model.learn | {bare:.2f} | "
        + ", ".join(f"{t:.2f}" for t in times["bare"]) + " | 1.00 |",
        f"| model.learn + RecordCallback | {ours:.2f} | "
        + ", ".join(f"{t:.2f}" for t in times["callback"]) + f" | {ratio:.3f} |",
        "",
        f"The callback adds {100 * (ratio - 1):+.1f}% (median of the rounds' ratios "
        + ", ".join(f"{r:.3f}" for r in ratios) + "; target: at most +10%).",
    ]  # fmt: skip
    print("\n".join(lines))
    if args.record:
        record.append([*record.header("recording a training run"), "", *lines])


if __name__ == "__main__":
    main()
