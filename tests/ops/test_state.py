"""``record.state=true``: the simulator state beside each transition (classic control's
``unwrapped.state``, MuJoCo's full qpos and qvel), replayed by ``validate --replay``
and exported as D4RL's ``infos/qpos``; refused where the backend has no state."""

from __future__ import annotations

import re
import shutil

import h5py
import numpy as np
import pytest

from collect_cli import dataformat as fmt
from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent, assert_split_on_done
from tests.support.cli_runner import run_cli

STATE, NEXT_STATE = "state/values", "next/state/values"


def collect(tmp_path, *overrides, name="src.h5"):
    out = tmp_path / name
    res = run_cli("run", *overrides, "record.state=true", "progress=none", f"out={out}")
    assert res.code == 0, res.stderr
    return out


def replayed(path, *args, whole: bool = True) -> re.Match:
    """``validate --replay``'s 0-mismatch line (of every transition, where ``whole``)."""
    res = run_cli("validate", str(path), "--replay", *args)
    assert res.code == 0, res.stdout + res.stderr
    found = re.search(r"replayed (\d+) of (\d+) transitions in \S+: 0 mismatches", res.stdout)
    assert found and (found[1] == found[2] or not whole), res.stdout
    return found


@pytest.mark.parametrize("collector", ["sync", "multisync", "multiasync"])
def test_classic_control_state_is_the_observed_one_and_the_final_one(tmp_path, collector):
    overrides = ["env=CartPole", "env.num_envs=2", "total_frames=600", f"collector={collector}"]
    if collector != "sync":
        overrides.append("collector.workers=2")
    out = collect(tmp_path, *overrides)
    assert_consistent(out)
    assert assert_split_on_done(out) > 10
    ds = open_dataset(out)
    state, nxt = ds.array(STATE), ds.array(NEXT_STATE)
    obs, next_obs = ds.array(fmt.OBSERVATION), ds.array("next/observation")
    mask = ds.array(fmt.MASK).astype(bool)
    # CartPole's observation is its state: s_t and s_t+1 (the final one at an end)
    np.testing.assert_allclose(state[mask], obs[mask], atol=1e-6)
    np.testing.assert_allclose(nxt[mask], next_obs[mask], atol=1e-6)
    assert ds.meta["record_state"] is True
    replayed(out)


def test_pendulum_state_replays_and_a_planted_state_error_is_located(tmp_path):
    out = collect(tmp_path, "env=Pendulum", "env.num_envs=2", "total_frames=600")
    replayed(out)
    copy = tmp_path / "planted.h5"
    shutil.copy(out, copy)
    with h5py.File(copy, "r+") as f:
        f[STATE][1, 57, 1] += 0.5  # the angular velocity of one frame
    res = run_cli("validate", str(copy), "--replay")
    assert res.code == 1 and "(lane 1, step 57)" in res.stdout, res.stdout + res.stderr


def test_backends_without_state_refuse_it_with_one_line(tmp_path):
    for backend in ("native", "envpool"):
        if backend == "envpool":
            pytest.importorskip("envpool")
        out = tmp_path / f"{backend}.h5"
        args = ["env=Pendulum", f"env.backend={backend}", "record.state=true", f"out={out}"]
        res = run_cli("run", *args, "total_frames=200", "progress=none")
        assert res.code == 2 and not out.exists()
        assert f"env.backend={backend} exposes none" in res.stderr.strip().splitlines()[-1]


def test_halfcheetah_records_its_full_qpos_replays_and_exports_it(tmp_path):
    pytest.importorskip("mujoco")
    out = collect(tmp_path, "env=gym", "env.id=HalfCheetah-v5", "env.num_envs=2",
                  "total_frames=2000")  # fmt: skip
    ds = open_dataset(out)
    qpos, qvel = ds.array("state/qpos"), ds.array("state/qvel")
    obs = ds.array(fmt.OBSERVATION)
    assert qpos.shape[-1] == 9 and qvel.shape[-1] == 9
    np.testing.assert_allclose(obs[..., :8], qpos[..., 1:], atol=1e-6)  # x: not observed
    np.testing.assert_allclose(obs[..., 8:], qvel, atol=1e-6)
    assert np.abs(qpos[..., 0]).max() > 0.01  # the x position the observation drops
    replayed(out)
    d4rl = tmp_path / "hc.hdf5"
    assert run_cli("export", str(out), "--format", "d4rl", "--out", str(d4rl)).code == 0
    with h5py.File(d4rl) as f:
        assert f["infos/qpos"].shape == (2000, 9) and f["infos/next_qvel"].shape == (2000, 9)
        np.testing.assert_array_equal(f["infos/qpos"][:1000], qpos[0])  # lane, then time


