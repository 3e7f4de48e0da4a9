"""Image observations stored once (``writer.layout=compact``) and the plugin codecs.

Every test compares a compact dataset with the full one the same seed writes,
reopened from disk through rlcollect's readers (both backends), or checks what
a kill, a resume, a merge or an export makes of it.
"""

from __future__ import annotations

import os
import signal

import h5py
import numpy as np
import pytest

from collect_cli import dataformat as fmt
from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent, assert_split_on_done, wait_for_frames
from tests.support.cli_runner import SUPPORT, out_path, run_cli, start_run

# 16-pixel frames, episodes of 7 steps: they end inside the batches of 12 steps
PIXELS = (
    "env=gym",
    "env.id=pixelenvs:Pixels-v0",
    "+env.kwargs.size=16",
    "+env.kwargs.length=7",
    "env.num_envs=2",
    "frames_per_batch=24",
    "progress=none",
)


def run(tmp_path, backend, name, *overrides):
    out = out_path(tmp_path, backend, name)
    res = run_cli("run", *PIXELS, f"writer={backend}", *overrides, f"out={out}", cwd=tmp_path)
    assert res.code == 0, res.stderr
    return out


def logical(path) -> dict[str, np.ndarray]:
    ds = open_dataset(path)
    return {key: np.asarray(ds.array(key)) for key, _, _ in ds.describe()}


def assert_same_dataset(a, b) -> None:
    left, right = logical(a), logical(b)
    assert sorted(left) == sorted(right)
    for key in left:
        np.testing.assert_array_equal(left[key], right[key], err_msg=key)


def datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def stored(path) -> set[str]:
    return {key for key, _, _ in open_dataset(path).stored()}


def test_compact_and_full_layouts_give_the_same_logical_dataset(tmp_path, backend):
    full = run(tmp_path, backend, "full", "writer.layout=full", "total_frames=96")
    compact = run(tmp_path, backend, "compact", "total_frames=96")  # auto: images -> compact
    assert_consistent(compact)
    assert open_dataset(compact).meta[fmt.LAYOUT] == fmt.COMPACT
    assert open_dataset(full).meta[fmt.LAYOUT] == fmt.FULL
    assert "next/observation" not in stored(compact) and "final/observation" in stored(compact)
    assert_same_dataset(full, compact)
    # the whole dataset loaded as a TensorDict, too
    loaded = open_dataset(compact).load()
    np.testing.assert_array_equal(
        loaded["next", "observation"].numpy(), logical(full)["next/observation"]
    )
    # an episode's last step holds its true final frame, not the next episode's reset
    data = logical(compact)
    done = data["next/done"][..., 0] & data["collector/mask"]
    lanes, times = np.nonzero(done[:, :-1])
    assert len(lanes) >= 4
    final, reset = data["next/observation"][lanes, times], data["observation"][lanes, times + 1]
    assert all(not np.array_equal(f, r) for f, r in zip(final, reset, strict=True))
    # ...the frame the env showed: the square moved by at most one step from the last one
    assert (final != data["observation"][lanes, times]).any()


def test_plain_h5py_rebuilds_next_observation(tmp_path):
    """The rule docs/dataset.md gives for readers without rlcollect."""
    path = run(tmp_path, "hdf5", "ds", "total_frames=96")
    with h5py.File(path, "r") as f:
        obs, mask = f["observation"][:], f["collector/mask"][:]
        traj, done = f["collector/traj_ids"][:], f["next/done"][:, :, 0]
        lane, time, final = f["final/lane"][:], f["final/time"][:], f["final/observation"][:]
    nxt = np.zeros_like(obs)
    nxt[:, :-1] = obs[:, 1:]  # the lane's next frame...
    nxt[lane, time] = final  # ...except where the final/ table keeps the true one
    np.testing.assert_array_equal(nxt[mask], logical(path)["next/observation"][mask])
    assert ((traj[:, 1:] != traj[:, :-1]) | done[:, :-1])[mask[:, :-1]].any()


