"""What a config value may be, in one place: numbers a dataset can hold (finite
floats, integers that fit in int64, each option's own range), the scale one
machine can run (env and worker counts, the batch against the memory available),
and the choices and codecs.

The schemas (``collect_cli/config.py``) carry their options' ranges as field
metadata (:func:`ranged`); :func:`check_numbers` walks every float and integer
field of a config's dataclasses with one rule. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any

from collect_cli.errors import ConfigError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # how datasets record integers
# A batch is held in memory whole, in several buffers: past this many frames it is
# a mistake (1e12 for 1e6), whatever the env. The memory check does the rest.
MAX_FRAMES_PER_BATCH = 2**31
RANGE = "rlcollect.range"  # the field metadata key of an option's range


@dataclass(frozen=True)
class Range:
    """The values an option may take: ``low``..``high`` (either open-ended)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself excluded
    noun: str = "a number"  # what a float option is, e.g. "a number of seconds"

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self, integer: bool, finite: bool = False) -> str:
        """The valid values in words: "at least 1", "in (0, 1]", "a number >= 0"
        (``finite``: "a finite number >= 0")."""
        low, high = _text(self.low), _text(self.high)
        if integer:
            if self.high is None:
                return f"at least {low}" if self.low is not None else "an integer"
            return f"from {low} to {high}" if self.low is not None else f"at most {high}"
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}]"
        noun = self.noun.replace("a number", "a finite number") if finite else self.noun
        if self.low is not None:
            return f"{noun} {'>' if self.low_open else '>='} {low}"
        return f"{noun} <= {high}" if self.high is not None else noun


def ranged(default: Any, low: float | None = None, high: float | None = None, **kw: Any) -> Any:
    """A schema field: ``default``, and the :class:`Range` its values must lie in
    (a list field: ``field(default_factory=..., metadata={RANGE: Range(...)})``)."""
    return field(default=default, metadata={RANGE: Range(low, high, **kw)})


def _text(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:g}" if isinstance(x, float) else str(x)  # 0.0 as 0, 1.0 as 1


def check_numbers(node: Any, prefix: str = "") -> None:
    """Every float field of the dataclass ``node`` (and of those it holds) finite,
    every integer field within int64, each in its field's :class:`Range`. Fields
    typed ``Any`` (integers given as 1e6) are :func:`as_int`'s; dicts (env.kwargs)
    are the user's own."""
    hints = typing.get_type_hints(type(node))
    for item in dataclasses.fields(node):
        key, value = f"{prefix}{item.name}", getattr(node, item.name)
        if dataclasses.is_dataclass(value):
            check_numbers(value, f"{key}.")
            continue
        kind = numeric_kind(hints[item.name])
        if kind is None or value is None:
            continue
        rng = item.metadata.get(RANGE, Range())
        for entry in value if isinstance(value, list) else [value]:
            refused = _refused(kind, entry, rng)
            if refused is None:
                continue
            valid, why = refused
            if isinstance(value, list):
                raise ConfigError(f"{key}={value} is not valid: each entry must be {valid}{why}")
            default = item.default
            hint = "" if default in (MISSING, None) else f" (default {default})"
            raise ConfigError(f"{key}={value} is not valid: {key} must be {valid}{hint}{why}")


