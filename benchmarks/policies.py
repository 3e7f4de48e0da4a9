"""policy=sb3 vs the loop a Stable-Baselines3 user writes by hand.

The bare loop has no rlcollect code in it: gymnasium's SyncVectorEnv,
``model.predict(obs, deterministic=True)``, ``envs.step(action)``, storing
nothing. rlcollect runs the same model on the same number of frames as the CLI
does (sync collector, hdf5 writer, policy=sb3). The two run in turn, ``--repeat``
rounds in one process; the figure is the median of the per-round ratios. The
models are trained for a few steps here: the speed does not depend on skill.

    python benchmarks/policies.py
    python benchmarks/policies.py --frames 1e5 --repeat 5 --no-record
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import record

CASES = {  # preset: (gymnasium id, algorithm)
    "Pendulum": ("Pendulum-v1", "SAC"),
    "CartPole": ("CartPole-v1", "PPO"),
}
TARGET = 0.85
# rlcollect rows: the default records the model's extras (log-prob, value), which
# cost the critic's forward pass that predict() skips; extras=false acts as predict does
VARIANTS = {"sb3": (), "sb3 extras=false": ("policy.extras=false",)}


def train(env_id: str, algo: str, path: Path) -> None:
    """A model with its algorithm's default network, trained a few steps."""
    from stable_baselines3 import PPO, SAC

    if algo == "SAC":
        model = SAC("MlpPolicy", env_id, learning_starts=32, batch_size=32, seed=0, device="cpu")
    else:
        model = PPO(
            "MlpPolicy", env_id, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu"
        )
    model.learn(64)
    model.save(path)


def bare_loop(env_id: str, algo: str, path: Path, num_envs: int, frames: int) -> float:
    """What a user writes with SB3 and gymnasium alone."""
    import stable_baselines3

    model = getattr(stable_baselines3, algo).load(path, device="cpu")
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
    obs, _ = envs.reset(seed=0)
    steps = -(-frames // num_envs)
    start = time.perf_counter()
    for _ in range(steps):
        action, _ = model.predict(obs, deterministic=True)
        obs, *_ = envs.step(action)
    seconds = time.perf_counter() - start
    envs.close()
    return steps * num_envs / seconds


def rlcollect(preset: str, path: Path, num_envs: int, frames: int, out: Path, *extra: str) -> float:
    """``rlcollect run env=<preset> policy=sb3 policy.path=<zip>``, in this process."""
    return record.run_frames_per_s(
        [
            f"env={preset}",
            f"env.num_envs={num_envs}",
            "policy=sb3",
            f"policy.path={path}",
            "collector=sync",
            "writer=hdf5",
            f"total_frames={frames}",
            f"out={out}",
            *extra,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, default=4e4)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--envs", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeat", type=int, default=5, help="paired rounds; medians reported")
    parser.add_argument(
        "--no-record", action="store_true", help="do not append to benchmarks/records/"
    )
    args = parser.parse_args()
    frames = int(args.frames)
    torch.set_num_threads(1)  # both contenders alike: one thread for the network

    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="rlcollect-bench-sb3-"))
    try:
        for preset in args.envs:
            env_id, algo = CASES[preset]
            model = tmp / f"{algo.lower()}.zip"
            train(env_id, algo, model)
            bare: list[float] = []
            ours: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for _ in range(max(1, args.repeat)):
                bare.append(bare_loop(env_id, algo, model, args.num_envs, frames))
                for name, extra in VARIANTS.items():
                    fps = rlcollect(preset, model, args.num_envs, frames, tmp / "o.h5", *extra)
                    ours[name].append(fps)
            for name, values in ours.items():
                ratios = [o / b for o, b in zip(values, bare, strict=True)]
                row = (preset, algo, name, float(np.median(bare)), float(np.median(values)), ratios)
                rows.append(row)
                print(
                    f"{preset:9s} {algo:4s} bare predict loop {row[3]:8.0f} frames/s, "
                    f"rlcollect {name} {row[4]:8.0f} frames/s: {np.median(ratios):.2f}x "
                    f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.no_record:
        return
    lines = [
        *record.header("policy=sb3 vs a bare model.predict loop"),
        f"Work: {frames} frames per contender and round, {args.num_envs} envs, torch threads 1, "
        f"{args.repeat} paired rounds; ratio = median of the per-round ratios "
        f"(target >= {TARGET}x).",
        "",
        "| env | algo | rlcollect (sync, hdf5) | bare predict loop (frames/s) "
        "| rlcollect (frames/s) | ratio (rounds) |",
        "|---|---|---|---:|---:|---|",
    ]
    for preset, algo, name, bare_fps, ours_fps, ratios in rows:
        lines.append(
            f"| {preset} | {algo} | {name} | {bare_fps:.0f} | {ours_fps:.0f} | "
            f"{np.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    record.append(lines)


if __name__ == "__main__":
    main()
