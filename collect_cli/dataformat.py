"""The dataset format: its one home.

Every module that makes, reads or checks a dataset (collectors' batches,
writers, readers, validate, export, merge, resume) takes key names, metadata
keys, statuses and the layout rules from here. Nothing here does I/O or
imports torch: the rules are functions of numpy arrays and metadata dicts.

A dataset is one logical ``[lanes, time]`` TensorDict (``docs/dataset.md``):

- frame keys, as tuples (TensorDict) or joined by ``/`` (HDF5 paths);
- the ``episodes/`` table, one row per trajectory (:data:`COLUMNS`);
- metadata (:data:`REQUIRED_META` and the counters a commit writes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

FORMAT_VERSION = 3
# version 1 (before 2026-12): the dataset's own cuts carried no next/done flag;
# version 2: no sources table nor episodes/source (one source: the run's policy)
READABLE_VERSIONS = (1, 2, 3)
FLAGGED_CUTS_SINCE = 2
SOURCES_SINCE = 3

# -- statuses --------------------------------------------------------------------------
RUNNING, COMPLETE, INTERRUPTED = "running", "complete", "interrupted"
STATUSES = (RUNNING, COMPLETE, INTERRUPTED)

# -- frame keys ------------------------------------------------------------------------
Key = tuple[str, ...]
OBSERVATION = "observation"
ACTION = "action"
NEXT = "next"
COLLECTOR = "collector"
FLAGS = ("done", "terminated", "truncated")  # a step's end flags, at the root and under next
TRAJ_KEY: Key = (COLLECTOR, "traj_ids")
MASK_KEY: Key = (COLLECTOR, "mask")
REWARD_KEY: Key = (NEXT, "reward")
DONE_KEY: Key = (NEXT, "done")
TERMINATED_KEY: Key = (NEXT, "terminated")
TRUNCATED_KEY: Key = (NEXT, "truncated")
STEP_COUNT = "step_count"
# added by postproc=multistep: the frame's own reward, and how far next/* look ahead
ORIGINAL_REWARD_KEY: Key = (NEXT, "original_reward")
STEPS_TO_NEXT_KEY: Key = ("steps_to_next_obs",)


def path(key: Key | str) -> str:
    """A key as stored in HDF5 and named in messages: parts joined by ``/``."""
    return key if isinstance(key, str) else "/".join(key)


def key_of(name: str) -> Key:
    """The tuple key of a ``/``-joined name."""
    return tuple(name.split("/"))


TRAJ, MASK = path(TRAJ_KEY), path(MASK_KEY)

# every dataset has these (prefix match: Dict observations are nested), with dtype kinds
REQUIRED_FRAME_KEYS: dict[str, str | None] = {
    OBSERVATION: None, ACTION: None, **{flag: "bool" for flag in FLAGS},
    path((NEXT, OBSERVATION)): None, path(REWARD_KEY): "float",
    **{path((NEXT, flag)): "bool" for flag in FLAGS}, TRAJ: "int64", MASK: "bool",
}  # fmt: skip

# -- text (gymnasium Text observations) ---------------------------------------------------
# In batches and memmap datasets a Text leaf is ``[..., width]`` uint8 (UTF-8, zero padded:
# specs.encode_text); HDF5 stores it as fixed-length byte strings ``S<width>``, one a frame,
# which plain h5py reads as ``bytes``. The metadata's observation space says which are Text.


def described_leaves(desc: Any, key: Key = ()) -> Iterator[tuple[Key, dict]]:
    """``(key, description)`` of each leaf of a serialised space (``specs.describe``):
    Dict and Tuple spaces nest, their keys joined as the frame keys are."""
    if not isinstance(desc, dict):
        return
    if desc.get("type") == "Dict":
        for name, sub in desc["spaces"].items():
            yield from described_leaves(sub, (*key, str(name)))
    elif desc.get("type") == "Tuple":
        for i, sub in enumerate(desc["spaces"]):
            yield from described_leaves(sub, (*key, str(i)))
    else:
        yield key, desc


def text_keys(meta: dict) -> set[Key]:
    """The frame keys holding Text (``observation/...`` and ``next/observation/...``),
    from the serialised observation space in ``meta``."""
    found: set[Key] = set()
    for key, desc in described_leaves(meta.get("observation_space")):
        if desc.get("type") == "Text":
            found.update({(OBSERVATION, *key), (NEXT, OBSERVATION, *key)})
    return found


def fixed_bytes(array: np.ndarray) -> np.ndarray:
    """Text as HDF5 stores it: ``[..., width]`` uint8 to ``S<width>`` (``S`` passes)."""
    array = np.asarray(array)
    if array.dtype.kind == "S":
        return array
    array = np.ascontiguousarray(array, np.uint8)
    return array.view(f"S{array.shape[-1]}")[..., 0]


def holds_text(dtype: str) -> bool:
    """Whether an array stored with ``dtype`` (as ``Dataset.describe`` names it) is
    Text: HDF5's fixed-length bytes, or memmap's uint8."""
    return np.dtype(dtype).kind == "S" or np.dtype(dtype) == np.uint8


# -- the episodes table ----------------------------------------------------------------
EPISODES = "episodes"
SOURCE = "source"  # the column naming each episode's row of the sources table (and exports')
COLUMNS: dict[str, np.dtype] = {
    "traj_id": np.dtype(np.int64),
    "lane": np.dtype(np.int64),
    "start": np.dtype(np.int64),
    "length": np.dtype(np.int64),
    "return": np.dtype(np.float64),
    "terminated": np.dtype(bool),
    "truncated": np.dtype(bool),
    "complete": np.dtype(bool),
    SOURCE: np.dtype(np.int64),  # the row of the sources table whose policy acted
}
Rows = dict[str, np.ndarray]


def column(name: str) -> str:
    """The stored path of an episodes column."""
    return f"{EPISODES}/{name}"


def is_episodes(name: str) -> bool:
    return name.startswith(EPISODES + "/")


def empty_rows() -> Rows:
    return {name: np.zeros(0, dtype) for name, dtype in COLUMNS.items()}


def concat_rows(parts: list[Rows]) -> Rows:
    if not parts:
        return empty_rows()
    return {name: np.concatenate([p[name] for p in parts]) for name in COLUMNS}


# policy outputs rlcollect's own policies record beside ``action`` (policy=sb3)
ACTION_LOG_PROB, VALUE, Q_VALUES = "action_log_prob", "value", "q_values"


def return_stats(rows: Rows, source: int | None = None) -> dict[str, float] | None:
    """Mean, std, min and max return of the complete episodes (of one ``source``, or
    all); None without one."""
    keep = np.asarray(rows["complete"], bool)
    if source is not None:
        keep = keep & (np.asarray(rows["source"]) == source)
    returns = np.asarray(rows["return"], np.float64)[keep]
    if not len(returns):
        return None
    return {
        "mean": float(np.mean(returns)),
        "std": float(np.std(returns)),
        "min": float(np.min(returns)),
        "max": float(np.max(returns)),
    }


# -- metadata --------------------------------------------------------------------------
MEMMAP_META_FILE = "rlcollect.json"  # a memmap dataset's metadata, inside its directory
IDENTITY = ("format_version", "backend")  # metadata every dataset carries: it is rlcollect's
# metadata that says what a dataset's frames mean (run.py's _stream_options writes them);
# datasets differing in MEANING (a missing key: its default) never merge
MEANING = {"postproc": {"name": "none"}, "split_trajs": False, "reset_when_done": True}
STREAM_KEYS = (*MEANING, "reset_at_each_iter", "max_frames_per_traj", "init_random_frames")
STREAM_KEYS += ("exploration_type", "info_keys", "record_state")
REQUIRED_META = ("format_version", "status", "frames", "steps", "episodes", "lanes", "env_id")
LANE_STEPS = "lane_steps"
# where the data came from: the policy's checkpoint (name, size, sha256, algorithm...)
# and the user's dataset.* fields, Minari's names (author, ref_min_score...)
PROVENANCE, DATASET = "provenance", "dataset"
DERIVED = "derived"  # what made a dataset from others (filter, split, merge --take)
REF_MIN, REF_MAX = "ref_min_score", "ref_max_score"


# -- the sources table (metadata): one row per policy that acted ---------------------------
SOURCES = "sources"
# a row's fields (None where unknown); ``origin`` names the dataset a merge took it from
SOURCE_FIELDS = ("policy", "algorithm", "checkpoint", "sha256", "training_step", "seed", "origin")
SOURCE_CONFIG = "config"  # and the YAML config of the run (or training) it came from
# metadata: {key: [source rows]} for frame keys only some sources recorded (a merge of
# shards whose policy extras differ): elsewhere their frames hold the fill, NaN or 0
FILLED = "filled"


def fill_value(dtype: np.dtype) -> Any:
    """What a frame of a :data:`FILLED` key holds where its source did not record it."""
    kind = np.dtype(dtype).kind
    return np.nan if kind in "fc" else (b"" if kind == "S" else 0)


def source_row(
    policy: str | None, record: dict | None = None, *, training_step: int | None = None,
    seed: int | None = None, origin: str | None = None, config: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One row of the sources table, from a policy's provenance ``record``."""
    record = record or {}
    checkpoint = record.get("checkpoint") or {}
    step = training_step if training_step is not None else record.get("training_step")
    values = (policy, record.get("algorithm"), checkpoint.get("name"), checkpoint.get("sha256"))
    return {
        **dict(zip(SOURCE_FIELDS, (*values, step, seed, origin), strict=True)),
        SOURCE_CONFIG: config,
    }


