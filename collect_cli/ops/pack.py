"""Whole episodes of datasets copied into a new one: ``filter``, ``split`` and
``merge --take`` (``docs/levels.md``).

Each input lane keeps its kept episodes in their order, moved up over what was
dropped (and over padding), so a lane of the output holds whole episodes back to
back; inputs' lanes follow one another as a merge's do, and lanes with nothing
kept are padding. The frames go through the dataset's own writer (its layout and
codec: compact image leaves, zstd), and the episodes table is the inputs' rows
moved to where their frames went, so what the frames alone cannot say is kept:
which episodes were cut (``next/truncated`` set at their last frame, durability
D13) and which source acted. The output is written under a temporary name beside
its destination and renamed into place at the end, as ``merge`` does: a failure
or Ctrl-C leaves nothing there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import MASK, TRAJ
from collect_cli.dataset import make_writer
from collect_cli.dataset.fsio import publish
from collect_cli.dataset.ownership import Identity, remove_leftovers, remove_output, staging_name
from collect_cli.errors import DatasetError, UsageError, WriteError
from collect_cli.ops.merge import Shard

WINDOW_BYTES = 32 << 20  # frames go through memory in blocks of about this size
# read all lanes' span at once where that reads at most this many times the kept frames,
# or at most SPAN_BYTES a key: one HDF5 call a key, not one a lane (chunks span lanes)
SPAN_FACTOR, SPAN_BYTES = 4, 128 << 20
# what a run's metadata holds that a copy recomputes or must not inherit
RECOMPUTED = ("status", "frames", "steps", "episodes", "lanes", fmt.LANE_STEPS, "start_time")
RECOMPUTED += ("end_time", "resumed", fmt.CODEC, fmt.LAYOUT, fmt.COMPACT_KEYS, "commit_0")


class Lanes:
    """Where one input's kept frames go: per lane, the input times of its kept
    frames in order (an output lane's frame ``t`` is input frame ``times[t]``)."""

    def __init__(self, shard: Shard, read: Callable[[str], Any], kept_ids: np.ndarray):
        self.shard = shard
        ends = shard.lane_steps
        parts: list[list[np.ndarray]] = [[] for _ in range(shard.lanes)]
        window = max(1, WINDOW_BYTES // (9 * max(1, shard.lanes)))  # traj and mask
        for t0 in range(0, shard.steps, window):
            t1 = min(shard.steps, t0 + window)
            traj = np.asarray(read(TRAJ)[:, t0:t1])
            kept = np.asarray(read(MASK)[:, t0:t1]).astype(bool) & np.isin(traj, kept_ids)
            kept &= np.arange(t0, t1)[None, :] < ends[:, None]  # committed frames only
            lanes, times = np.nonzero(kept)
            cuts = np.searchsorted(lanes, np.arange(1, shard.lanes))
            for lane, found in enumerate(np.split(times + t0, cuts)):
                parts[lane].append(found)
        self.times = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
        self.steps = max((len(t) for t in self.times), default=0)

    def moved(self, rows: fmt.Rows, lane_offset: int, traj: np.ndarray) -> fmt.Rows:
        """``rows`` (kept, of this input) at their place in the output: lane offset,
        start where the episode's first frame went, the trajectory ids ``traj``;
        a :class:`DatasetError` where the frames are not where the rows say."""
        rows = {k: np.array(v, copy=True) for k, v in rows.items()}
        counts = np.array([len(t) for t in self.times], np.int64)
        base = np.concatenate([[0], np.cumsum(counts)])
        span = int(self.shard.steps) + 1  # one sorted key a kept frame: lane, then time
        keys = np.concatenate(
            [t + lane * span for lane, t in enumerate(self.times)] or [np.zeros(0, np.int64)]
        )
        wanted = rows["lane"] * span + rows["start"]
        at = np.searchsorted(keys, wanted)
        found = at < len(keys)
        found[found] = keys[at[found]] == wanted[found]
        per_lane = np.bincount(rows["lane"], rows["length"], minlength=len(counts))
        fits = at + rows["length"] <= base[rows["lane"] + 1]
        if not (found.all() and fits.all() and (per_lane == counts).all()):
            bad = int(np.flatnonzero(~(found & fits))[0]) if not (found & fits).all() else 0
            raise DatasetError(
                f"{str(self.shard.path)!r}: episode traj_id {rows['traj_id'][bad]} does not "
                f"match its frames; `rlcollect validate {self.shard.path}` says what is wrong"
            )
        rows["start"] = at - base[rows["lane"]]
        rows["lane"] = rows["lane"] + lane_offset
        rows["traj_id"] = traj
        return rows


def _text_as_bytes(array: np.ndarray) -> np.ndarray:
    """A Text leaf as a batch holds it (``[..., width]`` uint8), from HDF5's ``S<width>``."""
    if array.dtype.kind != "S":
        return array
    width = array.dtype.itemsize
    return np.ascontiguousarray(array).view(np.uint8).reshape(*array.shape, width)


def _batches(
    lanes: Lanes,
    read: Callable[[str], Any],
    keys: dict[str, tuple[tuple[int, ...], str]],
    cut_ends: dict[int, np.ndarray],
    traj_offset: int,
):
    """``[lanes, window]`` frame dicts (keys joined by ``/``) of one input's kept
    frames, window after window; ``cut_ends``: per lane, the output times of the
    last frames of cut episodes (their end flags are set)."""
    nlanes = len(lanes.times)
    row = sum(
        max(1, int(np.prod(f, dtype=np.int64))) * np.dtype(d).itemsize for f, d in keys.values()
    )
    window = max(1, min(lanes.steps, WINDOW_BYTES // max(1, row * nlanes)))
    for t0 in range(0, lanes.steps, window):
        t1 = min(lanes.steps, t0 + window)
        out: dict[str, np.ndarray] = {}
        for key, (feat, dtype) in keys.items():
            fill = (
                -1
                if key == TRAJ
                else (fmt.fill_value(dtype) if key not in lanes.shard.arrays else 0)
            )
            out[key] = np.full((nlanes, t1 - t0, *feat), fill, np.dtype(dtype))
        picks = [(lane, times[t0:t1]) for lane, times in enumerate(lanes.times)]
        picks = [(lane, mine) for lane, mine in picks if len(mine)]
        if not picks:
            continue
        lo = min(int(mine[0]) for _, mine in picks)
        hi = max(int(mine[-1]) for _, mine in picks) + 1
        needed = sum(len(mine) for _, mine in picks)
        for key, (feat, dtype) in keys.items():
            if key not in lanes.shard.arrays:
                continue
            stored = read(key)
            frame = max(1, int(np.prod(feat))) * np.dtype(dtype).itemsize
            spread = (hi - lo) * nlanes
            together = spread <= SPAN_FACTOR * needed or spread * frame <= SPAN_BYTES
            span = np.asarray(stored[:, lo:hi]) if together else None
            for lane, mine in picks:
                if span is not None:
                    block, first = span[lane], lo
                else:
                    block = np.asarray(stored[lane, int(mine[0]) : int(mine[-1]) + 1])
                    first = int(mine[0])
                np.take(block, mine - first, axis=0, out=out[key][lane, : len(mine)])
        for lane, mine in picks:
            out[TRAJ][lane, : len(mine)] += traj_offset
            ends = cut_ends.get(lane, np.zeros(0, np.int64))
            ends = ends[(ends >= t0) & (ends < t1)] - t0
            for flag in (fmt.path(fmt.TRUNCATED_KEY), fmt.path(fmt.DONE_KEY)):
                out[flag][lane, ends] = True
        yield {k: _text_as_bytes(v) for k, v in out.items()}


def _tensordict(frames: dict[str, np.ndarray]):
    import torch
    from tensordict import TensorDict

    some = next(iter(frames.values()))
    td = TensorDict({}, batch_size=list(some.shape[:2]))
    for key, value in frames.items():
        td.set(fmt.key_of(key), torch.from_numpy(value))
    return td


def writer_options(meta: dict[str, Any]) -> dict[str, Any]:
    """The writer options that store a copy as the input is stored: its layout and codec."""
    codec = meta.get(fmt.CODEC) or {}
    options: dict[str, Any] = {"layout": fmt.AUTO if meta.get(fmt.COMPACT_KEYS) else fmt.FULL}
    if meta.get("backend") == "hdf5":
        name = codec.get("name", "none")
        options["compression"] = fmt.AUTO if codec.get("leaves") == fmt.IMAGE_LEAVES else name
        options["compression_level"] = codec.get("level")
    return options


def write(
    parts: list[tuple[Shard, np.ndarray]],
    dest: Path,
    replaces: Identity | None,
    meta: dict[str, Any],
    keys: dict[str, tuple[tuple[int, ...], str]],
    traj_offsets: list[int] | None = None,
) -> dict[str, Any]:
    """Write the kept episodes (``parts``: an input and a bool per row of its
    ``rows``) to ``dest`` with metadata ``meta`` and frame ``keys``; inputs' lanes
    one after the other, their sources rows offset by ``shard.source_offset``."""
    kept = sum(int(k.sum()) for _, k in parts)
    if not kept:
        raise UsageError("no episode is left: nothing to write (loosen the conditions)")
    backend = parts[0][0].ds.backend
    meta = {k: v for k, v in meta.items() if k not in RECOMPUTED and not k.startswith("commit")}
    remove_leftovers(dest)
    tmp = staging_name(dest, "packing")
    lanes_total = sum(shard.lanes for shard, _ in parts)
    options = {"metadata": meta, "lanes": lanes_total, "rows_given": True}
    writer = make_writer(backend, tmp, **options, **writer_options(parts[0][0].meta))
    try:
        writer.open()
        lane_offset = 0
        for i, (shard, keep) in enumerate(parts):
            rows = {k: v[keep] for k, v in shard.rows.items()}
            offset = traj_offsets[i] if traj_offsets else 0
            with shard.ds.reader(by_lane=True) as read:
                lanes = Lanes(shard, read, rows["traj_id"])
                moved = lanes.moved(rows, lane_offset, rows["traj_id"] + offset)
                moved[fmt.SOURCE] = rows[fmt.SOURCE] + shard.source_offset
                cut = ~moved["complete"]
                ends = moved["start"][cut] + moved["length"][cut] - 1
                cut_lanes = moved["lane"][cut] - lane_offset
                cut_ends = {int(x): ends[cut_lanes == x] for x in np.unique(cut_lanes)}
                for frames in _batches(lanes, read, keys, cut_ends, offset):
                    writer.append(_tensordict(frames), lane_start=lane_offset)
                    writer.commit(when_due=True)
            writer.add_rows(moved)
            lane_offset += shard.lanes
        writer.close(fmt.COMPLETE)
        publish(tmp, dest, replaces)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            writer.close(fmt.INTERRUPTED)
        with contextlib.suppress(OSError):
            remove_output(tmp)
        if isinstance(exc, OSError):
            raise WriteError(
                f"writing {str(dest)!r} failed: {exc.strerror or exc}; nothing was written"
            ) from None
        raise
    return {
        "path": str(dest),
        "backend": backend,
        "frames": writer.frames,
        "episodes": writer.episodes,
        "lanes": lanes_total,
        "steps": writer.steps,
    }
