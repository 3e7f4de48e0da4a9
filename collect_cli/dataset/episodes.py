"""The ``episodes/`` table: one row per trajectory, computed from frame batches.

Rows come out when an episode ends (``next/done``) in chronological order;
:meth:`EpisodeTracker.finish` emits the episodes still running, marked incomplete.
All work is vectorised over lanes and boundaries (no Python loop per lane).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDictBase

from collect_cli import dataformat as fmt
from collect_cli.dataformat import Rows, concat_rows

Frames = TensorDictBase | Mapping[fmt.Key, np.ndarray]  # a batch, or its leaves by key tuple

# the frame keys EpisodeTracker.update reads: whole-array numpy work, fastest on
# C-contiguous [lanes, time] arrays (writers.arrays.leaf_items makes these so)
TRACKED_KEYS = frozenset(
    {
        fmt.MASK_KEY,
        fmt.TRAJ_KEY,
        fmt.REWARD_KEY,
        fmt.ORIGINAL_REWARD_KEY,
        fmt.DONE_KEY,
        fmt.TERMINATED_KEY,
        fmt.TRUNCATED_KEY,
        fmt.STEPS_TO_NEXT_KEY,
    }
)


def frame_flags(batch: Frames, mask: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(reward, done, terminated, truncated)`` of each frame's own step, ``[lanes, time]``
    (:func:`~collect_cli.dataformat.own_step`); ``done`` is False on padding."""
    shape = mask.shape

    def get(key: fmt.Key) -> np.ndarray | None:
        value = batch.get(key, None)
        return None if value is None else np.asarray(value)

    reward, done = fmt.own_step(get, shape)
    return (
        reward,
        done & mask,
        get(fmt.TERMINATED_KEY).reshape(shape),
        get(fmt.TRUNCATED_KEY).reshape(shape),
    )


def _running_sum(x: np.ndarray) -> np.ndarray:
    """``np.cumsum(x, axis=1)`` of a float64 ``[lanes, time]`` array: the same sums, each
    added in turn along time; torch's scan is ~5x faster than numpy's on such rows."""
    return torch.cumsum(torch.from_numpy(np.ascontiguousarray(x)), 1).numpy()