def sources(meta: dict) -> list[dict[str, Any]]:
    """The dataset's sources table. One written before it (format 2) reads as one
    source, or one per shard it merged (:func:`legacy_source` says whose rows)."""
    if meta.get(SOURCES):
        return list(meta[SOURCES])
    return [
        source_row(
            (e.get(PROVENANCE) or {}).get("policy", e.get("policy")), e.get(PROVENANCE),
            seed=e.get("seed"), origin=e.get("path"), config=e.get("config"),
        )
        for e in meta.get("shards") or [meta]
    ]  # fmt: skip


def legacy_source(meta: dict, lanes: np.ndarray) -> np.ndarray:
    """``episodes/source`` of a dataset written before the column: the index of the
    merged shard whose lanes hold each row (0 for a dataset of one run)."""
    offsets = np.asarray([int(e.get("lane_offset", 0)) for e in meta.get("shards") or [{}]])
    found = np.searchsorted(offsets, np.asarray(lanes, np.int64), side="right") - 1
    return np.maximum(found, 0).astype(np.int64)


def lane_steps(meta: dict) -> np.ndarray:
    """Committed time steps per lane. Lanes advance evenly unless the dataset
    records them (multiasync, split_trajs): then every lane is at ``steps``."""
    recorded = meta.get(LANE_STEPS)
    if recorded:
        return np.asarray(recorded, np.int64)
    return np.full(int(meta["lanes"]), int(meta["steps"]), np.int64)


