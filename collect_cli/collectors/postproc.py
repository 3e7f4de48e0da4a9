"""Stream post-processors for collector batches (pure functions of the frames: no I/O).

Every processor consumes the ``[lanes, time]`` TensorDict batches a collector yields,
in order. A lane's frames are in time order across consecutive batches. A frame ``t``
*ends its episode* when ``next/done`` is True at ``t``, or when the lane's next frame
has another ``collector/traj_ids`` value (an episode cut by a reset: an end without a
terminal or truncation flag). Multi-worker collectors deliver batches of lane groups:
each call passes ``lane_start``, the global index of the batch's first lane; a group
always has the same ``lane_start`` and width, and groups are processed independently,
so batches of different groups may interleave.

- :class:`MultiStep`: n-step discounted rewards, lagged by ``n - 1`` steps.
- :func:`split_trajectories`: one batch regrouped as one row per trajectory piece.
- :class:`TrajectorySplitter`: the stream regrouped as one row per whole episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from collect_cli import dataformat as fmt
from collect_cli.dataformat import DONE_KEY, MASK_KEY, REWARD_KEY, TRAJ_KEY
from collect_cli.errors import CollectionError


def _require(batch: TensorDictBase, key: tuple[str, ...]) -> torch.Tensor:
    value = batch.get(key, None)
    if value is None:
        raise CollectionError(f"the batch has no {'/'.join(key)!r} entry, which is required")
    return value


def _check_batch(batch: TensorDictBase, who: str) -> tuple[int, int]:
    if not isinstance(batch, TensorDictBase) or batch.batch_dims != 2:
        shape = getattr(batch, "batch_size", type(batch).__name__)
        raise CollectionError(f"{who} needs a TensorDict batch [lanes, time], got {shape}")
    lanes, steps = batch.batch_size
    return int(lanes), int(steps)


def _flag(batch: TensorDictBase, key: tuple[str, ...]) -> torch.Tensor:
    """A ``[lanes, time, ...]`` bool entry reduced to ``[lanes, time]`` (any over the rest)."""
    value = _require(batch, key)
    lanes, steps = batch.batch_size
    return value.reshape(lanes, steps, -1).any(-1)


def _mask(batch: TensorDictBase, device: torch.device) -> torch.Tensor:
    mask = batch.get(MASK_KEY, None)
    if mask is None:
        return torch.ones(tuple(batch.batch_size), dtype=torch.bool, device=device)
    return mask.reshape(tuple(batch.batch_size)).bool()


# -- n-step returns -----------------------------------------------------------------------
class MultiStep:
    """n-step discounted rewards over a stream of batches, exact across batch boundaries.

    For an output frame ``t`` of a lane, let ``m`` (``steps_to_next_obs``) be
    ``min(n, e - t + 1)`` where ``e`` is the first frame ``>= t`` that ends the
    episode (``next/done``, or a ``collector/traj_ids`` change to the next frame), or
    the last frame of the data at :meth:`flush`. Then:

    - ``next/reward = sum_{k < m} gamma**k * r[t + k]`` (accumulated in float64, stored
      in the reward's dtype); the window never crosses an episode end;
    - every other ``next/...`` entry (observation, done, terminated, truncated,
      step_count, info...) is the one of frame ``t + m - 1``;
    - ``next/original_reward = r[t]`` and ``steps_to_next_obs = m`` (int64, shaped like
      the reward) are added; root entries (observation, action, policy extras,
      ``done``, ``collector/...``) are unchanged.

    Output lags input by ``n - 1`` steps: a call holds back each lane's last ``n - 1``
    frames (their window may reach into the next batch) and emits them, completed,
    at the front of the group's next output. A first call of ``T`` steps thus returns
    ``T - (n - 1)`` steps (None when that is <= 0: everything is held), later calls
    ``T`` steps; :meth:`flush` returns the held frames at the end of the run. ``n=1``
    holds nothing and only adds the two new entries. Outputs are new TensorDicts
    whose root entries may be views of the input batch.

    Padding frames (``collector/mask`` False) cannot be processed: they raise
    :class:`~collect_cli.errors.CollectionError`.
    """

    def __init__(self, n: int, gamma: float):
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"MultiStep n must be an integer >= 1, got {n!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, int | float | np.floating):
            raise ValueError(f"MultiStep gamma must be a number in [0, 1], got {gamma!r}")
        if not 0.0 <= float(gamma) <= 1.0:
            raise ValueError(f"MultiStep gamma must be in [0, 1], got {gamma!r}")
        self.n = int(n)
        self.gamma = float(gamma)
        self._held: dict[int, TensorDictBase] = {}
        self._width: dict[int, int] = {}

    def __call__(self, batch: TensorDictBase, lane_start: int = 0) -> TensorDictBase | None:
        """Consume one batch of lanes ``lane_start...``; return the frames now complete.

        The result has the batch's keys plus ``next/original_reward`` and
        ``steps_to_next_obs``; its time dim covers the group's held frames followed
        by all but the last ``n - 1`` frames of this batch (None if empty).
        """
        lanes, _ = _check_batch(batch, "MultiStep")
        width = self._width.setdefault(lane_start, lanes)
        if width != lanes:
            raise CollectionError(
                f"MultiStep: lane group {lane_start} had {width} lanes, this batch has {lanes}"
            )
        mask = batch.get(MASK_KEY, None)
        if mask is not None and not bool(mask.all()):
            raise CollectionError(
                "MultiStep cannot process padding frames (collector/mask False): "
                "disable preemption (collector.preemptive_threshold) with postproc=multistep"
            )
        held = self._held.pop(lane_start, None)
        data = batch if held is None else torch.cat([held, batch], dim=1)
        ready = data.batch_size[1] - (self.n - 1)
        if self.n > 1:  # a copy: the caller may reuse the batch's buffers
            self._held[lane_start] = data[:, max(ready, 0) :].clone()
        if ready <= 0:
            return None
        return self._complete(data, ready)

    def flush(self) -> list[tuple[int, TensorDictBase]]:
        """The held frames of every lane group, as ``(lane_start, batch)`` by lane_start.

        Windows are cut at the end of the data: ``m`` counts only the frames seen,
        ``next/...`` entries come from the last of them. The processor is empty after.
        """
        out = []
        for lane_start in sorted(self._held):
            data = self._held[lane_start]
            if data.batch_size[1] > 0:
                out.append((lane_start, self._complete(data, data.batch_size[1])))
        self._held.clear()
        return out

    def _complete(self, data: TensorDictBase, count: int) -> TensorDictBase:
        """Outputs for the first ``count`` frames of ``data``; windows stop at its end."""
        lanes, steps = (int(s) for s in data.batch_size)
        n = self.n
        reward = _require(data, REWARD_KEY)
        dev = reward.device  # the TensorDict's own device may be None
        traj = _require(data, TRAJ_KEY).reshape(lanes, steps)
        end = _flag(data, DONE_KEY)
        end[:, :-1] |= traj[:, 1:] != traj[:, :-1]
        # frames from steps-1 on end the window: the last frame of the data (only reached
        # at flush; a normal call never looks past steps-2) and the padding after it
        extra = count + n - 1 - steps
        tail = torch.ones(lanes, extra + 1, dtype=torch.bool, device=dev)
        end = torch.cat([end[:, :-1], tail], dim=1)
        feat = reward.shape[2:]
        r64 = reward.to(torch.float64)
        if extra > 0:
            r64 = torch.cat([r64, r64.new_zeros(lanes, extra, *feat)], dim=1)
        alive = torch.ones(lanes, count, dtype=torch.bool, device=dev)
        steps_m = torch.zeros(lanes, count, dtype=torch.int64, device=dev)
        acc = torch.zeros(lanes, count, *feat, dtype=torch.float64, device=dev)
        expand = (lanes, count) + (1,) * len(feat)
        zero = torch.zeros((), dtype=torch.float64, device=dev)
        for k in range(n):  # frame t + k is in the window iff no end in t ... t + k - 1
            if k:
                alive = alive & ~end[:, k - 1 : k - 1 + count]
            in_window = torch.where(alive.reshape(expand), r64[:, k : k + count], zero)
            acc += in_window * self.gamma**k
            steps_m += alive
        # flat index of frame t + m - 1 in [lanes * steps]; index_select beats x[lane, src]
        src = torch.arange(count, device=dev).unsqueeze(0) + steps_m - 1
        src = (src + steps * torch.arange(lanes, device=dev).unsqueeze(1)).reshape(-1)
        nxt = data.get(fmt.NEXT).apply(
            lambda x: (
                x.reshape(-1, *x.shape[2:]).index_select(0, src).view(lanes, count, *x.shape[2:])
            ),
            batch_size=[lanes, count],
        )
        nxt.set("reward", acc.to(reward.dtype))
        nxt.set(fmt.ORIGINAL_REWARD_KEY[1:], reward[:, :count])
        out = data.exclude(fmt.NEXT)[:, :count]
        out.set(fmt.NEXT, nxt)
        out.set(
            fmt.STEPS_TO_NEXT_KEY, steps_m.reshape(expand).expand(reward[:, :count].shape).clone()
        )
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, gamma={self.gamma})"


# -- trajectory rows ------------------------------------------------------------------------
# Leaves are handled as plain tensor lists in the order of ``keys(True, True)``: the
# per-lane work below then costs a few tensor ops per leaf, not a TensorDict op each.
Keys = list[Any]


def _zeros_rows(leaves: list[torch.Tensor], dims: int, rows: int, length: int):
    """Zeros ``[rows, length, *feature]`` for each leaf (its ``dims`` batch dims dropped)."""
    return [x.new_zeros((rows, length, *x.shape[dims:])) for x in leaves]


def _rows_td(keys: Keys, tensors: list[torch.Tensor], lengths: torch.Tensor) -> TensorDict:
    """The ``[rows, length]`` TensorDict, ``collector/mask`` False and traj_ids -1 past
    each row's length."""
    length = tensors[0].shape[1] if tensors else 0
    out = TensorDict({}, batch_size=[len(lengths), length])
    for key, value in zip(keys, tensors, strict=True):
        out.set(key, value)
    valid = torch.arange(length, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    out.set(MASK_KEY, valid)
    traj = out.get(TRAJ_KEY, None)
    if traj is not None:
        traj.masked_fill_(~valid, -1)
    return out


def _scatter(dst: list[torch.Tensor], at: torch.Tensor, src: list[torch.Tensor], frm) -> None:
    """``dst[at] = src[frm]`` leaf by leaf, with ``at`` and ``frm`` flat indices into the
    first two dims (row * length + pos, lane * time + t): index_copy_ on flattened
    views is several times faster than a two-tensor index_put."""
    for d, x in zip(dst, src, strict=True):
        feat = x.shape[2:]
        d.view(-1, *feat).index_copy_(0, at, x.reshape(-1, *feat).index_select(0, frm))


def split_trajectories(batch: TensorDictBase) -> TensorDict:
    """One batch regrouped as one row per trajectory piece (the seed's ``split_trajs``).

    A piece is a maximal run of one ``collector/traj_ids`` value among a lane's
    non-padding frames (``collector/mask`` True); only the traj id splits pieces, as in
    the seed, and never across lanes. Rows are ordered by (lane, time); the result is
    ``[pieces, max_len]``, padded with zeros, with ``collector/mask`` False and
    ``collector/traj_ids`` -1 in the padding. No running state: a trajectory that goes
    on in the next batch gives a piece in each.
    """
    _check_batch(batch, "split_trajectories")
    traj = _require(batch, TRAJ_KEY).reshape(tuple(batch.batch_size))
    dev = traj.device
    lanes, times = torch.nonzero(_mask(batch, dev), as_tuple=True)  # lane-major order
    ids = traj[lanes, times]
    new = torch.ones(len(lanes), dtype=torch.bool, device=dev)
    new[1:] = (lanes[1:] != lanes[:-1]) | (ids[1:] != ids[:-1])
    piece = torch.cumsum(new, 0) - 1
    starts = torch.nonzero(new, as_tuple=True)[0]
    pos = torch.arange(len(lanes), device=dev) - starts[piece]
    lengths = torch.bincount(piece, minlength=len(starts))
    longest = int(lengths.max()) if len(starts) else 0
    keys = list(batch.keys(True, True))
    leaves = [batch.get(k) for k in keys]
    tensors = _zeros_rows(leaves, 2, len(starts), longest)
    _scatter(tensors, piece * longest + pos, leaves, lanes * batch.batch_size[1] + times)
    return _rows_td(keys, tensors, lengths)


class _Lanes:
    """The running episode of every lane of one group: chunks of leaf tensors."""

    def __init__(self, lanes: int, keys: Keys):
        self.keys = keys
        self.chunks: list[list[list[torch.Tensor]]] = [[] for _ in range(lanes)]
        self.traj = np.full(lanes, -1, np.int64)
        self.length = np.zeros(lanes, np.int64)
        self.last_t = np.zeros(lanes, np.int64)  # group time of the last buffered frame
        self.t0 = 0  # group time of the next batch's first step

    def take(self, lane: int) -> list[torch.Tensor]:
        """The lane's buffered frames (one tensor per leaf); the lane is empty after."""
        chunks = self.chunks[lane]
        self.chunks[lane] = []
        self.length[lane] = 0
        self.traj[lane] = -1
        return (
            chunks[0] if len(chunks) == 1 else [torch.cat(p, 0) for p in zip(*chunks, strict=True)]
        )


class TrajectorySplitter:
    """The stream regrouped as one row per whole episode, for episode-row datasets.

    Each lane's running episode is buffered across batches (its frames in order,
    padding frames dropped); a call returns the episodes that ended with it, as one
    TensorDict ``[k, L]`` (L = the longest of them) padded with zeros, with
    ``collector/mask`` False and ``collector/traj_ids`` -1 in the padding, or None.
    An episode ends at a frame with ``next/done`` (after :class:`MultiStep`: with
    ``steps_to_next_obs == 1``, the frame's own step), or when the lane's next non-padding
    frame has another traj id (a cut: that episode is returned by the call that shows
    the new id, possibly the batch after its last frame). Rows are ordered by the
    time of their last frame, then by lane. :meth:`flush` returns the episodes still
    running (cut by the end of the run), ordered by global lane. Only running
    episodes are held (as copies); every key passes through (e.g. :class:`MultiStep`
    outputs), and a group's batches must keep the same keys.
    """

    def __init__(self) -> None:
        self._groups: dict[int, _Lanes] = {}

    def __call__(self, batch: TensorDictBase, lane_start: int = 0) -> TensorDictBase | None:
        """Consume one batch of lanes ``lane_start...``; return the episodes it ended."""
        nlanes, steps = _check_batch(batch, "TrajectorySplitter")
        keys = list(batch.keys(True, True))
        st = self._groups.setdefault(lane_start, _Lanes(nlanes, keys))
        if len(st.traj) != nlanes:
            raise CollectionError(
                f"TrajectorySplitter: lane group {lane_start} had {len(st.traj)} lanes, "
                f"this batch has {nlanes}"
            )
        if keys != st.keys:
            raise CollectionError(
                f"TrajectorySplitter: the keys of lane group {lane_start}'s batches changed"
            )
        t0 = st.t0
        st.t0 += steps
        traj_t = _require(batch, TRAJ_KEY)
        dev = traj_t.device  # of the index tensors (the TensorDict's may be None)
        mask = _mask(batch, dev).cpu().numpy()
        traj = traj_t.reshape(nlanes, steps).cpu().numpy()
        done = _flag(batch, DONE_KEY)
        steps_to = batch.get(fmt.STEPS_TO_NEXT_KEY, None)
        if steps_to is not None:  # after MultiStep, next/done looks ahead: the own step's
            done = done & (steps_to.reshape(nlanes, steps, -1)[..., 0] == 1)
        done = done.cpu().numpy()
        lanes, times = np.nonzero(mask)  # lane-major
        if len(lanes) == 0:
            return None
        leaves = [batch.get(k) for k in keys]
        ids, dn = traj[lanes, times], done[lanes, times]
        first = np.ones(len(lanes), bool)
        first[1:] = lanes[1:] != lanes[:-1]
        last = np.ones(len(lanes), bool)
        last[:-1] = first[1:]
        breaks = np.zeros(len(lanes), bool)
        breaks[1:] = (ids[1:] != ids[:-1]) | dn[:-1]
        running = st.length[lanes] > 0
        cont = first & running & (st.traj[lanes] == ids)  # continues the buffered episode
        cut = first & running & ~cont  # the buffered episode was cut before this batch
        # pieces: runs of frames of one episode in this batch, lane-major
        piece_start = first | breaks
        starts = np.flatnonzero(piece_start)
        ends = np.append(starts[1:] - 1, len(lanes) - 1)
        p_lane = lanes[starts]
        p_cont = cont[starts]
        p_ended = ~last[ends] | dn[ends]
        p_len = ends - starts + 1

        # rows: the buffers cut before this batch, then the pieces that ended here
        # (each with its buffered prefix when it continues one)
        cut_lanes = lanes[cut]
        ended = np.flatnonzero(p_ended)
        n_cut = len(cut_lanes)
        row_lane = np.concatenate([cut_lanes, p_lane[ended]])
        prefix = np.concatenate(
            [st.length[cut_lanes], np.where(p_cont, st.length[p_lane], 0)[ended]]
        )
        row_len = np.concatenate([np.zeros(n_cut, np.int64), p_len[ended]]) + prefix
        row_end = np.concatenate([st.last_t[cut_lanes], t0 + times[ends[ended]]])
        from_buffer = np.concatenate([np.ones(n_cut, bool), p_cont[ended]])
        order = np.lexsort((row_lane, row_end))
        out = None
        if len(order):
            rank = np.empty(len(order), np.int64)
            rank[order] = np.arange(len(order))
            tensors = _zeros_rows(leaves, 2, len(order), int(row_len.max()))
            for i in np.flatnonzero(from_buffer):  # one loop step per lane at most
                row, size = int(rank[i]), int(prefix[i])
                for dst, src in zip(tensors, st.take(int(row_lane[i])), strict=True):
                    dst[row, :size] = src
            piece_of = np.cumsum(piece_start) - 1
            row_of_piece = np.zeros(len(starts), np.int64)
            row_of_piece[ended] = rank[n_cut:]
            offset = np.zeros(len(starts), np.int64)
            offset[ended] = prefix[n_cut:]
            sel = np.flatnonzero(p_ended[piece_of])  # frames of the ended pieces
            sp = piece_of[sel]
            at = row_of_piece[sp] * tensors[0].shape[1] + offset[sp] + sel - starts[sp]
            frm = lanes[sel] * steps + times[sel]
            _scatter(
                tensors, torch.as_tensor(at, device=dev), leaves, torch.as_tensor(frm, device=dev)
            )
            out = _rows_td(keys, tensors, torch.as_tensor(row_len[order], device=dev))

        # the last piece of a lane, if it did not end, starts or extends the lane's buffer
        for p in np.flatnonzero(~p_ended):
            lane, a, b = int(p_lane[p]), starts[p], ends[p]
            if not p_cont[p]:
                st.chunks[lane] = []
                st.length[lane] = 0
            t_a, t_b = int(times[a]), int(times[b])
            if t_b - t_a == b - a:  # copies: the caller may reuse the batch's buffers
                chunk = [x[lane, t_a : t_b + 1].clone() for x in leaves]
            else:  # padding inside the piece
                picked = torch.as_tensor(times[a : b + 1], device=dev)
                chunk = [x[lane, picked] for x in leaves]
            st.chunks[lane].append(chunk)
            st.length[lane] += b - a + 1
            st.traj[lane] = ids[b]
            st.last_t[lane] = t0 + t_b
        return out

    def flush(self) -> TensorDictBase | None:
        """The episodes still running (cut by the end of the run), by global lane.

        Same row format as a call (None if there are none); the splitter is empty after.
        """
        keys: Keys | None = None
        episodes = []
        for lane_start in sorted(self._groups):
            st = self._groups[lane_start]
            if keys is not None and st.keys != keys:
                raise CollectionError("TrajectorySplitter: lane groups have different keys")
            keys = st.keys
            episodes += [st.take(int(lane)) for lane in np.flatnonzero(st.length > 0)]
        self._groups.clear()
        if not episodes:
            return None
        lengths = [len(e[0]) for e in episodes]
        tensors = _zeros_rows(episodes[0], 1, len(episodes), max(lengths))
        for row, episode in enumerate(episodes):
            for dst, src in zip(tensors, episode, strict=True):
                dst[row, : len(src)] = src
        return _rows_td(keys, tensors, torch.as_tensor(lengths, device=tensors[0].device))

    def __repr__(self) -> str:
        running = sum(int((g.length > 0).sum()) for g in self._groups.values())
        return f"{type(self).__name__}(running_episodes={running})"
