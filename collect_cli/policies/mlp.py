"""``policy=mlp``: a deterministic MLP, seeded or with weights from a state_dict file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from collect_cli.config_checks import RANGE, Range, choice
from collect_cli.errors import ConfigError
from collect_cli.policies.kind import PolicyKind, file_record
from collect_cli.schema import PolicyConfig

# policy.activation -> its torch.nn class
ACTIVATIONS = {
    "tanh": "Tanh",
    "relu": "ReLU",
    "elu": "ELU",
    "gelu": "GELU",
    "silu": "SiLU",
    "identity": "Identity",
}


@dataclass
class MlpPolicyConfig(PolicyConfig):
    """A deterministic MLP; weights from ``checkpoint`` (a state_dict file) or seeded."""

    name: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [64, 64], metadata={RANGE: Range(low=1)})
    activation: str = "tanh"
    checkpoint: str | None = None


def check(cfg: MlpPolicyConfig) -> None:
    choice("policy.activation", cfg.activation, tuple(ACTIVATIONS))
    if not cfg.hidden:
        raise ConfigError("policy.hidden must be one layer size at least, e.g. [64, 64]")


def build(cfg: MlpPolicyConfig, obs_space, action_space, device, seed: int):
    import torch
    from torch import nn

    from collect_cli.policies.loaders import load_state_dict
    from collect_cli.policies.nets import MlpPolicy

    activation = getattr(nn, ACTIVATIONS[cfg.activation])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = MlpPolicy(obs_space, action_space, list(cfg.hidden), activation)
    if cfg.checkpoint:
        load_state_dict(policy, cfg.checkpoint)
    return policy.to(device).eval()


def provenance(cfg: MlpPolicyConfig) -> dict:
    if cfg.checkpoint and Path(cfg.checkpoint).is_file():
        return {"checkpoint": file_record(Path(cfg.checkpoint))}
    return {}


KIND = PolicyKind(
    "mlp",
    MlpPolicyConfig,
    build,
    "a deterministic MLP (policy.hidden, policy.activation, policy.checkpoint)",
    check=check,
    provenance=provenance,
)
