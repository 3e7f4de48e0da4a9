"""The one Writer contract: ``open`` -> ``append`` (per batch) -> ``commit`` -> ``close``.

The base class owns everything backends share: output-path checks, the
episodes table, metadata and status. A backend stores arrays: it implements
``_create`` / ``_write_frames`` / ``_write_episodes`` / ``_commit`` / ``_close``.
After ``commit`` returns, the dataset on disk is consistent up to that batch.
"""

from __future__ import annotations

import abc
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from tensordict import TensorDictBase

from collect_cli import dataformat as fmt
from collect_cli.dataformat import FORMAT_VERSION, MASK_KEY, Rows
from collect_cli.dataset.arrays import leaf_items
from collect_cli.dataset.episodes import EpisodeTracker
from collect_cli.dataset.fsio import publish
from collect_cli.dataset.ownership import (
    Identity,
    check_destination,
    remove_leftovers,
    remove_output,
    staging_name,
)
from collect_cli.errors import OutputError, UsageError, WriteError

# A writer starts writing its frames to the device every this many bytes
# (Writer.write_back), so that close's fsync is short.
WRITE_BACK_BYTES = 16 << 20


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Writer(abc.ABC):
    """Streams ``[lanes, time]`` batches into one dataset at ``path``."""

    backend: str = ""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        metadata: dict[str, Any],
        overwrite: bool = False,
        planned_steps: int | None = None,
        lanes: int | None = None,
        layout: str = fmt.AUTO,
        owner: int | None = None,
        commit_interval: float = 0.0,
        rows_given: bool = False,
    ):
        """``owner``: the pid of the run this writer writes for, which the staging
        dataset's name carries (default: this process; a run's writer process has
        the run's). ``commit_interval``: seconds from one commit to the next at least,
        for ``commit(when_due=True)``. ``rows_given``: the episodes table comes from
        :meth:`add_rows`, not from the frames (a copy of whole episodes, whose rows
        say what the frames alone cannot: which were cut, by which source)."""
        self.path = Path(path)
        self.owner = owner or os.getpid()
        self.commit_interval = commit_interval
        self._last_commit: float | None = None  # when the last commit ended (monotonic)
        self.layout = layout  # auto | full | compact: how observations are stored
        # observation keys stored once (compact layout), and the final/ table's specs
        self.compact: list[fmt.Key] = []
        self.final_specs: dict[fmt.Key, tuple[tuple[int, ...], np.dtype]] = {}
        self.finals = 0  # rows of the final/ table written
        self.overwrite = overwrite
        self.planned_steps = planned_steps
        self.lanes = lanes  # default: the width of the first batch
        # the time steps of most batches to come (the stream's joined ones), for the
        # layout made at the first: 0, the first batch's
        self.batch_steps = 0
        self.meta: dict[str, Any] = dict(metadata)
        self.cursor = np.zeros(0, np.int64)  # time steps written, per lane
        self.steps = 0  # the longest lane's time steps
        self.frames = 0  # committed valid frames
        self.episodes = 0  # episode rows, counted when they end (stored at a commit)
        self._held_rows: list[Rows] = []  # rows not yet stored: the next commit stores them
        self.next_traj_id = 0  # the first trajectory id a continuation may use (reopen)
        self.tracker: EpisodeTracker | None = None
        self.rows_given = rows_given
        self.source = 0  # the sources row (metadata) whose policy acts: episodes starting get it
        self._created = False
        self._closed = False
        self._publish_at: Path | None = None  # where the first commit renames the dataset
        self._replaces: Identity | None = None  # what it may replace there (overwrite)
        self._unsynced = 0  # bytes of frames appended since the last write-back

    # durability D1 (docs/durability.md)
    def open(self) -> Writer:
        """Create the empty dataset. It is built under a temporary sibling name and
        renamed into place by the first :meth:`commit`, once the first batch's
        datasets exist: HDF5 creates a dataset in several writes that a kill can
        cut, so the structure is made where a half-made file is never seen at
        ``path``. Later commits only add data to it and overwrite values."""
        final = self.path
        # what the first commit may replace: the dataset there now, with overwrite
        self._replaces = check_destination(final, overwrite=self.overwrite, flag="overwrite=true")
        staging = staging_name(final, "creating", self.owner)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            remove_leftovers(final, self.owner)
            self.meta.update(
                format_version=FORMAT_VERSION,
                backend=self.backend,
                status=fmt.RUNNING,
                start_time=now(),
                end_time=None,
                resumed=[],
                frames=0,
                steps=0,
                episodes=0,
                lanes=self.lanes,
            )
            self.path = staging
            self._open()
        except OSError as exc:
            self.path = final
            with contextlib.suppress(OSError):
                self._close()
            with contextlib.suppress(OSError):
                remove_output(staging)  # nothing was committed: leave nothing behind
            raise WriteError(f"cannot create {str(final)!r}: {exc.strerror or exc}") from exc
        self._publish_at = final
        return self

    # durability D13 (docs/durability.md)
    def reopen(self) -> Writer:
        """Continue the dataset at ``path`` after its last commit.

        Frames written after that commit are dropped (mask False, traj_id -1),
        episodes a crash left running get their row (``complete`` False), and
        :meth:`append` continues each lane where it stopped.
        ``next_traj_id`` is the first id the continuation may use.
        """
        try:
            disk = self._reopen()
            self.meta = {**disk, "status": fmt.RUNNING, "end_time": None}
            self.meta["resumed"] = [*disk.get("resumed", []), now()]
            self.lanes = int(disk["lanes"])
            self.frames, self.episodes = int(disk["frames"]), int(disk["episodes"])
            self.cursor = fmt.lane_steps(disk)
            self.steps = int(self.cursor.max()) if len(self.cursor) else 0
            self.tracker = self._tracker(self.lanes)
            self.tracker.start[:] = self.cursor
            self.compact = [fmt.key_of(k) for k in disk.get(fmt.COMPACT_KEYS) or []]
            self._drop_uncommitted()
            if self.compact and self._created:
                self._drop_stale_finals()
            known = self._read(fmt.column("traj_id"))[: self.episodes].tolist()
            self.next_traj_id = max(known) + 1 if known else 0
            if self._created:
                traj = self._read(fmt.TRAJ)
                self.next_traj_id = max(self.next_traj_id, int(traj.max()) + 1)
                if disk["status"] == fmt.RUNNING:  # killed: its running episodes have no row
                    mask = self._read(fmt.MASK)
                    reward, _ = fmt.own_step(self._get, traj.shape)
                    last = max(0, len(fmt.sources(disk)) - 1)  # the policy at the kill
                    rows = fmt.tail_rows(traj, mask, reward, self.cursor, set(known), last)
                    self._flag_cuts(*fmt.cut_points(rows, mask, self.cursor))
                    self._add_rows(rows)
            self.commit()
        except OSError as exc:
            raise self._os_error(exc) from exc
        return self

    # durability D13, D16 (docs/durability.md)
    def _drop_stale_finals(self) -> None:
        """Cut the ``final/`` table after its last row inside the committed steps:
        rows after it were written for frames the kill lost (all at the table's end)."""
        lane = self._read(fmt.path(fmt.FINAL_LANE_KEY))
        time = self._read(fmt.path(fmt.FINAL_TIME_KEY))
        valid = np.flatnonzero(fmt.valid_finals(lane, time, self.cursor))
        self.finals = int(valid[-1]) + 1 if len(valid) else 0
        self._cut_finals(self.finals)

    def _steps_to_allocate(self, allocated: int, needed: int) -> int:
        """Time steps a backend allocates ahead once ``needed`` no longer fit in the
        ``allocated`` ones: the planned steps of a finite run, doubling for an endless
        one (or past the plan)."""
        return max(needed, self.planned_steps or 0, 2 * allocated)

    def _plan_layout(self, items: list[tuple[fmt.Key, np.ndarray]]) -> None:
        """Pick the observation keys stored once (first batch) and record the layout."""
        if fmt.lookahead(self.meta) > 1:
            if self.layout == fmt.COMPACT:
                raise UsageError(
                    "writer.layout=compact cannot hold postproc=multistep (next/observation "
                    "looks n steps ahead): use writer.layout=full or auto"
                )
            self.compact = []
        else:
            leaves = [(k, a.shape[2:], a.dtype) for k, a in items]
            self.compact = fmt.compact_keys(leaves, self.layout)
        shapes = {k: (a.shape[2:], a.dtype) for k, a in items}
        self.final_specs = {fmt.final_key(k): shapes[k] for k in self.compact}
        if self.compact:
            self.final_specs[fmt.FINAL_LANE_KEY] = ((), np.dtype(np.int64))
            self.final_specs[fmt.FINAL_TIME_KEY] = ((), np.dtype(np.int64))
        self.meta[fmt.LAYOUT] = fmt.COMPACT if self.compact else fmt.FULL
        self.meta[fmt.COMPACT_KEYS] = [fmt.path(k) for k in self.compact]

    # durability D16 (docs/durability.md)
    def _split_finals(
        self, items: list[tuple[fmt.Key, np.ndarray]], lane_start: int, t0: int
    ) -> tuple[list[tuple[fmt.Key, np.ndarray]], dict[fmt.Key, np.ndarray]]:
        """The batch's items without the compact keys' next/observation, and the
        ``final/`` rows that keep what the next frame cannot give."""
        if not self.compact:
            return items, {}
        arrays = dict(items)
        traj, mask = arrays[fmt.TRAJ_KEY], arrays[fmt.MASK_KEY]
        done = arrays[fmt.DONE_KEY].reshape(mask.shape)
        lanes, times = fmt.final_points(traj, mask, done)
        drop = {fmt.next_key(k) for k in self.compact}
        # the values first, lane and time last: a row counts once its time is written
        rows = {fmt.final_key(k): arrays[fmt.next_key(k)][lanes, times] for k in self.compact}
        rows[fmt.FINAL_LANE_KEY] = (lanes + lane_start).astype(np.int64)
        rows[fmt.FINAL_TIME_KEY] = (times + t0).astype(np.int64)
        return [(k, a) for k, a in items if k not in drop], rows

    def _tracker(self, lanes: int) -> EpisodeTracker:
        # without resets at episode ends, a trajectory (one row) spans episodes
        return EpisodeTracker(
            lanes,
            split_on_done=bool(self.meta.get("reset_when_done", True)),
            by_lane=bool(self.meta.get("split_trajs", False)),
        )

    def _get(self, key: fmt.Key) -> np.ndarray | None:
        """One stored frame array, or None where the dataset has no ``key``."""
        return self._read(fmt.path(key)) if self._has(fmt.path(key)) else None

    # durability D13 (docs/durability.md)
    def _flag_cuts(self, lanes: np.ndarray, times: np.ndarray) -> None:
        """Mark the frames where the dataset cuts a trajectory (the end of the run, a
        reset between batches, a resume point): ``next/truncated`` and ``next/done``
        True at its last frame, as TorchRL's ``set_truncated`` does, so that splitting
        a lane on ``next/done`` gives its trajectories. After ``postproc=multistep``
        the frames whose n-step window ends there carry the same ``next/*`` flags."""
        if not len(lanes) or not self._created:
            return
        lanes, times = np.asarray(lanes, np.int64), np.asarray(times, np.int64)
        ahead = fmt.lookahead(self.meta)
        if ahead > 1:
            found_l, found_t = [lanes], [times]
            for lane, t in zip(lanes.tolist(), times.tolist(), strict=True):
                lo = max(0, t - ahead + 1)
                window = {
                    key: self._window(key, lane, lo, t + 1)
                    for key in (fmt.TRAJ_KEY, fmt.MASK_KEY, fmt.STEPS_TO_NEXT_KEY)
                }
                span = np.arange(lo, t + 1)
                steps_to = window[fmt.STEPS_TO_NEXT_KEY].reshape(len(span), -1)[:, 0]
                same = window[fmt.MASK_KEY] & (window[fmt.TRAJ_KEY] == window[fmt.TRAJ_KEY][-1])
                reach = same & (span + steps_to - 1 == t) & (span < t)
                found_l.append(np.full(int(reach.sum()), lane, np.int64))
                found_t.append(span[reach])
            lanes, times = np.concatenate(found_l), np.concatenate(found_t)
        for key in (fmt.TRUNCATED_KEY, fmt.DONE_KEY):
            self._set_points(key, lanes, times)

    def append(self, batch: TensorDictBase, lane_start: int = 0) -> Rows:
        """Append a ``[lanes, time]`` batch to lanes ``lane_start...`` after their last frame.

        Not yet durable: call :meth:`commit`. Returns the episodes it finished.
        Lane groups may advance unevenly (asynchronous workers): lanes shorter
        than the longest hold ``collector/mask`` False at their end.
        """
        width, steps = (int(n) for n in batch.batch_size[:2])
        items = leaf_items(batch)
        try:
            if not self._created:
                self.lanes = max(self.lanes or 0, lane_start + width)
                self.meta["lanes"] = self.lanes
                self.cursor = np.zeros(self.lanes, np.int64)
                self.tracker = None if self.rows_given else self._tracker(self.lanes)
                self._plan_layout(items)
                self._create([(k, a) for k, a in items if k not in self._dropped], self.lanes)
                self._created = True
            elif lane_start + width > self.lanes:  # new rows (a dataset of whole episodes)
                self._grow_lanes(lane_start + width)
                grown = lane_start + width - self.lanes
                self.cursor = np.concatenate([self.cursor, np.zeros(grown, np.int64)])
                if self.tracker is not None:
                    self.tracker.grow(lane_start + width)
                self.lanes = self.meta["lanes"] = lane_start + width
            group = slice(lane_start, lane_start + width)
            t0 = self.next_step(lane_start, width)
            items, finals = self._split_finals(items, lane_start, t0)
            self._write_frames(items, group, t0, steps)
            if finals:
                self._write_finals(finals, self.finals)
                self.finals += len(finals[fmt.FINAL_TIME_KEY])
            arrays = dict(items)
            rows = fmt.empty_rows()
            if self.tracker is not None:
                self.tracker.source = self.source
                rows = self.tracker.update(arrays, t0, lane_start)
                self._flag_cuts(*self.tracker.cuts)
        except OSError as exc:
            raise self._os_error(exc) from exc
        self.cursor[group] = t0 + steps
        self._unsynced += sum(a.nbytes for _, a in items)
        self.steps = int(self.cursor.max())
        self.frames += int(np.count_nonzero(arrays[MASK_KEY]))
        self._add_rows(rows)
        return rows

    def next_step(self, lane_start: int, width: int) -> int:
        """The time step :meth:`append` puts the next batch of lanes ``lane_start...`` at."""
        group = self.cursor[lane_start : lane_start + width]
        return int(group.max()) if len(group) else 0

    def add_rows(self, rows: Rows) -> None:
        """Add episode rows (a writer with ``rows_given``), stored at the next commit."""
        self._add_rows({name: np.asarray(rows[name], dtype) for name, dtype in fmt.COLUMNS.items()})

    def _add_rows(self, rows: Rows) -> None:
        """Count episode rows now, store them at the next commit: one write a commit
        for each column, not one a batch (rows not committed are not part of the
        dataset anyway)."""
        if len(rows["traj_id"]):
            self._held_rows.append(rows)
            self.episodes += len(rows["traj_id"])

    def _store_rows(self) -> None:
        if self._held_rows:
            rows = fmt.concat_rows(self._held_rows)
            self._write_episodes(rows, self.episodes - len(rows["traj_id"]))
            self._held_rows = []

    def commit_due(self) -> bool:
        """Whether ``commit_interval`` seconds have passed since the last commit (the
        first is due at once: it publishes the dataset)."""
        return (
            self._last_commit is None
            or time.monotonic() - self._last_commit >= self.commit_interval
        )

    # durability D1, D4 (docs/durability.md)
    def commit(self, when_due: bool = False) -> bool:
        """Make everything appended so far durable and visible to readers; with
        ``when_due``, only if :meth:`commit_due`. Whether it did.

        Frames past a lane's ``lane_steps`` entry may already be on disk after a
        crash; they are not part of the dataset until committed.
        """
        if when_due and not self.commit_due():
            return False
        self.meta.update(
            frames=self.frames,
            steps=self.steps,
            episodes=self.episodes,
            **{fmt.LANE_STEPS: self.cursor.tolist()},
        )
        try:
            self._store_rows()
            self._commit()
            # the first commit with frame storage made (split_trajs commits rows only
            # once episodes end), or the last: the dataset appears
            if self._publish_at is not None and (self._created or self._closed):
                self._publish()
        except OSError as exc:
            raise self._os_error(exc) from exc
        self._last_commit = time.monotonic()
        return True

    # durability D1, D19 (docs/durability.md)
    def _publish(self) -> None:
        """Rename the staging dataset to ``path``, replacing only the dataset checked
        at :meth:`open`; if something else is there now, give up the staging dataset
        (one batch) and leave what is there alone."""
        try:
            publish(self.path, self._publish_at, self._replaces, sync=False)
        except OutputError:
            self._closed = True
            with contextlib.suppress(OSError):
                self._close()
            with contextlib.suppress(OSError):
                remove_output(self.path)
            raise
        self.path, self._publish_at = self._publish_at, None

    # durability D11 (docs/durability.md)
    def write_back(self) -> None:
        """Start writing committed frames to the device ahead of :meth:`close`, once
        ``WRITE_BACK_BYTES`` have been appended since the last time, without waiting
        for the disk: it works while the envs step, and close's fsync has little left."""
        if self._unsynced < WRITE_BACK_BYTES:
            return
        self._unsynced = 0
        try:
            self._write_back()
        except OSError as exc:
            raise self._os_error(exc) from exc

    @abc.abstractmethod
    def _write_back(self) -> None:
        """Start writing the frames stored so far to the device (:func:`start_write_back`)."""

    # durability D11 (docs/durability.md)
    def close(self, status: str = fmt.COMPLETE) -> None:
        """Record the running episodes as incomplete, set ``status`` and commit."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.tracker is not None:
                rows = self.tracker.finish()
                self._flag_cuts(*self.tracker.cuts)
                self._add_rows(rows)
            # the data and counters first, like any commit; then the status alone, so
            # a kill while it is written can cost nothing but the status itself
            self.commit()
            self.meta.update(status=status, end_time=now())
            self.commit()
        finally:
            with contextlib.suppress(OSError):
                self._close()

    @property
    def _dropped(self) -> set[fmt.Key]:
        return {fmt.next_key(k) for k in self.compact}

    def _os_error(self, exc: OSError) -> WriteError:
        reason = exc.strerror or str(exc)
        return WriteError(
            f"writing {str(self._publish_at or self.path)!r} failed: {reason}; "
            f"the dataset is readable up to the last commit ({self.meta.get('frames', 0)} frames)"
        )

    @abc.abstractmethod
    def _open(self) -> None:
        """Create the (empty) dataset with ``self.meta``."""

    @abc.abstractmethod
    def _reopen(self) -> dict[str, Any]:
        """Open the existing dataset for appending; return its metadata.
        Sets ``_created`` when frame storage exists."""

    @abc.abstractmethod
    def _drop_uncommitted(self) -> None:
        """Mark frames past each lane's cursor as padding; cut episodes to the count."""

    @abc.abstractmethod
    def _read(self, key: str) -> np.ndarray:
        """One stored array (``key`` joined by ``/``), as on disk."""

    @abc.abstractmethod
    def _has(self, key: str) -> bool:
        """Whether frame storage for ``key`` (joined by ``/``) exists."""

    @abc.abstractmethod
    def _window(self, key: fmt.Key, lane: int, t0: int, t1: int) -> np.ndarray:
        """Frames ``t0:t1`` of one lane of ``key``, as stored."""

    @abc.abstractmethod
    def _set_points(self, key: fmt.Key, lanes: np.ndarray, times: np.ndarray) -> None:
        """Set the bool frame entry ``key`` True at each ``(lane, time)`` (written frames)."""

    @abc.abstractmethod
    def _grow_lanes(self, lanes: int) -> None:
        """Make room for ``lanes`` lanes (new ones empty: mask False, traj_ids -1)."""

    @abc.abstractmethod
    def _create(self, items: list[tuple[tuple[str, ...], np.ndarray]], lanes: int) -> None:
        """Create one storage per frame key, shaped from the first batch."""

    @abc.abstractmethod
    def _write_frames(self, items, lanes: slice, t0: int, steps: int) -> None:
        """Write ``items`` at ``[lanes, t0 : t0 + steps]``, growing the time axis as needed."""

    @abc.abstractmethod
    def _write_episodes(self, rows: Rows, start: int) -> None: ...

    @abc.abstractmethod
    def _write_finals(self, rows: dict[fmt.Key, np.ndarray], start: int) -> None:
        """Write rows ``start...`` of the ``final/`` table (made by ``_create``)."""

    @abc.abstractmethod
    def _cut_finals(self, count: int) -> None:
        """Keep the first ``count`` rows of the ``final/`` table."""

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _close(self) -> None: ...
