"""The file's root attributes: metadata stored in place (:class:`RootAttrs`), and the
commit records a reader trusts for the counters (durability D6, D7, D15)."""

from __future__ import annotations

import copy
import json
import zlib
from typing import Any

import h5py
import numpy as np

from collect_cli import dataformat as fmt

JSON_ATTRS = (
    "observation_space",
    "action_space",
    "versions",
    "shards",
    fmt.LANE_STEPS,
    "resumed",
    "sweep",
    "merged",
)
NULLABLE_TEXT = ("end_time",)  # None is stored as "" (and read back as None)
TEXT = h5py.string_dtype()  # how h5py stores a str: variable-length UTF-8
TEXT_INFO = h5py.check_string_dtype(TEXT)


# Commit records, written in turn: [seq, frames, steps, episodes, lanes, *lane_steps, crc32].
# The counters are separate attributes, which one flush writes in several pieces:
# a kill between them left e.g. ``frames`` of one commit and ``lane_steps`` of the
# one before. A record is one attribute, and the other slot still holds the
# previous commit whole if the process dies while one is written.
COMMIT_SLOTS = ("commit_0", "commit_1")
COUNTERS = ("frames", "steps", "episodes")
# Counters one entry per lane: with split_trajs the lanes (rows) grow at every
# commit. Stored with room to grow (padded with PAD, the length doubling when
# full), so that a commit overwrites them in place instead of replacing them.
GROWING = (fmt.LANE_STEPS, *COMMIT_SLOTS)
PAD = -1
# Those counters are root attributes, and HDF5 keeps an attribute's message in
# the object header, under 64 KiB: room for this many lanes (rows), no more.
MAX_LANES = 8000
HEAD = 6  # a commit record's entries besides lane_steps


class RootAttrs:
    """A file's root attributes, stored from a metadata dict (dicts and lists as
    JSON text, ``lane_steps`` as an int64 array).

    Values unchanged since the last :meth:`store` are neither encoded nor
    rewritten: a commit per batch changes only the counters. Values already
    stored with the same shape (numbers) or kind (text) are overwritten in place:
    assigning an attribute makes h5py create a new one and delete the old, which
    rewrites the object header's layout in several writes, and a kill in the
    middle of the flush that writes them can leave the whole file unreadable.
    Text is replaced in the global heap, and the header only gets the new
    reference, in place. ``None`` for a key of ``NULLABLE_TEXT`` is stored as
    ``""`` for the same reason. The numbers' handles and types are kept: opening
    an attribute and reading its type cost several times the write itself.
    """

    def __init__(self, node: h5py.Group) -> None:
        self._attrs = node.attrs
        self._node_id = node.id
        self._written: dict[str, Any] = {}  # the values as last stored
        self._numbers: dict[str, tuple[Any, np.dtype, tuple[int, ...], Any]] = {}

    # durability D7 (docs/durability.md)
    def store(self, meta: dict[str, Any]) -> None:
        for key, value in meta.items():
            if key in self._written and _same(self._written[key], value):
                continue
            stored = value
            if key == fmt.LANE_STEPS and value:
                stored = np.asarray(value, np.int64)
            elif isinstance(value, (dict, list)):
                stored = json.dumps(value)
            elif value is None and key in NULLABLE_TEXT:
                stored = ""
            if stored is None or not self._overwrite(key, stored):
                old = self._numbers.pop(key, None)  # its handle is closed before h5py deletes it
                if key in GROWING and old is not None and isinstance(stored, np.ndarray):
                    most = MAX_LANES + (HEAD if key in COMMIT_SLOTS else 0)
                    room = max(len(stored), min(2 * old[2][0], most))  # room to grow
                    stored = _padded(stored, room)
                if stored is not None:
                    self._attrs[key] = stored
                elif key in self._attrs:
                    del self._attrs[key]
            self._written[key] = _snapshot(key, value)

    def _overwrite(self, key: str, value: Any) -> bool:
        """Write a number (or numeric array) into the stored attribute ``key`` of
        the same shape, or text into a text one; False (nothing written) if there
        is no such attribute."""
        if isinstance(value, str):
            return self._overwrite_text(key, value)
        array = np.asarray(value)
        if array.dtype.kind not in "iuf":
            return False
        handle = self._numbers.get(key)
        if handle is None:
            try:
                attr = h5py.h5a.open(self._node_id, key.encode())
            except KeyError:
                return False
            dtype = attr.dtype
            if dtype.kind not in "iuf":
                return False
            handle = self._numbers[key] = (attr, dtype, attr.shape, h5py.h5t.py_create(dtype))
        attr, dtype, shape, memtype = handle
        if shape != array.shape:
            if key not in GROWING or array.ndim != 1 or len(shape) != 1 or shape[0] < len(array):
                return False
            array = _padded(array, shape[0])
        attr.write(np.ascontiguousarray(array, dtype), memtype)
        return True

    def _overwrite_text(self, key: str, value: str) -> bool:
        try:
            attr = h5py.h5a.open(self._node_id, key.encode())
        except KeyError:
            return False
        if attr.shape != () or h5py.check_string_dtype(attr.dtype) != TEXT_INFO:
            return False
        try:
            attr.write(np.array(value, dtype=TEXT))
        except (OSError, RuntimeError):
            return False  # unreadable (a kill while it was written): replaced instead
        return True

    def release(self) -> None:
        """Close the kept attribute handles (before the file is closed)."""
        self._numbers.clear()


