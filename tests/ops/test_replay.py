"""``rlcollect validate --replay``: recorded transitions stepped again in the real env
find no mismatch in real runs, and locate each planted error by (lane, step)."""

from __future__ import annotations

import re
import shutil

import h5py
import numpy as np
import pytest

from collect_cli.ops.replay import REBUILD, replay
from tests.support.cli_runner import out_path, run_cli

# 2 lanes x 300 steps of 200-step Pendulum episodes: each lane ends one at step 199
PENDULUM = ("env=Pendulum", "env.num_envs=2", "total_frames=600", "frames_per_batch=300")


def collect(tmp_path, *overrides, name="src.h5"):
    out = tmp_path / name
    res = run_cli("run", *overrides, "progress=none", f"out={out}", cwd=tmp_path)
    assert res.code == 0, res.stderr
    return out


@pytest.mark.parametrize(
    "overrides",
    [
        (*PENDULUM, "writer=memmap"),
        (*PENDULUM, "collector=multisync", "policy=mlp", "policy.noise=gaussian"),
        ("env=CartPole", "env.num_envs=3", "total_frames=900", "split_trajs=true"),
        ("env=Acrobot", "env.num_envs=2", "total_frames=600"),
        ("env=MountainCar", "env.num_envs=2", "total_frames=600", "env.backend=native"),
        ("env=MountainCarContinuous", "env.num_envs=2", "total_frames=400"),
    ],
    ids=["pendulum-memmap", "pendulum-multisync-mlp-noise", "cartpole-split", "acrobot",
         "mountaincar-native", "mountaincar-continuous"],
)  # fmt: skip
def test_real_runs_replay_with_no_mismatch(tmp_path, overrides):
    backend = "memmap" if "writer=memmap" in overrides else "hdf5"
    out = collect(tmp_path, *overrides, name=out_path(tmp_path, backend, "src").name)
    res = run_cli("validate", str(out), "--replay", cwd=tmp_path)
    assert res.code == 0, res.stdout + res.stderr
    replayed = re.search(r"replayed (\d+) of (\d+) transitions in \S+: 0 mismatches", res.stdout)
    assert replayed and replayed[1] == replayed[2] and int(replayed[1]) >= 400, res.stdout


def planted(tmp_path, source, plant) -> str:
    """Replay's stdout for a copy of ``source`` with ``plant(h5py file)`` applied."""
    copy = tmp_path / f"planted-{plant.__name__}.h5"
    shutil.copy(source, copy)
    with h5py.File(copy, "r+") as f:
        plant(f)
    res = run_cli("validate", str(copy), "--replay", cwd=tmp_path)
    assert res.code == 1, res.stdout + res.stderr
    return res.stdout


def test_each_planted_error_is_caught_where_it_is(tmp_path):
    src = collect(tmp_path, *PENDULUM)

    def shifted(f):  # lane 1's next observations one step late
        nxt = f["next/observation"]
        nxt[1, 1:] = nxt[1, :-1]

    out = planted(tmp_path, src, shifted)  # inside an episode: the integrity check's
    assert "differs from the next frame's 'observation'" in out and "lane 1 step 1" in out
    assert "lane 0" not in out

    def reset_state_as_final(f):  # the next episode's first observation at an episode's end
        f["next/observation"][0, 199] = f["observation"][0, 200]

    out = planted(tmp_path, src, reset_state_as_final)
    assert "next_observation: 1 mismatches, at (lane 0, step 199)" in out

    def swapped_actions(f):
        actions = f["action"][:]
        f["action"][0], f["action"][1] = actions[1], actions[0]

    out = planted(tmp_path, src, swapped_actions)  # every frame of both lanes
    assert "next_observation: 600 mismatches, at (lane 0, step 0)" in out and "reward: " in out

    def one_reward(f):  # and its episode's return, so that only the env can tell
        f["next/reward"][1, 42] += 0.5
        row = np.flatnonzero(f["episodes/traj_id"][:] == f["collector/traj_ids"][1, 42])[0]
        f["episodes/return"][row] += 0.5

    out = planted(tmp_path, src, one_reward)
    assert "reward: 1 mismatches, at (lane 1, step 42)" in out
    assert "next_observation" not in out


def test_samples_and_unreplayable_envs(tmp_path):
    src = collect(tmp_path, *PENDULUM)
    assert replay(src, samples=50).replayed == 50
    assert replay(src, samples=50, seed=3).replayed == 50
    res = run_cli("validate", str(src), "--replay", "--samples", "0", cwd=tmp_path)
    assert res.code == 2 and "--samples N (N >= 1) goes with --replay" in res.stderr
    counter = collect(tmp_path, "env=gym", "env.id=toyenvs:Counter-v0", "total_frames=40",
                      name="counter.h5")  # fmt: skip
    res = run_cli("validate", str(counter), "--replay", cwd=tmp_path)
    assert res.code == 2, res.stdout + res.stderr
    line = res.stderr.strip().splitlines()
    assert len(line) == 1 and "cannot replay toyenvs:Counter-v0" in line[0]
    assert all(name in line[0] for name in REBUILD)


def test_replay_reads_the_float32_state_back_exactly_enough():
    """The rebuilt state's rounding stays inside the tolerances (Pendulum's angle
    from float32 cos/sin): the check the tolerance rests on."""
    angle = np.float64(2.0)
    obs = np.array([np.cos(angle), np.sin(angle), 0.5], np.float32)
    state = REBUILD["Pendulum-v1"](obs)
    assert abs(state[0] - angle) < 1e-6 and state[1] == pytest.approx(0.5)


def test_envpool_pendulum_is_replayed_against_gymnasium_and_differs(tmp_path):
    pytest.importorskip("envpool")
    out = collect(tmp_path, "env=Pendulum", "env.backend=envpool", "env.num_envs=8",
                  "total_frames=4000")  # fmt: skip
    res = run_cli("validate", str(out), "--replay", cwd=tmp_path)
    assert "replayed against gymnasium's dynamics" in res.stderr
    found = re.search(
        r"replayed 4000 of 4000 transitions in Pendulum-v1: (\d+) mismatches", res.stdout
    )
    assert res.code == 1 and found and 0 < int(found[1]) < 100, res.stdout  # about 0.5%
