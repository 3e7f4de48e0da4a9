"""Devices by name: ``cpu``, ``cuda``, ``cuda:N``, checked against this machine."""

from __future__ import annotations

from collect_cli.errors import DeviceError


def resolve_device(name, key: str = "device"):
    """``torch.device`` for ``name`` (a ``cuda`` without index: the current one, so
    that generators and tensors share one explicit device); a usage error if it is
    malformed or this machine lacks it."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise DeviceError(f"{key}={name!r} is not a device: use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"{key}={name} asked for CUDA, but CUDA is not available here: use {key}=cpu"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(
                f"{key}={name} is out of range: this machine has {count} CUDA device(s)"
            )
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise DeviceError(f"{key}={name!r} is not supported: use cpu, cuda or cuda:N")
    return device


def cuda_devices() -> list[str]:
    """``cuda:N <name>`` of every CUDA device here."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(count)]
