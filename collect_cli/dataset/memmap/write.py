"""The memmap writer: one file per key, metadata replaced atomically at each commit."""

from __future__ import annotations

import errno
import json
import mmap
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, Rows
from collect_cli.dataformat import MEMMAP_META_FILE as META_FILE
from collect_cli.dataset.arrays import copy_into
from collect_cli.dataset.fsio import exchange, start_write_back
from collect_cli.dataset.memmap.read import read_meta
from collect_cli.dataset.memmap.tdmeta import numpy_dtype, spare, write_json, write_td_meta
from collect_cli.dataset.writer import Writer

RELEASE_BYTES = 32 << 20  # written bytes between two page releases (see _release_pages)
WRITE_BACK_RUN = 64 << 10  # a lane's bytes of one key in a batch, for its file's write-back


# durability D9 (docs/durability.md)
def build_frame_file(
    target: Path,
    layout: tuple[int, int, int],
    fill: bytes | None,
    source: tuple[Path, int] | None,
    lanes: int,
    steps: int,
) -> None:
    """Create a frame file of ``layout`` = (lanes, steps, bytes per step) on real
    blocks (a full disk fails here, not as a SIGBUS later), every byte set to the
    repeating ``fill`` pattern (zeros when None), then the first ``steps`` of the
    first ``lanes`` lanes copied from ``source`` = (file, its steps per lane).

    Written with file I/O, then synced and dropped from the page cache: pages
    filled in bulk sit there as large folios, and one write through the writer's
    mapping into such a folio maps all of it into the process, so a single batch
    touching every lane would map the whole file (its resident memory would grow
    with the dataset). Pages faulted in afresh by the writer stay small.
    """
    lane_cap, step_cap, row = layout
    size = lane_cap * step_cap * row
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(size, 1))
        if fill is not None:
            block = fill * max(1, (1 << 22) // len(fill))
            for offset in range(0, size, len(block)):
                os.pwrite(fd, block[: size - offset], offset)
        if source is not None:
            src_path, src_steps = source
            with open(src_path, "rb") as src:
                for lane in range(lanes):
                    copy_range(
                        src.fileno(), fd, steps * row, lane * src_steps * row, lane * step_cap * row
                    )
        if fill is not None or source is not None:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def copy_range(src: int, dst: int, count: int, src_offset: int, dst_offset: int) -> None:
    """Copy ``count`` bytes between two files in the kernel (read/write where the
    filesystem cannot)."""
    while count > 0:
        try:
            done = os.copy_file_range(src, dst, count, src_offset, dst_offset)
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            done = os.pwrite(dst, os.pread(src, min(count, 1 << 24), src_offset), dst_offset)
        if done == 0:
            raise OSError(errno.EIO, "short copy", str(src))
        count, src_offset, dst_offset = count - done, src_offset + done, dst_offset + done


class MemmapWriter(Writer):
    backend = "memmap"

    def __init__(self, path, **kw):
        super().__init__(path, **kw)
        self._maps: dict[tuple[str, ...], np.memmap] = {}
        self._specs: dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]] = {}
        self._episode_files: dict[str, Any] = {}
        self._final_files: dict[tuple[str, ...], Any] = {}  # the final/ table, append-only
        self._finals_listed = 0  # rows final/meta.json gives
        self.capacity = 0  # time steps allocated
        self.lane_capacity = 0  # lanes allocated (grows for datasets of whole episodes)
        self._unreleased = 0  # bytes written since the last page release
        self._batch_bytes = 0  # ...by the last batch
        self._lane_bytes: dict[tuple[str, ...], int] = {}  # a lane's bytes of a key, last batch
        self._episodes_listed: int | None = None  # rows episodes/meta.json gives

    def _file(self, key: tuple[str, ...]) -> Path:
        return self.path.joinpath(*key[:-1], key[-1] + ".memmap")

    def _open(self) -> None:
        self.path.mkdir()
        (self.path / "episodes").mkdir()
        for name in COLUMNS:
            # append-only, held open for the writer's lifetime; closed in _close
            file = self.path / "episodes" / f"{name}.memmap"
            self._episode_files[name] = open(file, "wb")  # noqa: SIM115
        self._write_td_meta()
        write_json(self.path / META_FILE, self.meta)

    def _reopen(self) -> dict[str, Any]:
        meta = read_meta(self.path)
        for meta_file in self.path.rglob("meta.json"):
            folder = meta_file.parent.relative_to(self.path).parts
            if folder[:1] == (fmt.FINAL,):
                for name, entry in json.loads(meta_file.read_text()).items():
                    if isinstance(entry, dict) and "dtype" in entry:
                        spec = (tuple(entry["shape"][1:]), numpy_dtype(entry["dtype"]))
                        self.final_specs[(*folder, name)] = spec
                continue
            if folder[:1] == ("episodes",):
                continue
            for name, entry in json.loads(meta_file.read_text()).items():
                if isinstance(entry, dict) and "dtype" in entry:
                    key = (*folder, name)
                    dtype = numpy_dtype(entry["dtype"])
                    shape = tuple(entry["shape"])
                    self._specs[key] = (shape[2:], dtype)
                    self.capacity = shape[1]
                    self.lane_capacity = shape[0]
                    self._maps[key] = np.memmap(
                        self._file(key), dtype=dtype, mode="r+", shape=shape
                    )
        self.lanes = int(meta["lanes"])
        self._created = bool(self._specs)
        return meta

    def _drop_uncommitted(self) -> None:
        for name, dtype in COLUMNS.items():
            file = self.path / "episodes" / f"{name}.memmap"
            os.truncate(file, self.episodes * np.dtype(dtype).itemsize)
            self._episode_files[name] = open(file, "ab")  # noqa: SIM115 (closed in _close)
        if not self._created:
            return
        mask, traj = self._maps[fmt.MASK_KEY], self._maps[fmt.TRAJ_KEY]
        for lane in range(self.lanes):
            mask[lane, self.cursor[lane] :] = False
            traj[lane, self.cursor[lane] :] = -1
        mask[self.lanes :] = False  # rows appended after the last commit
        traj[self.lanes :] = -1

    def _cut_finals(self, count: int) -> None:
        self._finals_listed = -1  # rewrite final/meta.json at the next commit
        for key, (feat, dtype) in self.final_specs.items():
            row = int(np.prod(feat, dtype=np.int64)) * np.dtype(dtype).itemsize
            os.truncate(self._file(key), count * row)
            self._final_files[key] = open(self._file(key), "ab")  # noqa: SIM115 (closed in _close)

    def _write_finals(self, rows, start: int) -> None:
        for key, array in rows.items():  # lane and time last (they make a row count)
            self._final_files[key].write(np.ascontiguousarray(array).tobytes())

    def _has(self, key: str) -> bool:
        return tuple(key.split("/")) in self._specs

    def _window(self, key: fmt.Key, lane: int, t0: int, t1: int) -> np.ndarray:
        return np.asarray(self._maps[key][lane, t0:t1])

    def _set_points(self, key: fmt.Key, lanes: np.ndarray, times: np.ndarray) -> None:
        self._maps[key][lanes, times] = True

    def _grow_lanes(self, lanes: int) -> None:
        if lanes > self.lane_capacity:
            self._resize(self.capacity, max(2 * self.lane_capacity, lanes))

    def _read(self, key: str) -> np.ndarray:
        if fmt.is_episodes(key):
            dtype = COLUMNS[key.split("/", 1)[1]]
            return np.fromfile(self.path / f"{key}.memmap", dtype=dtype)
        if fmt.key_of(key) in self.final_specs:
            feat, dtype = self.final_specs[fmt.key_of(key)]
            return np.fromfile(self._file(fmt.key_of(key)), dtype=dtype).reshape(-1, *feat)
        return np.asarray(self._maps[tuple(key.split("/"))])

    def _create(self, items, lanes: int) -> None:
        for key, array in items:
            self._specs[key] = (array.shape[2:], array.dtype)
            self._file(key).parent.mkdir(parents=True, exist_ok=True)
        for key in self.final_specs:
            self._file(key).parent.mkdir(parents=True, exist_ok=True)
            self._final_files[key] = open(self._file(key), "wb")  # noqa: SIM115 (closed in _close)
        self._resize(self._steps_to_allocate(0, items[0][1].shape[1]), lanes)

    # durability D10 (docs/durability.md)
    def _resize(self, capacity: int, lane_capacity: int | None = None) -> None:
        """(Re)allocate every frame file with ``capacity`` steps, keeping what is written.

        The new layout is built in a sibling directory (episodes files hard-linked,
        the committed metadata copied) and swapped in with one atomic exchange, so
        a crash at any moment leaves either the old dataset or the new one.
        """
        keep = min(self.steps, capacity)
        lane_capacity = lane_capacity or self.lane_capacity
        rows = min(self.lanes, lane_capacity)
        staging = self.path.with_name(self.path.name + ".resize")
        if staging.exists():
            shutil.rmtree(staging)
        for sub in [p for p in self.path.rglob("*") if p.is_dir()]:
            (staging / sub.relative_to(self.path)).mkdir(parents=True, exist_ok=True)
        for name in COLUMNS:
            os.link(
                self.path / "episodes" / f"{name}.memmap", staging / "episodes" / f"{name}.memmap"
            )
        shutil.copy2(self.path / "episodes" / "meta.json", staging / "episodes" / "meta.json")
        for key in self.final_specs:  # the final/ table, like the episodes: linked
            os.link(self._file(key), staging.joinpath(*key[:-1], key[-1] + ".memmap"))
        for meta_file in (self.path / fmt.FINAL).rglob("meta.json"):
            shutil.copy2(meta_file, staging / meta_file.relative_to(self.path))
        shutil.copy2(self.path / META_FILE, staging / META_FILE)
        for key, (feat, dtype) in self._specs.items():
            row = int(np.prod(feat, dtype=np.int64)) * np.dtype(dtype).itemsize
            target = staging.joinpath(*key[:-1], key[-1] + ".memmap")
            target.parent.mkdir(parents=True, exist_ok=True)
            build_frame_file(
                target,
                (lane_capacity, capacity, row),
                fill=np.full(1, -1, dtype).tobytes() if key == fmt.TRAJ_KEY else None,
                source=(self._file(key), self.capacity) if key in self._maps and keep else None,
                lanes=rows,
                steps=keep,
            )
        self._write_td_meta(
            root=staging,
            capacity=capacity,
            lane_capacity=lane_capacity,
            only_episodes=False,
            skip_episodes=True,
        )
        self._maps.clear()
        exchange(staging, self.path)
        shutil.rmtree(staging)
        self.capacity, self.lane_capacity = capacity, lane_capacity
        for key, (feat, dtype) in self._specs.items():
            self._maps[key] = np.memmap(
                self._file(key), dtype=dtype, mode="r+", shape=(lane_capacity, capacity, *feat)
            )

    def _write_frames(self, items, lanes: slice, t0: int, steps: int) -> None:
        if t0 + steps > self.capacity:
            self._resize(self._steps_to_allocate(self.capacity, t0 + steps))
        for key, array in items:
            copy_into(self._maps[key][lanes, t0 : t0 + steps], array)
            self._lane_bytes[key] = array[0].nbytes if len(array) else 0
        self._batch_bytes = sum(array.nbytes for _, array in items)
        self._unreleased += self._batch_bytes

    def _write_episodes(self, rows: Rows, start: int) -> None:
        if len(rows["traj_id"]):
            for name, f in self._episode_files.items():
                f.write(np.ascontiguousarray(rows[name], COLUMNS[name]).tobytes())

    def _write_td_meta(
        self,
        only_episodes: bool = False,
        root: Path | None = None,
        capacity: int | None = None,
        skip_episodes: bool = False,
        lane_capacity: int | None = None,
    ) -> None:
        """Write tensordict's ``meta.json`` files (under ``root``, default the dataset)."""
        root = root or self.path
        cap = self.capacity if capacity is None else capacity
        rows = self.lane_capacity if lane_capacity is None else lane_capacity
        frames = {k: ((rows, cap, *feat), dt) for k, (feat, dt) in self._specs.items()}
        finals = {k: ((self.finals, *feat), dt) for k, (feat, dt) in self.final_specs.items()}
        write_td_meta(
            root,
            frames,
            self.episodes,
            finals=finals,
            only_episodes=only_episodes,
            skip_episodes=skip_episodes,
        )
        if root == self.path and not skip_episodes:
            self._episodes_listed, self._finals_listed = self.episodes, self.finals

    # durability D4, D5 (docs/durability.md)
    def _commit(self) -> None:
        # Data first (into the page cache, which outlives this process), then the
        # metadata that makes it visible, each JSON file replaced atomically.
        for f in [*self._episode_files.values(), *self._final_files.values()]:
            f.flush()
        listed = (self._episodes_listed, self._finals_listed)
        if listed != (self.episodes, self.finals):  # most batches of long episodes end none
            self._write_td_meta(only_episodes=True)
        write_json(self.path / META_FILE, self.meta)
        if self._unreleased >= max(RELEASE_BYTES, 8 * self._batch_bytes):
            self._release_pages()

    def _release_pages(self) -> None:
        """Unmap the pages written so far from this process (they stay in the page
        cache and reach the file as usual): without this every written page counts
        in the writer's resident memory, which would grow with the dataset.

        Done once ``RELEASE_BYTES`` (or eight batches) were written, not at every
        commit: each lane's last page is only partly written and faults back in
        at the next batch, one fault per lane and key, which for thousands of
        lanes costs more than the batch's copy itself."""
        self._unreleased = 0
        for mm in self._maps.values():
            raw = getattr(mm, "_mmap", None)
            if raw is not None and hasattr(raw, "madvise"):
                raw.madvise(mmap.MADV_DONTNEED)

    # durability D11 (docs/durability.md)
    def _write_back(self) -> None:
        for key in self.written_back():  # by path: the maps' own names predate the rename
            fd = os.open(self._file(key), os.O_RDONLY)
            try:
                start_write_back(fd)
            finally:
                os.close(fd)

    def written_back(self) -> list[tuple[str, ...]]:
        """The keys whose files :meth:`_write_back` starts writing out: those a batch
        writes ``WRITE_BACK_RUN`` bytes or more of in each lane. A lane's last page is
        written again by the next batch, and writing a page while the disk writes it
        waits for the disk: with short runs (many lanes of small frames) that is most
        pages (measured: native Pendulum at 4096 lanes ran 3x slower)."""
        return [key for key in self._maps if self._lane_bytes.get(key, 0) >= WRITE_BACK_RUN]

    def _sync(self) -> None:
        """Force everything to the device (at close: durable across power loss)."""
        for mm in self._maps.values():
            mm.flush()
        for f in [*self._episode_files.values(), *self._final_files.values()]:
            f.flush()
            os.fsync(f.fileno())
        write_json(self.path / META_FILE, self.meta, sync=True)
        for meta in self.path.rglob("meta.json"):  # the commits' spares go
            spare(meta).unlink(missing_ok=True)

    def close(self, status: str = fmt.COMPLETE) -> None:
        if (
            status == fmt.COMPLETE
            and self._specs
            and (self.capacity, self.lane_capacity)
            != (
                self.steps,
                self.lanes,
            )
        ):
            self._resize(self.steps, self.lanes)
        super().close(status)

    def _close(self) -> None:
        self._sync()
        for f in [*self._episode_files.values(), *self._final_files.values()]:
            f.close()
        self._episode_files.clear()
        self._final_files.clear()
        self._maps.clear()
