"""Integrity check of a dataset on disk: schema, frames, traj ids, episodes.

:func:`check` returns the problems found (empty: the dataset is sound) and notes.
The frames are read once, in windows of a block of lanes by a span of steps
(:data:`WINDOW_BYTES` of frames at a time, aligned to the HDF5 chunks), so memory
is bounded whatever the dataset's size; what crosses a window's edge is carried
per lane. Per-trajectory sums come out of that pass; the ``episodes/`` table (one
row per trajectory) is then checked against them (:mod:`collect_cli.ops.validate_episodes`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataformat import COLUMNS, FORMAT_VERSION, MASK, STATUSES
from collect_cli.dataset import open_dataset
from collect_cli.errors import OutputError
from collect_cli.ops.validate_episodes import episodes_problems
from collect_cli.ops.validate_meta import action_bounds, settings

META_KEYS = (*fmt.REQUIRED_META, "config")
WINDOW_BYTES = 8 << 20  # frames read at a time, all keys together (peak: about twice)
ONE_PER_FRAME = (fmt.TRAJ_KEY, fmt.MASK_KEY, fmt.REWARD_KEY, *((fmt.NEXT, f) for f in fmt.FLAGS))


def validate(path: str | Path) -> list[str]:
    """Everything wrong with the dataset at ``path`` (an empty list: sound)."""
    return check(path)[0]


def check(path: str | Path) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` of the dataset at ``path``: what is wrong, and what
    is worth knowing about a sound one (a killed run's unflagged cuts, actions
    outside the action space where exploration noise was on)."""
    notes: list[str] = []
    return _problems(path, notes), notes


def _problems(path: str | Path, notes: list[str]) -> list[str]:
    try:
        ds = open_dataset(path)
        arrays = {key: (shape, dtype) for key, shape, dtype in ds.describe()}
    except (OutputError, OSError, KeyError, ValueError, RuntimeError) as exc:
        return [f"unreadable: {exc}"]
    meta = ds.meta
    problems = [f"metadata lacks {key!r}" for key in META_KEYS if key not in meta]
    if problems:
        return problems
    if meta["format_version"] not in fmt.READABLE_VERSIONS:
        problems.append(
            f"format_version {meta['format_version']} (expected one of "
            f"{', '.join(map(str, fmt.READABLE_VERSIONS))}; this rlcollect writes {FORMAT_VERSION})"
        )
    if meta["status"] not in STATUSES:
        problems.append(f"status {meta['status']!r} is not one of {', '.join(STATUSES)}")
    if meta["frames"] == 0 and MASK not in arrays:
        return problems  # nothing committed yet: an empty dataset is sound
    problems += _schema(arrays, meta)
    if problems:
        return problems
    try:
        problems += _frames_and_episodes(ds, arrays, notes)
    except (OSError, ValueError, RuntimeError, IndexError, TypeError) as exc:
        problems.append(f"unreadable data: {exc}")
    return problems


