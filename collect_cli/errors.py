"""Error families. Each carries the process exit code DESIGN.md assigns to it.

:func:`exit_code` is the one mapping from how a command ended to its exit code,
used by the CLI and by each job of a sweep."""

from __future__ import annotations

import signal

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# the signals that stop a command cleanly (EXIT_INTERRUPTED); its children ignore them
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
FAILED = "failed"  # the status of `run`'s JSON line when it raised (exit 1 or 2)


class RlcollectError(Exception):
    """Base class: a failure with a one-line, user-facing message."""

    exit_code = EXIT_RUNTIME


class UsageError(RlcollectError):
    """Bad usage or configuration: unknown env, invalid value, output exists..."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """The composed Hydra config is invalid."""


class SpaceError(UsageError):
    """An environment space rlcollect cannot record."""


class PolicyError(UsageError):
    """The policy cannot be built or does not match the action space."""


class DeviceError(UsageError):
    """A device string that is malformed or names absent hardware."""


class OutputError(UsageError):
    """The output path exists, is not writable, or is not a dataset."""


class CollectionError(RlcollectError):
    """Runtime failure while collecting: the env raised, a worker died..."""


class WriteError(RlcollectError):
    """Runtime failure while writing: disk full, I/O error..."""


class DatasetError(RlcollectError):
    """A dataset on disk that is damaged, inconsistent or empty where data is needed."""


class MergeError(UsageError):
    """Shards that cannot be merged: different envs, spaces, keys or dtypes; incomplete."""


def exit_code(outcome: BaseException | str) -> int:
    """The exit code of a command that raised ``outcome``, or whose run ended with
    status ``outcome``: 0 done, 1 runtime failure, 2 bad usage, 130 interrupted."""
    if isinstance(outcome, str):
        from collect_cli.dataformat import INTERRUPTED

        return EXIT_INTERRUPTED if outcome == INTERRUPTED else EXIT_OK
    if isinstance(outcome, RlcollectError):
        return outcome.exit_code
    if isinstance(outcome, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_RUNTIME


def exit_cause(code: int | None) -> str:
    """How a child process ended, from its exit code, as the end of a sentence."""
    if code is None:
        return "is gone"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
