"""Integrity check of a dataset on disk: schema, shapes, dtypes, mask, traj ids, episodes.

:func:`validate` returns the problems found (empty: the dataset is sound). It
reads the arrays it checks into memory; the checks are vectorised.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, FORMAT_VERSION, MASK, STATUSES
from collect_cli.errors import OutputError
from collect_cli.writers import open_dataset

META_KEYS = (*fmt.REQUIRED_META, "config")


def validate(path: str | Path) -> list[str]:
    """Everything wrong with the dataset at ``path`` (an empty list: sound)."""
    return check(path)[0]


def check(path: str | Path) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` of the dataset at ``path``: what is wrong, and what
    is worth knowing about a sound one (a killed run's unflagged cuts)."""
    notes: list[str] = []
    return _problems(path, notes), notes


def _problems(path: str | Path, notes: list[str]) -> list[str]:
    try:
        ds = open_dataset(path)
        arrays = {key: (shape, dtype) for key, shape, dtype in ds.describe()}
    except (OutputError, OSError, KeyError, ValueError, RuntimeError) as exc:
        return [f"unreadable: {exc}"]
    meta = ds.meta
    problems = [f"metadata lacks {key!r}" for key in META_KEYS if key not in meta]
    if problems:
        return problems
    if meta["format_version"] not in fmt.READABLE_VERSIONS:
        problems.append(
            f"format_version {meta['format_version']} (expected one of "
            f"{', '.join(map(str, fmt.READABLE_VERSIONS))}; this rlcollect writes {FORMAT_VERSION})"
        )
    if meta["status"] not in STATUSES:
        problems.append(f"status {meta['status']!r} is not one of {', '.join(STATUSES)}")
    if meta["frames"] == 0 and MASK not in arrays:
        return problems  # nothing committed yet: an empty dataset is sound
    problems += _schema(arrays, meta)
    if problems:
        return problems
    try:
        problems += _frames_and_episodes(ds, meta, notes)
    except (OSError, ValueError, RuntimeError) as exc:
        problems.append(f"unreadable data: {exc}")
    return problems


def _schema(arrays: dict, meta: dict) -> list[str]:
    problems = []
    lanes, steps = meta["lanes"], meta["steps"]
    for key, kind in fmt.REQUIRED_FRAME_KEYS.items():
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
    for key in sorted(fmt.text_keys(meta)):
        name = fmt.path(key)
        if name in arrays and not fmt.holds_text(arrays[name][1]):
            problems.append(
                f"{name!r} is Text in the observation space but stored as {arrays[name][1]} "
                "(expected fixed-length bytes S<width> or uint8)"
            )
    for column in COLUMNS:
        name = fmt.column(column)
        if name not in arrays:
            problems.append(f"missing key {name!r}")
        elif arrays[name][0][0] < meta["episodes"]:
            problems.append(
                f"{name!r} has {arrays[name][0][0]} rows, metadata says {meta['episodes']}"
            )
    return problems


# durability D16 (docs/durability.md)
def _compact(ds, meta: dict, traj: np.ndarray, valid: np.ndarray, done: np.ndarray) -> list[str]:
    """A compact dataset keeps every valid frame's next observation: the lane's next
    frame (same trajectory, not an episode end) or a ``final/`` row (durability D13)."""
    stored = {key for key, _, _ in ds.stored()}
    needed = [fmt.FINAL_LANE_KEY, fmt.FINAL_TIME_KEY, *map(fmt.final_key, ds.compact)]
    absent = [fmt.path(k) for k in needed if fmt.path(k) not in stored]
    if absent:
        return [f"layout compact without {absent[0]!r}: next/observation cannot be rebuilt"]
    lane = ds.array(fmt.path(fmt.FINAL_LANE_KEY))
    time = ds.array(fmt.path(fmt.FINAL_TIME_KEY))
    t_next, row = fmt.next_sources(traj, valid, lane, time, fmt.lane_steps(meta))
    lanes = np.arange(len(traj))[:, None]
    follows = (t_next >= 0) & (traj[lanes, np.maximum(t_next, 0)] == traj) & ~done
    lost = valid & (row < 0) & ~follows
    if lost.any():
        return [f"{int(lost.sum())} frames' next/observation is lost (no final/ row)"]
    return []


