"""Native backend throughput, layer by layer, on one job (default: Pendulum, 4096 envs).

Rows, each the same env, lanes and policy:
  env       the native env stepped by hand (its tensors in and out) with a bare policy
            (torch random actions or a plain torch MLP), storing nothing: the reference
  written   the whole ``rlcollect run`` in this process, writing the dataset; env and
            written run in turn, ``--repeat`` rounds (every other one written first),
            ratio = median of per-round ratios
  collector the SyncCollector filling batches (copied to the host), no writer
  cli       the real CLI, ``rlcollect run ... env.backend=native``, writing the dataset:
            frames/s as its summary reports it (collection + writing, start-up excluded)
  gymnasium the same CLI job with env.backend=gymnasium (one batch), for the ratio
  headline  wall time of ``rlcollect run env=Pendulum env.backend=native total_frames=1e6
            device=DEVICE`` (process start to exit)
  disk      (with env and written) what the disk takes: the written dataset's bytes a
            frame, and as many bytes written over a file in 16 MiB blocks then fsynced
            (no rlcollect; the second of two passes), in MB/s: the rate that ``written``
            at 0.7x or 1x env needs

    python benchmarks/native.py                                  # the issue's CPU job
    python benchmarks/native.py --rows cli --profile             # cProfile the run in-process
    python benchmarks/native.py --device cuda:0 --policy mlp --num-envs 65536 --writer memmap
    python benchmarks/native.py --rows env,written,disk --dir /dev/shm  # memory, not the disk
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from collect_cli import config
from collect_cli.collectors import SyncCollector
from collect_cli.dataset import open_dataset
from collect_cli.envs import env_factory
from collect_cli.policies.build import PolicyFactory
from collect_cli.run import run

sys.path.insert(0, str(Path(__file__).parent))
import contenders
import record

ROWS = ("env", "written", "collector", "cli", "gymnasium", "headline", "disk")
PRESETS = {
    "Pendulum": "Pendulum-v1",
    "CartPole": "CartPole-v1",
    "MountainCar": "MountainCar-v0",
    "MountainCarContinuous": "MountainCarContinuous-v0",
    "Acrobot": "Acrobot-v1",
}


def policy_factory(name: str, device: str) -> PolicyFactory:
    cfg = config.load(config.compose([f"policy={name}"])).policy
    return PolicyFactory(cfg, device, 0)


def bare_actor(name: str, env, device: str):
    """The policy as a user writes it: uniform random actions drawn by torch, or a
    plain 64x64 tanh MLP (no TensorDict, no rlcollect policy code)."""
    space, n = env.action_space, env.num_envs
    if name == "mlp":
        obs_dim = int(env.observation_space.shape[0])
        return contenders.mlp_actor(space, obs_dim).to(device)
    if name != "random":
        raise SystemExit(f"--policy {name}: the bare loop has random and mlp")
    if hasattr(space, "n"):
        return lambda obs: torch.randint(0, int(space.n), (n,), device=device)
    low = torch.as_tensor(space.low, device=device)
    span = torch.as_tensor(space.high, device=device) - low
    return lambda obs: low + span * torch.rand(n, *space.shape, device=device)


def env_only(args, frames: int) -> float:
    """The native env stepped by hand with a bare policy, nothing stored: the
    reference of the ``written`` row (the env's own tensors, no collector)."""
    env = env_factory(PRESETS[args.env], args.num_envs, "native", device=args.device)()
    policy = bare_actor(args.policy, env, args.device)
    env.reset(list(range(args.num_envs)))
    obs = env.obs_tensors()[0]  # on the device: no host copies, no syncs
    steps = max(1, frames // args.num_envs)
    with torch.no_grad():
        for i in range(steps + 10):
            if i == 10:  # warm-up done
                _sync(args.device)
                start = time.perf_counter()
            obs = env.step_tensors([policy(obs)]).obs
    _sync(args.device)
    return steps * args.num_envs / (time.perf_counter() - start)


def written(args, frames: int, out: Path) -> float:
    """The whole ``rlcollect run`` in this process (collector, writer, commits)."""
    return record.run_frames_per_s(cli_args(args, "native", frames, out))


def collector_only(args, frames: int) -> float:
    """SyncCollector batches (on the host), no writer; buffers as ``rlcollect run`` has them."""
    make = env_factory(PRESETS[args.env], args.num_envs, "native", device=args.device)
    collector = SyncCollector(
        make,
        policy_factory(args.policy, args.device),
        frames_per_batch=args.frames_per_batch,
        total_frames=-1,
        device=args.device,
        return_same_td=True,
        batch_buffers=2,
    )
    batches = max(1, frames // collector.frames_per_batch)
    try:
        it = iter(collector)
        next(it)  # warm-up
        start = time.perf_counter()
        for _ in range(batches):
            next(it)
        seconds = time.perf_counter() - start
    finally:
        collector.shutdown()
    return batches * collector.frames_per_batch / seconds


def allocated_bytes(path: Path) -> int:
    """Bytes the file (or the directory's files) take on disk."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_blocks * 512 for p in files)


def disk_mb_per_s(directory: Path, nbytes: int) -> float:
    """The disk's sequential write speed: ``nbytes`` (16 MiB at least) written over a
    file in 16 MiB blocks of random bytes, then fsync, in MB/s. The timed pass is the
    second over the same file: the first takes the file's pages and blocks, which on
    some VMs costs more than the disk itself (docs/performance.md)."""
    block = os.urandom(16 << 20)
    blocks = max(1, nbytes // len(block))
    path = directory / "disk-probe"
    os.sync()
    with path.open("wb", buffering=0) as fh:
        for _pass in range(2):  # the second one counts
            fh.seek(0)
            start = time.perf_counter()
            for _ in range(blocks):
                fh.write(block)
            os.fsync(fh.fileno())
            seconds = time.perf_counter() - start
    path.unlink()
    return blocks * len(block) / seconds / 1e6


def cli_args(args, backend: str, frames: int, out: Path) -> list[str]:
    return [
        f"env={args.env}",
        f"env.backend={backend}",
        f"env.num_envs={args.num_envs}",
        f"policy={args.policy}",
        f"device={args.device if backend == 'native' else 'cpu'}",
        f"frames_per_batch={args.frames_per_batch}",
        f"total_frames={frames}",
        f"writer={args.writer}",
        "progress=none",
        f"out={out}",
        "overwrite=true",
    ]


def cli_run(overrides: list[str], threads: int | None = None) -> tuple[dict, float]:
    """``rlcollect run OVERRIDES`` in a fresh process: its summary and the wall time."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "collect_cli", "run", *overrides],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"rlcollect run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def profile_run(overrides: list[str], top: int) -> None:
    """The CLI job in this process under cProfile: where the time goes."""
    settings = config.load(config.compose(overrides))
    profiler = cProfile.Profile()
    profiler.enable()
    result = run(settings)
    profiler.disable()
    print(f"\nprofiled run: {result.frames_per_s:,.0f} frames/s (with profiler overhead)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def machine() -> str:
    """record.machine(), plus the GPU when there is one."""
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return record.machine() + gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum", choices=list(PRESETS))
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--frames", type=float, default=2e7, help="frames of the cli row")
    parser.add_argument("--frames-per-batch", type=int, default=409600)
    parser.add_argument("--quick-frames", type=float, default=4e6, help="env/collector rows")
    parser.add_argument("--policy", default="random")
    parser.add_argument("--writer", default="hdf5", choices=["hdf5", "memmap"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", default="env,written,collector,cli,gymnasium")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of env and written")
    parser.add_argument(
        "--threads", type=int, help="torch intra-op threads (OMP_NUM_THREADS); default: torch's"
    )
    parser.add_argument(
        "--dir",
        help="where the datasets are written (default: the temp dir; /dev/shm takes the disk out)",
    )
    parser.add_argument("--profile", action="store_true", help="also cProfile the cli job")
    parser.add_argument(
        "--record", action="store_true", help="append a record to benchmarks/records/"
    )
    args = parser.parse_args()
    rows = args.rows.split(",")
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}: choose from {', '.join(ROWS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    frames, quick = int(args.frames), int(args.quick_frames)
    tmp = Path(tempfile.mkdtemp(prefix="rlcollect-native-", dir=args.dir))
    job = (
        f"{args.env}, {args.num_envs} envs, policy={args.policy}, device={args.device}, "
        f"torch threads {args.threads or torch.get_num_threads()}"
    )
    print(f"# {job}; {machine()}")
    results: list[tuple[str, float, str]] = []
    loads = [os.getloadavg()[0]]

    def show(name: str, value: float, note: str = "", unit: str = "frames/s") -> None:
        results.append((name, value, note))
        print(f"{name:44s} {value:14,.0f} {unit}  {note}", flush=True)

    try:
        if "env" in rows and "written" in rows:  # paired rounds, in this process
            out = tmp / ("w.h5" if args.writer == "hdf5" else "w")
            envs, wrote = [], []
            for round_ in range(max(1, args.repeat)):
                if round_ % 2:  # every other round the other way round (the VM drifts)
                    wrote.append(written(args, frames, out))
                    envs.append(env_only(args, quick))
                else:
                    envs.append(env_only(args, quick))
                    wrote.append(written(args, frames, out))
                loads.append(os.getloadavg()[0])
            ratios = [w / e for w, e in zip(wrote, envs, strict=True)]
            show("native env.step + bare policy (nothing stored)", statistics.median(envs))
            show(
                f"rlcollect run in-process, native, {args.writer}",
                statistics.median(wrote),
                f"{statistics.median(ratios):.2f}x env (median of per-round ratios "
                f"{', '.join(f'{r:.2f}' for r in ratios)})",
            )
            if "disk" in rows:
                size = allocated_bytes(out)
                per_frame = size / open_dataset(out).meta["frames"]
                need = [k * statistics.median(envs) * per_frame / 1e6 for k in (0.7, 1.0)]
                show("dataset bytes a frame (on disk)", per_frame, unit="B")
                show(
                    "disk: 16 MiB writes then fsync, MB/s",
                    disk_mb_per_s(tmp, size),
                    f"written at 0.7x env needs {need[0]:,.0f} MB/s, at 1x {need[1]:,.0f} MB/s",
                    unit="MB/s",
                )
        elif "env" in rows:
            show("native env.step + bare policy (nothing stored)", env_only(args, quick))
        if "collector" in rows:
            show("SyncCollector, batches on host (no writer)", collector_only(args, quick))
        if "cli" in rows:
            out = tmp / ("ds.h5" if args.writer == "hdf5" else "ds")
            overrides = cli_args(args, "native", frames, out)
            summary, wall = cli_run(overrides, args.threads)
            command = "rlcollect run " + " ".join(overrides)
            show(f"rlcollect run, native, {args.writer}", summary["frames_per_s"], command)
            print(f"  {summary['frames']:,} frames in {summary['seconds']} s ({wall:.1f} s wall)")
            if args.profile:
                profile_run(overrides, 30)
            if out.is_dir():
                shutil.rmtree(out, ignore_errors=True)
            else:
                out.unlink(missing_ok=True)
        if "gymnasium" in rows:
            out = tmp / ("gym.h5" if args.writer == "hdf5" else "gym")
            summary, _ = cli_run(
                cli_args(args, "gymnasium", args.frames_per_batch, out), args.threads
            )
            show(f"rlcollect run, gymnasium, {args.writer}", summary["frames_per_s"], "(1 batch)")
        if "headline" in rows:
            out = tmp / "headline.h5"
            overrides = [
                "env=Pendulum",
                "env.backend=native",
                "total_frames=1e6",
                f"device={args.device}",
                "progress=none",
                f"out={out}",
                "overwrite=true",
            ]
            summary, wall = cli_run(overrides, args.threads)
            command = "rlcollect run " + " ".join(overrides[:4])
            loop = summary["frames_per_s"]
            print(f"headline: {command}: {wall:.1f} s wall, {loop:,.0f} frames/s in the loop")
            results.append(("headline wall seconds", wall, " ".join(overrides[:4])))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if args.record and results:
        lines = [
            *record.header("native backend", machine()),
            f"Job: {job}; datasets in {tmp.parent}  ",
            f"Load: 1-minute load average {min(loads):.2f}-{max(loads):.2f}",
            "",
            "| row | value | note |",
            "|---|---:|---|",
        ]
        lines += [f"| {name} | {value:,.0f} | {note} |" for name, value, note in results]
        record.append(lines)


if __name__ == "__main__":
    main()
