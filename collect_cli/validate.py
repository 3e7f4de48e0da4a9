"""Integrity check of a dataset on disk: schema, shapes, dtypes, mask, traj ids, episodes.

:func:`validate` returns the problems found (empty: the dataset is sound). It
reads the arrays it checks into memory; the checks are vectorised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collect_cli.errors import OutputError
from collect_cli.writers import open_dataset
from collect_cli.writers.base import FORMAT_VERSION, STATUSES
from collect_cli.writers.episodes import COLUMNS

FRAME_KEYS = {
    "observation": None,
    "action": None,
    "done": "bool",
    "terminated": "bool",
    "truncated": "bool",
    "next/observation": None,
    "next/reward": "float",
    "next/done": "bool",
    "next/terminated": "bool",
    "next/truncated": "bool",
    "collector/traj_ids": "int64",
    "collector/mask": "bool",
}
META_KEYS = ("format_version", "status", "frames", "steps", "episodes", "lanes", "env_id", "config")


def validate(path: str | Path) -> list[str]:
    """Everything wrong with the dataset at ``path`` (an empty list: sound)."""
    try:
        ds = open_dataset(path)
        arrays = {key: (shape, dtype) for key, shape, dtype in ds.describe()}
    except (OutputError, OSError, KeyError, ValueError, RuntimeError) as exc:
        return [f"unreadable: {exc}"]
    meta = ds.meta
    problems = [f"metadata lacks {key!r}" for key in META_KEYS if key not in meta]
    if problems:
        return problems
    if meta["format_version"] != FORMAT_VERSION:
        problems.append(f"format_version {meta['format_version']} (expected {FORMAT_VERSION})")
    if meta["status"] not in STATUSES:
        problems.append(f"status {meta['status']!r} is not one of {', '.join(STATUSES)}")
    if meta["frames"] == 0 and "collector/mask" not in arrays:
        return problems  # nothing committed yet: an empty dataset is sound
    problems += _schema(arrays, meta)
    if problems:
        return problems
    try:
        problems += _frames_and_episodes(ds, meta)
    except (OSError, ValueError, RuntimeError) as exc:
        problems.append(f"unreadable data: {exc}")
    return problems


def _schema(arrays: dict, meta: dict) -> list[str]:
    problems = []
    lanes, steps = meta["lanes"], meta["steps"]
    for key, kind in FRAME_KEYS.items():
        matches = [k for k in arrays if k == key or k.startswith(key + "/")]
        if not matches:
            problems.append(f"missing key {key!r}")
            continue
        for name in matches:
            shape, dtype = arrays[name]
            # rows past `lanes` (memmap, split_trajs) are allocated ahead and not yet committed
            if len(shape) < 2 or shape[0] < lanes or shape[1] < steps:
                problems.append(f"{name!r} has shape {shape}, expected [{lanes}, >={steps}, ...]")
            wrong = "float" not in dtype if kind == "float" else kind not in (None, dtype)
            if wrong:
                problems.append(f"{name!r} has dtype {dtype}, expected {kind}")
    for column in COLUMNS:
        name = f"episodes/{column}"
        if name not in arrays:
            problems.append(f"missing key {name!r}")
        elif arrays[name][0][0] < meta["episodes"]:
            problems.append(
                f"{name!r} has {arrays[name][0][0]} rows, metadata says {meta['episodes']}"
            )
    return problems


def _frames_and_episodes(ds, meta: dict) -> list[str]:
    problems = []
    lanes, steps = meta["lanes"], meta["steps"]
    lane_steps = np.asarray(meta.get("lane_steps") or [steps] * lanes)

    def frames(key: str) -> np.ndarray:
        return ds.array(key)[:lanes, :steps].reshape(lanes, -1)

    mask = frames("collector/mask")
    traj = frames("collector/traj_ids")
    done = frames("next/done")
    term = frames("next/terminated")
    trunc = frames("next/truncated")
    keys = {key for key, _, _ in ds.describe()}
    # after postproc=multistep, next/* look ahead: a frame's own step is "original"
    own_reward = "next/original_reward" if "next/original_reward" in keys else "next/reward"
    reward = frames(own_reward).astype(np.float64)
    own_done = done & (frames("steps_to_next_obs") == 1) if "steps_to_next_obs" in keys else done
    if not meta.get("reset_when_done", True):
        own_done = np.zeros_like(own_done)  # a trajectory spans episodes: no id change
    committed = np.arange(steps)[None, :] < lane_steps[:, None]
    valid = mask & committed
    if int(valid.sum()) != meta["frames"]:
        problems.append(f"{int(valid.sum())} valid frames, metadata says {meta['frames']}")
    padding = committed & ~mask
    if (traj[padding] != -1).any():
        problems.append(f"{int((traj[padding] != -1).sum())} padding frames have a traj_id != -1")
    if (traj[valid] < 0).any():
        problems.append(f"{int((traj[valid] < 0).sum())} valid frames have a negative traj_id")
    if not (done[valid] == (term[valid] | trunc[valid])).all():
        problems.append("next/done differs from next/terminated | next/truncated")

    # per lane, in time order (padding skipped), the id changes exactly after a done
    # frame, or after the last frame of an episode cut short (a resumed run)
    ep = {name: ds.array(f"episodes/{name}")[: meta["episodes"]] for name in COLUMNS}
    lane_of, time_of = np.nonzero(valid)
    ids, ends = traj[lane_of, time_of], own_done[lane_of, time_of]
    same_lane = lane_of[1:] == lane_of[:-1]
    changes = (ids[1:] != ids[:-1]) & same_lane
    cut = np.isin(ids[:-1], ep["traj_id"][~ep["complete"]]) & changes
    if not np.array_equal(changes, (ends[:-1] | cut) & same_lane):
        bad = int(np.argmax(changes != ((ends[:-1] | cut) & same_lane)))
        problems.append(
            f"traj_ids out of order in lane {lane_of[bad]} at step {time_of[bad]}: "
            "an id must change exactly after a done frame"
        )
    unique, first, inverse, counts = np.unique(
        ids, return_index=True, return_inverse=True, return_counts=True
    )
    lane_of_id = lane_of[first]
    if (lane_of_id[inverse] != lane_of).any():
        problems.append("a traj_id appears in more than one lane")
    returns = np.bincount(inverse, weights=reward[lane_of, time_of], minlength=len(unique))

    if len(np.unique(ep["traj_id"])) != len(ep["traj_id"]):
        problems.append("episodes/traj_id has duplicates")
    pos = np.searchsorted(unique, ep["traj_id"])
    known = (pos < len(unique)) & (unique[np.minimum(pos, len(unique) - 1)] == ep["traj_id"])
    if not known.all():
        problems.append(f"{int((~known).sum())} episodes rows name traj_ids absent from the frames")
        return problems
    if (ep["lane"] != lane_of_id[pos]).any():
        problems.append("episodes/lane disagrees with the frames")
    if (ep["length"] != counts[pos]).any():
        problems.append("episodes/length disagrees with the frames")
    if not np.allclose(ep["return"], returns[pos], rtol=1e-5, atol=1e-4):
        problems.append("episodes/return disagrees with the frames' rewards")
    last_frame = np.zeros(len(unique), np.int64)
    np.maximum.at(last_frame, inverse, np.arange(len(ids)))
    ended = ends[last_frame[pos]]
    if (ep["complete"] != ended).any():
        problems.append("episodes/complete disagrees with the frames' done flags")
    complete = ep["complete"]
    last = last_frame[pos][complete]
    if (ep["terminated"][complete] != term[lane_of[last], time_of[last]]).any() or (
        ep["truncated"][complete] != trunc[lane_of[last], time_of[last]]
    ).any():
        problems.append("episodes terminated/truncated disagree with the frames")
    missing = np.setdiff1d(unique, ep["traj_id"])
    if meta["status"] == "running":
        # a crashed run has not yet recorded the episodes still running in each lane
        tails = {int(traj[lane, np.flatnonzero(valid[lane])[-1]]) for lane in set(lane_of.tolist())}
        missing = np.array([m for m in missing.tolist() if m not in tails])
    if len(missing):
        problems.append(f"{len(missing)} trajectories have no episodes row (e.g. {missing[0]})")
    return problems
