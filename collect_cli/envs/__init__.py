"""Env backends behind one interface (:class:`VecEnv`), chosen by ``env.backend``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collect_cli.envs.base import StepResult, VecEnv
from collect_cli.errors import UsageError

__all__ = ["StepResult", "VecEnv", "env_factory"]


def env_factory(
    env_id: str, num_envs: int, backend: str = "gymnasium", kwargs: dict[str, Any] | None = None
) -> Callable[[], VecEnv]:
    """A picklable-enough zero-argument constructor for the chosen backend."""
    if backend == "gymnasium":
        from collect_cli.envs.gymnasium import GymnasiumVecEnv

        return lambda: GymnasiumVecEnv(env_id, num_envs, kwargs)
    raise UsageError(f"unknown env.backend {backend!r}: choose from gymnasium")
