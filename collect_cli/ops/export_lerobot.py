"""``export --format lerobot``: LeRobot dataset format v3.0, the layout that
``LeRobotDataset(repo_id, root=DEST)`` (lerobot 0.4) loads::

    meta/info.json        codebase_version v3.0, fps, features, path templates, totals
    meta/stats.json       per feature: min max mean std count q01 q10 q50 q90 q99
    meta/tasks.parquet    one task: the dataset's ``dataset.description``, else its env id
    meta/episodes/chunk-000/file-000.parquet   a row per episode: where its frames and
                          video frames lie, its stats, its rlcollect/source (traj_id...)
    meta/rlcollect.json   what LeRobot has no field for: env, spaces, sources, provenance
    data/chunk-000/file-000.parquet            a row per frame
    videos/<feature>/chunk-000/file-000.mp4    H.264, the episodes one after another

Frames: an observation that is one array is ``observation.state`` (or, an
``HxWx3`` uint8 image, ``observation.image``); a Dict/Tuple observation gives
``observation.<leaf>`` per leaf (images: ``observation.images.<leaf>``). Images
are MP4 video, or with ``images`` PNG in the Parquet rows (LeRobot's ``image``
dtype: lossless). ``action`` (``action.<leaf>``), ``next.reward``, ``next.done``
(terminated or truncated), ``next.terminated``, ``next.truncated``: an episode cut
by the end of the run ends with ``next.truncated`` True. Extras are
``infos.<key>``. Floating observations and actions are float32; values of shape
``S`` are flat vectors of ``prod(S)`` numbers.

Streams: Parquet row groups of ``ROW_GROUP_BYTES``, video frames straight to the
encoder; a new file once one holds about ``*_FILE_MB``, always at an episode's end
(an episode lies in one file, as LeRobot requires). Memory is bounded by a row
group, not by the dataset or an episode.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import __version__
from collect_cli import dataformat as fmt
from collect_cli.errors import UsageError
from collect_cli.ops.frames import REWARD, Plan, Source, blocks, d4rl_name
from collect_cli.ops.lerobot_stats import Moments, Totals
from collect_cli.ops.lerobot_video import (
    CHUNKS_SIZE,
    CODECS,
    DEFAULT_CODEC,
    VIDEO_PATH,
    Video,
    check_encoder,
    check_pictures,
    is_picture,
    png,
)

INSTALL = "pip install 'rlcollect[export]'"
INCOMPLETE = "truncation"  # how an exported incomplete episode ends
CODEBASE_VERSION = "v3.0"
DATA_FILE_MB = 100  # LeRobot's defaults: a new file once one holds about this many MiB
VIDEO_FILE_MB = 200
ROW_GROUP_BYTES = 8 << 20  # frame bytes buffered before a row group is written
EPISODE_ROWS = 1000  # episodes per row group of meta/episodes
DEFAULT_FPS = 30
CHUNK = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK + ".parquet"
EPISODES_PATH = "meta/episodes/" + CHUNK + ".parquet"
INDEX = ("timestamp", "frame_index", "episode_index", "index", "task_index")
FLAGS = ("next.done", "next.terminated", "next.truncated")
IMAGE_NAMES = ["height", "width", "channels"]


@dataclass
class Column:
    """A LeRobot feature and the dataset key it is read from (None: made here)."""

    name: str
    key: str | None
    kind: str  # number | text | image (PNG in the rows) | video
    dtype: np.dtype  # numbers: the dtype written
    shape: tuple[int, ...]  # per frame, as info.json declares it

    @property
    def width(self) -> int:
        return int(np.prod(self.shape))

    def feature(self) -> dict[str, Any]:
        if self.kind in ("image", "video"):
            return {"dtype": self.kind, "shape": list(self.shape), "names": IMAGE_NAMES}
        dtype = "string" if self.kind == "text" else self.dtype.name
        return {"dtype": dtype, "shape": list(self.shape), "names": None}

    def arrow_type(self, pa):
        if self.kind == "text":
            return pa.string()
        if self.kind == "image":
            return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        value = pa.from_numpy_dtype(self.dtype)
        return value if self.shape == (1,) else pa.list_(value, self.width)


def is_lerobot_export(path: Path) -> bool:
    """A LeRobot dataset folder (what ``--overwrite`` may replace), or an empty one."""
    if not path.is_dir():
        return False
    try:
        info = json.loads((path / "meta" / "info.json").read_text())
        return str(info.get("codebase_version", "")).startswith("v")
    except (OSError, ValueError, AttributeError):
        return not any(path.iterdir())


def require(ds, images: bool, fps: int | None, codec: str | None = None) -> None:
    """What the export needs here: pyarrow; PyAV with the encoder for videos, Pillow
    for PNG; ``--images``/``--video-codec`` only where there are pictures, not both."""
    if fps is not None and fps < 1:
        raise UsageError(f"--fps {fps}: give a positive whole number of frames per second")
    head = fmt.OBSERVATION + "/"
    pictures = [
        tuple(s[2:])
        for k, s, d in ds.describe()
        if (k == fmt.OBSERVATION or k.startswith(head)) and is_picture(s[2:], d)
    ]
    needs = ["pyarrow.parquet", *check_pictures(pictures, images, codec)]
    for module in needs:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"--format lerobot needs {module} ({exc}): {INSTALL}") from None
    if "av" in needs:
        check_encoder(codec)


def mission_key(meta: dict[str, Any]) -> str | None:
    """The observation's Text leaf whose first value an episode names as its task
    (MiniGrid's ``observation/mission``; the first by name where there are several)."""
    keys = sorted(fmt.path(k) for k in fmt.text_keys(meta) if k[0] == fmt.OBSERVATION)
    return keys[0] if keys else None


def columns(src: Source, images: bool) -> list[Column]:
    """The features of the export, in LeRobot's order, and where each comes from."""
    obs, act, extras = [], [], []
    for key in sorted(src.keys):
        name = d4rl_name(key)
        if name is None or name.startswith("next_observations") or key == REWARD:
            continue
        first = src.read(key, 0, 0, 1)[0]
        head, _, rest = key.partition("/")
        leaf = rest.replace("/", ".")
        if head == fmt.OBSERVATION and is_picture(first.shape, first.dtype):
            named = f"observation.images.{leaf}" if rest else "observation.image"
            obs.append(Column(named, key, "image" if images else "video", first.dtype, first.shape))
        elif head == fmt.OBSERVATION:
            obs.append(_numbers(f"observation.{leaf}" if rest else "observation.state", key, first))
        elif head == fmt.ACTION:
            act.append(_numbers(f"action.{leaf}" if rest else "action", key, first))
        else:
            extras.append(_numbers(name.replace("/", "."), key, first, cast=False))
    made = [
        Column("next.reward", REWARD, "number", np.dtype(np.float32), (1,)),
        *(Column(flag, None, "number", np.dtype(bool), (1,)) for flag in FLAGS),
    ]
    kinds = {name: np.dtype(np.float32 if name == "timestamp" else np.int64) for name in INDEX}
    index = [Column(name, None, "number", dtype, (1,)) for name, dtype in kinds.items()]
    cols = [*obs, *act, *made, *extras, *index]
    names = [c.name for c in cols]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise UsageError(f"--format lerobot: two dataset keys map to the feature {clash[0]!r}")
    return cols


def _numbers(name: str, key: str, first: np.ndarray, cast: bool = True) -> Column:
    if first.dtype.kind == "S":
        return Column(name, key, "text", first.dtype, (1,))
    dtype = np.dtype(np.float32) if cast and first.dtype.kind == "f" else first.dtype
    return Column(name, key, "number", dtype, (max(1, int(first.size)),))


def env_fps(meta: dict[str, Any]) -> int | None:
    """The env's ``metadata["render_fps"]`` (its registered class's), None where unknown."""
    import gymnasium as gym

    module, _, name = str(meta.get("env_id") or "").rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        entry = gym.spec(name).entry_point
        creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        fps = float((getattr(creator, "metadata", None) or {}).get("render_fps") or 0)
    except Exception:  # an env this process cannot look up: the default rate
        return None
    return round(fps) if fps >= 1 else None


class Files:
    """A table written as numbered Parquet files (``template``), a new one by ``next``."""

    def __init__(self, pq, root: Path, template: str, schema=None):
        self.pq, self.root, self.template, self.schema = pq, root, template, schema
        self.writer, self.number, self.bytes = None, 0, 0

    @property
    def where(self) -> tuple[int, int]:
        return divmod(self.number, CHUNKS_SIZE)

    def write(self, table, nbytes: int) -> None:
        if self.writer is None:
            chunk, file = self.where
            path = self.root / self.template.format(chunk_index=chunk, file_index=file)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.schema = self.schema or table.schema
            self.writer = self.pq.ParquetWriter(path, self.schema)
        self.writer.write_table(table.cast(self.schema))
        self.bytes += nbytes

    def next(self, force: bool = False) -> None:
        """Close the file once it holds ``DATA_FILE_MB`` (``force``: in any case)."""
        if self.writer is not None and (force or self.bytes >= DATA_FILE_MB << 20):
            self.writer.close()
            self.writer, self.number, self.bytes = None, self.number + 1, 0


class Writer:
    """The files of one export, written as the frames stream past in export order."""

    def __init__(
        self, root: Path, cols: list[Column], plan: Plan, fps: int, task: str, codec: str,
        mission: str | None = None,
    ):  # fmt: skip
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.cols, self.plan, self.fps, self.task = pa, cols, plan, fps, task
        self.mission = mission  # the key of each episode's task, else ``task`` for all
        self.tasks: dict[str, int] = {} if mission else {task: 0}  # task -> task_index
        self.task_index = 0  # the current episode's
        schema = pa.schema([(c.name, c.arrow_type(pa)) for c in cols if c.kind != "video"])
        self.data = Files(pq, root, DATA_PATH, schema)
        self.episodes = Files(pq, root, EPISODES_PATH)
        videos = [c for c in cols if c.kind == "video"]
        av = importlib.import_module("av") if videos else None
        self.videos = {c.name: Video(av, root, c.name, c.shape, fps, codec) for c in videos}
        for video in self.videos.values():
            video.file_mb = VIDEO_FILE_MB
        self.ends = plan.starts + plan.lengths
        self.pos = self.episode = 0  # the next frame, and its episode
        self.moments = self._moments(0)
        self.totals = Totals()
        self.pending: list[dict[str, Any]] = []  # frames not written yet
        self.pending_bytes = 0
        self.rows: list[dict[str, Any]] = []  # episode rows not written yet

    def _moments(self, episode: int) -> dict[str, Moments]:
        if episode >= len(self.ends):
            return {}
        length = int(self.plan.lengths[episode])
        return {
            c.name: Moments(c.kind in ("image", "video"), length)
            for c in self.cols
            if c.kind != "text"
        }

    def add(self, block: dict[str, np.ndarray]) -> None:
        """The next frames in export order, split at the episodes' ends."""
        count = len(next(iter(block.values())))
        at = 0
        while at < count:
            end = int(self.ends[self.episode])
            take = min(count - at, end - self.pos)
            self._frames({k: v[at : at + take] for k, v in block.items()}, take)
            at += take
            if self.pos == end:
                self._end_episode()

    def _frames(self, part: dict[str, np.ndarray], n: int) -> None:
        plan, at = self.plan, self.pos
        first = at - int(plan.starts[self.episode])
        offsets = np.arange(first, first + n)
        if first == 0 and self.mission is not None:  # the episode's task: its first mission
            said = part[self.mission].reshape(n)[0]
            text = said.decode("utf-8") if isinstance(said, bytes) else str(said)
            self.task_index = self.tasks.setdefault(text, len(self.tasks))
        terminated, truncated = plan.terminals[at : at + n], plan.timeouts[at : at + n]
        made = {
            "next.done": terminated | truncated, "next.terminated": terminated,
            "next.truncated": truncated, "timestamp": offsets / self.fps, "frame_index": offsets,
            "episode_index": np.full(n, self.episode), "index": np.arange(at, at + n),
            "task_index": np.full(n, self.task_index, np.int64),
        }  # fmt: skip
        rows: dict[str, Any] = {}
        for col in self.cols:
            values = made[col.name] if col.key is None else part[col.key]
            if col.kind == "text":
                rows[col.name] = np.char.decode(values.reshape(n), "utf-8").tolist()
                continue
            if col.kind == "number":
                values = np.asarray(values).reshape(n, col.width).astype(col.dtype, copy=False)
                rows[col.name] = values
            elif col.kind == "image":
                rows[col.name] = [png(frame) for frame in values]
            else:
                self.videos[col.name].add(values)
            self.moments[col.name].add(values, offsets)
        self.pending.append(rows)
        self.pending_bytes += sum(_nbytes(v) for v in rows.values())
        self.pos += n
        if self.pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        """Write the pending frames as one row group of the open data file."""
        if not self.pending:
            return
        arrays = []
        for col in (c for c in self.cols if c.kind != "video"):
            parts = [rows[col.name] for rows in self.pending]
            joined = [v for p in parts for v in p] if isinstance(parts[0], list) else None
            arrays.append(_arrow(self.pa, col, np.concatenate(parts) if joined is None else joined))
        table = self.pa.Table.from_arrays(arrays, schema=self.data.schema)
        self.data.write(table, self.pending_bytes)
        self.pending, self.pending_bytes = [], 0

    def _end_episode(self) -> None:
        plan, e = self.plan, self.episode
        start, length = int(plan.starts[e]), int(plan.lengths[e])
        (chunk, file), (meta_chunk, meta_file) = self.data.where, self.episodes.where
        row: dict[str, Any] = {
            "episode_index": e, "tasks": [self._task()], "length": length,
            "data/chunk_index": chunk, "data/file_index": file,
            "dataset_from_index": start, "dataset_to_index": start + length,
        }  # fmt: skip
        for name, video in self.videos.items():
            (chunk, file), head = video.where, f"videos/{name}/"
            row.update({head + "chunk_index": chunk, head + "file_index": file})
            row[head + "from_timestamp"] = (video.frames - length) / self.fps
            row[head + "to_timestamp"] = video.frames / self.fps
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = meta_chunk, meta_file
        row["rlcollect/traj_id"] = int(plan.traj_ids[e])
        row["rlcollect/source"] = int(plan.sources[e])
        row["rlcollect/complete"] = bool(plan.complete[e])
        for name, moments in self.moments.items():
            stats = moments.result()
            self.totals.add(name, stats)
            row.update({f"stats/{name}/{k}": v.tolist() for k, v in stats.items()})
        self.rows.append(row)
        if len(self.rows) >= EPISODE_ROWS:
            self._write_rows()
        # a new file once one is full, between episodes: an episode lies in one file
        if self.data.bytes + self.pending_bytes >= DATA_FILE_MB << 20:
            self._flush()
            self.data.next()
        for video in self.videos.values():
            video.next()
        self.episode += 1
        self.moments = self._moments(self.episode)

    def _task(self) -> str:
        return next(t for t, i in self.tasks.items() if i == self.task_index)

    def _write_rows(self) -> None:
        table = self.pa.Table.from_pylist(self.rows)
        self.episodes.write(table, table.nbytes)
        self.rows = []
        self.episodes.next()

    def close(self) -> dict[str, Any]:
        """Write what is buffered, close the files; the dataset's stats."""
        if self.pos != self.plan.frames:
            raise RuntimeError(f"exported {self.pos} of {self.plan.frames} frames")
        self._flush()
        if self.rows:
            self._write_rows()
        for files in (self.data, self.episodes, *self.videos.values()):
            files.next(force=True)
        return self.totals.result()


def _nbytes(values: Any) -> int:
    if isinstance(values, np.ndarray):
        return values.nbytes
    return sum(len(v) for v in values)


def _arrow(pa, col: Column, values: Any):
    if col.kind == "text":
        return pa.array(values, pa.string())
    if col.kind == "image":
        parts = [pa.array(values, pa.binary()), pa.nulls(len(values), pa.string())]
        return pa.StructArray.from_arrays(parts, ["bytes", "path"])  # datasets' Image
    if col.shape == (1,):
        return pa.array(values.reshape(len(values)))
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), col.width)


