"""End to end: stream options of ``rlcollect run`` on every writer backend, datasets
reopened from disk and checked against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent, assert_split_on_done, wait_for_frames
from tests.support.cli_runner import out_path, start_run

COUNTER = ("env=gym", "env.id=toyenvs:Counter-v0", "env.num_envs=2", "progress=none")


def frames_of(ds, key):
    return ds.array(key).reshape(ds.meta["lanes"], ds.meta["steps"], -1)[..., 0]


@pytest.mark.parametrize(
    "options",
    [
        ("env=CartPole", "reset_at_each_iter=true"),
        ("env=CartPole", "reset_when_done=false"),
        ("env=CartPole", "policy=mlp", "init_random_frames=500", "policy.noise=epsilon"),
        ("policy=mlp", "policy.noise=gaussian", "exploration_type=mode"),
        ("env=gym", "env.id=toyenvs:Counter-v0", "+env.kwargs.length=30", "max_frames_per_traj=7"),
    ],
    ids=["reset_at_each_iter", "no_reset_when_done", "init_random", "mode", "max_frames"],
)
def test_rollout_options_give_sound_datasets(cli, tmp_path, backend, options):
    out = out_path(tmp_path, backend)
    res = cli(
        "run",
        *options,
        "total_frames=3000",
        "frames_per_batch=300",
        "env.num_envs=3",
        f"writer={backend}",
        f"out={out}",
        "progress=none",
    )
    assert res.code == 0, res.stderr
    meta = assert_consistent(out)
    assert meta["frames"] == res.summary["frames"] == 3000
    ep = open_dataset(out).episodes()
    if "reset_when_done=false" not in options:  # there a trajectory spans episodes
        assert assert_split_on_done(out) == len(ep["traj_id"])
    if "reset_at_each_iter=true" in options:
        # 10 batches of 100 steps per lane: each batch's last episode in a lane is cut
        # (flagged truncated: CartPole truncates at 500 steps), unless it ended there
        ds = open_dataset(out)
        done, trunc = ds.array("next/done")[..., 0], ds.array("next/truncated")[..., 0]
        assert done[:, 99::100].all()
        assert (~ep["complete"]).sum() == trunc[:, 99::100].sum() > 20
    if "reset_when_done=false" in options:
        assert len(ep["traj_id"]) == 3 and not ep["complete"].any()
    if "max_frames_per_traj=7" in options:
        assert (ep["length"][ep["complete"]] == 7).all() and ep["truncated"][ep["complete"]].all()


def test_info_keys_recorded(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli(
        "run", *COUNTER, "env.id=toyenvs:Info-v0", "env.info_keys=[x_position,terms]",
        "total_frames=40", "frames_per_batch=8", f"writer={backend}", f"out={out}",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    assert_consistent(out)
    ds = open_dataset(out)
    x = ds.array("info/x_position")
    assert np.array_equal(x, 0.5 * ds.array("next/observation")[..., 0])
    assert ds.array("info/terms").shape == (2, 20, 2)


def n_step(t: int, n: int, gamma: float, length: int = 5) -> tuple[float, int]:
    """Counter: reward of the step from t is t + 1; episodes have ``length`` steps."""
    m = min(n, length - t)
    return sum(gamma**j * (t + 1 + j) for j in range(m)), m


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_multistep_exact_across_batches(cli, tmp_path, backend, n):
    out = out_path(tmp_path, backend)
    gamma = 0.5
    res = cli(
        "run", *COUNTER, "postproc=multistep", f"postproc.n={n}", f"postproc.gamma={gamma}",
        "total_frames=46", "frames_per_batch=6", f"writer={backend}", f"out={out}",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    meta = assert_consistent(out)
    assert meta["frames"] == 48 and meta["postproc"] == {"name": "multistep", "n": n, "gamma": 0.5}
    ds = open_dataset(out)
    obs = frames_of(ds, "observation").astype(int)  # the step index t inside its episode
    assert (obs == np.arange(24) % 5).all()  # 3 steps per batch: windows cross batches
    want = np.array([[n_step(t, n, gamma) for t in lane] for lane in obs])
    reward = frames_of(ds, "next/reward")
    steps_to = frames_of(ds, "steps_to_next_obs")
    # the last frames of each lane only see the steps that exist when the run ends
    ok = np.arange(24) + want[..., 1] <= 24
    assert np.allclose(reward[ok], want[..., 0][ok])
    assert (steps_to[ok] == want[..., 1][ok]).all()
    assert (frames_of(ds, "next/observation")[ok] == (obs + steps_to)[ok]).all()
    # the end of the run cuts each lane's last episode: the frames whose window ends
    # at the last frame carry its next/done and next/truncated
    ended, cut = obs + steps_to == 5, np.arange(24) + steps_to == 24
    assert (frames_of(ds, "next/done")[ok] == (ended | cut)[ok]).all()
    assert (frames_of(ds, "next/truncated")[ok] == (cut & ~ended)[ok]).all()
    assert assert_split_on_done(out) == meta["episodes"]
    assert np.array_equal(frames_of(ds, "next/original_reward"), obs + 1.0)
    ep = ds.episodes()
    assert np.allclose(ep["return"][ep["complete"]], 15.0)  # 1 + 2 + 3 + 4 + 5


def episode_frames(ds, key):
    """{traj_id: the episode's frames of ``key``} from the episodes table."""
    data = ds.array(key)
    ep = ds.episodes()
    return {
        int(tid): data[lane, start : start + length]
        for tid, lane, start, length in zip(
            ep["traj_id"], ep["lane"], ep["start"], ep["length"], strict=True
        )
    }


def test_split_trajs_rows_equal_the_lanes_episodes(cli, tmp_path, backend):
    common = ("env=CartPole", "env.num_envs=3", "total_frames=1500", "frames_per_batch=150",
              "seed=4", f"writer={backend}", "progress=none")  # fmt: skip
    lanes_out, rows_out = out_path(tmp_path, backend, "lanes"), out_path(tmp_path, backend, "rows")
    assert cli("run", *common, f"out={lanes_out}").code == 0
    res = cli("run", *common, "split_trajs=true", f"out={rows_out}")
    assert res.code == 0, res.stderr
    meta = assert_consistent(rows_out)
    lanes_meta = assert_consistent(lanes_out)
    assert meta["frames"] == lanes_meta["frames"] == 1500
    assert meta["episodes"] == lanes_meta["episodes"] == meta["lanes"]
    rows, lanes = open_dataset(rows_out), open_dataset(lanes_out)
    ep = rows.episodes()
    assert (ep["lane"] == np.arange(meta["lanes"])).all() and (ep["start"] == 0).all()
    mask = rows.array("collector/mask")
    assert (mask.sum(axis=1) == ep["length"]).all()
    traj = rows.array("collector/traj_ids")
    assert ((traj == ep["traj_id"][:, None]) == mask).all() and (traj[~mask] == -1).all()
    assert not ep["complete"][-3:].any() and ep["complete"][:-3].all()  # cut ones last
    for key in ("observation", "action", "next/reward", "next/observation", "next/terminated"):
        want, got = episode_frames(lanes, key), episode_frames(rows, key)
        assert want.keys() == got.keys()
        for tid, frames in want.items():
            assert np.array_equal(got[tid], frames), (key, tid)


def test_split_trajs_with_multistep(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    res = cli(
        "run", *COUNTER, "split_trajs=true", "postproc=multistep", "postproc.n=2",
        "postproc.gamma=1.0", "total_frames=42", "frames_per_batch=6", f"writer={backend}",
        f"out={out}",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    meta = assert_consistent(out)
    ds = open_dataset(out)
    ep = ds.episodes()
    full = ep["complete"]
    assert full.sum() == 8 and (ep["length"][full] == 5).all()
    reward = ds.array("next/reward")[..., 0][full][:, :5]
    assert np.array_equal(reward, np.tile([3.0, 5.0, 7.0, 9.0, 5.0], (8, 1)))
    assert meta["frames"] == 42


def test_split_trajs_interrupt_and_resume(cli, tmp_path, backend):
    out = out_path(tmp_path, backend)
    args = ["env=CartPole", "split_trajs=true", "frames_per_batch=400", f"writer={backend}",
            f"out={out}", "progress=none"]  # fmt: skip
    proc = start_run([*args, "total_frames=-1"], tmp_path)
    wait_for_frames(out, proc, minimum=2000)
    proc.send_signal(2)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    before = assert_consistent(out)
    assert before["status"] == "interrupted"
    target = before["frames"] + 3000
    res = cli("run", *args, f"total_frames={target}", "resume=true")
    assert res.code == 0, res.stderr
    meta = assert_consistent(out)
    assert meta["status"] == "complete" and meta["frames"] >= target
    ep = open_dataset(out).episodes()
    assert len(np.unique(ep["traj_id"])) == len(ep["traj_id"]) == meta["lanes"]
