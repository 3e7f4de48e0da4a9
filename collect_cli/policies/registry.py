"""Every policy kind, one line each: ``policy=<name>`` picks one."""

from __future__ import annotations

import importlib

from collect_cli.errors import ConfigError
from collect_cli.policies.kind import PolicyKind
from collect_cli.schema import PolicyConfig


def _load(*where: str) -> dict[str, PolicyKind]:
    kinds = []
    for path in where:  # "module:NAME" of a PolicyKind
        module, _, name = path.partition(":")
        kinds.append(getattr(importlib.import_module(module), name))
    return {kind.name: kind for kind in kinds}


KINDS = _load(
    "collect_cli.policies.random:KIND",
    "collect_cli.policies.mlp:KIND",
    "collect_cli.policies.user:TORCHSCRIPT",
    "collect_cli.policies.user:PYTHON",
    "collect_cli.policies.user:EXPORT",
    "collect_cli.policies.sb3:KIND",
)


def kind_of(cfg: PolicyConfig) -> PolicyKind:
    """The kind whose options ``cfg`` is."""
    for kind in KINDS.values():
        if type(cfg) is kind.config:
            return kind
    raise ConfigError(f"unknown policy {cfg.name!r}: choose from {', '.join(KINDS)}")
