"""EpisodeTracker against hand-computed rows, across batch boundaries and padding."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from collect_cli.dataformat import COLUMNS
from collect_cli.dataset.episodes import EpisodeTracker


def batch(traj, reward, done, mask=None, term=None):
    traj = torch.tensor(traj)
    shape = traj.shape
    done = torch.tensor(done, dtype=torch.bool)
    term = done if term is None else torch.tensor(term, dtype=torch.bool)
    mask = torch.ones(shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return TensorDict(
        {
            ("collector", "traj_ids"): traj,
            ("collector", "mask"): mask,
            ("next", "reward"): torch.tensor(reward, dtype=torch.float32)[..., None],
            ("next", "done"): done[..., None],
            ("next", "terminated"): term[..., None],
            ("next", "truncated"): (done & ~term)[..., None],
        },
        batch_size=shape,
    )


def test_rows_across_batches():
    tr = EpisodeTracker(2)
    rows = tr.update(
        batch(
            [[0, 0, 2, 2], [1, 1, 1, 1]],
            [[1, 2, 3, 4], [10, 20, 30, 40]],
            [[0, 1, 0, 0], [0, 0, 0, 0]],
        ),
        t0=0,
    )
    assert rows["traj_id"].tolist() == [0]
    assert rows["return"].tolist() == [3.0] and rows["length"].tolist() == [2]
    rows = tr.update(
        batch(
            [[2, 3, 3, 4], [1, 5, 5, 5]],
            [[5, 6, 7, 8], [50, 60, 70, 80]],
            [[1, 0, 1, 0], [1, 0, 0, 0]],
            term=[[0, 0, 1, 0], [1, 0, 0, 0]],
        ),
        t0=4,
    )
    # chronological: (t=4: lanes 0 and 1), then (t=6: lane 0)
    assert rows["traj_id"].tolist() == [2, 1, 3]
    assert rows["lane"].tolist() == [0, 1, 0]
    assert rows["start"].tolist() == [2, 0, 5]
    assert rows["length"].tolist() == [3, 5, 2]
    assert rows["return"].tolist() == [12.0, 150.0, 13.0]
    assert rows["truncated"].tolist() == [True, False, False]
    assert rows["terminated"].tolist() == [False, True, True]
    tail = tr.finish()
    assert tail["traj_id"].tolist() == [4, 5]
    assert tail["start"].tolist() == [7, 5]
    assert tail["length"].tolist() == [1, 3]
    assert tail["return"].tolist() == [8.0, 210.0]
    assert not tail["complete"].any()


def test_padding_is_not_counted():
    tr = EpisodeTracker(1)
    rows = tr.update(
        batch([[0, 0, -1]], [[1, 1, 0]], [[0, 0, 0]], mask=[[True, True, False]]), t0=0
    )
    assert len(rows["traj_id"]) == 0
    rows = tr.update(batch([[0, 1]], [[1, 1]], [[1, 0]]), t0=3)
    assert rows["length"].tolist() == [3] and rows["return"].tolist() == [3.0]
    np.testing.assert_array_equal(tr.finish()["traj_id"], [1])


def test_returns_are_summed_in_time_order_bit_for_bit():
    # rewards of very different sizes: any other order of the additions (pairwise,
    # blocked, in parallel) gives other float64 sums, and datasets would change
    rng = np.random.default_rng(0)
    lanes, steps = 3, 300
    reward = rng.standard_normal((lanes, steps)) * 10.0 ** rng.integers(-6, 7, (lanes, steps))
    reward = reward.astype(np.float32)
    done = np.zeros((lanes, steps), bool)
    done[:, -1] = True
    traj = np.repeat(np.arange(lanes)[:, None], steps, 1)
    rows = EpisodeTracker(lanes).update(batch(traj.tolist(), reward.tolist(), done.tolist()), t0=0)
    expected = []
    for lane in range(lanes):
        total = 0.0
        for r in reward[lane].tolist():
            total += r
        expected.append(total)
    assert rows["return"].tolist() == expected
    assert rows["return"].tolist() != reward.astype(np.float64).sum(axis=1).tolist()  # pairwise


def reference(batches, lanes):
    """Rows and cuts of each update, lane by lane and frame by frame (plain Python)."""
    running: dict[int, list] = {}  # lane -> [traj_id, start, length, return, last time]
    out, t0 = [], 0
    for b in batches:
        traj, mask = b["collector", "traj_ids"], b["collector", "mask"]
        reward, done = b["next", "reward"][..., 0], b["next", "done"][..., 0]
        term = b["next", "terminated"][..., 0]
        carried, ended = [], []
        for lane in range(lanes):
            for t in range(traj.shape[1]):
                if not mask[lane, t]:
                    continue
                now = running.get(lane)
                if now is not None and now[0] != int(traj[lane, t]):  # cut by a reset
                    row = (*now[:4], False, False, False, lane, now[4])
                    (ended if now[4] >= t0 else carried).append(row)
                    now = None
                if now is None:
                    now = running[lane] = [int(traj[lane, t]), t0 + t, 0, 0.0, 0]
                now[2] += 1
                now[3] += float(reward[lane, t])
                now[4] = t0 + t
                if done[lane, t]:
                    flags = (bool(term[lane, t]), not bool(term[lane, t]), True)
                    ended.append((*now[:4], *flags, lane, now[4]))
                    del running[lane]
        ended.sort(key=lambda row: (row[8], row[7]))  # by end time, then lane
        out.append((carried + ended, {(row[7], row[8]) for row in carried + ended if not row[6]}))
        t0 += traj.shape[1]
    return out


def test_rows_and_cuts_equal_a_frame_by_frame_count_with_padding_and_resets():
    rng = np.random.default_rng(1)
    lanes, steps, batches, next_id = 5, 9, [], 5
    ids = np.arange(lanes)
    for k in range(12):
        traj = np.empty((lanes, steps), np.int64)
        done = rng.random((lanes, steps)) < 0.15
        for t in range(steps):
            traj[:, t] = ids
            change = done[:, t] | (rng.random(lanes) < 0.05)  # an id change without done: a cut
            ids = ids.copy()
            ids[change] = np.arange(next_id, next_id + change.sum())
            next_id += int(change.sum())
        mask = np.ones((lanes, steps), bool)
        if k % 3 == 1:  # padded lanes (uneven workers), one lane empty
            mask = np.arange(steps)[None] < rng.integers(0, steps + 1, lanes)[:, None]
            mask[k % lanes] = False
        term = done & (rng.random((lanes, steps)) < 0.5)
        batches.append(
            batch(
                np.where(mask, traj, -1).tolist(),
                rng.standard_normal((lanes, steps)).tolist(),
                (done & mask).tolist(),
                mask=mask.tolist(),
                term=(term & mask).tolist(),
            )
        )
    tracker, t0 = EpisodeTracker(lanes), 0
    for b, (want, cuts) in zip(batches, reference(batches, lanes), strict=True):
        rows = tracker.update(b, t0)
        t0 += steps
        assert {k: rows[k].dtype for k in COLUMNS} == {k: np.dtype(v) for k, v in COLUMNS.items()}
        got = list(zip(*(rows[k].tolist() for k in ("traj_id", "start", "length")), strict=True))
        assert got == [row[:3] for row in want]
        np.testing.assert_allclose(rows["return"], [row[3] for row in want], rtol=1e-9)
        flags = ("terminated", "truncated", "complete", "lane")
        assert list(zip(*(rows[k].tolist() for k in flags), strict=True)) == [
            row[4:8] for row in want
        ]
        assert set(zip(*(c.tolist() for c in tracker.cuts), strict=True)) == cuts
    assert sum(len(w) for w, _ in reference(batches, lanes)) > 40  # the check saw episodes
