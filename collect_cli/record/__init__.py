"""Record a training run as an rlcollect dataset: :class:`Recorder` takes each vector
env step of any training loop; ``collect_cli.record.sb3.RecordCallback`` (also
``collect_cli.record.RecordCallback``, imported on first use) records what a
Stable-Baselines3 model's rollouts collect. Importing this package imports neither
torch nor Stable-Baselines3."""

from __future__ import annotations

from typing import Any

from collect_cli.record.recorder import NEXT_STEP, SAME_STEP, Recorder

__all__ = ["NEXT_STEP", "SAME_STEP", "RecordCallback", "Recorder"]


def __getattr__(name: str) -> Any:
    if name == "RecordCallback":
        from collect_cli.record.sb3 import RecordCallback

        return RecordCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
