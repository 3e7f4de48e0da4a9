"""Env backends behind one interface (:class:`VecEnv`), chosen by ``env.backend``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collect_cli.config import ENV_BACKENDS as BACKENDS
from collect_cli.envs.base import StepResult, VecEnv
from collect_cli.errors import UsageError

__all__ = ["BACKENDS", "EnvFactory", "StepResult", "VecEnv", "env_factory"]


@dataclass(frozen=True)
class EnvFactory:
    """A picklable zero-argument constructor (workers rebuild their env from it)."""

    env_id: str
    num_envs: int
    backend: str = "gymnasium"
    kwargs: dict[str, Any] = field(default_factory=dict)
    info_keys: tuple[str, ...] = ()
    device: str = "cpu"  # where env.backend=native runs (the others ignore it)
    wrappers: tuple[tuple[str, dict[str, Any]], ...] = ()  # gymnasium: around each env

    def __call__(self) -> VecEnv:
        if self.backend == "gymnasium":
            from collect_cli.envs.gymnasium import GymnasiumVecEnv

            return GymnasiumVecEnv(
                self.env_id, self.num_envs, dict(self.kwargs), tuple(self.info_keys), self.wrappers
            )
        if self.backend == "envpool":
            from collect_cli.envs.envpool import EnvpoolVecEnv

            return EnvpoolVecEnv(
                self.env_id, self.num_envs, dict(self.kwargs), tuple(self.info_keys)
            )
        if self.backend == "native":
            from collect_cli.envs.native import NativeVecEnv

            return NativeVecEnv(
                self.env_id, self.num_envs, dict(self.kwargs), tuple(self.info_keys), self.device
            )
        raise UsageError(f"unknown env.backend {self.backend!r}: choose from {', '.join(BACKENDS)}")


def env_factory(
    env_id: str,
    num_envs: int,
    backend: str = "gymnasium",
    kwargs: dict[str, Any] | None = None,
    info_keys: tuple[str, ...] | list[str] = (),
    device: str = "cpu",
    wrappers: tuple[tuple[str, dict[str, Any]], ...] = (),
) -> EnvFactory:
    """The constructor of ``num_envs`` lanes of ``env_id`` on ``backend``.

    ``info_keys``: numeric entries of the env's step ``info`` to record under ``info/``.
    ``device``: where ``backend="native"`` envs run (``cpu``, ``cuda:N``).
    ``wrappers``: ``("module.Class", kwargs)`` gymnasium wrappers around each env
    (an RL Zoo run's ``env_wrapper``), innermost first; gymnasium backend only.
    """
    if backend not in BACKENDS:
        raise UsageError(f"unknown env.backend {backend!r}: choose from {', '.join(BACKENDS)}")
    if wrappers and backend != "gymnasium":
        raise UsageError(
            f"env wrapper {wrappers[0][0]} (the policy's RL Zoo env_wrapper) wraps gymnasium "
            f"envs: use env.backend=gymnasium, not {backend}"
        )
    return EnvFactory(
        env_id,
        num_envs,
        backend,
        dict(kwargs or {}),
        tuple(info_keys),
        str(device),
        tuple((path, dict(kw)) for path, kw in wrappers),
    )
