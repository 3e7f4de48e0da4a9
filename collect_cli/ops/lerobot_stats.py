"""Statistics of a LeRobot export (``meta/stats.json`` and each episode's
``stats/<feature>/<stat>``): min, max, mean, std, count and the quantiles q01 q10
q50 q90 q99, per value of a feature, or per channel of an image in [0, 1], as
LeRobot's own writer computes them (images from up to ``IMAGE_SAMPLES`` frames of an
episode). Computed as the frames stream past: memory is a few thousand sampled rows
per feature, not an episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUANTILES = (1, 10, 50, 90, 99)
VECTOR_SAMPLES = 10_000  # frames of an episode its quantiles are taken from
IMAGE_SAMPLES = 100  # frames of an episode its image stats are taken from


class Moments:
    """One feature's statistics over one episode: min, max, mean, std and count of
    every frame, quantiles of up to ``VECTOR_SAMPLES`` evenly spaced ones. Images
    (LeRobot's way): all per channel, in [0, 1], over ``IMAGE_SAMPLES`` frames, from
    exact per-channel histograms of their pixels."""

    def __init__(self, image: bool, length: int):
        self.image = image
        cap = IMAGE_SAMPLES if self.image else VECTOR_SAMPLES
        # every frame where the episode is short enough (most are): no selection to make
        self.picks = None
        if length > cap:
            self.picks = np.unique(np.linspace(0, length - 1, cap).round().astype(int))
        self.picked = length if self.picks is None else len(self.picks)
        self.count, self.samples = 0, []
        self.hist = np.zeros((3, 256), np.int64) if image else None
        self.sum = self.squares = self.low = self.high = None

    def add(self, values: np.ndarray, offsets: np.ndarray) -> None:
        picked = values if self.picks is None else values[np.isin(offsets, self.picks)]
        if self.image:
            pixels = picked.reshape(-1, 3)
            for c in range(3):
                self.hist[c] += np.bincount(pixels[:, c], minlength=256)
            return
        values = values.astype(np.float64)
        self.samples.append(picked.astype(np.float64))
        low, high = values.min(axis=0), values.max(axis=0)
        if self.sum is None:
            self.sum, self.squares, self.low, self.high = 0.0, 0.0, low, high
        self.sum += values.sum(axis=0)
        self.squares += np.square(values).sum(axis=0)
        self.low, self.high = np.minimum(self.low, low), np.maximum(self.high, high)
        self.count += len(values)

    def result(self) -> dict[str, np.ndarray]:
        qs = [q / 100 for q in QUANTILES]
        if self.image:
            out = _histogram_stats(self.hist, qs)
            return {
                **{k: v.reshape(3, 1, 1) for k, v in out.items()},
                "count": np.array([self.picked]),
            }
        mean = self.sum / self.count
        std = np.sqrt(np.maximum(self.squares / self.count - mean**2, 0.0))
        out = {"min": self.low, "max": self.high, "mean": mean, "std": std}
        samples = self.samples[0] if len(self.samples) == 1 else np.concatenate(self.samples)
        found = quantiles(samples, qs)
        out.update({f"q{q:02d}": v for q, v in zip(QUANTILES, found, strict=True)})
        return {**out, "count": np.array([self.count])}


def quantiles(values: np.ndarray, qs: list[float]) -> list[np.ndarray]:
    """``np.quantile(values, qs, axis=0)`` (linear interpolation), from one sort: the
    same numbers without its per-call work (an export asks once a feature an episode)."""
    ordered = np.sort(values, axis=0)
    top = len(ordered) - 1
    out = []
    for q in qs:
        pos = q * top
        low = int(np.floor(pos))
        high = min(low + 1, top)
        out.append(ordered[low] + (pos - low) * (ordered[high] - ordered[low]))
    return out


def _histogram_stats(hist: np.ndarray, qs: list[float]) -> dict[str, np.ndarray]:
    """Per channel stats of pixel values from their histograms (``[channels, 256]``),
    scaled to [0, 1]; quantiles interpolated as ``np.quantile``'s default."""
    levels = np.arange(256) / 255.0
    n = hist.sum(axis=1)
    mean = hist @ levels / n
    std = np.sqrt(np.maximum(hist @ levels**2 / n - mean**2, 0.0))
    seen = hist > 0
    out = {"min": levels[seen.argmax(axis=1)], "max": levels[255 - seen[:, ::-1].argmax(axis=1)]}
    out.update({"mean": mean, "std": std})
    cum = np.cumsum(hist, axis=1)
    for q, name in zip(qs, QUANTILES, strict=True):
        pos = q * (n - 1)
        low = np.floor(pos)
        at = [levels[np.searchsorted(c, k, side="right")] for c, k in zip(cum, low, strict=True)]
        nxt = np.minimum(low + 1, n - 1)
        up = [levels[np.searchsorted(c, k, side="right")] for c, k in zip(cum, nxt, strict=True)]
        out[f"q{name:02d}"] = np.array(at) + (pos - low) * (np.array(up) - np.array(at))
    return out


class Totals:
    """The dataset's stats from its episodes': min of mins, max of maxes, pooled mean
    and std, quantiles weighted by count (as LeRobot aggregates them)."""

    def __init__(self):
        self.parts: dict[str, dict[str, Any]] = {}

    def add(self, name: str, stats: dict[str, np.ndarray]) -> None:
        n = float(stats["count"][0])
        part = self.parts.setdefault(name, {"count": 0.0})
        mean = stats["mean"]
        weighted = {"mean": mean * n, "square": (stats["std"] ** 2 + mean**2) * n}
        weighted.update({k: v * n for k, v in stats.items() if k.startswith("q")})
        for key, value in weighted.items():
            part[key] = part.get(key, 0.0) + value
        part["min"] = np.minimum(part.get("min", stats["min"]), stats["min"])
        part["max"] = np.maximum(part.get("max", stats["max"]), stats["max"])
        part["count"] += n

    def result(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, part in self.parts.items():
            n = part["count"]
            mean = part["mean"] / n
            std = np.sqrt(np.maximum(part["square"] / n - mean**2, 0.0))
            stats = {"min": part["min"], "max": part["max"], "mean": mean, "std": std}
            stats.update({k: v / n for k, v in part.items() if k.startswith("q")})
            out[name] = {k: np.asarray(v).tolist() for k, v in stats.items()}
            out[name]["count"] = [int(n)]
        return out
