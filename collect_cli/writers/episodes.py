"""The ``episodes/`` table: one row per trajectory, computed from frame batches.

Rows come out when an episode ends (``next/done``) in chronological order;
:meth:`EpisodeTracker.finish` emits the episodes still running, marked incomplete.
All work is vectorised over lanes and boundaries (no Python loop per lane).
"""

from __future__ import annotations

import numpy as np
from tensordict import TensorDictBase

COLUMNS: dict[str, np.dtype] = {
    "traj_id": np.dtype(np.int64),
    "lane": np.dtype(np.int64),
    "start": np.dtype(np.int64),
    "length": np.dtype(np.int64),
    "return": np.dtype(np.float64),
    "terminated": np.dtype(bool),
    "truncated": np.dtype(bool),
    "complete": np.dtype(bool),
}

Rows = dict[str, np.ndarray]


def empty_rows() -> Rows:
    return {name: np.zeros(0, dtype) for name, dtype in COLUMNS.items()}


def concat_rows(parts: list[Rows]) -> Rows:
    if not parts:
        return empty_rows()
    return {name: np.concatenate([p[name] for p in parts]) for name in COLUMNS}


class EpisodeTracker:
    """Carries the running episode of every lane across batches."""

    def __init__(self, lanes: int):
        self.lanes = lanes
        self.start = np.zeros(lanes, np.int64)
        self.length = np.zeros(lanes, np.int64)
        self.ret = np.zeros(lanes, np.float64)
        self.traj = np.full(lanes, -1, np.int64)

    def update(self, batch: TensorDictBase, t0: int, lane_start: int = 0) -> Rows:
        """Consume one batch of lanes ``lane_start...`` written at time offset ``t0``."""
        mask = batch.get(("collector", "mask")).numpy()
        traj = batch.get(("collector", "traj_ids")).numpy()
        reward = batch.get(("next", "reward")).numpy().reshape(mask.shape).astype(np.float64)
        term = batch.get(("next", "terminated")).numpy().reshape(mask.shape)
        trunc = batch.get(("next", "truncated")).numpy().reshape(mask.shape)
        done = batch.get(("next", "done")).numpy().reshape(mask.shape) & mask
        nlanes, steps = mask.shape
        group = slice(lane_start, lane_start + nlanes)
        carry_start, carry_len = self.start[group], self.length[group]
        carry_ret, carry_traj = self.ret[group], self.traj[group]

        cum_ret = np.cumsum(np.where(mask, reward, 0.0), axis=1)
        cum_len = np.cumsum(mask, axis=1)
        lanes, ts = np.nonzero(done)  # lane-major: sorted by lane, then time
        first = np.ones(len(lanes), bool)
        first[1:] = lanes[1:] != lanes[:-1]
        prev = np.arange(len(lanes)) - 1
        prev_ret = np.where(first, -carry_ret[lanes], cum_ret[lanes[prev], ts[prev]])
        prev_len = np.where(first, -carry_len[lanes], cum_len[lanes[prev], ts[prev]])
        rows: Rows = {
            "traj_id": traj[lanes, ts],
            "lane": lanes.astype(np.int64) + lane_start,
            "start": np.where(first, carry_start[lanes], t0 + ts[prev] + 1),
            "length": cum_len[lanes, ts] - prev_len,
            "return": cum_ret[lanes, ts] - prev_ret,
            "terminated": term[lanes, ts],
            "truncated": trunc[lanes, ts],
            "complete": np.ones(len(lanes), bool),
        }
        order = np.lexsort((lanes, ts))
        rows = {k: np.ascontiguousarray(v[order], COLUMNS[k]) for k, v in rows.items()}

        # carry the tails into the next batch
        last = np.ones(len(lanes), bool)
        last[:-1] = lanes[:-1] != lanes[1:]
        ended, end_t = lanes[last], ts[last]
        tail_ret = cum_ret[:, -1].copy()
        tail_len = cum_len[:, -1].copy()
        tail_ret[ended] -= cum_ret[ended, end_t]
        tail_len[ended] -= cum_len[ended, end_t]
        carry_ret += tail_ret
        carry_len += tail_len
        carry_ret[ended] = tail_ret[ended]
        carry_len[ended] = tail_len[ended]
        carry_start[ended] = t0 + end_t + 1
        has_valid = mask.any(axis=1)
        last_valid = steps - 1 - np.argmax(mask[:, ::-1], axis=1)
        carry_traj[:] = np.where(has_valid, traj[np.arange(nlanes), last_valid], carry_traj)
        carry_traj[ended[end_t == last_valid[ended]]] = -1
        return rows

    def finish(self) -> Rows:
        """Rows for the episodes cut by the end of the run (``complete=False``)."""
        open_lanes = np.flatnonzero((self.length > 0) & (self.traj >= 0))
        n = len(open_lanes)
        return {
            "traj_id": self.traj[open_lanes],
            "lane": open_lanes.astype(np.int64),
            "start": self.start[open_lanes],
            "length": self.length[open_lanes],
            "return": self.ret[open_lanes],
            "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool),
            "complete": np.zeros(n, bool),
        }
