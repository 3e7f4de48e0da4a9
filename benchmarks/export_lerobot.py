"""``rlcollect export --format lerobot``: (a) Parquet throughput against pyarrow
writing the same frame columns by hand, (b) video export speed against the env's own
frame rate.

(a) Pendulum, 8 envs. The reference is what a user writes by hand: the columns
LeRobot gets (``observation.state``, ``action``, ``next.reward``, ``next.done``,
``next.terminated``, ``next.truncated``, ``infos.traj_id``, ``timestamp``,
``frame_index``, ``episode_index``, ``index``, ``task_index``) as numpy arrays in
memory, in export order, one ``pa.table`` of a row a frame, one ``pq.write_table``.
rlcollect's export is timed whole (validating and reading the dataset, planning, the
stats, writing every file). Paired rounds, medians; target >= 0.5x by hand.

(b) Pong (``ale_py:ALE/Pong-v5``, 210x160 RGB; ``pixelenvs:Pixels-v0`` where ale_py
is missing): frames/s of the whole video export (``--video-codec`` h264 and av1)
against frames/s of a bare gymnasium loop stepping the same env with random actions
and storing nothing. Target >= 2x the env's rate.

    python benchmarks/export_lerobot.py                       # 2e5 / 2000 frames
    python benchmarks/export_lerobot.py --frames 1e6 --video-frames 4000 --record
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
import record

from collect_cli.dataset import open_dataset
from collect_cli.ops.export import export

FPS = 30  # Pendulum's render_fps: the timestamps' rate


def collect(out: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "collect_cli", "run", *args, f"out={out}", "progress=none"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def frames_in_memory(path: Path) -> dict[str, np.ndarray]:
    """The dataset's frames in export order (lane, then time), as LeRobot's columns."""
    ds = open_dataset(path)
    steps = ds.meta["steps"]
    keys = ("observation", "action", "next/reward", "next/terminated", "next/truncated")
    keys += ("collector/traj_ids",)
    arrays = {k: ds.array(k)[:, :steps] for k in (*keys, "collector/mask")}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for lane in range(arrays["collector/mask"].shape[0]):
        valid = arrays["collector/mask"][lane]
        for k in keys:
            parts[k].append(arrays[k][lane][valid])
    out = {k: np.concatenate(v) for k, v in parts.items()}
    ids = out["collector/traj_ids"].reshape(-1)
    n = len(ids)
    firsts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    lengths = np.diff(np.r_[firsts, n])
    frame = np.arange(n) - np.repeat(firsts, lengths)
    last = np.zeros(n, bool)
    last[firsts + lengths - 1] = True
    terminated = out["next/terminated"].reshape(n)
    truncated = out["next/truncated"].reshape(n) | (last & ~terminated)
    return {
        "observation.state": out["observation"].reshape(n, -1).astype(np.float32),
        "action": out["action"].reshape(n, -1).astype(np.float32),
        "next.reward": out["next/reward"].reshape(n).astype(np.float32),
        "next.done": terminated | truncated,
        "next.terminated": terminated,
        "next.truncated": truncated,
        "infos.traj_id": ids.astype(np.int64),
        "timestamp": (frame / FPS).astype(np.float32),
        "frame_index": frame,
        "episode_index": np.repeat(np.arange(len(firsts)), lengths),
        "index": np.arange(n),
        "task_index": np.zeros(n, np.int64),
    }


def by_hand(frames: dict[str, np.ndarray], dest: Path) -> None:
    columns = {}
    for name, values in frames.items():
        if values.ndim == 2:
            flat = pa.array(values.reshape(-1))
            columns[name] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        else:
            columns[name] = pa.array(values)
    pq.write_table(pa.table(columns), dest)


def parquet_rounds(frames: int, repeat: int, tmp: Path) -> list[str]:
    src = tmp / "pendulum.h5"
    collect(src, "env=Pendulum", "env.num_envs=8", f"total_frames={frames}")
    columns = frames_in_memory(src)
    times: dict[str, list[float]] = {"by hand": [], "rlcollect": []}
    for _ in range(repeat):  # paired rounds
        start = time.perf_counter()
        by_hand(columns, tmp / "hand.parquet")
        times["by hand"].append(time.perf_counter() - start)
        shutil.rmtree(tmp / "lerobot", ignore_errors=True)
        start = time.perf_counter()
        export(src, "lerobot", tmp / "lerobot")
        times["rlcollect"].append(time.perf_counter() - start)
    hand = statistics.median(times["by hand"])
    lines = [
        f"(a) Pendulum, 8 envs, {frames:,} frames; {repeat} paired rounds, medians",
        "",
        "| writer | seconds (median) | rounds | frames/s | x by hand |",
        "|---|---:|---|---:|---:|",
    ]
    for name, key in (
        ("pyarrow by hand (columns in memory)", "by hand"),
        ("rlcollect", "rlcollect"),
    ):
        value = statistics.median(times[key])
        rounds = ", ".join(f"{t:.2f}" for t in times[key])
        lines.append(
            f"| {name} | {value:.2f} | {rounds} | {frames / value:,.0f} | {hand / value:.2f} |"
        )
    return lines


def env_rate(env_id: str, steps: int) -> float:
    """Frames/s of a bare gymnasium loop: one env, random actions, nothing stored."""
    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    env = gym.make(name)
    env.reset(seed=0)
    env.action_space.seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    took = time.perf_counter() - start
    env.close()
    return steps / took


def video_rounds(frames: int, repeat: int, tmp: Path) -> list[str]:
    have_ale = importlib.util.find_spec("ale_py") is not None
    env_id = "ale_py:ALE/Pong-v5" if have_ale else "pixelenvs:Pixels-v0"
    src = tmp / "pixels.h5"
    collect(src, "env=gym", f"env.id={env_id}", "env.num_envs=2", f"total_frames={frames}")
    rate = statistics.median(env_rate(env_id, frames) for _ in range(repeat))
    lines = [
        "",
        f"(b) {env_id}, {frames:,} frames (2 envs); {repeat} rounds, medians; the env alone "
        f"(one gymnasium env, random actions): {rate:,.0f} frames/s",
        "",
        "| export | seconds (median) | rounds | frames/s | x the env's rate |",
        "|---|---:|---|---:|---:|",
    ]
    for codec in ("h264", "av1"):
        times = []
        for _ in range(repeat):
            shutil.rmtree(tmp / "video", ignore_errors=True)
            start = time.perf_counter()
            export(src, "lerobot", tmp / "video", video_codec=codec)
            times.append(time.perf_counter() - start)
        value = statistics.median(times)
        rounds = ", ".join(f"{t:.2f}" for t in times)
        lines.append(
            f"| `--video-codec {codec}` | {value:.2f} | {rounds} | {frames / value:,.0f} "
            f"| {frames / value / rate:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, default=2e5, help="(a): Pendulum frames")
    parser.add_argument("--video-frames", type=float, default=2000, help="(b): Pong frames")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="append to benchmarks/records/")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlcollect-export-lerobot-") as tmp:
        tmp = Path(tmp)
        lines = parquet_rounds(int(args.frames), args.repeat, tmp)
        lines += video_rounds(int(args.video_frames), args.repeat, tmp)
    print("\n".join(lines))
    if args.record:
        record.append([*record.header("lerobot export"), "", *lines])


if __name__ == "__main__":
    main()
