"""Env backends behind one interface (:class:`VecEnv`), one line each in
:data:`BACKENDS`: ``env.backend=<name>`` picks one. A backend is a ``VecEnv``
class whose constructor takes ``(env_id, num_envs, kwargs, info_keys, device,
wrappers)``; its module is imported when an env is built."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from collect_cli.errors import UsageError

__all__ = ["BACKENDS", "EnvBackend", "EnvFactory", "available", "env_factory"]


@dataclass(frozen=True)
class EnvBackend:
    vec_env: str  # "module:Class" of its VecEnv
    dist: str  # the distribution `rlcollect envs` reports the version of
    max_envs: int  # envs per collector process, at most
    lanes: str  # what a lane is, in words (why max_envs)
    wraps: bool = False  # takes gymnasium wrappers around each env (an RL Zoo env_wrapper)
    states: bool = False  # records the simulator's state (record.state=true)


BACKENDS = {
    "gymnasium": EnvBackend(
        "collect_cli.envs.gymnasium:GymnasiumVecEnv", "gymnasium", 2**14,
        "one Python env object per lane", wraps=True, states=True,
    ),
    "envpool": EnvBackend(
        "collect_cli.envs.envpool:EnvpoolVecEnv", "envpool", 2**14, "one C++ env per lane"
    ),
    "native": EnvBackend(  # batched torch, part of rlcollect: there whenever torch is
        "collect_cli.envs.native:NativeVecEnv", "torch", 2**24,
        "lanes are rows of the batched tensors",
    ),
}  # fmt: skip


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
    state: bool = False  # record the simulator's state (backends with ``states``)

    def __call__(self):  # -> envs.base.VecEnv
        module, _, name = BACKENDS[self.backend].vec_env.partition(":")
        cls = getattr(importlib.import_module(module), name)
        extra = {"state": True} if self.state else {}
        return cls(
            self.env_id,
            self.num_envs,
            dict(self.kwargs),
            tuple(self.info_keys),
            device=self.device,
            wrappers=self.wrappers,
            **extra,
        )


def available() -> list[dict[str, Any]]:
    """Each backend: whether its distribution is installed here, and its version."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name, backend in BACKENDS.items():
        try:
            found = version(backend.dist)
        except PackageNotFoundError:
            out.append({"name": name, "available": False, "detail": "not installed"})
            continue
        detail = found if backend.dist == name else f"{backend.dist} {found}"
        out.append({"name": name, "available": True, "detail": detail})
    return out


def env_factory(
    env_id: str,
    num_envs: int,
    backend: str = "gymnasium",
    kwargs: dict[str, Any] | None = None,
    info_keys: tuple[str, ...] | list[str] = (),
    device: str = "cpu",
    wrappers: tuple[tuple[str, dict[str, Any]], ...] = (),
    state: bool = False,
) -> EnvFactory:
    """The constructor of ``num_envs`` lanes of ``env_id`` on ``backend``.

    ``info_keys``: numeric entries of the env's step ``info`` to record under ``info/``.
    ``device``: where ``backend="native"`` envs run (``cpu``, ``cuda:N``).
    ``wrappers``: ``("module.Class", kwargs)`` gymnasium wrappers around each env
    (an RL Zoo run's ``env_wrapper``), innermost first; gymnasium backend only.
    ``state``: also record the simulator's state (``record.state=true``: MuJoCo's
    qpos and qvel, classic control's ``unwrapped.state``); gymnasium backend only.
    """
    if backend not in BACKENDS:
        raise UsageError(f"unknown env.backend {backend!r}: choose from {', '.join(BACKENDS)}")
    if wrappers and not BACKENDS[backend].wraps:
        raise UsageError(
            f"env wrapper {wrappers[0][0]} (the policy's RL Zoo env_wrapper) wraps gymnasium "
            f"envs: use env.backend=gymnasium, not {backend}"
        )
    if state and not BACKENDS[backend].states:
        raise UsageError(
            f"record.state=true records the simulator state of gymnasium envs; env.backend="
            f"{backend} exposes none: use env.backend=gymnasium, or record.state=false"
        )
    return EnvFactory(
        env_id,
        num_envs,
        backend,
        dict(kwargs or {}),
        tuple(info_keys),
        str(device),
        tuple((path, dict(kw)) for path, kw in wrappers),
        bool(state),
    )
