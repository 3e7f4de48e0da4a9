"""Side-by-side throughput: rlcollect vs the loop a user writes by hand.

The reference of every ratio is a bare loop with no rlcollect code in it, run in
the same process as the contenders, in turn with them (``--repeat`` rounds, every
other one in reverse order; each ratio is the median of the per-round ratios):

- gymnasium: ``SyncVectorEnv``, numpy observation -> ``torch.from_numpy`` -> a
  64x64 tanh MLP (actions squashed into the bounds, argmax for discrete) -> numpy
  action -> ``envs.step``, storing nothing; ``envs.action_space.sample()`` for
  the random policy;
- envpool: ``envpool.make_gymnasium(..., num_threads=2)`` stepped with uniform
  random actions drawn by torch (and, as an extra row, with one fixed action).

With multisync in the matrix, a third reference, "two bare loops at once", runs
the bare loop in two processes started together, half the frames each: what two
processes step on this machine (on 2 cores often well under twice one loop;
its CPU time includes the two interpreters' start-up). multisync / sync is
given beside two bare loops / one, of the same rounds: the gain a second process
brings rlcollect against the gain it brings the bare loop.

Diagnostic rows, "collector alone": rlcollect's sync and multisync collectors,
built as ``rlcollect run`` builds them and iterated with nothing written; the
pairs table gives multisync / sync of these too, so that a record shows how much
of a shortfall is the collection's and how much the writing's.

An extra row, "TensorDict loop", is the bare loop with each observation wrapped
in a TensorDict and rlcollect's own policy module (the reference of earlier
records): the difference to the bare loop is the cost of that wrapping alone.
rlcollect rows are full ``rlcollect run``s in this process (collector, episodes
table, writer, commits). Each row also gives the CPU time a frame took (this
process and its workers; a run's start-up included). torch runs with one
intra-op thread unless ``--threads`` says otherwise (0: torch's default, which is
what a user's ``rlcollect run`` gets). Appends a dated record to the month's file,
``benchmarks/records/YYYY-MM.md``.

    python benchmarks/bench.py                       # the default matrix
    python benchmarks/bench.py --frames 1e6 --repeat 5 --no-contenders \
        --no-tensordict-loop --no-envpool
    python benchmarks/bench.py --envs CartPole --policies mlp --frames 1e5 --repeat 5
    python benchmarks/bench.py --threads 0 --envs CartPole --policies mlp --collectors sync

The second is the per-step record of issue 23: at the default 2e5 frames a
multisync round lasts ~1 s, and a run's fixed costs (its first batch, the close's
fsync) take 2-3% of it against ~1% of sync's (docs/performance.md).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import resource
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
from collect_cli.policies.build import build_policy

sys.path.insert(0, str(Path(__file__).parent))
import contenders
import record

PRESETS = {"Pendulum": "Pendulum-v1", "CartPole": "CartPole-v1"}
MULTI_VS_SYNC = ("sync", "multisync")
BARE = "bare gymnasium loop"
PAIR = "two bare loops at once (2 processes)"
ENVPOOL_LANES, ENVPOOL_THREADS = 256, 2


def alone_name(collector: str) -> str:
    return f"rlcollect {collector} collector alone (no writer)"


def bare_loop(
    env_id: str, num_envs: int, policy_name: str, frames: int, window: list | None = None
) -> float:
    """The loop a user writes: SyncVectorEnv and a plain torch MLP, storing nothing.
    ``window``: a barrier to pass once set up, and a queue to put the timed loop's
    ``(start, end, frames)`` on (:func:`bare_pair`)."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
    obs, _ = envs.reset(seed=0)
    act = contenders.mlp_actor(envs.single_action_space, obs.shape[1])
    steps = -(-frames // num_envs)
    if window is not None:
        window[0].wait(timeout=600)  # the other loop died: this one fails too
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            if policy_name == "random":
                action = envs.action_space.sample()
            else:
                action = act(torch.from_numpy(obs)).numpy()
            obs, *_ = envs.step(action)
    end = time.perf_counter()
    if window is not None:
        window[1].put((start, end, steps * num_envs))
    envs.close()
    return steps * num_envs / (end - start)


def _one_thread_loop(*job) -> None:
    torch.set_num_threads(1)
    bare_loop(*job)


def bare_pair(env_id: str, num_envs: int, policy_name: str, frames: int) -> float:
    """Two bare loops at once, each in a process of its own with ``frames / 2``, timed
    from the first start to the last end: what two processes of the bare loop step
    on this machine (no rlcollect code in it). Each runs on one torch thread, as
    rlcollect's workers do."""
    ctx = mp.get_context("spawn")  # not forked: torch's threads may have run here
    barrier, times = ctx.Barrier(2), ctx.Queue()
    half = -(-frames // 2)
    job = (env_id, num_envs, policy_name, half, [barrier, times])
    procs = [ctx.Process(target=_one_thread_loop, args=job, daemon=True) for _ in range(2)]
    spans: list[tuple[float, float, int]] = []
    try:
        for proc in procs:
            proc.start()
        while len(spans) < len(procs):
            try:
                spans.append(times.get(timeout=1.0))
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"a bare loop exited with code {failed[0]}") from None
        for proc in procs:
            proc.join()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
    starts, ends, stepped = zip(*spans, strict=True)
    return sum(stepped) / (max(ends) - min(starts))


def tensordict_loop(env_id: str, num_envs: int, policy_name: str, frames: int) -> float:
    """The bare loop with a TensorDict around each observation and rlcollect's policy
    module (not a reference: it holds part of rlcollect's per-step cost)."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)
    cfg = config.load(config.compose([f"policy={policy_name}"])).policy
    policy = build_policy(
        cfg, envs.single_observation_space, envs.single_action_space, torch.device("cpu"), 0
    )
    obs, _ = envs.reset(seed=0)
    steps = -(-frames // num_envs)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            td = TensorDict({"observation": torch.from_numpy(obs)}, batch_size=[num_envs])
            action = policy(td)["action"].numpy()
            obs, *_ = envs.step(action)
    seconds = time.perf_counter() - start
    envs.close()
    return steps * num_envs / seconds


def bare_envpool(env_id: str, num_envs: int, frames: int, fixed: bool = False) -> float:
    """envpool stepped by hand: uniform random actions from torch (or one fixed action)."""
    import envpool

    envs = envpool.make_gymnasium(env_id, num_envs=num_envs, num_threads=ENVPOOL_THREADS)
    envs.reset()
    space = envs.action_space
    low, high = float(space.low.min()), float(space.high.max())
    fixed_action = np.zeros((num_envs, *space.shape), np.float32)
    steps = -(-frames // num_envs)
    start = time.perf_counter()
    for _ in range(steps):
        if fixed:
            action = fixed_action
        else:
            action = (torch.rand(num_envs, *space.shape) * (high - low) + low).numpy()
        envs.step(action)
    seconds = time.perf_counter() - start
    envs.close()
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
        [*job_overrides(env, num_envs, policy, collector, frames), f"writer={writer}",
         f"out={out}", *extra]
    )  # fmt: skip


def job_overrides(env: str, num_envs: int, policy: str, collector: str, frames: int) -> list[str]:
    """The config overrides of one job, shared by the rlcollect rows."""
    return [
        f"env={env}",
        f"collector={collector}",
        f"env.num_envs={num_envs}",
        f"policy={policy}",
        f"total_frames={frames}",
    ]


def collector_alone(env: str, num_envs: int, policy: str, collector: str, frames: int) -> float:
    """rlcollect's collector as ``rlcollect run`` builds it, iterated for ``frames``
    frames with nothing written (not a reference: a diagnostic row, what writing
    costs a run beside it)."""
    from collect_cli import dataformat as fmt
    from collect_cli.run import build_collector, resolve_device

    settings = config.load(config.compose(job_overrides(env, num_envs, policy, collector, frames)))
    cpu = resolve_device("cpu")
    collector_ = build_collector(settings, cpu, cpu)
    try:
        start = time.perf_counter()
        got = sum(int(b.get(fmt.MASK_KEY).sum()) for _, b in collector_.iter_with_lanes())
        seconds = time.perf_counter() - start
    finally:
        collector_.shutdown()
    return got / seconds


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (a multisync run's workers)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


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
        help="rounds of the bare loop and the rlcollect rows (run in turn); medians reported",
    )
    parser.add_argument(
        "--no-record", action="store_true", help="do not append to benchmarks/records/"
    )
    parser.add_argument(
        "--tensordict-loop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the extra TensorDict-wrapped loop row",
    )
    parser.add_argument(
        "--contenders",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TorchRL and Minari on the same job, when installed",
    )
    parser.add_argument(
        "--collectors-alone",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="diagnostic rows: each collector iterated with nothing written",
    )
    parser.add_argument(
        "--envpool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rlcollect with env.backend=envpool (256 envs, 2 threads) vs bare envpool",
    )
    parser.add_argument(
        "--envpool-frames", type=float, default=2e6, help="frames of each envpool row"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)"
    )
    args = parser.parse_args()
    frames = int(args.frames)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    rows = []  # (env, policy, contender, frames/s, ratio to the bare loop, CPU us a frame)
    pairs = []  # (env, policy, writer, per-round multisync / sync ratios)
    notes = []
    tmp = Path(tempfile.mkdtemp(prefix="rlcollect-bench-"))
    loads = [os.getloadavg()[0]]

    cpu: dict[str, list[float]] = {}  # contender -> CPU us a frame, per round

    def measured(name: str, count: int, contender, *args) -> float:
        """``contender(*args)``'s frames/s; its CPU time a frame is kept under ``name``."""
        before = cpu_seconds()
        fps = contender(*args)
        cpu.setdefault(name, []).append((cpu_seconds() - before) / count * 1e6)
        return fps

    def add_rows(env: str, policy: str, runs: dict[str, list[float]], base: str) -> None:
        for name, values in runs.items():
            ratios = [v / b for v, b in zip(values, runs[base], strict=False)]
            fps, ratio = float(np.median(values)), float(np.median(ratios))
            us = float(np.median(cpu.pop(name)))
            rows.append((env, policy, name, fps, ratio, us))
            print(
                f"{env:9s} {policy:7s} {name:48s} {fps:10.0f} frames/s  ({ratio:.2f}x bare)"
                f"  {us:6.1f} CPU us/frame"
            )

    try:
        for env in args.envs:
            for policy in args.policies:
                # the VM's speed drifts: contenders run in turn, `repeat` rounds, medians
                # kept; every other round runs them in reverse, so that no contender
                # always runs first or last in a round
                runs: dict[str, list[float]] = {}
                job = (PRESETS[env], args.num_envs, policy, frames)
                order = [(BARE, bare_loop, job)]
                if "multisync" in args.collectors:
                    order.append((PAIR, bare_pair, job))
                if args.tensordict_loop:
                    order.append(("TensorDict loop (rlcollect's policy)", tensordict_loop, job))
                if args.collectors_alone:
                    for collector in args.collectors:
                        alone = (env, args.num_envs, policy, collector, frames)
                        order.append((alone_name(collector), collector_alone, alone))
                for writer in args.writers:  # the collectors of one writer back to back
                    for collector in args.collectors:
                        name = f"rlcollect {collector}, {writer}"
                        run_job = (
                            env,
                            args.num_envs,
                            policy,
                            collector,
                            writer,
                            frames,
                            tmp / writer,
                        )
                        order.append((name, rlcollect, run_job))
                for round_ in range(max(1, args.repeat)):
                    for name, contender, args_ in order if round_ % 2 == 0 else order[::-1]:
                        runs.setdefault(name, []).append(measured(name, frames, contender, *args_))
                    loads.append(os.getloadavg()[0])
                add_rows(env, policy, runs, BARE)
                for writer in args.writers:
                    sync, multi = (runs.get(f"rlcollect {c}, {writer}") for c in MULTI_VS_SYNC)
                    if sync and multi:
                        ratios = [m / s for m, s in zip(multi, sync, strict=True)]
                        scaling = [p / b for p, b in zip(runs[PAIR], runs[BARE], strict=True)]
                        alone = [runs.get(alone_name(c)) for c in MULTI_VS_SYNC]
                        unwritten = (
                            [m / s for m, s in zip(alone[1], alone[0], strict=True)]
                            if all(alone)
                            else None
                        )
                        pairs.append((env, policy, writer, ratios, scaling, unwritten))
                        print(
                            f"{env:9s} {policy:7s} multisync / sync, {writer}: "
                            f"{np.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})"
                            f"; two bare loops / one: {np.median(scaling):.2f}x"
                            + (
                                f"; collectors alone: {np.median(unwritten):.2f}x"
                                if unwritten
                                else ""
                            )
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
                        base = float(np.median(runs[BARE]))
                        rows.append((env, policy, f"{name}, memmap", fps, fps / base, None))
                if args.contenders and contenders.available("minari"):
                    fps = contenders.minari_run(
                        PRESETS[env], policy, frames, tmp / f"minari-{env}-{policy}"
                    )
                    base = float(np.median(runs[BARE]))
                    rows.append((env, policy, "Minari DataCollector, hdf5", fps, fps / base, None))
        if args.envpool and contenders.available("envpool"):
            pool_frames = int(args.envpool_frames)
            runs = {}
            pool = ("Pendulum-v1", ENVPOOL_LANES, pool_frames)
            pool_run = (
                "Pendulum", ENVPOOL_LANES, "random", "sync", "hdf5", pool_frames,
                tmp / "ep.h5", "env.backend=envpool", f"frames_per_batch={ENVPOOL_LANES * 100}",
                f"+env.kwargs.num_threads={ENVPOOL_THREADS}",
            )  # fmt: skip
            order = [
                ("bare envpool, random actions", bare_envpool, (*pool, False)),
                ("bare envpool, fixed action", bare_envpool, (*pool, True)),
                ("rlcollect sync, envpool x256, hdf5", rlcollect, pool_run),
            ]
            for round_ in range(max(1, args.repeat)):
                for name, contender, args_ in order if round_ % 2 == 0 else order[::-1]:
                    runs.setdefault(name, []).append(measured(name, pool_frames, contender, *args_))
                loads.append(os.getloadavg()[0])
            add_rows("Pendulum", "random", runs, "bare envpool, random actions")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.contenders:
        names = {"torchrl": "torchrl", "minari": "minari[create]"}
        missing = [names[n] for n in names if not contenders.available(n)]
        if missing:
            notes.append(f"{' and '.join(missing)} not installed: skipped (make bench-compare)")
    if args.envpool and not contenders.available("envpool"):
        notes.append("envpool not installed: its rows skipped")
    for note in notes:
        print(note)
    load = f"1-minute load average {min(loads):.2f}-{max(loads):.2f} (at the start and each round)"
    print(load)

    if args.no_record:
        return
    lines = [
        *record.header(),
        f"Work: {frames} frames per contender ({int(args.envpool_frames)} for envpool), "
        f"{args.num_envs} envs per process (multisync: 2 workers), torch threads {threads}; "
        f"{args.repeat} rounds run in turn (every other round in reverse order); frames/s: "
        "median of the rounds; ratio: median "
        "of the per-round ratios to the bare loop of the same round (TorchRL and Minari: "
        "one run, to the median bare loop)  ",
        f"Load: {load}\n",
        "| env | policy | contender | frames/s | vs bare loop | CPU us a frame |",
        "|---|---|---|---:|---:|---:|",
    ]
    lines += [
        f"| {e} | {p} | {c} | {f:,.0f} | {r:.2f}x | {'' if us is None else f'{us:.1f}'} |"
        for e, p, c, f, r, us in rows
    ]
    if pairs:
        lines += [
            "\nmultisync x2 / sync, each round's two runs back to back; beside it, what two "
            "processes gained over one on the same rounds (two bare loops at once / one), "
            "and multisync's collector over sync's with nothing written (collectors "
            "alone):\n",
            "| env | policy | writer | median of rounds | rounds | two bare loops / one "
            "| collectors alone |",
            "|---|---|---|---:|---|---:|---:|",
        ]
        lines += [
            f"| {e} | {p} | {w} | {np.median(r):.2f}x | {', '.join(f'{x:.2f}' for x in r)} "
            f"| {np.median(c):.2f}x | {'' if a is None else f'{np.median(a):.2f}x'} |"
            for e, p, w, r, c, a in pairs
        ]
    lines += [f"\n{note}" for note in notes]
    record.append(lines)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