def numeric_kind(hint: Any) -> type | None:
    """``int`` or ``float`` for a field typed so (optional, or a list of them)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return numeric_kind(args[0]) if args else None
    if origin in (typing.Union, types.UnionType):  # X | None
        kinds = {numeric_kind(a) for a in args if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else None
    return hint if hint in (int, float) else None


def _refused(kind: type, value: Any, rng: Range) -> tuple[str, str] | None:
    """(what ``value`` must be instead, why), or None if it is valid."""
    if kind is float:
        if not math.isfinite(value):
            return rng.describe(False, finite=True), ": NaN and infinity cannot make a dataset"
        return None if rng.holds(value) else (rng.describe(integer=False), "")
    if not INT64_MIN <= value <= INT64_MAX:
        low = INT64_MIN if rng.low is None else max(INT64_MIN, int(rng.low))
        high = INT64_MAX if rng.high is None else min(INT64_MAX, int(rng.high))
        return f"an integer from {low} to {high}", ": datasets record it as a 64-bit integer"
    return None if rng.holds(value) else (rng.describe(integer=True), "")


def as_int(
    name: str, value: Any, *, allow_endless: bool = False, high: int = INT64_MAX, why: str = ""
) -> int:
    """Accept 1000, 1e6, "1e6"; reject non-numeric and non-integral values, and
    values past ``high`` (``why``: the reason for it; default the int64 limit)."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(
                f"{name} must be a number such as 20000 or 1e6, got {value!r}"
            ) from None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ConfigError(f"{name} must be integral, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if allow_endless and value == -1:
        return value
    hint = " (or -1 to run until interrupted)" if allow_endless else ""
    if value <= 0:
        raise ConfigError(f"{name} must be a positive integer{hint}, got {value}")
    if value > high:
        why = why or "datasets record it as a 64-bit integer"
        raise ConfigError(
            f"{name}={value} is too large: {why}; use an integer from 1 to {high}{hint}"
        )
    return value


def as_frames_per_batch(value: Any) -> int:
    """``frames_per_batch``, checked before any env is built (the memory it needs
    is checked once the env's frame size is known: :func:`check_batch_memory`)."""
    return as_int(
        "frames_per_batch",
        value,
        high=MAX_FRAMES_PER_BATCH,
        why=f"a batch is held in memory whole, in several buffers, and {MAX_FRAMES_PER_BATCH} "
        "(2**31) frames is the most rlcollect accepts (typical: 1000 to 100000)",
    )


def cpus() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def max_workers() -> int:
    """The most collector worker processes: 4 per usable CPU, at least 16."""
    return max(16, 4 * cpus())


def check_scale(name: str, backend: Any, num_envs: int, workers: int) -> None:
    """Env and worker counts this machine can run (before any env is built);
    ``backend`` is env backend ``name``'s registry entry (``envs.EnvBackend``)."""
    if num_envs > backend.max_envs:
        raise ConfigError(
            f"env.num_envs={num_envs} is too many for env.backend={name}: at most "
            f"{backend.max_envs} envs per collector process ({backend.lanes}); "
            f"use env.num_envs from 1 to {backend.max_envs}, and more collector.workers "
            "(collector=multisync) or env.backend=native for more lanes"
        )
    if workers > max_workers():
        raise ConfigError(
            f"collector.workers={workers} is too many: at most {max_workers()} here (4 per "
            f"CPU this process may use, {cpus()} CPUs, and at least 16; more worker processes "
            f"only contend for the CPUs); use collector.workers from 1 to {max_workers()}, "
            "and more env.num_envs per worker"
        )


def available_memory() -> int | None:
    """Bytes of memory this process could still take: Linux's MemAvailable, or its
    cgroup's room where that is less; None where neither is known."""
    found = []
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    cgroup = "/sys/fs/cgroup/"
    try:
        with open(cgroup + "memory.max") as top, open(cgroup + "memory.current") as used:
            limit = top.read().strip()
            if limit != "max":
                found.append(max(0, int(limit) - int(used.read().strip())))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_batch_memory(frame_bytes: int, frames: int, frames_per_batch: int) -> None:
    """Refuse batch buffers of ``frames`` frames (all the buffers of a run, over
    all its processes) of ``frame_bytes`` bytes each, when the memory available
    cannot hold them, before they are allocated. ``frames_per_batch``: the run's,
    named in the message with the largest value that fits."""
    need, available = frame_bytes * frames, available_memory()
    if available is None or need <= available:
        return
    fits = frames_per_batch * available // need
    fix = (
        f"use frames_per_batch from 1 to {fits}"
        if fits >= 1
        else "use fewer env.num_envs or collector.workers"
    )
    raise ConfigError(
        f"frames_per_batch={frames_per_batch} needs more memory than is available: the "
        f"collector's batch buffers hold {frames} frames of {_size(frame_bytes)} each "
        f"({_size(need)}, observations and next observations, actions, rewards, flags...), "
        f"and {_size(available)} is available; {fix}"
    )


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}" if unit != "B" else f"{nbytes} B"
        nbytes /= 1024
    raise AssertionError


def importable(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not valid: choose from {', '.join(choices)}")
    return value