def test_mujoco_replay_without_state_rebuilds_it_or_asks_for_it(tmp_path):
    pytest.importorskip("mujoco")
    cheetah = tmp_path / "cheetah.h5"
    res = run_cli("run", "env=gym", "env.id=HalfCheetah-v5", "total_frames=400",
                  f"out={cheetah}", "progress=none")  # fmt: skip
    assert res.code == 0, res.stderr
    replayed(cheetah)  # qpos[1:] and qvel are observed; x does not change the dynamics
    hopper = tmp_path / "hopper.h5"
    res = run_cli("run", "env=gym", "env.id=Hopper-v5", "total_frames=200", f"out={hopper}",
                  "progress=none")  # fmt: skip
    assert res.code == 0, res.stderr
    res = run_cli("validate", str(hopper), "--replay")
    assert res.code == 2 and "collect it with record.state=true" in res.stderr
    replayed(collect(tmp_path, "env=gym", "env.id=Hopper-v5", "total_frames=400", name="h.h5"))


def test_killed_resumed_and_merged_datasets_replay_with_no_mismatch(tmp_path):
    """A run killed with SIGKILL, resumed, then merged with another: the recorded
    states still replay every transition exactly."""
    import signal

    from tests.helpers import wait_for_frames
    from tests.support.cli_runner import start_run

    killed = tmp_path / "killed.h5"
    args = ["env=Pendulum", "env.num_envs=2", "record.state=true", "frames_per_batch=200"]
    proc = start_run([*args, "total_frames=-1", f"out={killed}", "progress=none"], tmp_path)
    wait_for_frames(killed, proc, minimum=600)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    res = run_cli(
        "run", *args, "total_frames=2000", f"out={killed}", "resume=true", "progress=none"
    )
    assert res.code == 0, res.stderr
    assert open_dataset(killed).meta["resumed"]
    replayed(killed, whole=False)  # 10,000 of them
    other = collect(tmp_path, "env=Pendulum", "env.num_envs=2", "total_frames=400", name="b.h5")
    merged = tmp_path / "merged.h5"
    assert run_cli("merge", str(killed), str(other), "--out", str(merged)).code == 0
    found = replayed(merged, whole=False)
    assert int(found[2]) == open_dataset(merged).meta["frames"]


def test_halfcheetah_rerendered_from_its_states_equals_what_collection_rendered(tmp_path):
    """The frames drawn from the recorded qpos/qvel are the env's frames of those states:
    the episode stepped again from its first recorded state with the recorded actions,
    drawn after each step, pixel for pixel (and within 30 dB of gymnasium's own frame,
    which lags one physics substep)."""
    import gymnasium as gym

    from collect_cli.report import render
    from tests.report.test_render import mujoco_renders

    if not mujoco_renders():
        pytest.skip("MuJoCo cannot render here (a GL: EGL or OSMesa)")
    out = collect(tmp_path, "env=gym", "env.id=HalfCheetah-v5", "env.num_envs=2",
                  "total_frames=60", "frames_per_batch=60")  # fmt: skip
    ds = open_dataset(out)
    rows = ds.episodes()
    how = render.plan(ds, size=(96, 64))
    with ds.reader() as read:
        ep = render.episode(ds, rows, 0, read)
        steps = np.arange(ep.length)
        again = list(render.frames(read, how, ep, steps, overlay=False))
    how.close()
    assert how.source == "state" and len(again) == ep.length == 30
    env = gym.make("HalfCheetah-v5", render_mode="rgb_array", width=96, height=64).unwrapped
    env.reset(seed=0)
    qpos, qvel, actions = (ds.array(k)[ep.lane] for k in ("state/qpos", "state/qvel", "action"))
    env.set_state(qpos[0], qvel[0])
    import mujoco

    seen, current = [env.render()], [env.render()]
    for t in range(ep.length - 1):  # what the env shows after each recorded step
        env.step(actions[t])
        seen.append(env.render())
        mujoco.mj_forward(env.model, env.data)  # body positions of the stepped qpos
        current.append(env.render())
    env.close()
    for t, (a, b) in enumerate(zip(again, current, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
    # gymnasium's own frame after a step draws the body positions MuJoCo computed at the
    # last substep's start (mj_step integrates qpos after them): one substep behind
    quality = [psnr(a, b) for a, b in zip(again[1:], seen[1:], strict=True)]
    assert min(quality) >= 30, quality


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    err = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if err == 0 else 10 * np.log10(255.0**2 / err)


def test_each_episode_records_the_seed_its_reset_took(tmp_path):
    """``state/reset_seed``: a fresh env reset with an episode's seed starts it from the
    recorded first observation; the seed holds over the whole episode."""
    import gymnasium as gym

    out = collect(tmp_path, "env=CartPole", "env.num_envs=2", "total_frames=600")
    ds = open_dataset(out)
    seeds, obs, rows = ds.array("state/reset_seed"), ds.array(fmt.OBSERVATION), ds.episodes()
    assert seeds.dtype == np.int64 and len(rows["traj_id"]) > 10
    env = gym.make("CartPole-v1")
    for lane, start, length in zip(rows["lane"], rows["start"], rows["length"], strict=True):
        mine = seeds[lane, start : start + length]
        assert (mine == mine[0]).all()
        first, _ = env.reset(seed=int(mine[0]))
        np.testing.assert_array_equal(first, obs[lane, start])
    assert len(np.unique(seeds[ds.array(fmt.MASK).astype(bool)])) == len(rows["traj_id"])
