"""``rlcollect export --format lerobot``: LeRobot v3.0 datasets, loaded back by
LeRobot's own ``LeRobotDataset`` and compared with the native dataset's frames.

The reader runs in a venv of its own, ``.venv-lerobot`` (``make
.venv-lerobot/.installed``, a prerequisite of ``make test``; built here on first use
when missing, and these tests skip only when the package index cannot be reached):
lerobot 0.4.4, the last release for this Python, installed ``--no-deps`` with the
few packages its dataset reader imports, on the CPU build of torch 2.13. That is
outside lerobot's own pins (torch < 2.11, whose PyPI wheels are CUDA builds of
several GB, and torchvision < 0.26, which only loads beside those): the reader is
LeRobot's code running outside its torch pin. torchvision itself cannot load into
CPU torch from PyPI's wheels, so ``tests/support/lerobot_reader.py`` puts in the
three names LeRobot calls (``transforms.ToTensor``, ``set_video_backend``,
``io.VideoReader`` over PyAV, the ``pyav`` backend); the rest, the checks of the
files, the index, timestamps and episode bounds and the choice of video frame by
timestamp, is LeRobot's.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from collect_cli.ops import export_lerobot, lerobot_stats
from collect_cli.ops.export import export
from tests.ops.test_export import native_episodes
from tests.support.cli_runner import SUPPORT, run_cli

ROOT = Path(__file__).resolve().parents[2]
READER_VENV = ROOT / ".venv-lerobot"
READER = SUPPORT / "lerobot_reader.py"
OFFLINE = ("Could not find a version", "NewConnectionError", "Temporary failure", "Network")
# 2 lanes x 250 steps of Pendulum (200-step episodes): per lane one whole episode
# and one of 50 steps cut by the end of the run
PENDULUM = ("env=Pendulum", "env.num_envs=2", "total_frames=500", "frames_per_batch=250")
# 2 lanes x 115 steps of 64x64 RGB frames (50-step episodes): 2 whole and one cut a lane
PIXELS = ("env=gym", "env.id=pixelenvs:Pixels-v0", "env.num_envs=2", "total_frames=230")
PIXELS += ("frames_per_batch=230",)


def collect(folder: Path, *args: str) -> Path:
    out = folder / "src.h5"
    res = run_cli("run", *args, "progress=none", f"out={out}", cwd=folder)
    assert res.code == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    return collect(tmp_path_factory.mktemp("pendulum"), *PENDULUM)


@pytest.fixture(scope="module")
def pixels(tmp_path_factory) -> Path:
    return collect(tmp_path_factory.mktemp("pixels"), *PIXELS)


def frames_of(src: Path) -> dict[str, np.ndarray]:
    """The native dataset's frames in export order (lane, then time), read independently,
    with each episode's length and completeness."""
    episodes = native_episodes(src)
    keys = ("observation", "action", "next/reward")
    out = {k: np.concatenate([ep[k] for ep in episodes]) for k in keys}
    out["lengths"] = np.array([len(ep["action"]) for ep in episodes])
    out["complete"] = np.array([ep["complete"] for ep in episodes])
    return out


@pytest.fixture(scope="session")
def reader_python() -> Path:
    """The reader venv's python, built once (under a lock: test workers share it)."""
    python, stamp = READER_VENV / "bin" / "python", READER_VENV / ".installed"
    with open(Path(tempfile.gettempdir()) / "rlcollect-lerobot-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            res = subprocess.run(
                ["make", "-s", str(stamp.relative_to(ROOT))],
                cwd=ROOT, capture_output=True, text=True, timeout=1200,
            )  # fmt: skip
            said = (res.stdout + res.stderr)[-2000:]
            if res.returncode and any(word in said for word in OFFLINE):
                pytest.skip(f"LeRobot's reader venv cannot be built (no package index?): {said}")
            assert res.returncode == 0, said
    return python