def _schema(arrays: dict, meta: dict) -> list[str]:
    problems = []
    lanes, steps = meta["lanes"], meta["steps"]
    for key, kind in fmt.REQUIRED_FRAME_KEYS.items():
        matches = [k for k in arrays if k == key or k.startswith(key + "/")]
        if not matches:
            problems.append(f"missing key {key!r}")
            continue
        for name in matches:
            shape, dtype = arrays[name]
            # rows past `lanes` (memmap, split_trajs) are allocated ahead and not yet committed
            if len(shape) < 2 or shape[0] < lanes or shape[1] < steps:
                problems.append(f"{name!r} has shape {shape}, expected [{lanes}, >={steps}, ...]")
            wrong = "float" not in dtype if kind == "float" else kind not in (None, dtype)
            if wrong:
                problems.append(f"{name!r} has dtype {dtype}, expected {kind}")
    recorded = meta.get(fmt.LANE_STEPS)
    if recorded and len(recorded) != lanes:
        problems.append(f"lane_steps has {len(recorded)} entries, metadata says {lanes} lanes")
    for key in ONE_PER_FRAME:
        shape = arrays.get(fmt.path(key), ((), None))[0]
        if len(shape) >= 2 and int(np.prod(shape[2:], dtype=np.int64)) != 1:
            problems.append(f"{fmt.path(key)!r} has shape {shape}, expected one value a frame")
    for key in sorted(fmt.text_keys(meta)):
        name = fmt.path(key)
        if name in arrays and not fmt.holds_text(arrays[name][1]):
            problems.append(
                f"{name!r} is Text in the observation space but stored as {arrays[name][1]} "
                "(expected fixed-length bytes S<width> or uint8)"
            )
    for column in COLUMNS:
        name = fmt.column(column)
        if column == fmt.SOURCE and meta["format_version"] < fmt.SOURCES_SINCE:
            continue  # older datasets have one source, or one per merged shard
        if name not in arrays:
            problems.append(f"missing key {name!r}")
        elif arrays[name][0][0] < meta["episodes"]:
            problems.append(
                f"{name!r} has {arrays[name][0][0]} rows, metadata says {meta['episodes']}"
            )
    return problems


class Found:
    """Problems of one kind each: how many frames, and the first one's lane and step."""

    def __init__(self) -> None:
        self.seen: dict[tuple, list] = {}  # kind -> [count, lane, step, detail]

    def add(self, kind: tuple, bad: np.ndarray, l0: int, t0: int, detail=None, times=None) -> None:
        """``bad``: ``[lanes, steps]`` of the window at lane ``l0``, step ``t0`` (or
        the steps ``times`` name); ``detail(lane, step)`` (window-local) tells of the first."""
        n = int(np.count_nonzero(bad))
        if not n:
            return
        entry = self.seen.setdefault(kind, [0, None, None, ""])
        if entry[1] is None:
            li, ti = divmod(int(np.flatnonzero(bad)[0]), bad.shape[1])
            step = t0 + ti if times is None else int(times[li, ti])
            entry[1:] = [l0 + li, step, detail(li, ti) if detail else ""]
        entry[0] += n

    def add_one(self, kind: tuple, lane: int, step: int, detail: str = "") -> None:
        entry = self.seen.setdefault(kind, [0, lane, step, detail])
        entry[0] += 1


class Carry:
    """Each lane's last valid frame so far (``t`` -1: none yet): what a window
    needs of the one before."""

    def __init__(self, lanes: int):
        self.t = np.full(lanes, -1, np.int64)
        self.traj = np.full(lanes, -2, np.int64)
        self.split = np.zeros(lanes, bool)  # its own step ended its trajectory
        self.done = np.zeros(lanes, bool)  # next/done
        self.final = np.zeros(lanes, bool)  # it has a final/ row (compact layout)


