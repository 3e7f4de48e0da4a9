"""The user's own policies: a TorchScript file, a ``torch.export`` program, or a
Python factory (``pkg.module:factory``). Their actions are recorded as returned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING

from collect_cli.policies.kind import PolicyKind, file_record, versions
from collect_cli.schema import PolicyConfig


@dataclass
class TorchScriptPolicyConfig(PolicyConfig):
    """A TorchScript module (deprecated upstream: prefer ``policy=export``)."""

    name: str = "torchscript"
    path: str = MISSING


@dataclass
class ExportPolicyConfig(PolicyConfig):
    """A ``torch.export`` program from the observation to the action (or a dict)."""

    name: str = "export"
    path: str = MISSING


@dataclass
class PythonPolicyConfig(PolicyConfig):
    """``pkg.module:factory`` returning a module or callable on the observation."""

    name: str = "python"
    target: str = MISSING


def build_torchscript(cfg: TorchScriptPolicyConfig, obs_space, action_space, device, seed: int):
    from collect_cli.policies.loaders import load_torchscript_policy

    return load_torchscript_policy(cfg.path).to(device).eval()


def build_export(cfg: ExportPolicyConfig, obs_space, action_space, device, seed: int):
    from collect_cli.policies.loaders import load_export_policy

    return load_export_policy(cfg.path).to(device)


def build_python(cfg: PythonPolicyConfig, obs_space, action_space, device, seed: int):
    import torch
    from torch import nn

    from collect_cli.policies.loaders import load_python_policy

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = load_python_policy(cfg.target, obs_space, action_space)
    return policy.to(device).eval() if isinstance(policy, nn.Module) else policy


def file_provenance(cfg: TorchScriptPolicyConfig | ExportPolicyConfig) -> dict:
    path = Path(cfg.path)
    record = {"checkpoint": file_record(path)} if path.is_file() else {}
    return {**record, "library_versions": versions("torch")}


TORCHSCRIPT = PolicyKind(
    "torchscript",
    TorchScriptPolicyConfig,
    build_torchscript,
    "a TorchScript file (policy.path; deprecated upstream: prefer export)",
    needs=("path", "policy.path=policy.pt"),
    provenance=file_provenance,
    user_code=True,
)
EXPORT = PolicyKind(
    "export",
    ExportPolicyConfig,
    build_export,
    "a torch.export program (policy.path)",
    needs=("path", "policy.path=policy.pt2"),
    provenance=file_provenance,
    user_code=True,
)
PYTHON = PolicyKind(
    "python",
    PythonPolicyConfig,
    build_python,
    "your factory pkg.module:fn (policy.target)",
    needs=("target", "policy.target=my_pkg.policies:make_policy"),
    provenance=lambda cfg: {"target": cfg.target},
    user_code=True,
)
