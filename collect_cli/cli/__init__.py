"""The ``rlcollect`` command line: the only package that prints.

stdout carries results only (the run's JSON line, ``info`` output); progress,
logs and errors go to stderr. Heavy imports (torch, hydra) happen inside commands
so that ``--help`` and ``--version`` answer fast.
"""

from __future__ import annotations

import atexit
import os
import sys

from collect_cli.cli import collect, datasets, family, render  # noqa: F401  (their commands join the app)
from collect_cli.cli.app import STOP, app, err
from collect_cli.errors import EXIT_INTERRUPTED

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # a stop that reached no handler of the command's
        err("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit as exc:
        if not (STOP.raised and exc.code == EXIT_INTERRUPTED):
            raise
        # CPython ends a process by SIGINT, whatever its exit code, once a
        # KeyboardInterrupt ended an import's nested run, even one caught later:
        # run the exit hooks (writer, workers) and exit 130 as the command said
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(EXIT_INTERRUPTED)
