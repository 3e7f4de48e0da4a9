"""The frames an export writes, in its order: every valid, committed frame
(``collector/mask`` True, within its lane's committed steps), lane by lane, in
time order, so each episode is contiguous. Padding is never exported, including
the padding a preempted worker leaves inside an episode's time span. Shared by
the D4RL, Minari and Hugging Face exports (and read by ``report``).

An episode cut by the end of the run (``complete`` False), or left running by a
killed run (no ``episodes/`` row yet), ends with a timeout (Minari: truncation)
at its last step; with ``drop_incomplete`` it is left out (:class:`Plan`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataset import Dataset
from collect_cli.errors import DatasetError

BLOCK_BYTES = 16 << 20  # frames read per block, over all keys (peak RSS: about 3x)
# flags the exports carry as terminals/timeouts (from the plan), and the mask
SKIPPED = {*fmt.FLAGS, *(fmt.path((fmt.NEXT, flag)) for flag in fmt.FLAGS), fmt.MASK}
TRAJ, REWARD = fmt.TRAJ, fmt.path(fmt.REWARD_KEY)
TERMINATED, TRUNCATED = fmt.path(fmt.TERMINATED_KEY), fmt.path(fmt.TRUNCATED_KEY)
# how an incomplete episode ends, per format
INCOMPLETE_END = {"d4rl": "timeout", "minari": "truncation", "hf": "timeout"}


class Source:
    """Read access to a dataset's frame arrays, by lane and time range."""

    def __init__(self, ds: Dataset):
        meta = ds.meta
        self.ds = ds
        self.meta = meta
        self.lanes, self.steps = int(meta.get("lanes") or 0), int(meta.get("steps") or 0)
        self.lane_steps = fmt.lane_steps(meta) if self.lanes else np.zeros(0, np.int64)
        self.keys = [k for k, _, _ in ds.describe() if not fmt.is_episodes(k)]
        self.text = {fmt.path(key) for key in fmt.text_keys(meta)}  # read as byte strings
        if fmt.MASK not in self.keys or not meta.get("frames"):
            raise DatasetError(f"{str(ds.path)!r} holds no committed frames: nothing to export")
        self._reading = contextlib.ExitStack()
        self._read = self._reading.enter_context(ds.reader(by_lane=True))

    def read(self, key: str, lanes: Any, start: int, stop: int) -> np.ndarray:
        array = np.asarray(self._read(key)[lanes, start:stop])
        return fmt.fixed_bytes(array) if key in self.text else array

    def episode_rows(self) -> dict[str, np.ndarray]:
        return self.ds.episodes()

    def close(self) -> None:
        self._reading.close()


@dataclass
class Plan:
    """Which frames are exported, in which order, and where episodes start and end.
    Built lane by lane: its memory is a byte or two a frame, whatever the dataset."""

    keep: np.ndarray  # [lanes, steps] bool
    frames: int  # exported frames
    traj_ids: np.ndarray  # per episode
    starts: np.ndarray  # first exported frame of each episode
    lengths: np.ndarray
    complete: np.ndarray  # per episode: ended by the env (not cut)
    sources: np.ndarray  # per episode: its row of the sources table
    terminals: np.ndarray  # next/terminated per exported frame
    timeouts: np.ndarray  # truncated, or the last step of an incomplete episode
    incomplete: int  # incomplete episodes in the source
    dropped: bool  # ...left out (else exported, ending with a timeout)

    @classmethod
    def build(cls, src: Source, drop_incomplete: bool) -> Plan:
        rows = src.episode_rows()
        complete_ids = rows["traj_id"][rows["complete"]]
        keep = np.zeros((src.lanes, src.steps), bool)
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("ids", "lengths", "term", "trunc")}
        incomplete: set[int] = set()
        lane_parts: dict[int, dict[str, list[np.ndarray]]] = {}  # a lane's, window by window
        for lanes, t0, t1 in windows(src, 11):  # traj, mask, terminated, truncated
            traj = src.read(TRAJ, lanes, t0, t1).reshape(-1, t1 - t0)
            valid = src.read(fmt.MASK, lanes, t0, t1).reshape(traj.shape).astype(bool)
            valid &= np.arange(t0, t1)[None, :] < src.lane_steps[lanes][:, None]
            term = src.read(TERMINATED, lanes, t0, t1).reshape(traj.shape)
            trunc = src.read(TRUNCATED, lanes, t0, t1).reshape(traj.shape)
            ended = valid & np.isin(traj, complete_ids)
            incomplete.update(np.unique(traj[valid & ~ended]).tolist())
            kept = ended if drop_incomplete else valid
            keep[lanes, t0:t1] = kept
            for i, lane in enumerate(range(lanes.start, lanes.stop)):
                mine = lane_parts.setdefault(lane, {"ids": [], "term": [], "trunc": []})
                for name, values in (("ids", traj), ("term", term), ("trunc", trunc)):
                    mine[name].append(values[i][kept[i]])
                if t1 < src.steps:
                    continue  # the lane goes on in the next window
                done = {k: np.concatenate(v) for k, v in lane_parts.pop(lane).items()}
                ids = done["ids"]
                if not len(ids):
                    continue
                first = np.flatnonzero(np.append(True, ids[1:] != ids[:-1]))
                parts["ids"].append(ids[first])
                parts["lengths"].append(np.diff(np.append(first, len(ids))))
                parts["term"].append(done["term"])
                parts["trunc"].append(done["trunc"])
        if not parts["ids"]:
            raise DatasetError("nothing to export: every episode is incomplete and was dropped")
        traj_ids, lengths = np.concatenate(parts["ids"]), np.concatenate(parts["lengths"])
        starts = np.cumsum(lengths) - lengths
        timeouts = np.concatenate(parts["trunc"]).astype(bool)
        complete = np.isin(traj_ids, complete_ids)
        timeouts[(starts + lengths - 1)[~complete]] = True
        terminals = np.concatenate(parts["term"]).astype(bool)
        sources = episode_sources(rows, traj_ids, len(fmt.sources(src.meta)) - 1)
        return cls(
            keep, int(lengths.sum()), traj_ids, starts, lengths, complete, sources, terminals,
            timeouts, len(incomplete), drop_incomplete,
        )  # fmt: skip