class Scan:
    """The one pass over the frames (see the module's docstring)."""

    def __init__(self, ds, arrays: dict, read, rows: dict, conf: dict, notes: list[str]):
        meta = ds.meta
        self.read = functools.cache(read)  # a handle a key, looked up once
        self.arrays, self.meta, self.conf = arrays, meta, conf
        self.notes = notes
        self.lanes, self.ends = int(meta["lanes"]), fmt.lane_steps(meta)
        self.split = bool(conf["reset_when_done"])
        self.running = meta["status"] == fmt.RUNNING
        self.cut_ids = np.unique(rows["traj_id"][~rows["complete"]])
        self.found, self.frames, self.runs = Found(), 0, []
        self.half: list[np.ndarray] = []  # (lane, traj) of half-flagged frames (kill)
        self.tails = np.full(self.lanes, -2, np.int64)  # traj_id of each lane's last frame
        self.unflagged_tails = 0
        self.has = set(arrays)
        obs = [k for k in arrays if fmt.key_of(k)[0] == fmt.OBSERVATION]
        nexts = {k: fmt.path(fmt.next_key(fmt.key_of(k))) for k in obs}
        # full layout: next/observation stored; compact leaves are rebuilt (checked apart)
        self.pairs = [(k, n) for k, n in nexts.items() if n in arrays and not ds.rebuilt(n)]
        floats = [k for k in arrays if np.dtype(arrays[k][1]).kind == "f"]
        rewards = (fmt.path(fmt.REWARD_KEY), fmt.path(fmt.ORIGINAL_REWARD_KEY))
        self.nan_keys = [k for k in floats if k in obs or k in rewards]
        self.nan_keys += [n for k, n in self.pairs if n in floats]
        self.bounds = [b for b in action_bounds(meta) if b[0] in arrays]
        self.multistep = fmt.path(fmt.STEPS_TO_NEXT_KEY) in arrays
        self.finals = self._finals(ds) if ds.compact else None

    def _finals(self, ds) -> np.ndarray:
        """Sorted ``lane * stride + time`` of the ``final/`` rows that count."""
        lane = np.asarray(ds.array(fmt.path(fmt.FINAL_LANE_KEY)), np.int64)
        time = np.asarray(ds.array(fmt.path(fmt.FINAL_TIME_KEY)), np.int64)
        ok = fmt.valid_finals(lane, time, self.ends)
        self.stride = int(self.ends.max(initial=0)) + 1
        return np.unique(lane[ok] * self.stride + time[ok])

    # -- windows ------------------------------------------------------------------------
    def run(self) -> None:
        keys = [fmt.MASK, fmt.TRAJ, *map(fmt.path, ONE_PER_FRAME[2:]), *self.nan_keys]
        keys += [fmt.path(fmt.ORIGINAL_REWARD_KEY), fmt.path(fmt.STEPS_TO_NEXT_KEY)]
        keys += list(fmt.FLAGS)
        keys += [b[0] for b in self.bounds] + [k for k, _ in self.pairs]
        keys = [k for k in dict.fromkeys(keys) if k in self.has]
        sizes = {k: np.dtype(self.arrays[k][1]).itemsize * int(np.prod(self.arrays[k][0][2:]))
                 for k in keys}  # fmt: skip
        frame = sum(sizes.values())
        # windows of whole chunks (HDF5) of the largest frames (images: one lane a chunk)
        big = self.read(max(sizes, key=sizes.get))
        unit_l, unit_t = (getattr(big, "chunks", None) or (1, 1))[:2]
        # a chunk's lanes over time; more lanes where whole lanes fit (short ones)
        whole = WINDOW_BYTES // max(1, frame * int(self.ends.max(initial=1)))
        block = max(unit_l, min(self.lanes, whole) // unit_l * unit_l)
        for l0 in range(0, self.lanes, block):
            l1 = min(self.lanes, l0 + block)
            end = int(self.ends[l0:l1].max(initial=0))
            span = max(unit_t, WINDOW_BYTES // max(1, frame * (l1 - l0)) // unit_t * unit_t)
            carry = Carry(l1 - l0)
            for t0 in range(0, end, span):
                self._window(l0, l1, t0, min(end, t0 + span), end, carry)
            self._end_block(l0, l1, carry)

    def _window(self, l0: int, l1: int, t0: int, t1: int, end: int, carry: Carry) -> None:
        b, w, found = l1 - l0, t1 - t0, self.found
        cached: dict[fmt.Key, np.ndarray | None] = {}
        span = [t1]

        def get(key: fmt.Key) -> np.ndarray | None:
            """``key`` over the window and the steps after it its frames look ahead."""
            if key not in cached:
                name = fmt.path(key)
                read = name in self.has
                cached[key] = np.asarray(self.read(name)[l0:l1, t0 : span[0]]) if read else None
            return cached[key]

        def one(key: fmt.Key) -> np.ndarray:
            return get(key).reshape(b, -1)

        if self.multistep:  # next/* look up to n steps ahead
            ahead = int(np.clip(one(fmt.STEPS_TO_NEXT_KEY).max(initial=1), 1, 1 << 12))
            cached.clear()
        else:
            ahead = 1
        span[0] = te = min(end, t1 + ahead)
        mask, traj = one(fmt.MASK_KEY).astype(bool), one(fmt.TRAJ_KEY)
        committed = np.arange(t0, te)[None, :] < self.ends[l0:l1, None]
        valid_e = mask & committed
        reward_e, ended_e = fmt.own_step(get, mask.shape)
        ended_e &= valid_e
        done, term, trunc = (one((fmt.NEXT, f))[:, :w].astype(bool) for f in fmt.FLAGS)
        valid, ended, reward = valid_e[:, :w], ended_e[:, :w], reward_e[:, :w]
        own_traj = traj[:, :w]
        self.frames += int(np.count_nonzero(valid))
        found.add(("padding",), (committed & ~mask)[:, :w] & (own_traj != -1), l0, t0)
        found.add(("negative",), valid & (own_traj < 0), l0, t0)
        wrong = valid & (done != (term | trunc))
        if self.running:  # durability D13: a kill while cuts were flagged (truncated first)
            half = wrong & trunc & ~done & ~term
            li, ti = np.nonzero(half)
            self.half.append(np.stack([li + l0, own_traj[li, ti]], 1))
            wrong &= ~half
        found.add(("flags",), wrong, l0, t0)
        for flag in fmt.FLAGS:  # a stored state s_t is never a final one
            if flag in self.has:
                found.add(("root", flag), valid & one((flag,))[:, :w].astype(bool), l0, t0)
        splits = ended if self.split else np.zeros_like(ended)
        has_final = None
        if self.finals is not None:
            keys = (np.arange(l0, l1)[:, None] * self.stride + np.arange(t0, t1)[None, :])[valid]
            has_final = np.zeros_like(valid)
            pos = np.searchsorted(self.finals, keys)
            has_final[valid] = self.finals[np.minimum(pos, len(self.finals) - 1)] == keys
        self._pairs(l0, t0, valid, own_traj, splits, done, has_final, carry)
        self._runs(l0, t0, valid, own_traj, reward, ended, done, term, trunc)
        for key in self.nan_keys:
            value = get(fmt.key_of(key))[:, :w]
            if np.dtype(value.dtype).kind == "f":
                found.add(("nan", key), valid & np.isnan(value).reshape(b, w, -1).any(-1), l0, t0)
        for key, low, high in self.bounds:
            value = get(fmt.key_of(key))[:, :w].reshape(b, w, *low.shape).astype(np.float64)
            out = ~((value >= low) & (value <= high)).reshape(b, w, -1).all(-1)
            found.add(("action", key), valid & out, l0, t0, lambda i, j, v=value: v[i, j].tolist())
        steps_to = one(fmt.STEPS_TO_NEXT_KEY) if self.multistep else valid_e
        for key, nkey in self.pairs:
            obs, nxt = get(fmt.key_of(key)), get(fmt.key_of(nkey))[:, :w]
            self._next_obs(key, nkey, l0, t0, obs, nxt, valid_e, traj, ended_e, steps_to[:, :w])

    def _next_obs(self, key, nkey, l0, t0, obs, nxt, valid_e, traj, ended_e, steps_to) -> None:
        """A frame's next observation is a copy of the observation ``steps_to`` frames
        later where that frame is valid and of the same trajectory, with no frame in
        between ending it or padding (exact: the same env output, bit for bit)."""
        b, w = nxt.shape[:2]
        whole = valid_e.all()
        gaps = None if whole else np.cumsum(~valid_e, axis=1)  # none between t and t+k
        ks = np.unique(steps_to[valid_e[:, :w]]).tolist() if self.multistep else [1]
        for k in ks:
            if k < 1 or k >= obs.shape[1]:
                continue
            n = min(w, obs.shape[1] - k)
            need = valid_e[:, :n] & (traj[:, k : k + n] == traj[:, :n])
            need &= ~ended_e[:, k - 1 : k - 1 + n]
            if self.multistep:
                need &= steps_to[:, :n] == k
            if gaps is not None:
                need &= gaps[:, k : k + n] == gaps[:, :n]
            same = _same(nxt[:, :n], obs[:, k : k + n]).reshape(b, n, -1).all(-1)

            def show(li, ti):
                return f"traj_id {int(traj[li, ti])}"

            self.found.add(("successor", nkey, key), need & ~same, l0, t0, show)

    def _pairs(self, l0, t0, valid, traj, splits, done, has_final, carry: Carry) -> None:
        """Each valid frame and the lane's valid frame before it (padding skipped,
        across windows): traj ids change exactly after a frame that ends its
        trajectory (a done, or a cut: durability D13), and in the compact layout a
        frame not followed by its trajectory's next state has a ``final/`` row (D16)."""
        b, w = valid.shape
        times = np.broadcast_to(np.arange(t0, t0 + w), (b, w))
        if valid.all():  # the usual window: the frame before is the step before

            def prev(now: np.ndarray, carried: np.ndarray) -> np.ndarray:
                return np.concatenate([carried[:, None].astype(now.dtype), now[:, :-1]], 1)

            first = np.zeros((b, w), bool)
            first[:, 0] = True
        else:  # the last valid step before each step, -1: in an earlier window
            last = np.maximum.accumulate(np.where(valid, np.arange(w), -1), axis=1)
            before = np.concatenate([np.full((b, 1), -1), last[:, :-1]], 1)
            first, at = before < 0, np.maximum(before, 0)

            def prev(now: np.ndarray, carried: np.ndarray) -> np.ndarray:
                return np.where(first, carried[:, None], np.take_along_axis(now, at, 1))

        has_prev = valid & (~first | (carry.t >= 0)[:, None])
        p_id, p_t = prev(traj, carry.traj), prev(times, carry.t)
        changes = has_prev & (traj != p_id)
        expected = has_prev & prev(splits, carry.split)
        expected[changes] |= np.isin(p_id[changes], self.cut_ids)
        self.found.add(("order",), changes != expected, l0, t0, times=p_t)
        if has_final is not None:
            followed = (traj == p_id) & ~prev(done, carry.done)
            lost = has_prev & ~followed & ~prev(has_final, carry.final)
            self.found.add(("lost",), lost, l0, t0, times=p_t)
        lanes = np.flatnonzero(valid.any(axis=1))
        at_last = w - 1 - np.argmax(valid[lanes, ::-1], axis=1)
        carry.t[lanes], carry.traj[lanes] = t0 + at_last, traj[lanes, at_last]
        carry.split[lanes], carry.done[lanes] = splits[lanes, at_last], done[lanes, at_last]
        if has_final is not None:
            carry.final[lanes] = has_final[lanes, at_last]

    def _runs(self, l0, t0, valid, traj, reward, ended, done, term, trunc) -> None:
        """Sums of each run of frames of one trajectory in one lane of the window."""
        li, ti = np.nonzero(valid)
        if not len(li):
            return
        ids = traj[li, ti]
        start = np.ones(len(li), bool)
        start[1:] = (li[1:] != li[:-1]) | (ids[1:] != ids[:-1])
        first = np.flatnonzero(start)
        last = np.append(first[1:], len(li)) - 1
        r = reward[li, ti]
        el, et = li[last], ti[last]
        self.runs.append(
            {
                "traj_id": ids[first],
                "lane": l0 + li[first],
                "start": t0 + ti[first],
                "end": t0 + et,
                "length": last - first + 1,
                "return": np.add.reduceat(r, first),
                "size": np.add.reduceat(np.abs(r), first),
                "ended": ended[el, et],
                "done": done[el, et],
                "terminated": term[el, et],
                "truncated": trunc[el, et],
            }
        )

    def _end_block(self, l0: int, l1: int, carry: Carry) -> None:
        """Each lane's last valid frame: no frame follows it."""
        seen = carry.t >= 0
        self.tails[l0:l1][seen] = carry.traj[seen]
        self.unflagged_tails += int(np.count_nonzero(seen & ~carry.done))
        if self.finals is not None:
            for lane in np.flatnonzero(seen & ~carry.final).tolist():
                self.found.add_one(("lost",), l0 + lane, int(carry.t[lane]))

    def messages(self) -> list[str]:
        out = []
        if self.frames != self.meta["frames"]:
            out.append(f"{self.frames} valid frames, metadata says {self.meta['frames']}")
        noise = self.conf["noise"] != "none" and self.conf["exploration_type"] == "random"
        for kind, (n, lane, step, detail) in self.found.seen.items():
            text = MESSAGES[kind[0]].format(
                *kind[1:], n=n, frames=f"{n} frame{'s' * (n > 1)}", detail=detail,
                where=f"lane {lane} step {step}", lane=lane, step=step,
            )  # fmt: skip
            if kind[0] == "action" and noise:  # exploration noise: worth a note, no more
                self.notes.append(f"{text}; policy.noise={self.conf['noise']} was on")
            elif kind[0] == "action" and self.conf["user_code"]:  # the env clips or refuses
                self.notes.append(f"{text}; the policy's own code returned it")
            else:
                out.append(text)
        return out


# the frames pass's problems, by kind; {where}: lane and step of the first
MESSAGES = {
    "padding": "{n} padding frames have a traj_id != -1 (first: {where})",
    "negative": "{n} valid frames have a negative traj_id (first: {where})",
    "flags": "next/done differs from next/terminated | next/truncated at {where} ({frames})",
    "root": "{0!r} (the state's own flag) is True at {where} ({frames}): a stored state is "
    "never a final one (it follows a step that did not end, or a reset)",
    "order": "traj_ids out of order in lane {lane} at step {step}: an id must change exactly "
    "after a done frame",
    "lost": "{n} frames' next/observation is lost (no final/ row; first: {where})",
    "nan": "NaN in {0!r} at {where} ({frames})",
    "successor": "{0!r} differs from the next frame's {1!r} inside a trajectory at {where} "
    "({detail}; {frames})",
    "action": "{0!r} outside the action space at {where}: {detail} ({frames})",
}


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise bit-for-bit equality (NaN equals the same NaN)."""
    if a.dtype != b.dtype:
        return a == b
    if a.dtype.kind in "fc":
        kind = np.dtype(f"u{a.dtype.itemsize}") if a.dtype.itemsize <= 8 else None
        if kind is not None:
            return a.view(kind) == b.view(kind)
    return a == b


def _frames_and_episodes(ds, arrays: dict, notes: list[str]) -> list[str]:
    meta = ds.meta
    conf = settings(meta)
    rows = ds.episodes()
    table = fmt.sources(meta)
    outside = np.flatnonzero((rows[fmt.SOURCE] < 0) | (rows[fmt.SOURCE] >= len(table)))
    if len(outside):
        i = int(outside[0])
        return [
            f"episodes/source row {i} is {rows['source'][i]}: the sources table has "
            f"{len(table)} row(s)"
        ]
    stored = {key for key, _, _ in ds.stored()}
    needed = [fmt.FINAL_LANE_KEY, fmt.FINAL_TIME_KEY, *map(fmt.final_key, ds.compact)]
    absent = [fmt.path(k) for k in needed if fmt.path(k) not in stored]
    if ds.compact and absent:
        return [f"layout compact without {absent[0]!r}: next/observation cannot be rebuilt"]
    with ds.reader() as read:
        scan = Scan(ds, arrays, read, rows, conf, notes)
        scan.run()
    problems = scan.messages()
    if scan.half:  # half-flagged frames must be their lane's last trajectory's
        half = np.concatenate(scan.half)
        bad = half[scan.tails[half[:, 0]] != half[:, 1]]
        if len(bad):
            problems.append(
                f"next/done differs from next/terminated | next/truncated at lane {bad[0, 0]} "
                f"(traj_id {bad[0, 1]}: next/truncated without next/done, not at the lane's end)"
            )
    problems += episodes_problems(
        rows, scan.runs, scan.tails, meta, conf, notes, scan.unflagged_tails
    )
    return problems
