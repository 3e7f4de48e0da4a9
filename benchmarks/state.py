"""What ``record.state=true`` costs: a HalfCheetah-v5 run (8 envs, random policy,
hdf5) with and without the simulator state recorded.

Paired rounds (the order alternating), each a whole ``rlcollect run`` in-process
through ``collect_cli.run.run``; the figure is the median of the rounds' ratios of
frames/s. Target: recording the state adds at most 10% (ratio >= 0.91).

    python benchmarks/state.py                        # 2e5 frames, 3 rounds
    python benchmarks/state.py --frames 2e5 --repeat 5 --record
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record

from collect_cli import config
from collect_cli.run import run


def once(frames: int, out: Path, state: bool) -> float:
    overrides = ["env=gym", "env.id=HalfCheetah-v5", "env.num_envs=8", f"total_frames={frames}"]
    overrides += [f"out={out}", "progress=none", "overwrite=true", f"record.state={state}"]
    return run(config.load(config.compose(overrides))).frames_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=float, default=2e5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="append to benchmarks/records/")
    args = parser.parse_args()
    frames = int(args.frames)
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="rlcollect-state-") as tmp:
        once(8000, Path(tmp) / "warm.h5", True)
        for i in range(args.repeat):
            for state in (False, True) if i % 2 == 0 else (True, False):
                rates[state].append(once(frames, Path(tmp) / f"{state}.h5", state))
    ratios = [s / b for s, b in zip(rates[True], rates[False], strict=True)]
    lines = [
        f"HalfCheetah-v5, 8 envs, random policy, hdf5, {frames:,} frames; "
        f"{args.repeat} paired rounds",
        "",
        "| record.state | frames/s (median) | rounds |",
        "|---|---:|---|",
        *(
            f"| {str(s).lower()} | {statistics.median(rates[s]):,.0f} | "
            + ", ".join(f"{r:,.0f}" for r in rates[s])
            + " |"
            for s in (False, True)
        ),
        "",
        f"Ratio (median of rounds): {statistics.median(ratios):.3f}x "
        f"({', '.join(f'{r:.3f}' for r in ratios)}); target >= 0.91x (<= 10% added).",
    ]
    print("\n".join(lines))
    if args.record:
        record.append([*record.header("record.state"), "", *lines])


if __name__ == "__main__":
    main()
