"""What a dataset's metadata says its frames must obey, for ``validate``: the stream's
settings (from the metadata, else from the config it records) and the action space's
bounds."""

from __future__ import annotations

import numpy as np
import yaml

from collect_cli import dataformat as fmt
from collect_cli.policies.registry import KINDS

# what shaped the stream; a merged dataset's metadata lacks them: its config has them
SETTINGS = {"reset_when_done": True, "reset_at_each_iter": False, "exploration_type": "random"}


def settings(meta: dict) -> dict:
    """The stream's settings (:data:`SETTINGS`) and ``noise`` (policy.noise): from the
    metadata, else from the config it records (a merged dataset's: its first shard's)."""
    try:
        config = yaml.safe_load(meta.get("config") or "") or {}
    except yaml.YAMLError:
        config = {}
    config = config if isinstance(config, dict) else {}
    out = {k: meta[k] if k in meta else config.get(k, default) for k, default in SETTINGS.items()}
    policy = config.get("policy") if isinstance(config.get("policy"), dict) else {}
    out["noise"] = str(policy.get("noise", "none"))
    out["user_code"] = _user_code(str(meta.get("policy", policy.get("name"))))
    return out


def _user_code(kind: str) -> bool:
    """Whether policy ``kind`` runs the user's code (its actions recorded as returned)."""
    return any(KINDS[k].user_code for k in kind.split("+") if k in KINDS)


def action_bounds(meta: dict) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(stored key, low, high)`` of each leaf of the serialised action space:
    inclusive bounds as float64, shaped like a frame's value. A float Box's are widened
    by a few units in the last place (a sampler's ``low + span * u`` may round past)."""
    out = []
    for key, desc in fmt.described_leaves(meta.get("action_space")):
        kind = desc.get("type")
        if kind == "Box":
            shape, dtype = tuple(desc["shape"]), np.dtype(desc["dtype"])
            low = np.broadcast_to(np.asarray(desc["low"], np.float64), shape)
            high = np.broadcast_to(np.asarray(desc["high"], np.float64), shape)
            if dtype.kind == "f":  # both bounds finite: low + span * u (half: low + e)
                finite = np.isfinite(low) & np.isfinite(high)
                scale = np.where(finite, np.maximum(np.abs(low), np.abs(high)), 0.0)
                slack = 4 * np.finfo(dtype).eps * scale
                low, high = low - slack, high + slack
            out.append((fmt.path((fmt.ACTION, *key)), low, high))
        elif kind in ("Discrete", "MultiDiscrete", "MultiBinary"):
            span = desc.get("nvec", desc.get("n"))
            span = np.full(np.asarray(span).tolist(), 2) if kind == "MultiBinary" else span
            low = np.broadcast_to(np.asarray(desc.get("start", 0), np.float64), np.shape(span))
            out.append((fmt.path((fmt.ACTION, *key)), low, low + np.asarray(span) - 1))
    return out
