"""The one Writer contract: ``open`` -> ``append`` (per batch) -> ``commit`` -> ``close``.

The base class owns everything backends share: output-path checks, the
episodes table, metadata and status. A backend stores arrays: it implements
``_create`` / ``_write_frames`` / ``_write_episodes`` / ``_commit`` / ``_close``.
After ``commit`` returns, the dataset on disk is consistent up to that batch.
"""

from __future__ import annotations

import abc
import contextlib
import glob
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from tensordict import TensorDictBase

from collect_cli.errors import OutputError, WriteError
from collect_cli.writers.episodes import EpisodeTracker, Rows

FORMAT_VERSION = 1
STATUSES = ("running", "complete", "interrupted")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def check_output(path: Path, overwrite: bool) -> None:
    """Fail early (before any env starts) if ``path`` cannot be written."""
    if path.exists() and not overwrite:
        raise OutputError(
            f"output {str(path)!r} already exists: pass overwrite=true or another out="
        )
    parent = path.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write output {str(path)!r}: {str(existing)!r} is not writable")


def remove_output(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def staging_leftovers(path: Path) -> list[tuple[Path, int]]:
    """``(sibling, pid)`` of each ``.<name>.creating-<pid>`` staging dataset of
    ``path`` (also ``<pid>.resize``, memmap's): what runs that have not made
    their first commit, or were killed before it, are building."""
    prefix = f".{path.name}.creating-"
    found = []
    for sibling in sorted(path.parent.glob(f"{glob.escape(prefix)}*")):
        pid = sibling.name[len(prefix) :].split(".", 1)[0]
        if pid.isdigit():
            found.append((sibling, int(pid)))
    return found


def remove_stale_staging(path: Path) -> None:
    """Remove the staging datasets of ``path`` left by runs that are gone."""
    for leftover, pid in staging_leftovers(path):
        if pid != os.getpid() and _alive(pid):
            continue  # another run's, still going
        remove_output(leftover)


def missing_dataset(path: Path) -> OutputError:
    """The error for no dataset at ``path``, naming a run that has not committed
    (or was killed before its first commit) if its staging dataset is there."""
    for staging, pid in staging_leftovers(path):
        if staging.name.endswith(".resize"):
            continue
        if _alive(pid):
            return OutputError(
                f"no dataset at {str(path)!r} yet: the run with pid {pid} is creating it "
                "and it appears at its first commit"
            )
        return OutputError(
            f"no dataset at {str(path)!r}: the run with pid {pid} was killed before its "
            f"first commit, so nothing was saved (the next run to it removes {staging.name})"
        )
    return OutputError(f"no dataset at {str(path)!r}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


MASK_KEY = ("collector", "mask")


def leaf_items(batch: TensorDictBase) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """``(key tuple, numpy array)`` for every leaf of a CPU batch, the mask last:
    a frame whose mask is on disk has all its other entries on disk too."""
    out = []
    for key, value in batch.items(True, True):
        key = key if isinstance(key, tuple) else (key,)
        out.append((key, value.detach().cpu().numpy()))
    out.sort(key=lambda item: item[0] == MASK_KEY)
    return out


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
    ):
        self.path = Path(path)
        self.overwrite = overwrite
        self.planned_steps = planned_steps
        self.lanes = lanes  # default: the width of the first batch
        self.meta: dict[str, Any] = dict(metadata)
        self.cursor = np.zeros(0, np.int64)  # time steps written, per lane
        self.steps = 0  # the longest lane's time steps
        self.frames = 0  # committed valid frames
        self.episodes = 0
        self.tracker: EpisodeTracker | None = None
        self._created = False
        self._closed = False
        self._publish_at: Path | None = None  # where the first commit renames the dataset

    def open(self) -> Writer:
        """Create the empty dataset. It is built under a temporary sibling name and
        renamed into place by the first :meth:`commit`, once the first batch's
        datasets exist: HDF5 creates a dataset in several writes that a kill can
        cut, so the structure is made where a half-made file is never seen at
        ``path``. Later commits only add data to it and overwrite values."""
        check_output(self.path, self.overwrite)
        final = self.path
        staging = final.with_name(f".{final.name}.creating-{os.getpid()}")
        try:
            if final.exists():
                remove_output(final)
            final.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_staging(final)  # and this process's own, if any
            self.meta.update(
                format_version=FORMAT_VERSION,
                backend=self.backend,
                status="running",
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
            for leftover in (staging, final):
                with contextlib.suppress(OSError):
                    remove_output(leftover)  # nothing was committed: leave nothing behind
            raise WriteError(f"cannot create {str(final)!r}: {exc.strerror or exc}") from exc
        self._publish_at = final
        return self

    def reopen(self) -> Writer:
        """Continue the dataset at ``path`` after its last commit.

        Frames written after that commit are dropped (mask False, traj_id -1),
        episodes a crash left running get their row (``complete`` False), and
        :meth:`append` continues each lane where it stopped.
        ``next_traj_id`` is the first id the continuation may use.
        """
        try:
            disk = self._reopen()
            self.meta = {**disk, "status": "running", "end_time": None}
            self.meta["resumed"] = [*disk.get("resumed", []), now()]
            self.lanes = int(disk["lanes"])
            self.frames, self.episodes = int(disk["frames"]), int(disk["episodes"])
            self.cursor = np.asarray(disk.get("lane_steps") or [disk["steps"]] * self.lanes)
            self.steps = int(self.cursor.max()) if len(self.cursor) else 0
            self.tracker = self._tracker(self.lanes)
            self.tracker.start[:] = self.cursor
            self._drop_uncommitted()
            known = self._read("episodes/traj_id")[: self.episodes]
            self.next_traj_id = int(known.max()) + 1 if len(known) else 0
            if self._created:
                traj = self._read("collector/traj_ids")
                self.next_traj_id = max(self.next_traj_id, int(traj.max()) + 1)
                if disk["status"] == "running":  # killed: its running episodes have no row
                    rows = self._tail_rows(set(known.tolist()))
                    self._write_episodes(rows, self.episodes)
                    self.episodes += len(rows["traj_id"])
            self.commit()
        except OSError as exc:
            raise self._os_error(exc) from exc
        return self

    def _tracker(self, lanes: int) -> EpisodeTracker:
        # without resets at episode ends, a trajectory (one row) spans episodes
        return EpisodeTracker(
            lanes,
            split_on_done=bool(self.meta.get("reset_when_done", True)),
            by_lane=bool(self.meta.get("split_trajs", False)),
        )

    def _tail_rows(self, known: set[int]) -> Rows:
        """Rows for each lane's last trajectory when it has none (cut by a crash)."""
        traj, mask = self._read("collector/traj_ids"), self._read("collector/mask")
        reward_key = "next/original_reward" if self._has("next/original_reward") else "next/reward"
        reward = self._read(reward_key).reshape(traj.shape)
        rows = []
        for lane in range(self.lanes):
            valid = np.flatnonzero(mask[lane, : self.cursor[lane]])
            if not len(valid) or int(traj[lane, valid[-1]]) in known:
                continue
            last = traj[lane, valid[-1]]
            frames = valid[traj[lane, valid] == last]
            rows.append(
                (last, lane, frames[0], len(frames), reward[lane, frames].sum(dtype=np.float64))
            )
        columns = list(zip(*rows, strict=True)) if rows else [[]] * 5
        n = len(rows)
        return {
            "traj_id": np.asarray(columns[0], np.int64),
            "lane": np.asarray(columns[1], np.int64),
            "start": np.asarray(columns[2], np.int64),
            "length": np.asarray(columns[3], np.int64),
            "return": np.asarray(columns[4], np.float64),
            "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool),
            "complete": np.zeros(n, bool),
        }

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
                self.tracker = self._tracker(self.lanes)
                self._create(items, self.lanes)
                self._created = True
            elif lane_start + width > self.lanes:  # new rows (a dataset of whole episodes)
                self._grow_lanes(lane_start + width)
                grown = lane_start + width - self.lanes
                self.cursor = np.concatenate([self.cursor, np.zeros(grown, np.int64)])
                self.tracker.grow(lane_start + width)
                self.lanes = self.meta["lanes"] = lane_start + width
            group = slice(lane_start, lane_start + width)
            t0 = int(self.cursor[group].max())
            self._write_frames(items, group, t0, steps)
            rows = self.tracker.update(batch, t0, lane_start)
            self._write_episodes(rows, self.episodes)
        except OSError as exc:
            raise self._os_error(exc) from exc
        self.cursor[group] = t0 + steps
        self.steps = int(self.cursor.max())
        self.frames += int(batch.get(("collector", "mask")).sum())
        self.episodes += len(rows["traj_id"])
        return rows

    def commit(self) -> None:
        """Make everything appended so far durable and visible to readers.

        Frames past a lane's ``lane_steps`` entry may already be on disk after a
        crash; they are not part of the dataset until committed.
        """
        self.meta.update(
            frames=self.frames,
            steps=self.steps,
            episodes=self.episodes,
            lane_steps=self.cursor.tolist(),
        )
        try:
            self._commit()
            # the first commit with frame storage made (split_trajs commits rows only
            # once episodes end), or the last: the dataset appears
            if self._publish_at is not None and (self._created or self._closed):
                os.rename(self.path, self._publish_at)
                self.path, self._publish_at = self._publish_at, None
        except OSError as exc:
            raise self._os_error(exc) from exc

    def close(self, status: str = "complete") -> None:
        """Record the running episodes as incomplete, set ``status`` and commit."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.tracker is not None:
                rows = self.tracker.finish()
                self._write_episodes(rows, self.episodes)
                self.episodes += len(rows["traj_id"])
            # the data and counters first, like any commit; then the status alone, so
            # a kill while it is written can cost nothing but the status itself
            self.commit()
            self.meta.update(status=status, end_time=now())
            self.commit()
        finally:
            with contextlib.suppress(OSError):
                self._close()

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
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _close(self) -> None: ...