def _padded(array: np.ndarray, length: int) -> np.ndarray:
    return np.concatenate([array, np.full(length - len(array), PAD, array.dtype)])


def _snapshot(key: str, value: Any) -> Any:
    """A copy of ``value`` as stored; ``lane_steps`` (a flat list of ints, one per
    lane, at every commit) shallowly: deepcopy took 8 ms a commit for 4096 lanes."""
    return list(value) if key == fmt.LANE_STEPS else copy.deepcopy(value)


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except ValueError:  # arrays: compared element-wise
        return False


# durability D15 (docs/durability.md)
def lanes_limit(lanes: int, what: str) -> str | None:
    """Why ``lanes`` lanes (or rows) are too many for an HDF5 dataset; None if not."""
    if lanes <= MAX_LANES:
        return None
    return (
        f"writer=hdf5 records at most {MAX_LANES} {what} (their step counts are file "
        f"attributes, which HDF5 keeps under 64 KiB), not {lanes}"
    )


# durability D6 (docs/durability.md)
def commit_record(seq: int, meta: dict[str, Any]) -> np.ndarray:
    lanes = np.asarray(meta.get(fmt.LANE_STEPS) or [], np.int64)
    head = [seq, *(int(meta[key]) for key in COUNTERS), len(lanes)]
    body = np.concatenate([np.asarray(head, np.int64), lanes])
    return np.append(body, np.int64(zlib.crc32(body.tobytes())))


# durability D6 (docs/durability.md)
def read_commit(attrs: h5py.AttributeManager) -> dict[str, Any] | None:
    """The newest whole commit record (``seq``, counters, ``lane_steps``), or None
    (a file from an older rlcollect, or written by ``merge``)."""
    best = None
    for name in COMMIT_SLOTS:
        try:
            record = np.asarray(attrs[name], np.int64).ravel()
        except (KeyError, OSError, ValueError, TypeError):
            continue  # absent, or cut by a crash while it was rewritten
        if len(record) < HEAD or not 0 <= record[4] <= len(record) - HEAD:
            continue
        record = record[: HEAD + record[4]]  # without the room to grow (PAD)
        if zlib.crc32(record[:-1].tobytes()) != record[-1]:
            continue
        if best is None or record[0] > best[0]:
            best = record
    if best is None:
        return None
    counters = dict(zip(COUNTERS, (int(n) for n in best[1:4]), strict=True))
    return {"seq": int(best[0]), **counters, fmt.LANE_STEPS: best[5:-1].tolist()}


# durability D6 (docs/durability.md)
def file_meta(attrs: h5py.AttributeManager) -> tuple[dict[str, Any], int]:
    """The metadata with the counters of the last whole commit, and its sequence number."""
    meta = decode_attrs(attrs)
    meta.setdefault("status", fmt.RUNNING)  # unreadable: killed while closing
    record = read_commit(attrs)
    if record is None:
        return meta, 0
    seq = record.pop("seq")
    meta.update(record)
    if record[fmt.LANE_STEPS]:  # the lanes too (split_trajs: grown by the commit after)
        meta["lanes"] = len(record[fmt.LANE_STEPS])
    return meta, seq


def decode_attrs(attrs: h5py.AttributeManager) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key in attrs:
        if key in COMMIT_SLOTS:
            continue
        try:
            value = attrs[key]
        except (OSError, RuntimeError):
            continue  # its last write was cut by a kill (the status when closing)
        if key in NULLABLE_TEXT and value == "":
            value = None
        elif isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, (np.generic, np.ndarray)):
            value = value.tolist()  # numbers; lane_steps is an int64 array
        if isinstance(value, str) and (key in JSON_ATTRS or value[:1] in ("{", "[")):
            value = json.loads(value)  # dicts and lists are stored as JSON text
        meta[key] = value
    return meta