def windows(src: Source, row_bytes: int) -> Iterator[tuple[slice, int, int]]:
    """``(lanes, t0, t1)`` blocks of about ``BLOCK_BYTES`` in export order (lane, then
    time): whole lanes together where they fit (one read a key: chunks span lanes),
    else one lane in windows of time."""
    steps = max(1, src.steps)
    group = BLOCK_BYTES // (steps * max(1, row_bytes))
    if group >= 2:
        for l0 in range(0, src.lanes, group):
            yield slice(l0, min(src.lanes, l0 + group)), 0, src.steps
        return
    window = max(1, BLOCK_BYTES // max(1, row_bytes))
    for lane in range(src.lanes):
        for t0 in range(0, steps, window):
            yield slice(lane, lane + 1), t0, min(steps, t0 + window)


def episode_sources(rows: fmt.Rows, traj_ids: np.ndarray, unknown: int) -> np.ndarray:
    """The sources row of each trajectory of ``traj_ids`` from the episodes ``rows``;
    ``unknown`` (the last row: the policy at the kill) for one a killed run left
    without a row."""
    order = np.argsort(rows["traj_id"], kind="stable")
    known = rows["traj_id"][order]
    at = np.minimum(np.searchsorted(known, traj_ids), max(0, len(known) - 1))
    found = (known[at] == traj_ids) if len(known) else np.zeros(len(traj_ids), bool)
    return np.where(found, rows[fmt.SOURCE][order][at] if len(known) else unknown, unknown)


def blocks(src: Source, keys: list[str], keep: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
    """The kept frames of ``keys`` in export order, a lane's at a time, read in blocks
    of about ``BLOCK_BYTES`` (:func:`windows`)."""
    row_bytes = sum(src.read(k, 0, 0, 1)[0].nbytes for k in keys) or 1
    for lanes, t0, t1 in windows(src, row_bytes):
        kept = keep[lanes, t0:t1]
        if not kept.any():
            continue
        first = int(np.argmax(kept.any(axis=0)))  # the block's span of kept frames
        last = t1 - t0 - int(np.argmax(kept.any(axis=0)[::-1]))
        read = {k: src.read(k, lanes, t0 + first, t0 + last) for k in keys}
        for i in range(kept.shape[0]):
            sel = kept[i, first:last]
            if sel.any():
                yield {k: v[i][sel] for k, v in read.items()}


def episodes(blocks: Iterator[dict[str, np.ndarray]], lengths: np.ndarray) -> Iterator[dict]:
    """Regroup the stream of frame blocks into consecutive episodes of ``lengths``."""
    pending: list[dict[str, np.ndarray]] = []
    have = 0
    todo = iter(lengths.tolist())
    need = next(todo, None)
    for block in blocks:
        pending.append(block)
        have += len(next(iter(block.values())))
        while need is not None and have >= need:
            joined = pending[0]
            if len(pending) > 1:
                joined = {k: np.concatenate([p[k] for p in pending]) for k in joined}
            yield {k: v[:need] for k, v in joined.items()}
            have -= need
            pending = [{k: v[need:] for k, v in joined.items()}] if have else []
            need = next(todo, None)


def d4rl_name(key: str) -> str | None:
    """Where a dataset key goes in the D4RL layout (None: not exported)."""
    if key in SKIPPED:
        return None
    head, _, rest = key.partition("/")
    tail = "/" + rest if rest else ""
    if head == fmt.OBSERVATION:
        return "observations" + tail
    if head == fmt.ACTION:
        return "actions" + tail
    if head == fmt.STATE:  # record.state: D4RL's infos/qpos, infos/qvel
        return "infos/" + rest
    if head == fmt.NEXT:
        sub, _, deeper = rest.partition("/")
        if sub == fmt.OBSERVATION:
            return "next_observations" + ("/" + deeper if deeper else "")
        if sub == fmt.STATE:
            return "infos/next_" + deeper
        if key == REWARD:
            return "rewards"
        return "infos/next/" + rest.removeprefix("info/")
    if key == TRAJ:
        return "infos/traj_id"
    if head == fmt.COLLECTOR:
        return None
    return "infos/" + key.removeprefix("info/")