def _frames_and_episodes(ds, meta: dict, notes: list[str]) -> list[str]:
    problems = []
    lanes, steps = meta["lanes"], meta["steps"]
    keys = {key for key, _, _ in ds.describe()}

    @functools.cache  # own_step reads next/done too: each array is read once
    def get(key: fmt.Key) -> np.ndarray | None:
        name = fmt.path(key)
        return ds.array(name)[:lanes, :steps].reshape(lanes, -1) if name in keys else None

    mask, traj = get(fmt.MASK_KEY), get(fmt.TRAJ_KEY)
    done, term, trunc = get(fmt.DONE_KEY), get(fmt.TERMINATED_KEY), get(fmt.TRUNCATED_KEY)
    reward, own_done = fmt.own_step(get, mask.shape)
    if not meta.get("reset_when_done", True):
        own_done = np.zeros_like(own_done)  # a trajectory spans episodes: no id change
    committed = fmt.committed(meta)
    valid = mask & committed
    if int(valid.sum()) != meta["frames"]:
        problems.append(f"{int(valid.sum())} valid frames, metadata says {meta['frames']}")
    padding = committed & ~mask
    if (traj[padding] != -1).any():
        problems.append(f"{int((traj[padding] != -1).sum())} padding frames have a traj_id != -1")
    if (traj[valid] < 0).any():
        problems.append(f"{int((traj[valid] < 0).sum())} valid frames have a negative traj_id")
    agree = done == (term | trunc)
    running = meta["status"] == fmt.RUNNING
    if running:  # durability D13: a kill while cuts were flagged (truncated goes first)
        tail_at = fmt.last_valid(valid, fmt.lane_steps(meta))  # each lane's last frame
        tail = np.where(tail_at >= 0, traj[np.arange(lanes), np.maximum(tail_at, 0)], -2)
        agree |= (traj == tail[:, None]) & trunc & ~done & ~term
    if not agree[valid].all():
        problems.append("next/done differs from next/terminated | next/truncated")
    if ds.compact:
        problems += _compact(ds, meta, traj, valid, done)

    # per lane, in time order (padding skipped), the id changes exactly after a frame
    # that ends its trajectory: a done frame, or the last frame of one the dataset cut
    ep = {name: ds.array(fmt.column(name))[: meta["episodes"]] for name in COLUMNS}
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
    if (ep["start"] != time_of[first[pos]]).any():  # first: the id's earliest frame
        problems.append("episodes/start disagrees with the frames")
    if not np.allclose(ep["return"], returns[pos], rtol=1e-5, atol=1e-4):
        problems.append("episodes/return disagrees with the frames' rewards")
    last_frame = np.zeros(len(unique), np.int64)
    np.maximum.at(last_frame, inverse, np.arange(len(ids)))
    complete = ep["complete"]
    end_lane, end_time = lane_of[last_frame[pos]], time_of[last_frame[pos]]
    if (complete & ~ends[last_frame[pos]]).any():
        problems.append("episodes/complete disagrees with the frames' done flags")
    last = last_frame[pos][complete]
    if (ep["terminated"][complete] != term[lane_of[last], time_of[last]]).any() or (
        ep["truncated"][complete] != trunc[lane_of[last], time_of[last]]
    ).any():
        problems.append("episodes terminated/truncated disagree with the frames")
    # the dataset's own cuts end with next/truncated and next/done, like an env's
    flagged = trunc & done
    unflagged = ~complete & ~flagged[end_lane, end_time] & meta.get("reset_when_done", True)
    unflagged &= meta["format_version"] >= fmt.FLAGGED_CUTS_SINCE
    missing = np.setdiff1d(unique, ep["traj_id"])
    if running:
        # a killed run has not yet recorded (nor flagged) the trajectory of each lane
        # that the kill cut: resume=true does both
        tails = {int(traj[lane, t]) for lane, t in enumerate(tail_at.tolist()) if t >= 0}
        missing = np.array([m for m in missing.tolist() if m not in tails])
        cut = sum(1 for lane, t in enumerate(tail_at.tolist()) if t >= 0 and not done[lane, t])
        if cut:
            notes.append(
                f"{cut} trajectories cut by the kill end without next/done: resume=true flags them"
            )
        unflagged &= ~np.isin(ep["traj_id"], list(tails))
    if unflagged.any():
        problems.append(
            f"{int(unflagged.sum())} trajectories cut by the dataset end without next/truncated"
        )
    if len(missing):
        problems.append(f"{len(missing)} trajectories have no episodes row (e.g. {missing[0]})")
    return problems
