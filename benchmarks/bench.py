"""Side-by-side throughput: rlcollect vs a plain gymnasium vector-env loop.

Each contender does the same work in the same process run: ``--frames`` frames
of one env with ``--num-envs`` lanes and the same policy. Prints frames/s and
the ratio to the plain loop, and appends a dated record to RESULTS.md.

    python benchmarks/bench.py                       # the default matrix
    python benchmarks/bench.py --envs CartPole --policies mlp --frames 1e5 --repeat 5
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
from tensordict import TensorDict

from collect_cli import config
from collect_cli.policies import build_policy

sys.path.insert(0, str(Path(__file__).parent))
import contenders
import record

PRESETS = {"Pendulum": "Pendulum-v1", "CartPole": "CartPole-v1"}
MULTI_VS_SYNC = ("sync", "multisync")


def plain_loop(env_id: str, num_envs: int, policy_name: str, frames: int) -> float:
    """The ceiling: gymnasium's SyncVectorEnv and the policy, storing nothing."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
    cfg = config.load(config.compose([f"policy={policy_name}"])).policy
    policy = build_policy(
        cfg, vec.single_observation_space, vec.single_action_space, torch.device("cpu"), 0
    )
    obs, _ = vec.reset(seed=0)
    steps = -(-frames // num_envs)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            td = TensorDict({"observation": torch.from_numpy(obs)}, batch_size=[num_envs])
            action = policy(td)["action"].numpy()
            obs, *_ = vec.step(action)
    seconds = time.perf_counter() - start
    vec.close()
    return steps * num_envs / seconds


def rlcollect(
    env: str,
    num_envs: int,
    policy: str,
    collector: str,
    writer: str,
    frames: int,
    out: Path,
    *extra: str,
) -> float:
    """A full ``rlcollect run``: collector, episodes table, writer, commits."""
    return record.run_frames_per_s(
        [
            f"env={env}",
            f"collector={collector}",
            f"env.num_envs={num_envs}",
            f"policy={policy}",
            f"writer={writer}",
            f"total_frames={frames}",
            f"out={out}",
            *extra,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, default=2e5)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--envs", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--policies", nargs="+", default=["random", "mlp"])
    parser.add_argument("--writers", nargs="+", default=["hdf5", "memmap"])
    parser.add_argument("--collectors", nargs="+", default=["sync", "multisync"])
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds of the plain loop and the rlcollect rows (run in turn); medians reported",
    )
    parser.add_argument("--no-record", action="store_true", help="do not append to RESULTS.md")
    parser.add_argument(
        "--contenders",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TorchRL and Minari on the same job, when installed",
    )
    parser.add_argument(
        "--envpool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rlcollect with env.backend=envpool (256 envs, 2 threads), when installed",
    )
    args = parser.parse_args()
    frames = int(args.frames)
    torch.set_num_threads(1)

    rows = []
    pairs = []  # (env, policy, writer, per-round multisync / sync ratios)
    notes = []
    tmp = Path(tempfile.mkdtemp(prefix="rlcollect-bench-"))

    def add_row(env: str, policy: str, name: str, fps: float, base: float) -> None:
        rows.append((env, policy, name, fps, fps / base))
        print(f"{env:9s} {policy:7s} {name:34s} {fps:10.0f} frames/s  ({fps / base:.2f}x plain)")

    try:
        for env in args.envs:
            for policy in args.policies:
                # the VM's speed drifts: contenders run in turn, `repeat` rounds, medians kept
                runs: dict[str, list[float]] = {}
                for _ in range(max(1, args.repeat)):
                    fps = plain_loop(PRESETS[env], args.num_envs, policy, frames)
                    runs.setdefault("plain gymnasium loop", []).append(fps)
                    for writer in args.writers:  # the collectors of one writer back to back
                        for collector in args.collectors:
                            fps = rlcollect(
                                env, args.num_envs, policy, collector, writer, frames, tmp / writer
                            )
                            runs.setdefault(f"rlcollect {collector}, {writer}", []).append(fps)
                base = float(np.median(runs["plain gymnasium loop"]))
                for name, values in runs.items():
                    add_row(env, policy, name, float(np.median(values)), base)
                for writer in args.writers:
                    sync, multi = (runs.get(f"rlcollect {c}, {writer}") for c in MULTI_VS_SYNC)
                    if sync and multi:
                        ratios = [m / s for m, s in zip(multi, sync, strict=True)]
                        pairs.append((env, policy, writer, ratios))
                        print(
                            f"{env:9s} {policy:7s} multisync / sync, {writer}: "
                            f"{np.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})"
                        )
                if args.contenders and contenders.available("torchrl"):
                    for workers in (0, 2):
                        lanes = args.num_envs // max(1, workers)
                        fps = contenders.torchrl_run(
                            PRESETS[env],
                            lanes,
                            policy,
                            frames,
                            tmp / f"trl-{env}-{policy}-{workers}",
                            workers,
                        )
                        name = "TorchRL MultiSync x2" if workers else "TorchRL SyncDataCollector"
                        add_row(env, policy, f"{name}, memmap", fps, base)
                if args.contenders and contenders.available("minari"):
                    fps = contenders.minari_run(
                        PRESETS[env], policy, frames, tmp / f"minari-{env}-{policy}"
                    )
                    add_row(env, policy, "Minari DataCollector, hdf5", fps, base)
        if args.envpool and contenders.available("envpool"):
            base = next(
                (r[3] for r in rows if r[:3] == ("Pendulum", "random", "plain gymnasium loop")),
                None,
            )
            base = base or plain_loop("Pendulum-v1", args.num_envs, "random", frames)
            fps = rlcollect(
                "Pendulum", 256, "random", "sync", "hdf5", max(frames, 2_000_000), tmp / "ep.h5",
                "env.backend=envpool", "frames_per_batch=25600", "+env.kwargs.num_threads=2",
            )  # fmt: skip
            add_row("Pendulum", "random", "rlcollect sync, envpool x256, hdf5", fps, base)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.contenders:
        names = {"torchrl": "torchrl", "minari": "minari[create]"}
        missing = [names[n] for n in names if not contenders.available(n)]
        if missing:
            notes.append(f"{' and '.join(missing)} not installed: skipped (make bench-compare)")
    if args.envpool and not contenders.available("envpool"):
        notes.append("envpool not installed: its row skipped")
    for note in notes:
        print(note)

    if args.no_record:
        return
    lines = [
        *record.header(),
        f"Work: {frames} frames per contender, {args.num_envs} envs per process "
        f"(multisync: 2 workers), torch threads 1; plain loop and rlcollect rows: median of "
        f"{args.repeat} rounds run in turn, the other contenders once\n",
        "| env | policy | contender | frames/s | vs plain loop |",
        "|---|---|---|---:|---:|",
    ]
    lines += [f"| {e} | {p} | {c} | {f:,.0f} | {r:.2f}x |" for e, p, c, f, r in rows]
    if pairs:
        lines += [
            "\nmultisync x2 / sync, each round's two runs back to back (the VM's speed drifts"
            " between rounds):\n",
            "| env | policy | writer | median of rounds | rounds |",
            "|---|---|---|---:|---|",
        ]
        lines += [
            f"| {e} | {p} | {w} | {np.median(r):.2f}x | {', '.join(f'{x:.2f}' for x in r)} |"
            for e, p, w, r in pairs
        ]
    lines += [f"\n{note}" for note in notes]
    record.append(lines)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
