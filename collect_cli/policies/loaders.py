"""Loading a user's policy: a Python factory, a TorchScript file, a ``torch.export``
program, or MLP weights (a state_dict)."""

from __future__ import annotations

import importlib
import inspect
import logging
from pathlib import Path

import torch
from gymnasium import spaces
from tensordict.nn import TensorDictModuleBase
from torch import nn

from collect_cli.errors import PolicyError
from collect_cli.policies.nets import ObservationPolicy

log = logging.getLogger("rlcollect")
_torchscript_noted = False  # the deprecation note is said once per process


def load_python_policy(
    target: str, obs_space: spaces.Space, action_space: spaces.Space
) -> nn.Module:
    """Import ``pkg.module:factory`` and build the policy it returns."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyError(f"policy.target={target!r} must look like 'pkg.module:factory'")
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:
        raise PolicyError(
            f"cannot import policy.target module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PolicyError(f"policy.target {target!r}: {module_name} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise PolicyError(f"policy.target {target!r} is not callable")
    try:
        params = inspect.signature(obj).parameters
        takes_spaces = "observation_space" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )
    except (TypeError, ValueError):
        takes_spaces = False
    try:
        if takes_spaces:
            policy = obj(observation_space=obs_space, action_space=action_space)
        else:
            policy = obj()
    except Exception as exc:
        raise PolicyError(f"policy factory {target} raised {type(exc).__name__}: {exc}") from None
    if isinstance(policy, TensorDictModuleBase):
        return policy
    if not callable(policy):
        raise PolicyError(f"policy factory {target} returned {type(policy).__name__}, not a policy")
    return ObservationPolicy(policy, target)


def load_torchscript_policy(path: str) -> nn.Module:
    global _torchscript_noted
    file = Path(path)
    if not file.is_file():
        raise PolicyError(f"policy.path {path!r} does not exist")
    try:
        module = torch.jit.load(str(file), map_location="cpu")
    except Exception as exc:
        raise PolicyError(
            f"policy.path {path!r} is not a TorchScript file ({type(exc).__name__})"
        ) from None
    if not _torchscript_noted:  # after the load: a usage error stays one line
        _torchscript_noted = True
        log.warning(
            "TorchScript is deprecated upstream (torch 2.13): save the policy with "
            "torch.export and use policy=export"
        )
    return ObservationPolicy(module, path)


def load_export_policy(path: str) -> nn.Module:
    """A ``torch.export`` program (``torch.export.save``) from observation to action
    (or to a dict with ``action`` and extras)."""
    file = Path(path)
    if not file.is_file():
        raise PolicyError(f"policy.path {path!r} does not exist")
    try:
        program = torch.export.load(str(file))
    except Exception as exc:
        raise PolicyError(
            f"policy.path {path!r} is not a torch.export program ({type(exc).__name__}): "
            "save one with torch.export.save(torch.export.export(module, (obs,)), path)"
        ) from None
    return ObservationPolicy(program.module(), path)


def load_state_dict(module: nn.Module, path: str) -> None:
    """Load a weights-only checkpoint into ``module`` (accepts ``net.``-prefixed keys or not)."""
    file = Path(path)
    if not file.is_file():
        raise PolicyError(f"policy checkpoint {path!r} does not exist")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise PolicyError(
            f"policy checkpoint {path!r} is not a readable state_dict ({type(exc).__name__})"
        ) from None
    if not isinstance(state, dict):
        raise PolicyError(f"policy checkpoint {path!r} holds a {type(state).__name__}, not a dict")
    net = module.net  # type: ignore[attr-defined]
    state = {k.removeprefix("net."): v for k, v in state.items()}
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        detail = str(exc).strip().splitlines()
        raise PolicyError(
            f"policy checkpoint {path!r} does not match the MLP "
            f"({detail[1].strip() if len(detail) > 1 else detail[0]})"
        ) from None