def committed(meta: dict) -> np.ndarray:
    """``[lanes, steps]`` bool: the frames a commit covers (padding included)."""
    return np.arange(int(meta["steps"]))[None, :] < lane_steps(meta)[:, None]


# -- layout rules ----------------------------------------------------------------------
def lookahead(meta: dict) -> int:
    """How many steps a frame's ``next/*`` entries may look ahead (``postproc=multistep``'s n)."""
    post = meta.get("postproc") or {}
    return int(post.get("n", 1)) if post.get("name") == "multistep" else 1


Getter = Callable[[Key], "np.ndarray | None"]


def own_step(get: Getter, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(reward, done)`` of each frame's own step, ``[lanes, time]`` (float64, bool).

    After ``postproc=multistep`` the ``next/*`` entries look up to n steps ahead:
    the frame's own reward is ``next/original_reward``, and its own step ended
    the trajectory only where ``next/done`` holds with ``steps_to_next_obs == 1``.
    ``get`` returns a stored array, or None where the key is absent.
    """
    reward = get(ORIGINAL_REWARD_KEY)
    if reward is None:
        reward = get(REWARD_KEY)
    done = np.asarray(get(DONE_KEY)).reshape(shape).astype(bool, copy=False)
    steps_to = get(STEPS_TO_NEXT_KEY)
    if steps_to is not None:
        done = done & (np.asarray(steps_to).reshape(shape) == 1)
    return np.asarray(reward).reshape(shape).astype(np.float64), done


def last_valid(mask: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per lane, the time index of the last True of ``mask[lane, :ends[lane]]`` (-1: none)."""
    steps = mask.shape[1]
    upto = mask & (np.arange(steps)[None, :] < np.asarray(ends)[:, None])
    last = steps - 1 - np.argmax(upto[:, ::-1], axis=1)
    return np.where(upto.any(axis=1), last, -1)


# durability D13 (docs/durability.md)
def tail_rows(
    traj: np.ndarray,
    mask: np.ndarray,
    reward: np.ndarray,
    ends: np.ndarray,
    known: set[int],
    source: int = 0,
) -> Rows:
    """Rows (``complete`` False: the dataset cut them) for each lane's last
    trajectory up to ``ends[lane]`` that has no row in ``known``: the episodes a
    killed run left running. ``reward`` is each frame's own (:func:`own_step`);
    ``source``, the sources row they are given (the last: the policy at the kill)."""
    last = last_valid(mask, ends)
    found = []
    for lane in np.flatnonzero(last >= 0):
        tid = int(traj[lane, last[lane]])
        if tid in known:
            continue
        frames = np.flatnonzero(
            mask[lane, : last[lane] + 1] & (traj[lane, : last[lane] + 1] == tid)
        )
        found.append(
            (tid, lane, frames[0], len(frames), reward[lane, frames].sum(dtype=np.float64))
        )
    n = len(found)
    values = list(zip(*found, strict=True)) if found else [[]] * 5
    rows = {name: np.asarray(v, COLUMNS[name]) for name, v in zip(COLUMNS, values, strict=False)}
    rows.update({flag: np.zeros(n, bool) for flag in ("terminated", "truncated", "complete")})
    rows["source"] = np.full(n, source, np.int64)
    return rows


# durability D13 (docs/durability.md)
def cut_points(rows: Rows, mask: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lanes, times)`` of the last stored frame of each cut row (``complete`` False):
    where ``next/truncated`` and ``next/done`` must be True. ``mask``/``ends`` are
    the lanes' masks and committed lengths (rows name their lane; a cut trajectory
    is the last one of its lane)."""
    cut = ~rows["complete"]
    lanes = rows["lane"][cut]
    last = last_valid(mask[lanes], np.asarray(ends)[lanes]) if len(lanes) else lanes
    return lanes, last


# -- simulator state (record.state=true) -----------------------------------------------
# state/<leaf>: the state s_t was observed in (next/state/<leaf>: its successor, the
# true final state at an episode's end); MuJoCo's qpos and qvel, classic control's
# unwrapped.state as state/values
STATE, QPOS, QVEL, STATE_VALUES = "state", "qpos", "qvel", "values"
RESET_SEED = "reset_seed"  # state/reset_seed: the seed of the reset the episode began with


# -- observation layouts ---------------------------------------------------------------
# ``full`` stores next/observation as its own array. ``compact`` stores each observation
# once: next/observation is the lane's next frame, except where that frame is not the
# same trajectory's next state (an episode's end, a cut, a batch's last step), and
# there the true next observation is kept in the ``final/`` table (lane, time, value).
AUTO, FULL, COMPACT = "auto", "full", "compact"
LAYOUTS = (AUTO, FULL, COMPACT)
LAYOUT = "layout"  # metadata: the layout written (full | compact)
COMPACT_KEYS = "compact_keys"  # metadata: the observation keys stored once ("/"-joined)
CODEC = "codec"  # metadata: {name, level, filter id, plugin}: what a reader needs
FINAL = "final"
FINAL_LANE_KEY: Key = (FINAL, "lane")
FINAL_TIME_KEY: Key = (FINAL, "time")
FINAL_FILL = -1  # a final row not written (or dropped by a resume): lane and time -1


def is_image(shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """An image observation: uint8 of rank >= 2 per frame (HxW, HxWxC, CxHxW, stacks)."""
    return np.dtype(dtype) == np.uint8 and len(shape) >= 2


def compact_keys(leaves: list[tuple[Key, tuple[int, ...], np.dtype]], layout: str) -> list[Key]:
    """The observation keys a dataset stores once: ``leaves`` are ``(key, per-frame
    shape, dtype)`` of the first batch. ``auto``: the image ones; ``compact``: all."""
    if layout == FULL:
        return []
    return [
        key
        for key, shape, dtype in leaves
        if key[:1] == (OBSERVATION,) and (layout == COMPACT or is_image(shape, dtype))
    ]


def next_key(obs_key: Key) -> Key:
    return (NEXT, *obs_key)


def final_key(obs_key: Key) -> Key:
    return (FINAL, *obs_key)


# durability D16 (docs/durability.md)
def final_points(traj: np.ndarray, mask: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(lanes, times)`` of a ``[lanes, time]`` batch whose next observation the compact
    layout keeps: valid frames that end an episode (``done``), whose lane's next valid
    frame in the batch is another trajectory's, or that have none in the batch (the
    batch's last step: the next batch may never come, durability D13)."""
    lanes, steps = mask.shape
    nxt = np.full(lanes, -1, np.int64)  # traj id of the next valid frame, walking back
    keep = np.zeros_like(mask)
    for t in range(steps - 1, -1, -1):
        keep[:, t] = mask[:, t] & (done[:, t] | (nxt != traj[:, t]))
        nxt = np.where(mask[:, t], traj[:, t], nxt)
    return np.nonzero(keep)


# durability D16 (docs/durability.md)
def valid_finals(lane: np.ndarray, time: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which rows of the ``final/`` table count: written (lane >= 0) and inside their
    lane's committed steps ``ends`` (rows past them belong to frames a kill lost)."""
    lane, time = np.asarray(lane), np.asarray(time)
    ok = (lane >= 0) & (lane < len(ends))
    ok[ok] &= time[ok] < np.asarray(ends)[lane[ok]]
    return ok


def next_sources(
    traj: np.ndarray, mask: np.ndarray, lane: np.ndarray, time: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Where the compact layout keeps each frame's next observation, ``[lanes, time]``:
    ``(t_next, row)``: ``row >= 0`` is a ``final/`` row; else ``t_next >= 0`` is the
    lane's next valid frame, whose observation it is; both -1 for padding (zeros)."""
    lanes, steps = mask.shape
    t_next = np.full((lanes, steps), -1, np.int64)
    nxt = np.full(lanes, -1, np.int64)
    for t in range(steps - 1, -1, -1):
        t_next[:, t] = np.where(mask[:, t], nxt, -1)
        nxt = np.where(mask[:, t], t, nxt)
    row = np.full((lanes, steps), -1, np.int64)
    ok = np.flatnonzero(valid_finals(lane, time, ends))
    row[np.asarray(lane)[ok], np.asarray(time)[ok]] = ok  # a later row wins
    t_next[row >= 0] = -1
    return t_next, row


def rebuild_next(
    obs: np.ndarray, finals: np.ndarray, t_next: np.ndarray, row: np.ndarray
) -> np.ndarray:
    """next/observation of lanes ``[L, T, ...]`` from their observations, the
    ``final/`` values and :func:`next_sources` of those lanes."""
    out = np.zeros_like(obs)
    lanes, times = np.nonzero(t_next >= 0)
    out[lanes, times] = obs[lanes, t_next[lanes, times]]
    lanes, times = np.nonzero(row >= 0)
    if len(lanes):
        out[lanes, times] = finals[row[lanes, times]]
    return out


# -- codecs (writer.compression) -------------------------------------------------------
# name -> (HDF5 filter id, level range or None, default level, needs hdf5plugin). The
# plugin codecs are read back only where ``import hdf5plugin`` registered their filters.
CODECS: dict[str, tuple[int | None, tuple[int, int] | None, int | None, bool]] = {
    "none": (None, None, None, False),
    "gzip": (1, (0, 9), 4, False),
    "lzf": (32000, None, None, False),
    "zstd": (32015, (1, 22), 3, True),
    "lz4": (32004, None, None, True),
    "blosc2": (32026, (0, 9), 5, True),  # Blosc2's lz4 with byte-shuffle
    "blosc2-zstd": (32026, (0, 9), 5, True),
}
PLUGIN = "hdf5plugin"
# writer.compression=auto (the default): image leaves with this codec, the rest raw; a
# frame of Pong is 100 KB raw and ~140 B with zstd, at the same speed (benchmarks/RESULTS.md)
IMAGE_CODEC = "zstd"
ALL_LEAVES, IMAGE_LEAVES = "all", "images"  # the codec metadata's ``leaves``


def leaf_codec(name: str, shape: tuple[int, ...], dtype: np.dtype) -> str:
    """The codec a leaf of per-frame ``shape`` and ``dtype`` is stored with, where
    ``writer.compression`` is ``name``: ``auto`` compresses the image leaves only."""
    if name != AUTO:
        return name
    return IMAGE_CODEC if is_image(shape, dtype) else "none"


def codec_meta(name: str, level: int | None, leaves: str = ALL_LEAVES) -> dict:
    """The ``codec`` metadata of a dataset written with ``name`` at ``level`` on
    ``leaves`` (all of them, or the image ones: ``writer.compression=auto``)."""
    filter_id, levels, default, plugin = CODECS[name]
    return {
        "name": name,
        "level": (default if level is None else level) if levels else None,
        "filter_id": filter_id,
        "plugin": PLUGIN if plugin else None,
        "leaves": leaves if name != "none" else None,
    }


def codec_text(codec: dict | None) -> str:
    """A dataset's codec in words, from its metadata: ``zstd level 3 (image leaves)``."""
    codec = codec or {}
    if codec.get("name", "none") == "none":
        return "none"
    level = f" level {codec['level']}" if codec.get("level") is not None else ""
    leaves = " (image leaves)" if codec.get("leaves") == IMAGE_LEAVES else ""
    return f"{codec['name']}{level}{leaves}"
