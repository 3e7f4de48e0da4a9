"""Progress display for the CLI (stderr only): Rich on a TTY, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from collect_cli.run import ProgressState


def _fmt_eta(state: ProgressState) -> str:
    if state.total_frames <= 0 or state.frames <= 0:
        return "-"
    new = state.frames - state.frames_before
    if new <= 0:
        return "-"
    left = state.elapsed * (state.total_frames - state.frames) / new
    return time.strftime("%H:%M:%S", time.gmtime(max(0.0, left)))


def _fmt_return(state: ProgressState) -> str:
    return "-" if state.mean_return is None else f"{state.mean_return:.2f}"


class PlainProgress:
    """ANSI-free lines, at most one per ``interval`` seconds, plus the final one."""

    def __init__(
        self, stream: TextIO | None = None, interval: float = 2.0, label: str | None = None
    ):
        self.stream = stream or sys.stderr
        self.interval = interval
        self.prefix = f"{label}: " if label else ""  # e.g. "job 3: " in a sweep
        self._last = -float("inf")

    def __call__(self, state: ProgressState) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        self._write(state)

    def _write(self, state: ProgressState) -> None:
        total = f"/{state.total_frames}" if state.total_frames > 0 else ""
        pct = f" ({100 * state.frames / state.total_frames:.0f}%)" if state.total_frames > 0 else ""
        fps = (state.frames - state.frames_before) / state.elapsed if state.elapsed > 0 else 0.0
        print(
            f"{self.prefix}frames {state.frames}{total}{pct} | {fps:.0f} frames/s | "
            f"episodes {state.episodes} | mean return {_fmt_return(state)} | "
            f"eta {_fmt_eta(state)}",
            file=self.stream,
            flush=True,
        )

    def close(self, state: ProgressState | None) -> None:
        if state is not None:
            self._write(state)


class RichProgress:
    """A live Rich bar on stderr: frames, frames/s, episodes, mean return, ETA."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(  # fits 80 columns
            BarColumn(bar_width=16),
            MofNCompleteColumn(),
            TextColumn("{task.fields[fps]} f/s"),
            TextColumn("ep {task.fields[episodes]}"),
            TextColumn("ret {task.fields[ret]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = None

    def __call__(self, state: ProgressState) -> None:
        new = state.frames - state.frames_before
        fps = f"{new / state.elapsed:,.0f}" if state.elapsed > 0 else "-"
        fields = {"fps": fps, "episodes": state.episodes, "ret": _fmt_return(state)}
        if self._task is None:
            self._progress.start()
            total = state.total_frames if state.total_frames > 0 else None
            self._task = self._progress.add_task("collect", total=total, **fields)
        self._progress.update(self._task, completed=state.frames, **fields)

    def close(self, state: ProgressState | None) -> None:
        self._progress.stop()


class Recorder:
    """Wraps a display and remembers the last state (for the final line)."""

    def __init__(self, display: PlainProgress | RichProgress | None):
        self.display = display
        self.last: ProgressState | None = None

    def __call__(self, state: ProgressState) -> None:
        self.last = state
        if self.display is not None:
            self.display(state)

    def close(self) -> None:
        if self.display is not None:
            self.display.close(self.last)


def make_progress(mode: str, label: str | None = None) -> Recorder:
    """``label`` prefixes plain lines (a sweep's job); a labelled display is never Rich."""
    if mode == "auto":
        mode = "rich" if sys.stderr.isatty() and label is None else "plain"
    if mode == "rich" and label is None:
        return Recorder(RichProgress())
    if mode in ("rich", "plain"):
        return Recorder(PlainProgress(label=label))
    return Recorder(None)
