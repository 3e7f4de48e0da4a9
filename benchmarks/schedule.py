"""Where a run's CPU time goes, process by process and thread by thread (Linux).

Runs ``rlcollect run OVERRIDES`` in this process, on a thread, and over a window
in its middle reads the kernel's scheduler statistics (``schedstat``) of this
process's threads and of its children (a multisync run's workers, a sync run's
writer process): the share of the window each spent running on a CPU, waiting
for one (runnable, not running) and sleeping; and, from ``/proc/stat``, how
much of the machine was idle. ``--collector-alone`` iterates the collector the
run would build with nothing written instead (bench.py's diagnostic row).

    python benchmarks/schedule.py env=CartPole collector=multisync total_frames=8e5
    python benchmarks/schedule.py --repeat 3 --collector-alone env=CartPole collector=multisync
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record

TICKS = os.sysconf("SC_CLK_TCK")


def schedstat(task: Path) -> tuple[float, float]:
    """Seconds a task has run on a CPU and waited for one."""
    run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def voluntary(task: Path) -> int:
    for line in (task / "status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            return int(line.split()[1])
    return 0


def machine_ticks() -> list[int]:
    """``/proc/stat``'s all-CPU line: user, nice, system, idle, iowait, irq, softirq, steal."""
    return [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def tasks() -> dict[str, list[Path]]:
    """This process's threads by name, and its children (all their threads), by name."""
    mine = {t.native_id: t.name for t in threading.enumerate()}
    found: dict[str, list[Path]] = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found.setdefault(f"thread {mine.get(int(task.name), task.name)}", []).append(task)
    for child in multiprocessing.active_children():
        with_threads = list(Path(f"/proc/{child.pid}/task").glob("*"))
        if with_threads:
            found[f"process {child.name}"] = with_threads
    return found


def sample(found: dict[str, list[Path]]) -> dict[str, tuple[float, float, int]]:
    out = {}
    for name, paths in found.items():
        try:
            stats = [(*schedstat(p), voluntary(p)) for p in paths]
        except (OSError, ValueError):
            continue  # ended
        out[name] = tuple(sum(s[i] for s in stats) for i in range(3))
    return out


def job(overrides: list[str], alone: bool, out: Path, started: threading.Event):
    """The run (or the bare collector) to watch, as a callable returning frames/s;
    it sets ``started`` once collecting has begun (imports and start-up done)."""
    from collect_cli import config
    from collect_cli import dataformat as fmt
    from collect_cli.run import build_collector, resolve_device, run

    settings = config.load(
        config.compose([*overrides, f"out={out}", "overwrite=true", "progress=none"])
    )
    if not alone:
        return lambda: run(settings, progress=lambda state: started.set()).frames_per_s

    def iterate() -> float:
        cpu = resolve_device("cpu")
        collector = build_collector(settings, cpu, cpu)
        try:
            start, frames = time.perf_counter(), 0
            for _, batch in collector.iter_with_lanes():
                frames += int(batch.get(fmt.MASK_KEY).sum())
                started.set()
            return frames / (time.perf_counter() - start)
        finally:
            collector.shutdown()

    return iterate


def watch(target, started: threading.Event, skip: float, window: float):
    """Frames/s of one run of ``target``, and what each task did over the window."""
    result: dict[str, float] = {}
    started.clear()
    thread = threading.Thread(target=lambda: result.update(fps=target()), name="run")
    thread.start()
    while not started.wait(0.1):
        if not thread.is_alive():
            raise SystemExit("the run failed (see above)")
    time.sleep(skip)  # the first batches
    found = tasks()
    before, ticks0, t0 = sample(found), machine_ticks(), time.perf_counter()
    time.sleep(window)
    after, ticks1, t1 = sample(found), machine_ticks(), time.perf_counter()
    thread.join()
    if "fps" not in result:
        raise SystemExit("the run failed (see above)")
    seconds, lines = t1 - t0, []
    ticks = [b - a for a, b in zip(ticks0, ticks1, strict=True)]
    total = sum(ticks) or 1
    lines.append(
        f"machine: user {(ticks[0] + ticks[1]) / total:.2f}, system "
        f"{sum(ticks[2:7:4]) / total:.2f}, idle {(ticks[3] + ticks[4]) / total:.2f}, "
        f"steal {ticks[7] / total:.2f} (of {os.cpu_count()} CPUs, {seconds:.1f} s)"
    )
    for name in sorted(set(before) & set(after)):
        run_s, wait_s, switches = (b - a for a, b in zip(before[name], after[name], strict=True))
        if run_s + wait_s < 0.005 * seconds:
            continue  # idle all along (torch's pool, the progress thread...)
        lines.append(
            f"  {name:<28} run {run_s / seconds:.2f}  wait for a CPU {wait_s / seconds:.2f}  "
            f"sleep {max(0.0, 1 - (run_s + wait_s) / seconds):.2f}  "
            f"({switches / seconds:,.0f} sleeps/s)"
        )
    return result["fps"], lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="+", help="rlcollect run's key=value arguments")
    parser.add_argument("--collector-alone", action="store_true", help="nothing written")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--skip", type=float, default=0.5, help="seconds of collecting before the window"
    )
    parser.add_argument("--window", type=float, default=2.0, help="seconds watched")
    parser.add_argument(
        "--record", action="store_true", help="append a record to benchmarks/records/"
    )
    args = parser.parse_args()
    if not Path("/proc/self/schedstat").exists():
        raise SystemExit("needs Linux's scheduler statistics (/proc/<pid>/schedstat)")
    what = "collector alone (nothing written)" if args.collector_alone else "rlcollect run"
    lines = [f"{what}: {' '.join(args.overrides)}"]
    with tempfile.TemporaryDirectory(prefix="rlcollect-schedule-") as tmp:
        started = threading.Event()
        target = job(args.overrides, args.collector_alone, Path(tmp) / "data", started)
        for round_ in range(1, args.repeat + 1):
            fps, found = watch(target, started, args.skip, args.window)
            lines += [f"round {round_}: {fps:,.0f} frames/s", *found]
            print("\n".join(lines[-len(found) - 1 :]), flush=True)
    if args.record:
        record.append([*record.header("where the CPU time goes"), "", "```", *lines, "```"])


if __name__ == "__main__":
    main()
