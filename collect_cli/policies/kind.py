"""What a policy kind is: its options (a schema class, Hydra's ``policy=<name>``) and
what rlcollect does with them. Each kind's module makes one :class:`PolicyKind`;
``registry.py`` lists them. A kind's module stays light at import (torch inside
its functions): the registry is read whenever a config is composed."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from collect_cli.schema import PolicyConfig


def _nothing(cfg: Any) -> None:
    return None


def _no_record(cfg: Any) -> dict[str, Any]:
    return {}


def _no_wrappers(cfg: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    return ()


@dataclass(frozen=True)
class PolicyKind:
    name: str  # policy=<name>
    config: type[PolicyConfig]
    # (cfg, observation space, action space, torch device, seed) -> the policy module
    build: Callable[..., Any]
    summary: str  # one line for `rlcollect run --help`
    needs: tuple[str, str] | None = None  # (the option that must be set, an example)
    check: Callable[[Any], None] = _nothing  # its options' values (ConfigError)
    provenance: Callable[[Any], dict[str, Any]] = _no_record  # what produced the actions
    # gymnasium wrappers the policy was trained inside, around each env
    env_wrappers: Callable[[Any], tuple[tuple[str, dict[str, Any]], ...]] = _no_wrappers
    # the user's own code acts: its actions are recorded as it returned them, bounds or
    # not (the env may clip them); rlcollect's own policies act inside the action space
    user_code: bool = False


def file_record(path: Path) -> dict[str, Any]:
    """A checkpoint file's name, size and sha256 (a kind's provenance)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"name": path.name, "size": path.stat().st_size, "sha256": digest.hexdigest()}


def versions(*dists: str) -> dict[str, str]:
    """The installed versions of ``dists`` (a kind's provenance)."""
    out = {}
    for dist in dists:
        with suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out