class EpisodeTracker:
    """Carries the running episode of every lane across batches.

    An episode ends at a done frame (``split_on_done``) or where the lane's
    traj_id changes without one (a reset cut it: ``complete`` False). After each
    :meth:`update` and :meth:`finish`, :attr:`cuts` holds ``(lanes, times)`` of
    the last frame of every row they returned with ``complete`` False.
    """

    def __init__(self, lanes: int, split_on_done: bool = True, by_lane: bool = False):
        self.lanes = lanes
        self.split_on_done = split_on_done
        self.by_lane = by_lane  # rows ordered by lane (rows are episodes), not by end time
        self.start = np.zeros(lanes, np.int64)
        self.length = np.zeros(lanes, np.int64)
        self.ret = np.zeros(lanes, np.float64)
        self.traj = np.full(lanes, -1, np.int64)
        self.last_t = np.full(lanes, -1, np.int64)  # each lane's last valid frame
        self.src = np.zeros(lanes, np.int64)  # the sources row of each running episode
        self.source = 0  # the sources row whose policy acts now: episodes starting take it
        self.cuts: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64),) * 2

    def grow(self, lanes: int) -> None:
        extra = lanes - self.lanes
        self.start = np.concatenate([self.start, np.zeros(extra, np.int64)])
        self.length = np.concatenate([self.length, np.zeros(extra, np.int64)])
        self.ret = np.concatenate([self.ret, np.zeros(extra, np.float64)])
        self.traj = np.concatenate([self.traj, np.full(extra, -1, np.int64)])
        self.last_t = np.concatenate([self.last_t, np.full(extra, -1, np.int64)])
        self.src = np.concatenate([self.src, np.full(extra, self.source, np.int64)])
        self.lanes = lanes

    def update(self, batch: Frames, t0: int, lane_start: int = 0) -> Rows:
        """Consume one batch of lanes ``lane_start...`` written at time offset ``t0``
        (a TensorDict, or its leaves by key tuple: lane-major arrays read faster).

        A batch without padding (the usual one) skips the work padding needs: its
        lanes' first and last valid frames are its first and last (this runs once a
        batch, and on small batches its cost is the number of numpy calls)."""
        mask = np.asarray(batch.get(fmt.MASK_KEY))
        traj = np.asarray(batch.get(fmt.TRAJ_KEY))
        reward, done, term, trunc = frame_flags(batch, mask)
        if not self.split_on_done:
            done = np.zeros_like(done)
        nlanes, steps = mask.shape
        group = slice(lane_start, lane_start + nlanes)
        carry_start, carry_len = self.start[group], self.length[group]
        carry_ret, carry_traj, carry_src = self.ret[group], self.traj[group], self.src[group]

        # cuts: the next valid frame of the lane has another traj_id, and no done here
        full = bool(mask.all())  # no padding: the next valid frame is the next one
        ends = done.copy()
        if full:
            ends[:, :-1] |= traj[:, 1:] != traj[:, :-1]
            has_valid, first_valid, last_valid = True, 0, steps - 1
            first_id, last_id = traj[:, 0], traj[:, -1]
        else:
            lane_v, t_v = np.nonzero(mask)
            change = np.zeros(len(lane_v), bool)
            change[:-1] = (lane_v[1:] == lane_v[:-1]) & (
                traj[lane_v[1:], t_v[1:]] != traj[lane_v[:-1], t_v[:-1]]
            )
            ends[lane_v[change], t_v[change]] = True
            every = np.arange(nlanes)
            has_valid = mask.any(axis=1)
            first_valid = np.argmax(mask, axis=1)
            last_valid = steps - 1 - np.argmax(mask[:, ::-1], axis=1)
            first_id, last_id = traj[every, first_valid], traj[every, last_valid]

        # a lane with no episode running starts its next one at its first valid frame
        # (after padding where its previous batch ended early, or a resume point)
        idle = carry_len == 0
        carry_start[idle] = t0 + (first_valid if full else first_valid[idle])
        carry_src[idle] = self.source

        # episodes carried in from the previous batch that a reset cut at its end
        cross = np.flatnonzero(
            has_valid & (carry_traj >= 0) & (carry_len > 0) & (first_id != carry_traj)
        )
        cut_rows = None
        if len(cross):
            cut_rows = self._rows(
                cross, lane_start, carry_start, carry_len, carry_ret, carry_traj, carry_src
            )
            cut_at = self.last_t[group][cross]
            carry_len[cross], carry_ret[cross], carry_src[cross] = 0, 0.0, self.source
            carry_start[cross] = t0 + (first_valid if full else first_valid[cross])
        else:
            cut_at = cross

        cum_ret = _running_sum(reward if full else np.where(mask, reward, 0.0))
        if full:
            cum_len = np.broadcast_to(np.arange(1, steps + 1), (nlanes, steps))
        else:
            cum_len = np.cumsum(mask, axis=1)
        lanes, ts = np.divmod(np.flatnonzero(ends), steps)  # sorted by lane, then time
        first = np.ones(len(lanes), bool)
        first[1:] = lanes[1:] != lanes[:-1]
        prev = np.arange(len(lanes)) - 1
        prev_ret = np.where(first, -carry_ret[lanes], cum_ret[lanes[prev], ts[prev]])
        prev_len = np.where(first, -carry_len[lanes], cum_len[lanes[prev], ts[prev]])
        complete = done[lanes, ts]
        start = np.where(first, carry_start[lanes], t0 + ts[prev] + 1)
        source = np.where(first, carry_src[lanes], self.source)
        length = cum_len[lanes, ts] - prev_len
        ret = cum_ret[lanes, ts] - prev_ret
        if not self.by_lane:  # rows in the order episodes end: by time, then lane
            order = np.lexsort((lanes, ts))
            row_lanes, row_ts = lanes[order], ts[order]
            start, length, ret, row_done = start[order], length[order], ret[order], complete[order]
            source = source[order]
        else:
            row_lanes, row_ts, row_done = lanes, ts, complete
        rows: Rows = {  # each column's dtype is COLUMNS' already (int64, float64, bool)
            "traj_id": traj[row_lanes, row_ts],
            "lane": row_lanes + lane_start,
            "start": start,
            "length": length,
            "return": ret,
            "terminated": term[row_lanes, row_ts] & row_done,
            "truncated": trunc[row_lanes, row_ts] & row_done,
            "complete": row_done,
            fmt.SOURCE: source,
        }
        inner = ~complete
        self.cuts = (
            np.concatenate([cross + lane_start, lanes[inner] + lane_start]).astype(np.int64),
            np.concatenate([cut_at, t0 + ts[inner]]).astype(np.int64),
        )

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
        carry_src[ended] = self.source
        if full:
            carry_traj[:] = last_id
            self.last_t[group] = t0 + last_valid
            carry_traj[ended[end_t == last_valid]] = -1
        else:
            carry_traj[:] = np.where(has_valid, last_id, carry_traj)
            self.last_t[group] = np.where(has_valid, t0 + last_valid, self.last_t[group])
            carry_traj[ended[end_t == last_valid[ended]]] = -1
        return rows if cut_rows is None else concat_rows([cut_rows, rows])

    def _rows(self, lanes, lane_start, start, length, ret, traj, src) -> Rows:
        n = len(lanes)
        return {
            "traj_id": traj[lanes].astype(np.int64),
            "lane": lanes.astype(np.int64) + lane_start,
            "start": start[lanes].astype(np.int64),
            "length": length[lanes].astype(np.int64),
            "return": ret[lanes].astype(np.float64),
            "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool),
            "complete": np.zeros(n, bool),
            fmt.SOURCE: src[lanes].astype(np.int64),
        }

    def finish(self) -> Rows:
        """Rows for the episodes cut by the end of the run (``complete=False``)."""
        open_lanes = np.flatnonzero((self.length > 0) & (self.traj >= 0))
        self.cuts = (open_lanes.astype(np.int64), self.last_t[open_lanes])
        return self._rows(open_lanes, 0, self.start, self.length, self.ret, self.traj, self.src)