def write_lerobot(
    src: Source,
    plan: Plan,
    path: Path,
    *,
    images: bool = False,
    fps: int | None = None,
    codec: str | None = None,
) -> dict[str, Any]:
    """Write the export into the new folder ``path``; what the summary adds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = src.meta
    found = env_fps(meta) if fps is None else None
    rate = fps or found or DEFAULT_FPS
    rate_from = "--fps" if fps else ("env render_fps" if found else "default")
    described = (meta.get(fmt.DATASET) or {}).get("description")
    task = str(described or meta.get("env_id") or "rlcollect")
    cols = columns(src, images)
    path.mkdir()
    codec = codec or DEFAULT_CODEC
    mission = mission_key(meta)
    writer = Writer(path, cols, plan, rate, task, codec, mission)
    keys = {c.key for c in cols if c.key is not None} | ({mission} if mission else set())
    for block in blocks(src, sorted(keys), plan.keep):
        writer.add(block)
    stats = writer.close()
    features = {c.name: c.feature() for c in cols}
    for name, video in writer.videos.items():
        features[name]["info"] = video.info()
    episodes, get = len(plan.starts), meta.get
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": None, "total_episodes": episodes,
        "total_frames": plan.frames, "total_tasks": len(writer.tasks), "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": VIDEO_FILE_MB,
        "fps": rate, "splits": {"train": f"0:{episodes}"}, "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if writer.videos else None, "features": features,
    }  # fmt: skip
    record = {
        "format": "lerobot", "exported_by": f"rlcollect {__version__}", "env_id": get("env_id"),
        "policy": get("policy"), "seed": get("seed"), "source": str(src.ds.path.absolute()),
        "source_status": get("status"), "episodes": episodes, "frames": plan.frames,
        "incomplete_episodes": plan.incomplete,
        "incomplete": "dropped" if plan.dropped else INCOMPLETE,
        "episode_order": "lane, then time", "fps": rate, "fps_from": rate_from,
        "features": {c.name: c.key for c in cols if c.key is not None},
        "video": {"codec": codec, "encoder": CODECS[codec][0], "options": CODECS[codec][1]}
        if writer.videos
        else None,
        "tasks_from": mission or "dataset.description, else env_id",
        "observation_space": get("observation_space"), "action_space": get("action_space"),
        "config": get("config"), "provenance": get("provenance"),
        fmt.SOURCES: fmt.sources(meta),  # an episode's rlcollect/source: its row
    }  # fmt: skip
    for name, value in (("info", info), ("stats", stats), ("rlcollect", record)):
        (path / "meta" / f"{name}.json").write_text(json.dumps(value, indent=4))
    # LeRobot reads a task's text as its row's index (pandas' metadata says which column)
    columns_ = [("task_index", "int64", "int64"), ("task", "unicode", "object")]
    pandas = {"index_columns": ["task"], "column_indexes": [], "pandas_version": "2.0.0",
              "columns": [{"name": n, "field_name": n, "pandas_type": t, "numpy_type": d,
                           "metadata": None} for n, t, d in columns_]}  # fmt: skip
    named = list(writer.tasks)  # in task_index order
    tasks = pa.table(
        {
            "task_index": pa.array(range(len(named)), pa.int64()),
            "task": pa.array(named, pa.string()),
        }
    )
    tasks = tasks.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
    pq.write_table(tasks, path / "meta" / "tasks.parquet")
    found_tasks = {"task": named[0]} if len(named) == 1 else {"tasks": len(named)}
    return {
        "fps": rate,
        "fps_from": rate_from,
        **found_tasks,
        "video_codec": codec if writer.videos else None,
    }
