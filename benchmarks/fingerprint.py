"""The sha256 of every array of the datasets of 20 configurations: a refactor that
claims "no behaviour change" runs this before and after and compares the output.

    python benchmarks/fingerprint.py > before.json   # at the old commit
    python benchmarks/fingerprint.py > after.json    # at the new one
    diff before.json after.json

Arrays are hashed as the reader gives them (the logical dataset), so a change of
codec or chunking alone leaves the fingerprint as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PENDULUM = ["env=Pendulum", "env.num_envs=4", "total_frames=600", "frames_per_batch=200"]
CARTPOLE = ["env=CartPole", "env.num_envs=4", "total_frames=600", "frames_per_batch=200"]
PIXELS = ["env=gym", "env.id=pixelenvs:Pixels-v0", "env.num_envs=2", "total_frames=200"]
CONFIGS = {
    "sync-hdf5": PENDULUM,
    "sync-memmap": [*PENDULUM, "writer=memmap"],
    "mlp": [*PENDULUM, "policy=mlp"],
    "multisync": [*PENDULUM, "collector=multisync", "collector.workers=2"],
    "multisync-memmap": [*CARTPOLE, "collector=multisync", "writer=memmap"],
    "envpool": [*CARTPOLE, "env.backend=envpool"],
    "native": [*CARTPOLE, "env.backend=native"],
    "multistep": [*PENDULUM, "postproc=multistep"],
    "split_trajs": [*CARTPOLE, "split_trajs=true"],
    "split_trajs-memmap": [*CARTPOLE, "split_trajs=true", "writer=memmap"],
    "init_random": [*PENDULUM, "policy=mlp", "init_random_frames=200"],
    "gaussian": [*PENDULUM, "policy=mlp", "policy.noise=gaussian"],
    "epsilon": [*CARTPOLE, "policy=mlp", "policy.noise=epsilon"],
    "reset_at_each_iter": [*CARTPOLE, "reset_at_each_iter=true"],
    "max_frames_per_traj": [
        "env=gym",
        "env.id=toyenvs:Counter-v0",
        "total_frames=200",
        "max_frames_per_traj=3",
    ],
    "nested-obs": ["env=gym", "env.id=toyenvs:Nested-v0", "env.num_envs=2", "total_frames=200"],
    "info-keys": [
        "env=gym",
        "env.id=toyenvs:Info-v0",
        "env.num_envs=2",
        "total_frames=200",
        "env.info_keys=[x_position,terms]",
    ],
    "pixels": PIXELS,
    "pixels-compact": [*PIXELS, "writer.layout=compact"],
    "pixels-memmap": [*PIXELS, "writer=memmap"],
}


def open_dataset(path: Path):
    try:
        from collect_cli.dataset import open_dataset as opener
    except ImportError:  # before the storage layer was named dataset/
        from collect_cli.dataset import open_dataset as opener
    return opener(path)


def fingerprint(path: Path) -> dict[str, str]:
    ds = open_dataset(path)
    out = {}
    for key, _, _ in sorted(ds.describe()):
        array = np.ascontiguousarray(ds.array(key))
        digest = hashlib.sha256(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(array.tobytes() if array.dtype != object else repr(array.tolist()).encode())
        out[key] = digest.hexdigest()[:16]
    return out


def main() -> None:
    env = {"PYTHONPATH": str(ROOT / "tests" / "support")}
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in CONFIGS.items():
            out = Path(tmp) / name
            args = [*overrides, "progress=none", f"out={out}"]
            cmd = [sys.executable, "-m", "collect_cli", "run", *args]
            run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
            if run.returncode != 0:
                result[name] = f"exit {run.returncode}: {run.stderr.strip().splitlines()[-1:]}"
                continue
            made = out if out.exists() else out.with_suffix(".h5")
            result[name] = fingerprint(made)
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
