"""Error families. Each carries the process exit code DESIGN.md assigns to it."""

from __future__ import annotations


class RlcollectError(Exception):
    """Base class: a failure with a one-line, user-facing message."""

    exit_code = 1


class UsageError(RlcollectError):
    """Bad usage or configuration: unknown env, invalid value, output exists..."""

    exit_code = 2


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
