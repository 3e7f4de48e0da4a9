"""The ``rlcollect`` app: its root options, the stop signals' handling, and
:func:`guarded`, which turns any error of a command into one line and its exit code."""

from __future__ import annotations

import functools
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import typer

from collect_cli import __version__
from collect_cli.errors import (
    EXIT_INTERRUPTED,
    STOP_SIGNALS,
    RlcollectError,
    exit_code,
)

app = typer.Typer(
    name="rlcollect",
    help="Collect RL rollouts into HDF5 or memory-mapped TensorDict datasets.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: rendering it with rich took 40% of --help
)


def err(message: str) -> None:
    print(f"rlcollect: error: {message}", file=sys.stderr, flush=True)


class _StopOnce:
    """SIGINT and SIGTERM outside a run's collection loop (which traps them itself):
    the first raises KeyboardInterrupt, so the command unwinds, cleans up and exits
    130 with one line; later ones are ignored, so that they cannot break the cleanup
    (durability D21). Whatever a command then raises, it ended by that stop: an
    import or a library cut in the middle may fail in its own way."""

    fired = False  # a stop is being handled: ignore the next ones
    raised = False  # ...by this handler's KeyboardInterrupt

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.fired:
            self.fired = self.raised = True
            raise KeyboardInterrupt


STOP = _StopOnce()


def import_torch_held() -> None:
    """Import torch and tensordict with the stop signals held, and take a stop that
    came meanwhile right after: a KeyboardInterrupt inside torch's import leaves a
    half-made module whose teardown at exit can abort the process (SIGABRT, not 130)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        import tensordict  # noqa: F401  (and torch)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _trap_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        STOP.fired = STOP.raised = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, STOP)


def was_stop(exc: BaseException) -> bool:
    """Whether ``exc`` ended a command because a stop signal came."""
    return isinstance(exc, KeyboardInterrupt) or STOP.raised


def _version(value: bool) -> None:
    if value:
        print(f"rlcollect {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Roll out a policy in RL environments and write the trajectories as a dataset."""
    _trap_stop_signals()  # before any heavy import: a stop at any moment exits 130


def guarded(command: Callable[..., int]) -> Callable[..., None]:
    """A command whose body returns its exit code: any error becomes one line on
    stderr and the exit code ``errors.exit_code`` gives it."""

    @functools.wraps(command)
    def run_guarded(*args: Any, **kwargs: Any) -> None:
        raise typer.Exit(guard_call(lambda: command(*args, **kwargs), debug=False))

    return run_guarded


def guard_call(fn, debug: bool) -> int:
    try:
        return fn()
    except (Exception, KeyboardInterrupt) as exc:
        if debug and not isinstance(exc, KeyboardInterrupt):
            traceback.print_exc()
            worker_trace = getattr(exc, "worker_traceback", None)
            if worker_trace:
                print(f"in the worker process:\n{worker_trace}", file=sys.stderr, end="")
        if was_stop(exc):
            err("interrupted")
            return EXIT_INTERRUPTED
        if isinstance(exc, RlcollectError):
            err(str(exc))
        else:
            err(f"unexpected {type(exc).__name__}: {exc} (rerun with debug=true for a traceback)")
        return exit_code(exc)
