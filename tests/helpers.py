"""Dataset consistency checks and process-tree helpers shared by the tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from collect_cli.writers import open_dataset


def assert_consistent(path: Path | str) -> dict:
    """Check the contract on a dataset reopened from disk; return its metadata."""
    ds = open_dataset(path)
    meta = ds.meta
    mask = ds.array("collector/mask")
    traj = ds.array("collector/traj_ids")
    done = ds.array("next/done")[..., 0]
    assert int(mask.sum()) == meta["frames"]
    assert (traj[~mask] == -1).all(), "padding must carry traj_id -1"
    assert (traj[mask] >= 0).all()
    lanes_of = {}
    for lane in range(traj.shape[0]):
        valid = np.flatnonzero(mask[lane])
        ids, d = traj[lane, valid], done[lane, valid]
        # within a lane (skipping padding) the id changes exactly after a done frame
        np.testing.assert_array_equal(ids[1:] != ids[:-1], d[:-1])
        for i in np.unique(ids):
            assert lanes_of.setdefault(int(i), lane) == lane, f"traj {i} in two lanes"
    ep = ds.episodes()
    count = meta["episodes"]
    assert len(ep["traj_id"]) == count
    assert len(np.unique(ep["traj_id"])) == count
    assert set(ep["traj_id"].tolist()) == set(lanes_of)
    assert int(ep["length"].sum()) == meta["frames"]
    for i in range(count):
        assert lanes_of[int(ep["traj_id"][i])] == ep["lane"][i]
    return meta


def descendants(pid: int) -> set[int]:
    """Live descendant pids of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.add(child)
            stack.append(child)
    return out


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line contains ``text`` (leftover workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
