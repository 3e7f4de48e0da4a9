"""Every policy kind, one line each: ``policy=<name>`` picks one."""

from __future__ import annotations

from collect_cli.errors import ConfigError
from collect_cli.policies import mlp, random, sb3, user
from collect_cli.policies.kind import PolicyKind
from collect_cli.schema import PolicyConfig

KINDS: dict[str, PolicyKind] = {
    kind.name: kind
    for kind in (
        random.KIND,
        mlp.KIND,
        user.TORCHSCRIPT,
        user.PYTHON,
        user.EXPORT,
        sb3.KIND,
    )
}


def kind_of(cfg: PolicyConfig) -> PolicyKind:
    """The kind whose options ``cfg`` is."""
    for kind in KINDS.values():
        if type(cfg) is kind.config:
            return kind
    raise ConfigError(f"unknown policy {cfg.name!r}: choose from {', '.join(KINDS)}")
