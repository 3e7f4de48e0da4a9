"""Merge shards (the datasets of one sweep, or any compatible datasets) into one.

The merged dataset concatenates the shards' lanes in the order given and pads
time to the longest shard: padding holds ``collector/mask`` False and
``collector/traj_ids`` -1, like any padding. Trajectory ids are offset per shard
(by the ids the shards before it used) so they stay unique, in the frames and
in ``episodes/traj_id``; ``episodes/lane`` is offset by the lanes before it.
Frames a shard did not commit (past its ``lane_steps``) are padding too.

HDF5 shards merge by default into virtual datasets (no frame data copied): each
frame key maps the shards' arrays, whose file names are stored relative to the
merged file's directory, so a directory holding the shards and the merged file
can move as a whole. ``collector/traj_ids`` (rewritten) and ``episodes/`` are
real datasets. ``copy=True`` writes a self-contained file. Memmap shards are
always copied (a memmap dataset is one file per key).

The merged dataset is written under a temporary name beside ``dest`` and renamed
into place at the end, so a failure leaves nothing at ``dest``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import __version__
from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, MASK, TRAJ, Rows, concat_rows
from collect_cli.dataset import BACKENDS, Dataset, open_dataset
from collect_cli.dataset import backend as backend_module
from collect_cli.dataset.fsio import publish
from collect_cli.dataset.ownership import (
    check_destination,
    claim,
    remove_leftovers,
    remove_output,
    staging_name,
)
from collect_cli.dataset.writer import now
from collect_cli.errors import MergeError, UsageError, WriteError
from collect_cli.policies import provenance

KEYS = ("all", "common")  # merge --keys: which frame keys the merged dataset has
WINDOW_BYTES = 32 << 20  # copies go through memory in blocks of about this size
FLAGGED = (fmt.path(fmt.DONE_KEY), fmt.path(fmt.TRUNCATED_KEY))  # set where a kill cut a lane
SAME = (
    ("env_id", "env"),
    ("observation_space", "observation space"),
    ("action_space", "action space"),
)


@dataclass
class Shard:
    path: Path
    ds: Dataset
    arrays: dict[str, tuple[tuple[int, ...], str]]  # frame key -> (shape on disk, dtype)
    lanes: int
    steps: int
    lane_steps: np.ndarray  # committed time steps per lane
    rows: Rows  # its episodes (plus rows for episodes a crash left running)
    cuts: tuple[np.ndarray, np.ndarray] | None = None  # (lanes, times) a kill cut, unflagged
    lane_offset: int = 0
    traj_offset: int = 0
    source_offset: int = 0

    @property
    def meta(self) -> dict[str, Any]:
        return self.ds.meta

    @property
    def whole(self) -> bool:
        """Every lane committed up to ``steps``: one block maps the shard."""
        return bool((self.lane_steps == self.steps).all())

    def copy_into(self, read: Callable[[str], Any], key: str, dst: Any) -> None:
        """Copy the shard's committed ``key`` into ``dst[lanes of the shard, :steps]``."""
        shape, _ = self.arrays[key]
        src = read(key)
        row = max(1, int(np.prod(shape[2:], dtype=np.int64))) * np.dtype(src.dtype).itemsize
        window = max(1, WINDOW_BYTES // (row * self.lanes))
        lanes = slice(self.lane_offset, self.lane_offset + self.lanes)
        for t0 in range(0, self.steps, window):
            t1 = min(self.steps, t0 + window)
            block = np.asarray(src[:, t0:t1])
            if key in (TRAJ, MASK):
                beyond = np.arange(t0, t1)[None, :] >= self.lane_steps[:, None]
                if key == TRAJ:
                    block = np.where((block >= 0) & ~beyond, block + self.traj_offset, -1)
                else:
                    block = block & ~beyond
            elif key in FLAGGED and self.cuts is not None:
                cut_lanes, cut_times = self.cuts
                inside = (cut_times >= t0) & (cut_times < t1)
                block = block.copy()  # a memmap shard's block is a view of the shard's file
                block[cut_lanes[inside], cut_times[inside] - t0] = True
            dst[lanes, t0:t1] = block

    def changed(self, key: str) -> bool:
        """Whether the merged ``key`` differs from the shard's stored array (so it is
        copied, never linked): traj ids offset, flags set where a kill cut a lane, and
        a compact shard's next/observation (rebuilt on read, not stored)."""
        flagged = key in FLAGGED and self.cuts is not None
        return key == TRAJ or flagged or self.ds.rebuilt(key)


def _load(path: Path) -> Shard:
    ds = open_dataset(path)  # OutputError (exit 2) for a missing or unreadable path
    meta = ds.meta
    lacking = [key for key in fmt.REQUIRED_META if key not in meta]
    if lacking:
        raise MergeError(f"{str(path)!r} is not an rlcollect dataset: no {lacking[0]!r} metadata")
    arrays = {k: (tuple(s), d) for k, s, d in ds.describe() if not fmt.is_episodes(k)}
    if not meta["frames"] or TRAJ not in arrays or MASK not in arrays:
        raise MergeError(f"shard {str(path)!r} holds no committed frames: leave it out")
    lanes, steps = int(meta["lanes"]), int(meta["steps"])
    rows = ds.episodes()
    shard = Shard(path, ds, arrays, lanes, steps, fmt.lane_steps(meta), rows)
    if meta["status"] == fmt.RUNNING:  # killed: its running episodes have no row yet
        with ds.reader() as read:
            traj, mask = np.asarray(read(TRAJ)), np.asarray(read(MASK))

            def get(key: fmt.Key) -> np.ndarray | None:
                return np.asarray(read(fmt.path(key))) if fmt.path(key) in arrays else None

            reward, _ = fmt.own_step(get, traj.shape)
        tails = fmt.tail_rows(traj, mask, reward, shard.lane_steps, set(rows["traj_id"].tolist()))
        shard.rows = concat_rows([rows, tails])
        shard.cuts = fmt.cut_points(tails, mask, shard.lane_steps)
    return shard


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(shards: list[Shard], allow_incomplete: bool) -> None:
    """Raise :class:`MergeError` naming the first difference that forbids a merge."""
    first = shards[0]
    p0 = str(first.path)
    for shard in shards:
        p = str(shard.path)
        status = shard.meta["status"]
        if status != fmt.COMPLETE and not allow_incomplete:
            raise MergeError(
                f"shard {p!r} is not complete (status {status}): pass --allow-incomplete "
                "to merge the frames it committed, or leave it out"
            )
        if shard.ds.backend != first.ds.backend:
            raise MergeError(
                f"shards differ in backend: {p0!r} is {first.ds.backend}, {p!r} is "
                f"{shard.ds.backend}: merge shards of one writer"
            )
        for key, what in SAME:
            if shard.meta.get(key) != first.meta.get(key):
                raise MergeError(
                    f"shards differ in {what}: {p0!r} has {_short(first.meta.get(key))}, "
                    f"{p!r} has {_short(shard.meta.get(key))}"
                )
        for key, default in fmt.MEANING.items():  # n-step frames, rows, resets
            ours, theirs = first.meta.get(key, default), shard.meta.get(key, default)
            if ours != theirs:
                raise MergeError(
                    f"shards differ in {key}: {p0!r} has {_short(ours)}, {p!r} has "
                    f"{_short(theirs)}: their frames mean different things"
                )
        for a, b in ((first, shard), (shard, first)):
            extra = sorted(k for k in set(a.arrays) - set(b.arrays) if not fillable(k))
            if extra:
                raise MergeError(
                    f"shards differ in keys: {str(a.path)!r} has {extra[0]!r}, "
                    f"{str(b.path)!r} has not (only policy outputs and info keys may differ)"
                )
        for key, (shape, dtype) in shard.arrays.items():
            if key not in first.arrays:
                continue  # compared with the first shard that has it, by keys()
            ref_shape, ref_dtype = first.arrays[key]
            if dtype != ref_dtype:
                raise MergeError(
                    f"shards differ in the dtype of {key!r}: {ref_dtype} in {p0!r}, "
                    f"{dtype} in {p!r}"
                )
            if shape[2:] != ref_shape[2:]:
                raise MergeError(
                    f"shards differ in the shape of {key!r}: {list(ref_shape[2:])} per frame "
                    f"in {p0!r}, {list(shape[2:])} in {p!r}"
                )


def fillable(key: str) -> bool:
    """Whether shards may differ in having ``key``: what a policy or an env's infos
    add beside the transition (``action_log_prob``, ``info/...``), never the
    transition's own keys nor the collector's."""
    parts = fmt.key_of(key)
    own = (fmt.OBSERVATION, fmt.ACTION, fmt.COLLECTOR, fmt.FINAL, *fmt.FLAGS)
    if parts[0] == fmt.NEXT:
        parts = parts[1:]
        own = (fmt.OBSERVATION, *fmt.FLAGS, fmt.REWARD_KEY[1], fmt.ORIGINAL_REWARD_KEY[1])
    return parts[0] not in own and fmt.path(parts) not in (fmt.STEP_COUNT, *fmt.STEPS_TO_NEXT_KEY)


def keys(shards: list[Shard], which: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The merged frame keys and their per-frame shape and dtype: every shard's
    (``all``), or only those every shard has (``common``); first seen, first."""
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for shard in shards:
        for key, (shape, dtype) in shard.arrays.items():
            if key in found:
                continue
            holders = [s for s in shards if key in s.arrays]
            for other in holders:
                theirs = other.arrays[key]
                if theirs[1] != dtype or theirs[0][2:] != shape[2:]:
                    raise MergeError(
                        f"shards differ in {key!r}: {list(shape[2:])} {dtype} in "
                        f"{str(shard.path)!r}, {list(theirs[0][2:])} {theirs[1]} in "
                        f"{str(other.path)!r}"
                    )
            if which == "all" or len(holders) == len(shards):
                found[key] = (shape[2:], dtype)
    return found


def _filled(shards: list[Shard], merged: dict[str, Any]) -> dict[str, list[int]]:
    """``dataformat.FILLED``: for each key some shards lack, the source rows that hold it."""
    out = {}
    for key in merged:
        holders = [s for s in shards if key in s.arrays]
        if len(holders) < len(shards):
            rows = [s.source_offset + i for s in holders for i in range(len(fmt.sources(s.meta)))]
            out[key] = rows
    return out


def _place(shards: list[Shard]) -> None:
    lanes = traj = sources = 0
    for shard in shards:
        shard.lane_offset, shard.traj_offset, shard.source_offset = lanes, traj, sources
        lanes += shard.lanes
        sources += len(fmt.sources(shard.meta))
        ids = shard.rows["traj_id"]
        traj += int(ids.max()) + 1 if len(ids) else 0


def _rows(shards: list[Shard]) -> Rows:
    parts = []
    for shard in shards:
        rows = dict(shard.rows)
        rows["traj_id"] = rows["traj_id"] + shard.traj_offset
        rows["lane"] = rows["lane"] + shard.lane_offset
        rows[fmt.SOURCE] = rows[fmt.SOURCE] + shard.source_offset
        parts.append(rows)
    return {k: np.ascontiguousarray(v, COLUMNS[k]) for k, v in concat_rows(parts).items()}


def _metadata(shards: list[Shard], dest: Path, rows: Rows, virtual: bool) -> dict[str, Any]:
    first = shards[0].meta

    def joined(key: str) -> Any:
        values = list(dict.fromkeys(str(s.meta.get(key)) for s in shards))
        return values[0] if len(values) == 1 else "+".join(values)

    sweeps = {json.dumps(s.meta.get("sweep", {}).get("id")) for s in shards}
    meta: dict[str, Any] = {
        # the oldest shard's rules hold for the whole (version 1: cuts unflagged)
        "format_version": min(int(s.meta["format_version"]) for s in shards),
        "backend": shards[0].ds.backend,
        "status": fmt.COMPLETE
        if all(s.meta["status"] == fmt.COMPLETE for s in shards)
        else fmt.INTERRUPTED,
        "rlcollect_version": __version__,
        "versions": first.get("versions"),
        "env_id": first["env_id"],
        "env_preset": first.get("env_preset"),
        "env_backend": first.get("env_backend"),
        "observation_space": first.get("observation_space"),
        "action_space": first.get("action_space"),
        "policy": joined("policy"),
        "collector": joined("collector"),
        "config": first.get("config", ""),  # the first shard's; each shard's seed is in shards
        "start_time": min(str(s.meta.get("start_time") or "") for s in shards) or None,
        "end_time": max(str(s.meta.get("end_time") or "") for s in shards) or None,
        "frames": sum(int(s.meta["frames"]) for s in shards),
        "steps": max(s.steps for s in shards),
        "episodes": len(rows["traj_id"]),
        "lanes": sum(s.lanes for s in shards),
        fmt.LANE_STEPS: [int(n) for s in shards for n in s.lane_steps],
        "merged": {"time": now(), "mode": "virtual" if virtual else "copy"},
        # a virtual merge reads the shards' chunks: their codec's plugin is needed too
        fmt.CODEC: next((s.meta[fmt.CODEC] for s in shards if virtual and _plugin(s)), None),
        "shards": [_shard_entry(s, dest) for s in shards],
        fmt.SOURCES: _sources(shards, dest),
        **provenance.merged([s.meta for s in shards]),
    }
    for key in fmt.STREAM_KEYS:  # kept where every shard says the same
        values = [json.dumps(s.meta.get(key), sort_keys=True) for s in shards]
        if key in first and len(set(values)) == 1:
            meta[key] = first[key]
    if len(sweeps) == 1 and "sweep" in first:
        sweep = first["sweep"]
        meta["sweep"] = {"id": sweep.get("id"), "overrides": sweep.get("overrides")}
    return meta


def _sources(shards: list[Shard], dest: Path) -> list[dict[str, Any]]:
    """The shards' sources tables one after the other; each row names the shard it
    came from (``origin``) unless it already names an earlier one."""
    table = []
    for shard in shards:
        where = _shard_entry(shard, dest)["path"]
        table += [{**row, "origin": row.get("origin") or where} for row in fmt.sources(shard.meta)]
    return table


def _plugin(shard: Shard) -> bool:
    return bool((shard.meta.get(fmt.CODEC) or {}).get("plugin"))


def _shard_entry(shard: Shard, dest: Path) -> dict[str, Any]:
    sweep = shard.meta.get("sweep") or {}
    return {
        "path": os.path.relpath(shard.path.resolve(), dest.resolve().parent),
        "seed": shard.meta.get("seed"),
        "frames": int(shard.meta["frames"]),
        "episodes": len(shard.rows["traj_id"]),
        "lanes": shard.lanes,
        "steps": shard.steps,
        "status": shard.meta["status"],
        provenance.PROVENANCE: shard.meta.get(provenance.PROVENANCE),
        "lane_offset": shard.lane_offset,
        "traj_id_offset": shard.traj_offset,
        "sweep_job": sweep.get("job"),
        "sweep_jobs": sweep.get("jobs"),
    }


def merge(
    paths: list[str | Path],
    dest: str | Path,
    *,
    copy: bool = False,
    allow_incomplete: bool = False,
    overwrite: bool = False,
    which: str = "all",
) -> dict[str, Any]:
    """Merge the datasets at ``paths`` into ``dest``; return a summary of the result.
    ``which``: the frame keys kept where shards differ in their policy outputs or info
    keys: ``all`` (frames of shards without one hold NaN or 0, ``dataformat.FILLED``)
    or ``common``."""
    dest = Path(dest)
    if not paths:
        raise MergeError("name the shards to merge")
    if which not in KEYS:
        raise UsageError(f"--keys {which!r}: choose from {', '.join(KEYS)}")
    with claim(dest, "rlcollect merge"):  # durability D17
        # durability D18: never an input, nor what an input's virtual datasets read
        replaces = check_destination(dest, overwrite=overwrite, inputs=paths)
        shards = [_load(Path(p)) for p in paths]
        seen: dict[Path, Path] = {}
        for shard in shards:
            where = shard.path.resolve()
            if where in seen:
                raise MergeError(
                    f"shard {str(shard.path)!r} is named twice: each shard merges once"
                )
            seen[where] = shard.path
        _check(shards, allow_incomplete)
        _place(shards)
        merged = keys(shards, which)
        rows = _rows(shards)
        backend = shards[0].ds.backend
        virtual = BACKENDS[backend].links and not copy
        meta = _metadata(shards, dest, rows, virtual)
        if filled := _filled(shards, merged):
            meta[fmt.FILLED] = filled
        if why := backend_module(backend).lanes_limit(meta["lanes"], "lanes"):
            raise MergeError(f"{why}: merge fewer shards (memmap datasets have no such limit)")
        remove_leftovers(dest)
        tmp = staging_name(dest, "merging")
        try:
            write = backend_module(backend).write_merged
            write(tmp, dest, shards, virtual, meta, rows, merged)
            publish(tmp, dest, replaces)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                remove_output(tmp)
            if isinstance(exc, OSError):
                raise WriteError(
                    f"merging into {str(dest)!r} failed: {exc.strerror or exc}; nothing was written"
                ) from None
            raise
    return {
        "path": str(dest),
        "backend": backend,
        "mode": meta["merged"]["mode"],
        "shards": len(shards),
        "frames": meta["frames"],
        "episodes": meta["episodes"],
        "lanes": meta["lanes"],
        "steps": meta["steps"],
        "status": meta["status"],
        "filled": sorted(filled),
        "dropped": sorted({k for s in shards for k in s.arrays} - set(merged)),
    }
