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

from collections.abc import Callable

import numpy as np

FORMAT_VERSION = 2
# version 1 (before 2026-12): the dataset's own cuts carried no next/done flag
READABLE_VERSIONS = (1, 2)
FLAGGED_CUTS_SINCE = 2

# the name a dataset of each backend gets by default: an .h5 file or a directory
SUFFIXES = {"hdf5": ".h5", "memmap": ""}

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
    OBSERVATION: None,
    ACTION: None,
    **{flag: "bool" for flag in FLAGS},
    path((NEXT, OBSERVATION)): None,
    path(REWARD_KEY): "float",
    **{path((NEXT, flag)): "bool" for flag in FLAGS},
    TRAJ: "int64",
    MASK: "bool",
}

# -- text (gymnasium Text observations) ---------------------------------------------------
# In batches and memmap datasets a Text leaf is ``[..., width]`` uint8 (UTF-8, zero padded:
# specs.encode_text); HDF5 stores it as fixed-length byte strings ``S<width>``, one a frame,
# which plain h5py reads as ``bytes``. The metadata's observation space says which are Text.


def text_keys(meta: dict) -> set[Key]:
    """The frame keys holding Text (``observation/...`` and ``next/observation/...``),
    from the serialised observation space in ``meta``."""
    found: set[Key] = set()

    def walk(desc: dict, key: Key) -> None:
        kind = desc.get("type")
        if kind == "Dict":
            for name, sub in desc["spaces"].items():
                walk(sub, (*key, str(name)))
        elif kind == "Tuple":
            for i, sub in enumerate(desc["spaces"]):
                walk(sub, (*key, str(i)))
        elif kind == "Text":
            found.update({(OBSERVATION, *key), (NEXT, OBSERVATION, *key)})

    space = meta.get("observation_space")
    if isinstance(space, dict):
        walk(space, ())
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


def return_stats(rows: Rows) -> dict[str, float] | None:
    """Mean, std, min and max return of the complete episodes; None without one."""
    returns = np.asarray(rows["return"], np.float64)[np.asarray(rows["complete"], bool)]
    if not len(returns):
        return None
    return {
        "mean": float(np.mean(returns)),
        "std": float(np.std(returns)),
        "min": float(np.min(returns)),
        "max": float(np.max(returns)),
    }


# -- metadata --------------------------------------------------------------------------
REQUIRED_META = ("format_version", "status", "frames", "steps", "episodes", "lanes", "env_id")
LANE_STEPS = "lane_steps"
# where the data came from: the policy's checkpoint (name, size, sha256, algorithm...)
# and the user's dataset.* fields, Minari's names (author, ref_min_score...)
PROVENANCE, DATASET = "provenance", "dataset"
REF_MIN, REF_MAX = "ref_min_score", "ref_max_score"


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
    done = np.asarray(get(DONE_KEY)).reshape(shape).astype(bool)
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
    traj: np.ndarray, mask: np.ndarray, reward: np.ndarray, ends: np.ndarray, known: set[int]
) -> Rows:
    """Rows (``complete`` False: the dataset cut them) for each lane's last
    trajectory up to ``ends[lane]`` that has no row in ``known``: the episodes a
    killed run left running. ``reward`` is each frame's own (:func:`own_step`)."""
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