@pytest.mark.parametrize(
    ("codec", "level"),
    [("zstd", 1), ("zstd", 19), ("lz4", None), ("blosc2", 5), ("blosc2-zstd", 3), ("gzip", 9)],
)
def test_every_codec_round_trips_bit_exactly(tmp_path, codec, level):
    raw = run(tmp_path, "hdf5", "raw", "total_frames=48")
    extra = [f"writer.compression={codec}", "total_frames=48"]
    extra += [] if level is None else [f"writer.compression_level={level}"]
    packed = run(tmp_path, "hdf5", "packed", *extra)
    assert_consistent(packed)
    assert_same_dataset(raw, packed)
    codec_meta = open_dataset(packed).meta[fmt.CODEC]
    assert codec_meta["name"] == codec and codec_meta["level"] == (level if level else None)
    import hdf5plugin  # noqa: F401  (what other readers import, as `info` says)

    with h5py.File(packed, "r") as f:
        filters = f["observation"].id.get_create_plist()
        assert filters.get_filter(0)[0] == codec_meta["filter_id"]
        assert f["observation"].chunks[2:] == (16, 16, 3)  # whole frames in a chunk


def test_resume_after_sigkill_of_a_compact_run(tmp_path, backend):
    out = out_path(tmp_path, backend, "killed")
    args = [*PIXELS, f"writer={backend}", f"out={out}"]
    proc = start_run([*args, "total_frames=-1"], tmp_path)
    wait_for_frames(out, proc, minimum=200)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert assert_consistent(out)["status"] == "running"  # every next observation recoverable
    data = logical(out)
    ends = fmt.lane_steps(open_dataset(out).meta)
    last = [data["next/observation"][lane, n - 1] for lane, n in enumerate(ends)]
    assert all(frame.any() for frame in last)  # the cut trajectories' final frames are kept
    res = run_cli("run", *args, "total_frames=400", "resume=true", cwd=tmp_path)
    assert res.code == 0, res.stderr
    meta = assert_consistent(out)
    assert meta["status"] == "complete" and assert_split_on_done(out) == meta["episodes"]
    data = logical(out)
    mask = data["collector/mask"]
    assert data["next/observation"][mask].reshape(int(mask.sum()), -1).any(axis=1).all()


def test_merge_of_compact_shards_equals_the_merge_of_full_ones(tmp_path, backend):
    merged = {}
    for layout in ("full", "compact"):
        options = (f"writer.layout={layout}", "total_frames=48")
        shards = [run(tmp_path, backend, f"{layout}{s}", *options, f"seed={s}") for s in (1, 2)]
        merged[layout] = out_path(tmp_path, backend, f"merged-{layout}")
        shards = [str(s) for s in shards]
        res = run_cli("merge", *shards, "--out", str(merged[layout]), cwd=tmp_path)
        assert res.code == 0, res.stderr
        assert_consistent(merged[layout])
    assert_same_dataset(merged["full"], merged["compact"])


@pytest.mark.parametrize("form", ["d4rl", "minari"])
def test_export_of_compact_equals_export_of_full(tmp_path, backend, form):
    files = {}
    for layout in ("full", "compact"):
        source = run(tmp_path, backend, layout, f"writer.layout={layout}", "total_frames=96")
        dest = tmp_path / form / layout / "ns" / "px-v0"
        res = run_cli("export", str(source), "--format", form, "--out", str(dest), cwd=tmp_path)
        assert res.code == 0, res.stderr
        found = sorted(p for p in dest.parent.rglob("*") if p.suffix in (".h5", ".hdf5"))
        files[layout] = found or [dest]
    for a, b in zip(files["full"], files["compact"], strict=True):
        with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
            data = [n for n in datasets(fa) if not n.startswith("metadata/")]
            assert any("observation" in n for n in data)
            for name in data:
                np.testing.assert_array_equal(fa[name][()], fb[name][()], err_msg=name)


