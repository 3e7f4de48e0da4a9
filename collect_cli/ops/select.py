"""Which whole episodes ``filter``, ``split`` and ``merge --take`` keep: pure rules
over an episodes table (``dataformat.Rows``), deterministic for a seed.

A fraction of ``n`` episodes is the nearest whole number, halves up
(:func:`share`). A random choice draws from ``numpy.random.default_rng`` seeded
with ``[seed, *stream]``: each shard and each source its own stream, so that adding
a shard does not change what is taken from the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.errors import UsageError


def fraction(value: float, what: str) -> float:
    """``value`` if it is a fraction in (0, 1], else a usage error naming ``what``."""
    if not (isinstance(value, (int, float)) and 0.0 < value <= 1.0 and math.isfinite(value)):
        raise UsageError(f"{what} {value!r} is not a fraction in (0, 1]: e.g. 0.1")
    return float(value)


def share(value: float, n: int) -> int:
    """How many of ``n`` episodes the fraction ``value`` takes: the nearest whole
    number, halves up."""
    return math.floor(value * n + 0.5)


def _random(n: int, count: int, seed: int, *stream: int) -> np.ndarray:
    """``count`` of ``range(n)`` drawn without replacement, as a bool mask."""
    chosen = np.zeros(n, bool)
    rng = np.random.default_rng([seed, *stream])
    chosen[rng.permutation(n)[:count]] = True
    return chosen


@dataclass(frozen=True)
class Conditions:
    """``rlcollect filter``'s conditions, applied in this order: the ones on each
    episode (completeness, source, return), then ``top`` of what is left by return
    (ties: the earlier row first), then ``max_episodes`` drawn at random."""

    min_return: float | None = None
    max_return: float | None = None
    complete_only: bool = False
    sources: tuple[int, ...] = ()
    top: float | None = None
    max_episodes: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.top is not None:
            fraction(self.top, "--top")
        if self.max_episodes is not None and self.max_episodes < 1:
            raise UsageError(f"--max-episodes {self.max_episodes} must be at least 1")
        low, high = self.min_return, self.max_return
        if low is not None and high is not None and low > high:
            raise UsageError(f"--min-return {low:g} is above --max-return {high:g}: none kept")

    def asked(self) -> dict:
        """The conditions given, as the output's metadata records them."""
        out = {k: v for k, v in vars(self).items() if v not in (None, (), False)}
        return {**out, "seed": self.seed}

    def choose(self, rows: fmt.Rows, table: list[dict]) -> np.ndarray:
        """Which ``rows`` are kept (bool per row)."""
        unknown = [s for s in self.sources if not 0 <= s < len(table)]
        if unknown:
            raise UsageError(
                f"--source {unknown[0]}: the dataset has sources 0..{len(table) - 1} "
                "(`rlcollect info` lists them)"
            )
        ret = np.asarray(rows["return"], np.float64)
        keep = np.ones(len(ret), bool)
        if self.complete_only:
            keep &= rows["complete"].astype(bool)
        if self.sources:
            keep &= np.isin(rows[fmt.SOURCE], self.sources)
        if self.min_return is not None:
            keep &= ret >= self.min_return
        if self.max_return is not None:
            keep &= ret <= self.max_return
        if self.top is not None:
            left = np.flatnonzero(keep)
            best = left[np.argsort(-ret[left], kind="stable")][: share(self.top, len(left))]
            keep[:] = False
            keep[best] = True
        if self.max_episodes is not None and keep.sum() > self.max_episodes:
            left = np.flatnonzero(keep)
            keep[:] = False
            keep[left[_random(len(left), self.max_episodes, self.seed)]] = True
        return keep


def split(rows: fmt.Rows, val: float, seed: int) -> np.ndarray:
    """Which ``rows`` go to the validation half (bool per row): :func:`share` of each
    source's episodes at random, so that both halves keep the mixture."""
    fraction(val, "--val")
    chosen = np.zeros(len(rows["traj_id"]), bool)
    for source in np.unique(rows[fmt.SOURCE]).tolist():
        mine = np.flatnonzero(rows[fmt.SOURCE] == source)
        chosen[mine[_random(len(mine), share(val, len(mine)), seed, source)]] = True
    return chosen


def take(rows: fmt.Rows, value: float, seed: int, shard: int) -> np.ndarray:
    """``merge --take``: :func:`share` of the shard's episodes, at random (bool per row)."""
    n = len(rows["traj_id"])
    return _random(n, share(value, n), seed, shard)
