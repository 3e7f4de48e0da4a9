"""Stream post-processors: MultiStep, split_trajectories, TrajectorySplitter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from collect_cli.collectors.postproc import MultiStep, TrajectorySplitter, split_trajectories
from collect_cli.errors import CollectionError

GAMMA = 0.9


# -- stream builders ------------------------------------------------------------------------
def make_stream(reward, done, traj, terminated=None, mask=None, obs_dim=1) -> TensorDict:
    """A ``[lanes, T]`` stream: observation/pos = global time, next/pos = time + 1."""
    reward = np.asarray(reward, np.float32)
    done = np.asarray(done, bool)
    lanes, steps = reward.shape
    term = done if terminated is None else np.asarray(terminated, bool) & done
    trunc = done & ~term
    mask = np.ones((lanes, steps), bool) if mask is None else np.asarray(mask, bool)
    t = torch.arange(steps, dtype=torch.float32).expand(lanes, steps)
    pos = t.unsqueeze(-1).expand(lanes, steps, obs_dim).clone()
    lane = torch.arange(lanes, dtype=torch.float32).unsqueeze(1).expand(lanes, steps)

    def flag(x):
        return torch.as_tensor(x).reshape(lanes, steps, 1)

    prev_done = np.zeros_like(done)
    prev_done[:, 1:] = done[:, :-1]
    td = TensorDict(
        {
            "observation": {"pos": pos, "lane": lane.unsqueeze(-1).clone()},
            "action": (t * 10).unsqueeze(-1).clone(),
            "sample_log_prob": -t.clone(),
            "done": flag(prev_done),
            "terminated": flag(prev_done),
            "truncated": flag(np.zeros_like(done)),
            "next": {
                "observation": {"pos": pos + 1, "lane": lane.unsqueeze(-1).clone()},
                "reward": torch.as_tensor(reward).unsqueeze(-1),
                "done": flag(done),
                "terminated": flag(term),
                "truncated": flag(trunc),
                "step_count": (t.long() + 100).unsqueeze(-1),
                "info": {"x": t.unsqueeze(-1) * 0.5},
            },
            "collector": {
                "traj_ids": torch.as_tensor(np.asarray(traj, np.int64)),
                "mask": torch.as_tensor(mask),
            },
        },
        batch_size=[lanes, steps],
    )
    pad = ~torch.as_tensor(mask)
    if pad.any():
        for key in td.keys(True, True):
            if key != ("collector", "mask"):
                td.get(key)[pad] = -1 if key == ("collector", "traj_ids") else 0
    return td


def random_stream(seed, lanes=3, steps=60) -> TensorDict:
    rng = np.random.default_rng(seed)
    reward = rng.normal(size=(lanes, steps)).round(3)
    done = rng.random((lanes, steps)) < 0.12
    cut = (rng.random((lanes, steps)) < 0.06) & ~done
    term = rng.random((lanes, steps)) < 0.5
    traj = np.zeros((lanes, steps), np.int64)
    next_id = lanes
    for lane in range(lanes):  # reference-style loop: fine in a test
        traj[lane, 0] = lane
        for t in range(1, steps):
            if done[lane, t - 1] or cut[lane, t - 1]:
                traj[lane, t] = next_id
                next_id += 1
            else:
                traj[lane, t] = traj[lane, t - 1]
    return make_stream(reward, done, traj, terminated=term)


def split(stream, sizes):
    out, t = [], 0
    for size in sizes:
        out.append(stream[:, t : t + size])
        t += size
    assert t == stream.batch_size[1]
    return out


def random_sizes(rng, total, low=1, high=9):
    sizes = []
    while sum(sizes) < total:
        sizes.append(int(min(rng.integers(low, high + 1), total - sum(sizes))))
    return sizes


def run_multistep(ms, batches, lane_start=0):
    outs = [o for o in (ms(b, lane_start) for b in batches) if o is not None]
    outs += [o for _, o in ms.flush()]
    return torch.cat(outs, 1)


# -- MultiStep reference ------------------------------------------------------------------------
def reference_multistep(stream, n, gamma):
    """Per lane, per frame: walk the window one step at a time (obviously correct, slow)."""
    reward = stream["next", "reward"][..., 0].double().numpy()
    done = stream["next", "done"][..., 0].numpy()
    traj = stream["collector", "traj_ids"].numpy()
    lanes, steps = reward.shape
    ret = np.zeros((lanes, steps))
    m = np.zeros((lanes, steps), np.int64)
    for lane in range(lanes):
        for t in range(steps):
            k = 0
            while k < n and t + k < steps:
                ret[lane, t] += gamma**k * reward[lane, t + k]
                j = t + k
                k += 1
                if done[lane, j] or (j + 1 < steps and traj[lane, j + 1] != traj[lane, j]):
                    break
            m[lane, t] = k
    return ret, m


def check_against_reference(out, stream, n, gamma):
    ret, m = reference_multistep(stream, n, gamma)
    assert out.batch_size == stream.batch_size
    np.testing.assert_allclose(out["next", "reward"][..., 0].numpy(), ret, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out["steps_to_next_obs"][..., 0].numpy(), m)
    assert out["steps_to_next_obs"].dtype == torch.int64
    assert out["steps_to_next_obs"].shape == out["next", "reward"].shape
    assert (out["next", "original_reward"] == stream["next", "reward"]).all()
    lane_idx = torch.arange(stream.batch_size[0]).unsqueeze(1)
    src = torch.arange(stream.batch_size[1]).unsqueeze(0) + torch.as_tensor(m) - 1
    for key in stream["next"].keys(True, True):
        if key == "reward":
            continue
        assert (out["next"].get(key) == stream["next"].get(key)[lane_idx, src]).all(), key
    for key in stream.exclude("next").keys(True, True):
        assert (out.get(key) == stream.get(key)).all(), key


# -- MultiStep: hand-computed values ------------------------------------------------------------
# lane 0: r = 1..8; done (terminated) at t=3; traj 0,0,0,0,1,1 then a cut (no done) to 2 at t=6
# lane 1: done (truncated) at t=1 and (terminated) at t=6
# lane 2: one episode running past the end of the data
HAND_TRAJ = [[0, 0, 0, 0, 1, 1, 2, 2], [5, 5, 6, 6, 6, 6, 6, 7], [9] * 8]
HAND_DONE = [[0, 0, 0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 1, 0], [0] * 8]
HAND_TERM = [[0, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 0], [0] * 8]

# (n-step reward, steps_to_next_obs) per frame of lane 0, for gamma = 0.9
HAND_LANE0 = {
    1: ([1, 2, 3, 4, 5, 6, 7, 8], [1] * 8),
    2: ([2.8, 4.7, 6.6, 4, 10.4, 6, 14.2, 8], [2, 2, 2, 1, 2, 1, 2, 1]),
    3: ([5.23, 7.94, 6.6, 4, 10.4, 6, 14.2, 8], [3, 3, 2, 1, 2, 1, 2, 1]),
    5: ([8.146, 7.94, 6.6, 4, 10.4, 6, 14.2, 8], [4, 3, 2, 1, 2, 1, 2, 1]),
}
# lanes 1 and 2 for n = 3
HAND_N3 = {
    1: ([2.8, 2, 10.65, 13.36, 16.07, 12.3, 7, 8], [2, 1, 3, 3, 3, 2, 1, 1]),
    2: ([5.23, 7.94, 10.65, 13.36, 16.07, 18.78, 14.2, 8], [3, 3, 3, 3, 3, 3, 2, 1]),
}


def hand_stream():
    reward = np.tile(np.arange(1, 9, dtype=np.float32), (3, 1))
    return make_stream(reward, HAND_DONE, HAND_TRAJ, terminated=HAND_TERM)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("sizes", [[8], [3, 2, 3], [1, 1, 4, 2], [2, 6]])
def test_multistep_hand_computed(n, sizes):
    stream = hand_stream()
    out = run_multistep(MultiStep(n, GAMMA), split(stream, sizes))
    assert out.batch_size == (3, 8)
    expected = {0: HAND_LANE0[n], **(HAND_N3 if n == 3 else {})}
    for lane, (ret, m) in expected.items():
        got_r = out["next", "reward"][lane, :, 0].numpy()
        np.testing.assert_allclose(got_r, ret, rtol=1e-6)
        assert out["steps_to_next_obs"][lane, :, 0].tolist() == m
        assert out["next", "original_reward"][lane, :, 0].tolist() == list(range(1, 9))
        # next/observation = time index + 1 of frame t + m - 1 = t + m
        want_obs = [t + mm for t, mm in enumerate(m)]
        assert out["next", "observation", "pos"][lane, :, 0].tolist() == want_obs
        done = np.asarray(HAND_DONE[lane], bool)
        term = np.asarray(HAND_TERM[lane], bool)
        src = [t + mm - 1 for t, mm in enumerate(m)]
        assert out["next", "done"][lane, :, 0].tolist() == done[src].tolist()
        assert out["next", "terminated"][lane, :, 0].tolist() == term[src].tolist()
        assert out["next", "truncated"][lane, :, 0].tolist() == (done & ~term)[src].tolist()
        # root entries unchanged
        assert out["observation", "pos"][lane, :, 0].tolist() == list(range(8))
        assert out["collector", "traj_ids"][lane].tolist() == HAND_TRAJ[lane]


def test_multistep_hand_spot_values():
    """A few frames spelled out: window across batch boundaries, episode ends, end of data."""
    stream = hand_stream()
    ms = MultiStep(3, GAMMA)
    first = ms(stream[:, :3])  # frames 0..2 in; only frame 0 is complete
    assert first.batch_size == (3, 1)
    assert first["next", "reward"][0, 0, 0].item() == pytest.approx(1 + 0.9 * 2 + 0.81 * 3)
    second = ms(stream[:, 3:5])  # frames 1, 2 now complete (window of frame 1 reaches 3)
    assert second.batch_size == (3, 2)
    # lane 0 frame 1: 2 + .9*3 + .81*4, ends on the terminal frame 3
    assert second["next", "reward"][0, 0, 0].item() == pytest.approx(7.94)
    assert second["next", "done"][0, 0, 0].item() is True
    assert second["next", "terminated"][0, 0, 0].item() is True
    # lane 1 frame 1: done at 1 itself -> m = 1, truncated
    assert second["steps_to_next_obs"][1, 0, 0].item() == 1
    assert second["next", "truncated"][1, 0, 0].item() is True
    third = ms(stream[:, 5:8])
    assert third.batch_size == (3, 3)  # frames 3, 4, 5
    # lane 0 frame 4: traj 1 is cut after frame 5 -> 5 + .9*6, next obs 6, not done
    assert third["next", "reward"][0, 1, 0].item() == pytest.approx(10.4)
    assert third["next", "done"][0, 1, 0].item() is False
    assert third["next", "observation", "pos"][0, 1, 0].item() == 6
    [(lane_start, tail)] = ms.flush()
    assert lane_start == 0 and tail.batch_size == (3, 2)  # frames 6, 7
    assert tail["steps_to_next_obs"][2, :, 0].tolist() == [2, 1]  # cut by the end of data
    assert tail["next", "reward"][2, :, 0].tolist() == pytest.approx([7 + 0.9 * 8, 8])
    assert tail["next", "step_count"][2, :, 0].tolist() == [107, 107]
    assert ms.flush() == []


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(4))
def test_multistep_matches_reference_on_random_splits(n, seed):
    stream = random_stream(seed)
    rng = np.random.default_rng(100 + seed)
    sizes = random_sizes(rng, stream.batch_size[1], 1, 2 * n + 3)
    out = run_multistep(MultiStep(n, GAMMA), split(stream, sizes))
    check_against_reference(out, stream, n, GAMMA)


def test_multistep_output_lag_and_held_frames():
    stream = random_stream(7, lanes=2, steps=20)
    ms = MultiStep(5, 0.5)
    assert ms(stream[:, :3]) is None  # 3 <= n - 1: all held
    assert ms(stream[:, 3:5]).batch_size == (2, 1)  # 3 held + 2 new - 4 held back
    out = ms(stream[:, 5:12])
    assert out.batch_size == (2, 7)
    out2 = ms(stream[:, 12:20])
    assert out2.batch_size == (2, 8)
    [(_, tail)] = ms.flush()
    assert tail.batch_size == (2, 4)


def test_multistep_first_call_emits_t_minus_n_plus_1():
    stream = random_stream(3, lanes=2, steps=20)
    ms = MultiStep(3, GAMMA)
    assert ms(stream[:, :10]).batch_size == (2, 8)
    assert ms(stream[:, 10:20]).batch_size == (2, 10)


def test_multistep_n1_is_identity_plus_two_keys():
    stream = random_stream(1)
    ms = MultiStep(1, GAMMA)
    out = ms(stream)
    assert ms.flush() == []
    assert set(out.keys(True, True)) == set(stream.keys(True, True)) | {
        ("next", "original_reward"),
        "steps_to_next_obs",
    }
    for key in stream.keys(True, True):
        assert (out.get(key) == stream.get(key)).all(), key
    assert (out["next", "original_reward"] == stream["next", "reward"]).all()
    assert (out["steps_to_next_obs"] == 1).all()


def test_multistep_gamma_zero_and_one():
    stream = hand_stream()
    out0 = run_multistep(MultiStep(3, 0.0), split(stream, [4, 4]))
    assert (out0["next", "reward"] == stream["next", "reward"]).all()
    out1 = run_multistep(MultiStep(3, 1.0), split(stream, [4, 4]))
    assert out1["next", "reward"][0, :, 0].tolist() == [6, 9, 7, 4, 11, 6, 15, 8]


def test_multistep_lane_groups_interleaved_equal_one_group():
    stream = random_stream(11, lanes=6, steps=50)
    whole = run_multistep(MultiStep(3, GAMMA), split(stream, [7] * 7 + [1]))
    rng = np.random.default_rng(0)
    groups = {0: stream[:3], 3: stream[3:]}
    queues = {s: split(g, random_sizes(rng, 50, 1, 8)) for s, g in groups.items()}
    ms = MultiStep(3, GAMMA)
    outs = {0: [], 3: []}
    while queues[0] or queues[3]:
        start = int(rng.choice([s for s in queues if queues[s]]))
        out = ms(queues[start].pop(0), lane_start=start)
        if out is not None:
            assert out.batch_size[0] == 3
            outs[start].append(out)
    flushed = ms.flush()
    assert [s for s, _ in flushed] == [0, 3]
    for start, tail in flushed:
        outs[start].append(tail)
    joined = torch.cat([torch.cat(outs[0], 1), torch.cat(outs[3], 1)], 0)
    assert (joined == whole).all()
    check_against_reference(joined, stream, 3, GAMMA)


def test_multistep_rejects_padding():
    mask = np.ones((2, 6), bool)
    mask[:, 4:] = False
    stream = make_stream(np.ones((2, 6)), np.zeros((2, 6)), [[0] * 6, [1] * 6], mask=mask)
    with pytest.raises(CollectionError, match="padding"):
        MultiStep(2, GAMMA)(stream)


def test_multistep_rejects_a_changed_group_width():
    stream = random_stream(2, lanes=4, steps=10)
    ms = MultiStep(2, GAMMA)
    ms(stream[:2, :5])
    with pytest.raises(CollectionError, match="lane group 0"):
        ms(stream[:, 5:])


@pytest.mark.parametrize(
    ("n", "gamma"), [(0, 0.9), (-1, 0.9), (2.5, 0.9), (True, 0.9), (2, -0.1), (2, 1.5), (2, "x")]
)
def test_multistep_bad_arguments(n, gamma):
    with pytest.raises(ValueError, match="MultiStep"):
        MultiStep(n, gamma)


# -- split_trajectories -------------------------------------------------------------------------
def test_split_trajectories_one_batch():
    mask = [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    traj = [[0, 0, 1, 1, 1], [2, 2, 2, -1, -1]]
    batch = make_stream(np.ones((2, 5)), np.zeros((2, 5)), traj, mask=mask)
    out = split_trajectories(batch)
    assert out.batch_size == (3, 3)
    assert out["collector", "traj_ids"].tolist() == [[0, 0, -1], [1, 1, 1], [2, 2, 2]]
    assert out["collector", "mask"].tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 1]]
    assert out["observation", "pos"][..., 0].tolist() == [[0, 1, 0], [2, 3, 4], [0, 1, 2]]
    assert out["observation", "lane"][..., 0].tolist() == [[0, 0, 0], [0, 0, 0], [1, 1, 1]]
    assert out["next", "reward"][..., 0].tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 1]]
    steps = [[100, 101, 0], [102, 103, 104], [100, 101, 102]]
    assert out["next", "step_count"][..., 0].tolist() == steps
    assert set(out.keys(True, True)) == set(batch.keys(True, True))


def test_split_trajectories_all_padding():
    batch = make_stream(
        np.ones((2, 3)), np.zeros((2, 3)), [[0] * 3, [1] * 3], mask=np.zeros((2, 3))
    )
    out = split_trajectories(batch)
    assert out.batch_size == (0, 0)


# -- TrajectorySplitter ---------------------------------------------------------------------------
def hand_splitter_batches():
    """2 lanes, 3 batches of 4 steps; step 7 (end of batch 1) is padding.

    lane 0: traj 0 over 0..6, 8, 9 (done at 9: spans 3 batches); traj 2 at 10, 11 (open)
    lane 1: traj 1 at 0, 1 (done at 1); traj 3 at 2..6, cut at the batch boundary;
            traj 4 at 8..11 (open)
    """
    traj = [[0] * 10 + [2, 2], [1, 1, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4]]
    done = np.zeros((2, 12), bool)
    done[0, 9] = done[1, 1] = True
    mask = np.ones((2, 12), bool)
    mask[:, 7] = False
    reward = np.arange(24, dtype=np.float32).reshape(2, 12)
    return split(make_stream(reward, done, traj, mask=mask), [4, 4, 4])


def test_trajectory_splitter_hand_built():
    b0, b1, b2 = hand_splitter_batches()
    ts = TrajectorySplitter()
    out0 = ts(b0)
    assert out0.batch_size == (1, 2)
    assert out0["collector", "traj_ids"].tolist() == [[1, 1]]
    assert out0["observation", "pos"][..., 0].tolist() == [[0, 1]]
    assert out0["next", "reward"][..., 0].tolist() == [[12, 13]]
    assert ts(b1) is None
    out2 = ts(b2)
    assert out2.batch_size == (2, 9)
    # ordered by end time: traj 3 ended at 6 (seen cut now), traj 0 at 9
    assert out2["collector", "traj_ids"].tolist() == [[3] * 5 + [-1] * 4, [0] * 9]
    assert out2["collector", "mask"].sum(1).tolist() == [5, 9]
    assert out2["observation", "pos"][..., 0].tolist() == [
        [2, 3, 4, 5, 6, 0, 0, 0, 0],
        [0, 1, 2, 3, 4, 5, 6, 8, 9],
    ]
    assert out2["next", "done"][..., 0].tolist() == [[0] * 9, [0] * 8 + [1]]
    assert out2["observation", "lane"][..., 0].tolist() == [[1] * 5 + [0] * 4, [0] * 9]
    assert out2["next", "reward"][1, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert (out2["action"][0, 5:] == 0).all() and (out2["next", "info", "x"][0, 5:] == 0).all()
    rest = ts.flush()
    assert rest["collector", "traj_ids"].tolist() == [[2, 2, -1, -1], [4, 4, 4, 4]]
    assert rest["observation", "pos"][..., 0].tolist() == [[10, 11, 0, 0], [8, 9, 10, 11]]
    assert rest["collector", "mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert ts.flush() is None


def reference_episodes(batches):
    """Per lane, walk the non-padding frames of the concatenated batches.

    Returns [(call, end_time, lane, frame_times)], call = index of the call that emits
    the episode (len(batches) = flush).
    """
    stream = torch.cat(batches, 1)
    call_of = np.concatenate([np.full(b.batch_size[1], i) for i, b in enumerate(batches)])
    mask = stream["collector", "mask"].numpy()
    done = stream["next", "done"][..., 0].numpy()
    if stream.get("steps_to_next_obs", None) is not None:  # after MultiStep: own step
        done = done & (stream["steps_to_next_obs"][..., 0].numpy() == 1)
    traj = stream["collector", "traj_ids"].numpy()
    episodes = []
    for lane in range(stream.batch_size[0]):
        times = list(np.flatnonzero(mask[lane]))
        current = []
        for i, t in enumerate(times):
            current.append(t)
            nxt = times[i + 1] if i + 1 < len(times) else None
            if done[lane, t]:
                episodes.append((call_of[t], t, lane, current))
                current = []
            elif nxt is not None and traj[lane, nxt] != traj[lane, t]:
                episodes.append((call_of[nxt], t, lane, current))
                current = []
        if current:
            episodes.append((len(batches), current[-1], lane, current))
    episodes.sort(key=lambda e: (e[0], e[1] if e[0] < len(batches) else 0, e[2]))
    return stream, episodes


def check_rows(outputs, batches, lane_offset=0):
    """Rows of every call (None skipped) + flush equal the reference episodes exactly."""
    stream, episodes = reference_episodes(batches)
    rows = []
    for call, out in enumerate(outputs):
        want = [e for e in episodes if e[0] == call]
        if not want:
            assert out is None, call
            continue
        assert out.batch_size == (len(want), max(len(e[3]) for e in want))
        rows += [(out[i], e) for i, e in enumerate(want)]
    assert len(rows) == len(episodes)
    for row, (_, _, lane, times) in rows:
        length = len(times)
        assert (
            row["collector", "mask"][:length].all() and not row["collector", "mask"][length:].any()
        )
        assert (row["collector", "traj_ids"][length:] == -1).all()
        frames = stream[lane + lane_offset, torch.as_tensor(times)]
        for key in frames.keys(True, True):
            assert (row.get(key)[:length] == frames.get(key)).all(), key
            if key != ("collector", "traj_ids"):
                assert (row.get(key)[length:] == 0).all(), key


def padded_random_batches(seed, lanes=3, steps=80):
    """A random stream split at random sizes; some batches get padding steps (mostly last)."""
    rng = np.random.default_rng(seed)
    stream = random_stream(seed, lanes, steps)
    batches, t = [], 0
    while t < steps:
        size = int(min(rng.integers(1, 12), steps - t))
        batch = stream[:, t : t + size]
        pad = int(rng.integers(0, 3)) if rng.random() < 0.4 else 0
        if pad:
            padding = make_stream(
                np.zeros((lanes, pad)),
                np.zeros((lanes, pad)),
                np.full((lanes, pad), -1),
                mask=np.zeros((lanes, pad)),
            )
            cut = int(rng.integers(0, size + 1))  # padding anywhere, usually at the end
            cut = size if rng.random() < 0.5 else cut
            batch = torch.cat([batch[:, :cut], padding, batch[:, cut:]], 1)
        batches.append(batch)
        t += size
    return batches


@pytest.mark.parametrize("seed", range(5))
def test_trajectory_splitter_matches_reference(seed):
    batches = padded_random_batches(seed)
    ts = TrajectorySplitter()
    outputs = [ts(b) for b in batches] + [ts.flush()]
    check_rows(outputs, batches)


def test_trajectory_splitter_long_episode_spans_many_batches():
    steps = 30
    done = np.zeros((2, steps), bool)
    done[0, 25] = True
    stream = make_stream(np.ones((2, steps)), done, [[0] * steps, [1] * steps])
    batches = split(stream, [5] * 6)
    ts = TrajectorySplitter()
    outputs = [ts(b) for b in batches] + [ts.flush()]
    assert [o is None for o in outputs] == [True] * 5 + [False, False]
    assert outputs[5]["collector", "mask"].sum().item() == 26
    # lane 0 goes on after its done without a new traj id: a new episode all the same
    assert outputs[6]["collector", "traj_ids"].tolist() == [[0] * 4 + [-1] * 26, [1] * 30]
    check_rows(outputs, batches)


def test_trajectory_splitter_lane_groups():
    batches = padded_random_batches(3, lanes=4, steps=40)
    ts = TrajectorySplitter()
    out_a, out_b = [], []
    for batch in batches:  # group 2 first, then group 0: interleaved
        out_b.append(ts(batch[2:], lane_start=2))
        out_a.append(ts(batch[:2], lane_start=0))
    rest = ts.flush()
    _, open_eps = reference_episodes(batches)
    open_lanes = [e[2] for e in open_eps if e[0] == len(batches)]
    assert rest["observation", "lane"][:, 0, 0].tolist() == open_lanes  # global lane order
    n_a = sum(1 for lane in open_lanes if lane < 2)

    def trim(rows):  # a slice of the flushed rows keeps the width of the longest of all
        return rows[:, : int(rows["collector", "mask"].sum(1).max())] if len(rows) else None

    check_rows([*out_a, trim(rest[:n_a])], [b[:2] for b in batches])
    check_rows([*out_b, trim(rest[n_a:])], [b[2:] for b in batches])


def test_trajectory_splitter_accepts_multistep_output():
    stream = random_stream(5, lanes=3, steps=60)
    ms = MultiStep(3, GAMMA)
    fed = [o for o in (ms(b) for b in split(stream, [10] * 6)) if o is not None]
    fed += [o for _, o in ms.flush()]
    ts = TrajectorySplitter()
    outputs = [ts(b) for b in fed] + [ts.flush()]
    check_rows(outputs, fed)
    rows = [o for o in outputs if o is not None]
    assert all(("next", "original_reward") in o.keys(True) for o in rows)
    assert all("steps_to_next_obs" in o for o in rows)
    whole = torch.cat(fed, 1)
    check_against_reference(whole, stream, 3, GAMMA)


def test_processors_copy_what_they_hold_when_the_caller_reuses_its_buffer():
    """A collector with return_same_td refills one buffer: held frames must be copies."""
    stream = random_stream(8, lanes=3, steps=48)
    buffer = stream[:, :8].clone()
    ms, ts = MultiStep(3, GAMMA), TrajectorySplitter()
    ms_out, ts_out = [], []
    for batch in split(stream, [8] * 6):
        buffer.update_(batch)
        out = ms(buffer)
        if out is not None:
            ms_out.append(out.clone())  # a consumer writes it out before the next batch
        ts_out.append(ts(buffer))
    ms_out += [o for _, o in ms.flush()]
    check_against_reference(torch.cat(ms_out, 1), stream, 3, GAMMA)
    check_rows([*ts_out, ts.flush()], split(stream, [8] * 6))


def test_split_trajectories_never_joins_lanes():
    """Pieces are per lane even when one lane ends and the next begins with the same id."""
    batch = make_stream(np.ones((2, 3)), np.zeros((2, 3)), [[4, 7, 7], [7, 7, 8]])
    out = split_trajectories(batch)
    assert out["collector", "traj_ids"].tolist() == [[4, -1], [7, 7], [7, 7], [8, -1]]
    assert out["observation", "lane"][:, 0, 0].tolist() == [0, 0, 1, 1]


def test_missing_keys_and_changed_keys_are_clear_errors():
    stream = random_stream(4, lanes=2, steps=10)
    with pytest.raises(CollectionError, match="'next/done'"):
        MultiStep(2, GAMMA)(stream.exclude(("next", "done")))
    with pytest.raises(CollectionError, match="'collector/traj_ids'"):
        TrajectorySplitter()(stream.exclude(("collector", "traj_ids")))
    with pytest.raises(CollectionError, match=r"\[lanes, time\]"):
        MultiStep(2, GAMMA)(stream[0])
    ts = TrajectorySplitter()
    ts(stream[:, :5])
    with pytest.raises(CollectionError, match="keys"):
        ts(stream[:, 5:].exclude("sample_log_prob"))