def test_pong_compact_and_full_are_the_same(tmp_path):
    pytest.importorskip("ale_py")
    datasets = []
    for layout in ("full", "compact"):
        out = tmp_path / f"pong-{layout}.h5"
        res = run_cli(
            "run",
            "env=gym",
            "env.id=ale_py:ALE/Pong-v5",
            "env.num_envs=2",
            "total_frames=40",
            "frames_per_batch=10",
            f"writer.layout={layout}",
            "writer.compression=zstd",
            "progress=none",
            f"out={out}",
            cwd=tmp_path,
        )
        assert res.code == 0, res.stderr
        datasets.append(out)
    assert open_dataset(datasets[1]).meta[fmt.LAYOUT] == fmt.COMPACT
    assert_same_dataset(*datasets)


@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        (["writer.compression=brotli"], "writer.compression"),
        (["writer.layout=sparse"], "writer.layout"),
        (["writer=memmap", "writer.layout=tight"], "writer.layout"),
        (["writer.compression=zstd", "writer.compression_level=23"], "out of range"),
        (["writer.compression=gzip", "writer.compression_level=-1"], "out of range"),
        (["writer.compression=lz4", "writer.compression_level=3"], "takes no level"),
        (["writer.layout=compact", "postproc=multistep"], "postproc=multistep"),
    ],
)
def test_codec_and_layout_usage_errors(tmp_path, overrides, text):
    out = tmp_path / "x.h5"
    res = run_cli("run", *PIXELS, "total_frames=24", *overrides, f"out={out}", cwd=tmp_path)
    assert res.code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], res.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_codec_without_its_plugin_is_a_usage_error(tmp_path):
    blocker = tmp_path / "noplugin"
    blocker.mkdir()
    (blocker / "hdf5plugin.py").write_text("raise ImportError('No module named hdf5plugin')\n")
    out = tmp_path / "out" / "x.h5"
    path = os.pathsep.join([str(blocker), str(SUPPORT), os.environ.get("PYTHONPATH", "")])
    res = run_cli(
        "run", *PIXELS, "total_frames=24", "writer.compression=zstd", f"out={out}",
        env={"PYTHONPATH": path}, cwd=tmp_path,
    )  # fmt: skip
    assert res.code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install hdf5plugin" in lines[0], res.stderr
    assert not out.parent.exists()


def test_the_rule_across_batches_with_padding_inside_a_trajectory():
    """A preempted worker's padding inside a trajectory, an episode end, a batch end:
    next/observation comes back as the collector gave it (pure dataformat rules)."""
    traj = np.array([[0, 0, -1, -1, 0, 1, 1]])
    mask = traj >= 0
    done = np.array([[0, 0, 0, 0, 1, 0, 0]], bool)
    obs = np.arange(7)[None, :] * 10  # frame t shows 10 t
    true_next = np.array([[10, 15, 0, 0, 45, 60, 65]])  # 15, 45, 65: what only the env saw
    lanes, times, values = [], [], []
    for t0, t1 in ((0, 4), (4, 7)):  # two batches
        lane, time = fmt.final_points(traj[:, t0:t1], mask[:, t0:t1], done[:, t0:t1])
        lanes += lane.tolist()
        times += (time + t0).tolist()
        values += true_next[lane, time + t0].tolist()
    assert list(zip(lanes, times, strict=True)) == [(0, 1), (0, 4), (0, 6)]
    ends = np.array([7])
    t_next, row = fmt.next_sources(traj, mask, np.array(lanes), np.array(times), ends)
    rebuilt = fmt.rebuild_next(obs, np.array(values), t_next, row)
    np.testing.assert_array_equal(rebuilt, true_next)
    # rows past the committed steps (a killed run's next batch) do not count
    t_next, row = fmt.next_sources(traj, mask, np.array(lanes), np.array(times), np.array([5]))
    assert row[0, 6] == -1 and row[0, 4] >= 0
