"""Values that cannot make a dataset (issue 61, item 7): NaN and infinity, integers
past int64, batches past memory, env and worker counts past a sane bound. Each is
refused by the real CLI with exit 2 and one line naming the key, before anything
is written, and (where the check needs no env) before any env is built."""

from __future__ import annotations

import pytest

from collect_cli import config_checks
from collect_cli.errors import ConfigError

PIXELS = "env.id=pixelenvs:Pixels-v0"  # 64x64x3 uint8 frames (tests/support/pixelenvs.py)


def refused(cli, tmp_path, *args: str):
    """Run ``rlcollect run ARGS`` in an empty ``tmp_path``; check that it was refused
    as bad usage with one line and left nothing there; that line."""
    assert not any(tmp_path.iterdir())
    res = cli("run", *args, f"out={tmp_path / 'bad.h5'}", "progress=none", cwd=tmp_path)
    assert res.code == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("rlcollect: error:")]
    assert len(errors) == 1, res.stderr
    assert "Traceback" not in res.stderr
    left = sorted(p.name for p in tmp_path.iterdir())  # no bad.h5, .bad.h5.*, data/
    assert left == [], left
    return errors[0]


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (("policy.noise=gaussian", "policy.noise_scale=nan"), "policy.noise_scale"),
        (("env=CartPole", "policy.noise=epsilon", "policy.epsilon=inf"), "policy.epsilon"),
        (("postproc=multistep", "postproc.gamma=nan"), "postproc.gamma"),
        (("collector=multisync", "collector.preemptive_threshold=-inf"), "preemptive_threshold"),
        (("writer.commit_interval=inf",), "writer.commit_interval"),
        (("dataset.ref_min_score=-inf", "dataset.ref_max_score=1"), "dataset.ref_min_score"),
        (("total_frames=1e19",), "total_frames"),
        (("seed=18446744073709551616",), "seed"),  # 2**64
        (("max_frames_per_traj=18446744073709551616",), "max_frames_per_traj"),
        (("init_random_frames=1e19",), "init_random_frames"),
        (("writer.chunk_frames=18446744073709551616",), "writer.chunk_frames"),
        (("frames_per_batch=1e12",), "frames_per_batch"),
        (("env.num_envs=100000",), "env.num_envs"),
        (("collector=multisync", "collector.workers=100000"), "collector.workers"),
    ],
)
def test_refused_before_anything_is_written(cli, tmp_path, args, key):
    line = refused(cli, tmp_path, "total_frames=1000", *args)
    assert f"{key}=" in line
    assert "must be" in line or "use" in line  # what the valid values are


@pytest.mark.parametrize(
    ("args", "key", "bound"),
    [
        (("env.num_envs=100000",), "env.num_envs", "at most 16384"),
        (("env.backend=native", "env.num_envs=100000000"), "env.num_envs", "at most 16777216"),
        (("collector=multisync", "collector.workers=100000"), "collector.workers", "at most"),
        (("frames_per_batch=1e12",), "frames_per_batch", "from 1 to 2147483648"),
    ],
)
def test_counts_refused_before_the_env_is_even_looked_up(cli, tmp_path, args, key, bound):
    """With an env id that does not exist, a run that looked the env up (let alone
    built it) would fail on the id: the count is refused first."""
    line = refused(cli, tmp_path, "env=gym", "env.id=NoSuchEnv-v0", *args)
    assert f"{key}=" in line and bound in line
    assert "NoSuchEnv" not in line


@pytest.mark.parametrize(
    "args",
    [
        ("env.num_envs=100000",),
        ("collector=multisync", "collector.workers=100000"),
        ("env.backend=native", "env.num_envs=100000000"),
    ],
)
def test_counts_refused_without_building_an_env(monkeypatch, tmp_path, args):
    """The same through the CLI in this process, with env construction replaced by a
    spy: the refusal comes from the config, and no env factory is ever asked for."""
    from typer.testing import CliRunner

    import collect_cli.envs
    import collect_cli.run
    from collect_cli.cli import app

    built = []
    monkeypatch.setattr(collect_cli.envs, "env_factory", lambda *a, **k: built.append(a))
    monkeypatch.setattr(collect_cli.run, "run", lambda *a, **k: built.append(a))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", *args, f"out={tmp_path / 'bad.h5'}", "progress=none"])
    assert res.exit_code == 2, res.output
    assert built == []
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("collector", ["sync", "multisync"])
def test_batch_past_memory_refused_before_its_buffers(cli, tmp_path, collector):
    """1e9 frames of a 64x64x3 image pass the count bound (2**31) but not memory: the
    collector refuses them once the env tells their size, before allocating any."""
    assert config_checks.MAX_FRAMES_PER_BATCH >= 10**9
    line = refused(
        cli, tmp_path, "env=gym", PIXELS, f"collector={collector}", "frames_per_batch=1e9"
    )
    assert "frames_per_batch=1000000000 needs more memory than is available" in line
    assert "use frames_per_batch from 1 to" in line


def test_large_integral_floats_still_accepted():
    from collect_cli import config

    s = config.load(config.compose(["total_frames=1e18", "frames_per_batch=1e6", "seed=-5"]))
    assert (s.total_frames, s.frames_per_batch, s.seed) == (10**18, 10**6, -5)


def test_memory_check_refuses_what_does_not_fit(monkeypatch):
    monkeypatch.setattr(config_checks, "available_memory", lambda: 1000)
    config_checks.check_batch_memory(10, 100, 50)  # 1000 bytes: fits
    with pytest.raises(ConfigError, match="from 1 to 25"):
        config_checks.check_batch_memory(10, 200, 50)  # 2 buffers of 50 x 2 lanes
    with pytest.raises(ConfigError, match=r"fewer env\.num_envs"):
        config_checks.check_batch_memory(10**6, 2, 1)
    monkeypatch.setattr(config_checks, "available_memory", lambda: None)  # not Linux
    config_checks.check_batch_memory(10**9, 10**9, 10**9)


def test_worker_bound_follows_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(config_checks, "cpus", lambda: 2)
    assert config_checks.max_workers() == 16
    monkeypatch.setattr(config_checks, "cpus", lambda: 64)
    assert config_checks.max_workers() == 256