def read(python: Path, dest: Path, items, tmp_path: Path, delta: bool = False) -> dict:
    """What LeRobot's ``LeRobotDataset(repo_id, root=dest)`` gives (lerobot_reader.py)."""
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    args = [str(python), str(READER), str(dest), "--items", ",".join(map(str, items))]
    res = subprocess.run(
        [*args, *(["--delta"] if delta else [])], capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def values(item: dict, key: str) -> np.ndarray:
    return np.array(item[key]["values"])


def pixels_of(item: dict, key: str) -> np.ndarray:
    """An image the reader returned, as HxWx3 uint8."""
    shape = item[key]["shape"]
    raw = np.frombuffer(base64.b64decode(item[key]["uint8"]), np.uint8)
    return raw.reshape(shape[1], shape[2], shape[0])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_lerobot_loads_every_frame_as_recorded(pendulum, reader_python, tmp_path):
    dest = tmp_path / "lerobot"
    res = run_cli("export", str(pendulum), "--format", "lerobot", "--out", str(dest))
    assert res.code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["episodes"] == 4 and summary["incomplete"] == "truncation"
    assert (summary["fps"], summary["fps_from"]) == (30, "env render_fps")  # Pendulum's
    native = frames_of(pendulum)
    n = len(native["action"])
    starts = np.cumsum(native["lengths"]) - native["lengths"]
    got = read(reader_python, dest, range(n), tmp_path, delta=False)
    assert (got["num_episodes"], got["num_frames"], got["len"], got["fps"]) == (4, n, n, 30)
    assert got["features"]["observation.state"] == {"dtype": "float32", "shape": [3]}
    assert got["features"]["action"] == {"dtype": "float32", "shape": [1]}
    assert got["tasks"] == ["Pendulum-v1"]
    rows = got["episodes"]
    assert [r["length"] for r in rows] == [200, 50, 200, 50]
    assert [r["dataset_from_index"] for r in rows] == starts.tolist()
    assert [r["rlcollect/complete"] for r in rows] == [True, False, True, False]
    assert {r["rlcollect/source"] for r in rows} == {0}
    assert set(got["stats"]["observation.state"]) >= {"min", "max", "mean", "std", "count", "q50"}
    items = [got["items"][str(i)] for i in range(n)]
    state = np.stack([values(it, "observation.state") for it in items])
    np.testing.assert_array_equal(state.astype(np.float32), native["observation"])
    np.testing.assert_array_equal(
        np.stack([values(it, "action") for it in items]).astype(np.float32), native["action"]
    )
    reward = np.array([values(it, "next.reward")[0] for it in items], np.float32)
    np.testing.assert_array_equal(reward, native["next/reward"][:, 0])
    episode = np.array([values(it, "episode_index")[0] for it in items])
    np.testing.assert_array_equal(episode, np.repeat(np.arange(4), native["lengths"]))
    frame = np.array([values(it, "frame_index")[0] for it in items])
    stamp = np.array([values(it, "timestamp")[0] for it in items])
    np.testing.assert_array_equal(frame, np.arange(n) - np.repeat(starts, native["lengths"]))
    np.testing.assert_allclose(stamp, frame / 30, atol=1e-5)
    flags = {f: np.array([values(it, f)[0] for it in items]) for f in export_lerobot.FLAGS}
    ends = np.zeros(n, bool)
    ends[starts + native["lengths"] - 1] = True
    np.testing.assert_array_equal(flags["next.done"], ends)  # each episode's last frame only
    cut = ends & np.repeat(~native["complete"], native["lengths"])
    np.testing.assert_array_equal(flags["next.truncated"], ends & (cut | ~flags["next.terminated"]))
    assert flags["next.truncated"][cut].all()  # the cut-episode rule
    assert all(it["task"] == "Pendulum-v1" for it in items[:3])


def test_lerobot_pads_across_episode_bounds(pendulum, reader_python, tmp_path):
    dest = tmp_path / "lerobot"
    export(pendulum, "lerobot", dest)
    firsts, lasts = [0, 200, 250], [199, 249, 499]
    got = read(reader_python, dest, [*firsts, *lasts, 100], tmp_path, delta=True)
    pads = got["pads"]
    for i in firsts:  # no frame before an episode's first
        assert pads[str(i)]["observation.state_is_pad"] == [True, False]
    for i in lasts:  # no action after an episode's last
        assert pads[str(i)]["action_is_pad"] == [False, True]
    assert pads["100"] == {f"{k}_is_pad": [False, False] for k in ("observation.state", "action")}


def image_items(native: dict) -> list[int]:
    """Frames to decode: every episode's first, second and last, and some between."""
    starts = np.cumsum(native["lengths"]) - native["lengths"]
    ends = starts + native["lengths"] - 1
    return sorted({*starts.tolist(), *(starts + 1).tolist(), *ends.tolist(), 17, 73, 140})


def test_lerobot_decodes_the_video_frames(pixels, reader_python, tmp_path):
    dest = tmp_path / "lerobot"
    res = run_cli("export", str(pixels), "-f", "lerobot", "-o", str(dest), cwd=tmp_path)
    assert res.code == 0, res.stderr
    native = frames_of(pixels)
    assert native["lengths"].tolist() == [50, 50, 15, 50, 50, 15]
    items = image_items(native)
    got = read(reader_python, dest, items, tmp_path)
    assert got["camera_keys"] == ["observation.image"]
    assert got["features"]["observation.image"] == {"dtype": "video", "shape": [64, 64, 3]}
    assert got["features"]["action"] == {"dtype": "int64", "shape": [1]}
    assert len(list((dest / "videos").rglob("*.mp4"))) == 1  # the episodes one after another
    worst = min(
        psnr(pixels_of(got["items"][str(i)], "observation.image"), native["observation"][i])
        for i in items
    )
    assert worst >= 35, worst
    for i in items:
        assert values(got["items"][str(i)], "action")[0] == native["action"][i]


def test_png_frames_read_exactly_from_split_files(pixels, reader_python, tmp_path, monkeypatch):
    dest = tmp_path / "lerobot"
    monkeypatch.setattr(export_lerobot, "DATA_FILE_MB", 0)  # a data file an episode
    monkeypatch.setattr(export_lerobot, "ROW_GROUP_BYTES", 1)
    export(pixels, "lerobot", dest, images=True)
    assert len(list((dest / "data").rglob("*.parquet"))) == 6
    assert not (dest / "videos").exists()
    native = frames_of(pixels)
    items = image_items(native)
    got = read(reader_python, dest, items, tmp_path)
    assert got["features"]["observation.image"] == {"dtype": "image", "shape": [64, 64, 3]}
    assert [r["data/file_index"] for r in got["episodes"]] == list(range(6))
    for i in items:
        np.testing.assert_array_equal(
            pixels_of(got["items"][str(i)], "observation.image"), native["observation"][i]
        )


def test_video_files_split_between_episodes(pixels, reader_python, tmp_path, monkeypatch):
    dest = tmp_path / "lerobot"
    monkeypatch.setattr(export_lerobot, "VIDEO_FILE_MB", 0)  # a video file an episode
    export(pixels, "lerobot", dest)
    videos = sorted((dest / "videos" / "observation.image" / "chunk-000").iterdir())
    assert [v.name for v in videos] == [f"file-{i:03d}.mp4" for i in range(6)]
    native = frames_of(pixels)
    items = image_items(native)
    got = read(reader_python, dest, items, tmp_path)
    rows = got["episodes"]
    assert [r["videos/observation.image/from_timestamp"] for r in rows] == [0.0] * 6
    worst = min(
        psnr(pixels_of(got["items"][str(i)], "observation.image"), native["observation"][i])
        for i in items
    )
    assert worst >= 35, worst


# -- the files, against what LeRobot's code requires (no reader) ------------------------


def test_files_hold_what_lerobot_reads(pendulum, tmp_path):
    dest = tmp_path / "lerobot"
    export(pendulum, "lerobot", dest, fps=15)
    info = json.loads((dest / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 15
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (4, 500, 1)
    assert info["splits"] == {"train": "0:4"} and info["video_path"] is None
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    names = list(info["features"])
    assert names[-5:] == ["timestamp", "frame_index", "episode_index", "index", "task_index"]
    table = pq.read_table(dest / "data" / "chunk-000" / "file-000.parquet")
    assert table.column_names == names  # every feature a column, in that order
    state = table.schema.field("observation.state").type  # datasets' List(float32, length=3)
    assert (state.list_size, str(state.value_type)) == (3, "float")
    assert str(table.schema.field("next.done").type) == "bool"
    frame = np.array(table["frame_index"])
    np.testing.assert_allclose(np.array(table["timestamp"]), frame / 15, atol=1e-6)
    np.testing.assert_array_equal(np.array(table["index"]), np.arange(500))
    tasks = pd.read_parquet(dest / "meta" / "tasks.parquet")
    assert tasks.loc["Pendulum-v1", "task_index"] == 0 and tasks.iloc[0].name == "Pendulum-v1"
    episodes = pq.read_table(dest / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    row = episodes.to_pylist()[1]
    assert (row["dataset_from_index"], row["dataset_to_index"], row["length"]) == (200, 250, 50)
    assert row["tasks"] == ["Pendulum-v1"] and row["stats/observation.state/count"] == [50]
    stats = json.loads((dest / "meta" / "stats.json").read_text())
    obs = np.array(frames_of(pendulum)["observation"], np.float64)
    np.testing.assert_allclose(stats["observation.state"]["mean"], obs.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["observation.state"]["std"], obs.std(0), rtol=1e-5)
    assert stats["observation.state"]["min"] == obs.min(0).tolist()
    assert stats["observation.state"]["count"] == [500]
    record = json.loads((dest / "meta" / "rlcollect.json").read_text())
    assert record["fps_from"] == "--fps" and record["sources"][0]["policy"] == "random"


def test_dict_observations_and_tuple_actions_become_a_feature_per_leaf(tmp_path):
    out = tmp_path / "nested.h5"
    args = ("env=gym", "env.id=toyenvs:Nested-v0", "env.num_envs=2", "total_frames=28")
    assert run_cli("run", *args, "progress=none", f"out={out}", cwd=tmp_path).code == 0
    dest = tmp_path / "lerobot"
    assert run_cli("export", str(out), "-f", "lerobot", "-o", str(dest), cwd=tmp_path).code == 0
    features = json.loads((dest / "meta" / "info.json").read_text())["features"]
    assert {"observation.pos", "observation.mode", "observation.flags"} <= set(features)
    assert {"action.0", "action.1", "action.2"} <= set(features)
    assert features["observation.pos"] == {"dtype": "float32", "shape": [2], "names": None}
    assert features["action.1"]["shape"] == [3]


def test_the_same_dataset_exports_the_same_frames(pixels, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    export(pixels, "lerobot", a)
    export(pixels, "lerobot", b)
    for name in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet"):
        assert pq.read_table(a / name).equals(pq.read_table(b / name))


def test_bad_requests_exit_2_and_leave_everything_as_it_was(pixels, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")

    def refused(*args: str, fmt="lerobot", env=None) -> str:
        res = run_cli("export", str(pixels), "--format", fmt, *args, cwd=tmp_path, env=env)
        assert res.code == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        return lines[0]

    assert "exists" in refused("--out", str(mine))
    assert "not a LeRobot dataset: not replacing it" in refused("--out", str(mine), "--overwrite")
    assert (mine / "notes.txt").read_text() == "keep me"
    assert "--fps 0" in refused("--out", str(tmp_path / "x"), "--fps", "0")
    assert "apply to --format lerobot only" in refused(
        "--out", str(tmp_path / "x"), "--images", fmt="hf"
    )
    blocker = tmp_path / "noav"
    blocker.mkdir()
    (blocker / "av.py").write_text("raise ImportError('No module named av')\n")
    env = {"PYTHONPATH": f"{blocker}:{SUPPORT}"}
    assert "pip install 'rlcollect[export]'" in refused("--out", str(tmp_path / "y"), env=env)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    done = tmp_path / "done"
    export(pixels, "lerobot", done, images=True)
    again = ("-f", "lerobot", "-o", str(done), "--overwrite", "--images")
    res = run_cli("export", str(pixels), *again, env=env)
    assert res.code == 0, res.stderr  # PNG needs no PyAV; an export replaces an export
    assert (done / "videos").exists() is False


def test_drop_incomplete_leaves_out_the_cut_episodes(pendulum, tmp_path):
    dest = tmp_path / "lerobot"
    result = export(pendulum, "lerobot", dest, drop_incomplete=True)
    assert (result.episodes, result.frames, result.incomplete) == (2, 400, "dropped")
    table = pq.read_table(dest / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    assert table["length"].to_pylist() == [200, 200]
    assert table["rlcollect/complete"].to_pylist() == [True, True]


def test_stats_match_numpy_over_the_frames_streamed_in_pieces():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(300, 4))
    moments = lerobot_stats.Moments(False, 300)
    for lo in range(0, 300, 70):  # blocks that end mid-episode
        moments.add(vectors[lo : lo + 70], np.arange(lo, min(300, lo + 70)))
    got = moments.result()
    np.testing.assert_allclose(got["mean"], vectors.mean(0))
    np.testing.assert_allclose(got["std"], vectors.std(0))
    np.testing.assert_array_equal(got["min"], vectors.min(0))
    np.testing.assert_allclose(got["q90"], np.quantile(vectors, 0.9, axis=0))
    assert got["count"].tolist() == [300]
    frames = rng.integers(0, 256, size=(30, 9, 7, 3), dtype=np.uint8)
    image = lerobot_stats.Moments(True, 30)
    image.add(frames[:11], np.arange(11))
    image.add(frames[11:], np.arange(11, 30))
    got, pixels = image.result(), frames.reshape(-1, 3) / 255.0
    assert got["mean"].shape == (3, 1, 1) and got["count"].tolist() == [30]
    for name, value in [("mean", pixels.mean(0)), ("std", pixels.std(0)), ("max", pixels.max(0))]:
        np.testing.assert_allclose(got[name].reshape(3), value, atol=1e-12)
    for q in lerobot_stats.QUANTILES:
        np.testing.assert_allclose(
            got[f"q{q:02d}"].reshape(3), np.quantile(pixels, q / 100, axis=0), atol=1e-12
        )
    totals = lerobot_stats.Totals()
    halves = [vectors[:100], vectors[100:]]
    for half in halves:
        part = lerobot_stats.Moments(False, len(half))
        part.add(half, np.arange(len(half)))
        totals.add("x", part.result())
    pooled = totals.result()["x"]
    np.testing.assert_allclose(pooled["mean"], vectors.mean(0))
    np.testing.assert_allclose(pooled["std"], vectors.std(0))
    assert pooled["count"] == [300]


# -- video codecs, bad requests, MiniGrid missions as tasks ------------------------------


def test_av1_videos_load_and_decode(pixels, reader_python, tmp_path):
    dest = tmp_path / "lerobot"
    args = ("-f", "lerobot", "-o", str(dest), "--video-codec", "av1")
    res = run_cli("export", str(pixels), *args, cwd=tmp_path)
    assert res.code == 0, res.stderr
    assert json.loads(res.stdout)["video_codec"] == "av1"
    info = json.loads((dest / "meta" / "info.json").read_text())
    video = info["features"]["observation.image"]["info"]
    assert (video["video.codec"], video["video.pix_fmt"]) == ("av1", "yuv420p")
    record = json.loads((dest / "meta" / "rlcollect.json").read_text())
    assert record["video"]["encoder"] == "libsvtav1"
    import av

    with av.open(str(next((dest / "videos").rglob("*.mp4")))) as container:
        assert container.streams.video[0].codec_context.name in ("libdav1d", "av1", "libaom-av1")
    native = frames_of(pixels)
    items = image_items(native)
    got = read(reader_python, dest, items, tmp_path)
    assert got["features"]["observation.image"] == {"dtype": "video", "shape": [64, 64, 3]}
    worst = min(
        psnr(pixels_of(got["items"][str(i)], "observation.image"), native["observation"][i])
        for i in items
    )
    assert worst >= 35, worst


def test_picture_options_need_pictures_and_an_encoder(pendulum, pixels, tmp_path):
    def refused(src: Path, *args: str, env=None) -> str:
        out = tmp_path / "out"
        res = run_cli("export", str(src), "-f", "lerobot", "-o", str(out), *args, env=env)
        assert res.code == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert not out.exists()  # nothing written
        return lines[0]

    assert "no image observation" in refused(pendulum, "--images")
    assert "no image observation" in refused(pendulum, "--video-codec", "av1")
    assert "exclude each other" in refused(pixels, "--images", "--video-codec", "h264")
    assert "unknown --video-codec 'vp9'" in refused(pixels, "--video-codec", "vp9")
    assert "apply to --format lerobot only" in refused(pixels, "--video-codec", "av1", "-f", "hf")
    blocker = tmp_path / "nosvt"
    blocker.mkdir()  # a PyAV without the SVT-AV1 encoder
    (blocker / "av.py").write_text("codecs_available = {'libx264', 'libdav1d'}\n")
    env = {"PYTHONPATH": f"{blocker}:{SUPPORT}"}
    said = refused(pixels, "--video-codec", "av1", env=env)
    assert "no libsvtav1 encoder for --video-codec av1" in said


# 2 lanes x 150 steps of MiniGrid's GoToDoor (a door's colour a mission, short episodes)
MINIGRID = ("env=gym", "env.id=minigrid:MiniGrid-GoToDoor-5x5-v0", "env.num_envs=2")
MINIGRID += ("total_frames=300", "frames_per_batch=150")


def test_minigrid_missions_become_tasks(reader_python, tmp_path):
    pytest.importorskip("minigrid")
    src = collect(tmp_path, *MINIGRID)
    dest = tmp_path / "lerobot"
    res = run_cli("export", str(src), "-f", "lerobot", "-o", str(dest), cwd=tmp_path)
    assert res.code == 0, res.stderr
    native = native_episodes(src)
    missions = [str(ep["observation/mission"][0]) for ep in native]
    first_seen = list(dict.fromkeys(missions))
    assert len(first_seen) >= 2  # the test needs more than one task
    assert json.loads(res.stdout)["tasks"] == len(first_seen)
    info = json.loads((dest / "meta" / "info.json").read_text())
    assert info["total_tasks"] == len(first_seen)
    lengths = np.array([len(ep["action"]) for ep in native])
    starts = np.cumsum(lengths) - lengths
    items = sorted({*starts.tolist(), *(starts + lengths - 1).tolist()})
    got = read(reader_python, dest, items, tmp_path)
    assert got["tasks"] == first_seen  # ds.meta.tasks, in task_index order
    assert [r["tasks"] for r in got["episodes"]] == [[m] for m in missions]
    episode_of = np.repeat(np.arange(len(native)), lengths)
    for i in items:
        item = got["items"][str(i)]
        assert item["task"] == missions[episode_of[i]]
        assert values(item, "task_index")[0] == first_seen.index(missions[episode_of[i]])
        # LeRobot loads the Text leaf too, as a string feature: the frame's own mission
        assert item["observation.mission"] == str(native[episode_of[i]]["observation/mission"][0])


# -- real envs: MuJoCo vectors, Atari frames --------------------------------------------


def test_halfcheetah_loads_exactly(reader_python, tmp_path):
    pytest.importorskip("mujoco")
    src = collect(tmp_path, "env=gym", "env.id=HalfCheetah-v5", "total_frames=60")
    dest = tmp_path / "lerobot"
    export(src, "lerobot", dest)
    native = frames_of(src)
    got = read(reader_python, dest, range(60), tmp_path)
    assert got["features"]["observation.state"]["shape"] == [17]
    items = [got["items"][str(i)] for i in range(60)]
    state = np.stack([values(it, "observation.state") for it in items]).astype(np.float32)
    np.testing.assert_array_equal(state, native["observation"][:60].astype(np.float32))
    action = np.stack([values(it, "action") for it in items]).astype(np.float32)
    np.testing.assert_array_equal(action, native["action"][:60].astype(np.float32))


def test_pong_frames_load_as_video_and_png(reader_python, tmp_path):
    pytest.importorskip("ale_py")
    src = collect(tmp_path, "env=gym", "env.id=ale_py:ALE/Pong-v5", "total_frames=40")
    native = frames_of(src)
    items = [0, 1, 17, 38, 39]
    export(src, "lerobot", tmp_path / "video")
    got = read(reader_python, tmp_path / "video", items, tmp_path)
    assert got["features"]["observation.image"] == {"dtype": "video", "shape": [210, 160, 3]}
    worst = min(
        psnr(pixels_of(got["items"][str(i)], "observation.image"), native["observation"][i])
        for i in items
    )
    print(f"Pong H.264 worst PSNR {worst:.1f} dB")
    assert worst >= 35, worst
    export(src, "lerobot", tmp_path / "png", images=True)
    got = read(reader_python, tmp_path / "png", items, tmp_path)
    for i in items:
        np.testing.assert_array_equal(
            pixels_of(got["items"][str(i)], "observation.image"), native["observation"][i]
        )
