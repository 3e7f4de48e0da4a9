"""``rlcollect render`` and the report's clips, on real datasets, through the real CLI.

Datasets are collected once per module by ``rlcollect run`` (and, for recorded
simulator states, by ``collect_cli.record.Recorder``); videos are decoded with
PyAV and Pillow and compared with the recorded frames, or with frames the env
renders here from the recorded observations and states.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from collect_cli import dataformat as fmt
from collect_cli.dataset import open_dataset
from collect_cli.report import render, video
from tests.support.cli_runner import SUPPORT, run_cli

av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")
# a Pixels image is 32 x 32; episodes of 12 steps, 2 lanes: 4 complete, 2 cut
PIXELS = [
    "env=gym",
    "env.id=pixelenvs:Pixels-v0",
    "+env.kwargs.size=32",
    "+env.kwargs.length=12",
    "env.num_envs=2",
    "total_frames=60",
    "frames_per_batch=60",
]
# Pendulum episodes of 20 steps (the env's time limit), 2 lanes: 4 complete, 2 cut
PENDULUM = [
    "env=Pendulum",
    "+env.kwargs.max_episode_steps=20",
    "env.num_envs=2",
    "total_frames=100",
    "frames_per_batch=100",
    "seed=3",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("render")
    made = {}
    for name, args in (
        ("pixels", PIXELS),
        ("pendulum", PENDULUM),
        # the env's own 200-step episodes: report clips take one step in 2
        ("long", ["env=Pendulum", "env.num_envs=2", "total_frames=400", "frames_per_batch=400"]),
    ):
        res = run_cli("run", *args, f"out={root / name}.h5", "progress=none", cwd=root)
        assert res.code == 0, res.stderr
        made[name] = root / f"{name}.h5"
    return made


def rows_of(path: Path) -> fmt.Rows:
    return open_dataset(path).episodes()


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def recorded(path: Path, row: int, key: str = fmt.OBSERVATION) -> np.ndarray:
    """The episode's recorded values of ``key``, one per step (no padding in these)."""
    ds = open_dataset(path)
    rows = ds.episodes()
    lane, start, length = (int(rows[c][row]) for c in ("lane", "start", "length"))
    return np.asarray(ds.array(key)[lane, start : start + length])


def test_image_episode_to_mp4_has_its_length_in_frames_and_its_pixels(data, tmp_path):
    out = tmp_path / "ep.mp4"
    res = run_cli(
        "render",
        str(data["pixels"]),
        "--episode",
        "1",
        "--out",
        str(out),
        "--size",
        "64x64",
        "--no-overlay",
        cwd=tmp_path,
    )
    assert res.code == 0, res.stderr
    summary = json.loads(res.stdout)
    rows = rows_of(data["pixels"])
    assert summary["episode"] == 1 and summary["traj_id"] == int(rows["traj_id"][1])
    assert summary["frames"] == int(rows["length"][1]) == 12
    assert summary["source"] == "images" and summary["size"] == [64, 64]
    assert summary["format"] == "mp4" and summary["path"] == str(out)
    decoded = decode(out)
    assert len(decoded) == 12 and decoded[0].shape == (64, 64, 3)
    # twice the recorded size, pixels repeated (nearest neighbour): H.264 keeps them
    want = recorded(data["pixels"], 1).repeat(2, axis=1).repeat(2, axis=2)
    quality = [psnr(got, ref) for got, ref in zip(decoded, want, strict=True)]
    assert min(quality) >= 30, quality
    # each frame is its own step's, not a neighbour's: the square moves between steps
    assert psnr(decoded[0], want[0]) > psnr(decoded[0], want[-1]) + 3
    assert not list(tmp_path.glob(".ep.mp4*")), "a temporary or lock file was left behind"


def test_odd_sizes_pad_for_mp4_and_gif_has_the_overlay(data, tmp_path):
    res = run_cli(
        "render",
        str(data["pixels"]),
        "--worst",
        "--out",
        "odd.mp4",
        "--size",
        "63x47",
        cwd=tmp_path,
    )
    assert res.code == 0, res.stderr
    assert json.loads(res.stdout)["size"] == [64, 48]  # yuv420p: one pixel added, edge repeated
    assert decode(tmp_path / "odd.mp4")[0].shape == (48, 64, 3)
    res = run_cli(
        "render", str(data["pixels"]), "--worst", "--out", "ep.gif", "--fps", "10", cwd=tmp_path
    )
    assert res.code == 0, res.stderr
    summary = json.loads(res.stdout)
    rows = rows_of(data["pixels"])
    complete = np.flatnonzero(rows["complete"])
    assert summary["episode"] == int(complete[np.argmin(rows["return"][complete])])
    gif = Image.open(tmp_path / "ep.gif")
    assert gif.size == (32, 32) and gif.n_frames == summary["frames"] == 12
    assert gif.info["duration"] == 100  # 10 fps
    plain = recorded(data["pixels"], summary["episode"])
    first = np.asarray(gif.convert("RGB"))
    # the overlay: white text outlined in black over the top left corner
    top = np.abs(first[:10].astype(int) - plain[0][:10]).sum(axis=-1)
    assert (top > 100).sum() > 10


def reference_pendulum(obs: np.ndarray, actions: np.ndarray) -> list[np.ndarray]:
    """Pendulum drawn here from each observation (angle from cos/sin) and action."""
    render.headless_defaults()
    import gymnasium as gym

    env = gym.make("Pendulum-v1", render_mode="rgb_array")
    env.reset(seed=0)
    frames = []
    for o, a in zip(obs, actions, strict=True):
        env.unwrapped.state = np.array([np.arctan2(o[1], o[0]), o[2]])
        env.unwrapped.last_u = float(a[0])
        frames.append(env.unwrapped.render())
    env.close()
    return frames


def test_pendulum_renders_from_the_observation_and_best_is_the_highest_return(data, tmp_path):
    res = run_cli(
        "render", str(data["pendulum"]), "--best", "--out", "best.mp4", "--no-overlay", cwd=tmp_path
    )
    assert res.code == 0, res.stderr
    summary = json.loads(res.stdout)
    rows = rows_of(data["pendulum"])
    complete = np.flatnonzero(rows["complete"])
    assert len(complete) == 4 and (~rows["complete"]).sum() == 2
    best = int(complete[np.argmax(rows["return"][complete])])
    assert summary["episode"] == best and summary["complete"]
    assert summary["return"] == pytest.approx(float(rows["return"][best]))
    assert summary["source"] == "observation" and summary["frames"] == 20
    assert summary["size"] == [500, 500] and summary["fps"] == 30
    decoded = decode(tmp_path / "best.mp4")
    assert len(decoded) == 20
    want = reference_pendulum(
        recorded(data["pendulum"], best), recorded(data["pendulum"], best, fmt.ACTION)
    )
    quality = [psnr(got, ref) for got, ref in zip(decoded, want, strict=True)]
    assert min(quality) >= 30, quality
    assert psnr(decoded[0], want[0]) > psnr(decoded[0], want[10])  # in step order
    # a cut episode renders too, by its row; --size resizes what the env drew
    cut = int(np.flatnonzero(~rows["complete"])[0])
    res = run_cli(
        "render",
        str(data["pendulum"]),
        "--episode",
        str(cut),
        "--out",
        "cut.gif",
        "--size",
        "100x80",
        cwd=tmp_path,
    )
    assert res.code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["frames"] == int(rows["length"][cut]) and not summary["complete"]
    assert Image.open(tmp_path / "cut.gif").size == (100, 80)


def bad(cwd: Path, *args: str) -> str:
    """``rlcollect render ARGS`` must exit 2 with one line and write nothing."""
    before = sorted(p.name for p in cwd.iterdir())
    res = run_cli("render", *args, cwd=cwd)
    assert res.code == 2, (args, res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlcollect: error: "), res.stderr
    assert sorted(p.name for p in cwd.iterdir()) == before, args
    return lines[0]


def test_usage_errors_exit_2_with_one_line_and_write_nothing(data, tmp_path):
    ds = str(data["pendulum"])
    assert "out of range" in bad(tmp_path, ds, "--episode", "6", "--out", "a.mp4")
    assert "out of range" in bad(tmp_path, ds, "--episode", "-1", "--out", "a.mp4")
    assert "name one episode" in bad(tmp_path, ds, "--best", "--worst", "--out", "a.mp4")
    assert "name one episode" in bad(tmp_path, ds, "--episode", "0", "--best", "--out", "a.mp4")
    assert "name one episode" in bad(tmp_path, ds, "--out", "a.mp4")
    assert ".mp4 or a .gif" in bad(tmp_path, ds, "--best", "--out", "a.avi")
    assert "--size" in bad(tmp_path, ds, "--best", "--out", "a.mp4", "--size", "big")
    assert "--fps" in bad(tmp_path, ds, "--best", "--out", "a.mp4", "--fps", "0")
    assert "missing.h5" in bad(tmp_path, "missing.h5", "--best", "--out", "a.mp4")
    # --out the dataset itself (whatever its name), with or without --overwrite
    copy = tmp_path / "data.mp4"
    copy.write_bytes(data["pendulum"].read_bytes())
    said = bad(tmp_path, str(copy), "--best", "--out", str(copy), "--overwrite")
    assert "source dataset" in said
    assert bad(tmp_path, ds, "--best", "--out", ds)
    # an existing video: only with --overwrite, and only a video file
    first = run_cli("render", ds, "--episode", "0", "--out", "ep.mp4", cwd=tmp_path)
    assert first.code == 0, first.stderr
    made = (tmp_path / "ep.mp4").read_bytes()
    assert "already exists" in bad(tmp_path, ds, "--worst", "--out", "ep.mp4")
    assert (tmp_path / "ep.mp4").read_bytes() == made
    again = run_cli("render", ds, "--worst", "--out", "ep.mp4", "--overwrite", cwd=tmp_path)
    assert again.code == 0, again.stderr
    assert (tmp_path / "ep.mp4").read_bytes() != made
    (tmp_path / "notes.gif").write_text("my notes")
    assert "not replacing" in bad(tmp_path, ds, "--best", "--out", "notes.gif", "--overwrite")
    (tmp_path / "clip.mp4").mkdir()
    assert "not replacing" in bad(tmp_path, ds, "--best", "--out", "clip.mp4", "--overwrite")


def test_without_pyav_mp4_says_how_to_install_it(data, tmp_path):
    stub = tmp_path / "stub" / "av"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named av')\n")
    path = os.pathsep.join([str(stub.parent), str(SUPPORT)])
    work = tmp_path / "work"
    work.mkdir()
    res = run_cli(
        "render",
        str(data["pendulum"]),
        "--best",
        "--out",
        "a.mp4",
        cwd=work,
        env={"PYTHONPATH": path},
    )
    assert res.code == 2 and "pip install 'rlcollect[video]'" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not list(work.iterdir())


def gif_clips(page: str) -> list[tuple[str, Image.Image]]:
    """The clips section's (caption, GIF) pairs."""
    section = re.search(r'<section id="clips">(.*?)</section>', page, re.S)
    assert section, "no clips section"
    found = re.findall(
        r'<img alt="[^"]*" src="data:image/gif;base64,([^"]+)"><figcaption[^>]*>([^<]*)<',
        section.group(1),
    )
    return [(caption, Image.open(io.BytesIO(base64.b64decode(b64)))) for b64, caption in found]


def test_report_page_embeds_the_best_and_worst_episode_as_clips(data, tmp_path):
    out = tmp_path / "page.html"
    res = run_cli("report", str(data["long"]), "--out", str(out), cwd=tmp_path)
    assert res.code == 0, res.stderr
    page = out.read_text()
    clips = gif_clips(page)
    assert len(clips) == 2
    rows = rows_of(data["long"])
    complete = np.flatnonzero(rows["complete"])
    best = int(complete[np.argmax(rows["return"][complete])])
    worst = int(complete[np.argmin(rows["return"][complete])])
    for (caption, gif), which, row in zip(clips, ("best", "worst"), (best, worst), strict=True):
        assert caption.startswith(f"long.h5: {which} complete episode (row {row},"), caption
        # 200 steps: one in 2, so 100 frames, 160 pixels wide (Pendulum draws squares)
        assert "200 steps; 100 frames (one step in 2, from observation)" in caption
        assert gif.size == (render.CLIP_WIDTH, render.CLIP_WIDTH)
        assert gif.n_frames == 100
    assert len(page) < 1_000_000  # two clips keep the page small
    # the JSON numbers do not change
    res = run_cli("report", str(data["long"]), "--json", cwd=tmp_path)
    assert res.code == 0 and "clips" not in json.loads(res.stdout)[0]


def test_report_notes_what_it_cannot_render(tmp_path):
    # toy env: no images, no recorded state, an observation that is not a state
    ds = tmp_path / "toy.h5"
    res = run_cli(
        "run",
        "env=gym",
        "env.id=toyenvs:Counter-v0",
        "total_frames=40",
        "frames_per_batch=40",
        f"out={ds}",
        "progress=none",
        cwd=tmp_path,
    )
    assert res.code == 0, res.stderr
    res = run_cli("report", str(ds), "--out", "page.html", cwd=tmp_path)
    assert res.code == 0, res.stderr
    section = re.search(
        r'<section id="clips">(.*?)</section>', (tmp_path / "page.html").read_text(), re.S
    )
    assert section, "no clips section"
    assert "<img" not in section.group(1)
    assert "toy.h5: no clips (nothing to render in toyenvs:Counter-v0" in section.group(1)
    said = bad(tmp_path, str(ds), "--episode", "0", "--out", "toy.mp4")
    assert "nothing to render" in said or "no complete" in said


def collect(path: Path, *args: str) -> Path:
    res = run_cli("run", *args, f"out={path}", "env.num_envs=1", "progress=none", cwd=path.parent)
    assert res.code == 0, res.stderr
    return path


def test_recorded_classic_control_state_renders_as_state(tmp_path):
    ds = collect(tmp_path / "cart.h5", "env=CartPole", "record.state=true", "total_frames=100",
                 "frames_per_batch=100")  # fmt: skip
    res = run_cli("render", str(ds), "--worst", "--out", "cart.mp4", "--no-overlay", cwd=tmp_path)
    assert res.code == 0, res.stderr
    summary = json.loads(res.stdout)
    values = fmt.path((fmt.STATE, fmt.STATE_VALUES))
    assert summary["source"] == "state" and summary["keys"] == [values]
    decoded = decode(tmp_path / "cart.mp4")
    assert len(decoded) == summary["frames"] == summary["length"] > 1
    want = reference(ds, summary["episode"], "CartPole-v1", {}, lambda u, s: setattr(u, "state", s))
    assert min(psnr(g, w) for g, w in zip(decoded, want, strict=True)) >= 30


def reference(path: Path, row: int, env_id: str, kwargs: dict, put) -> list[np.ndarray]:
    """The episode drawn here: ``put(unwrapped, state)`` of each recorded ``state/...``
    (all leaves in order), or of the observation where none is recorded."""
    render.headless_defaults()
    import gymnasium as gym

    ds = open_dataset(path)
    seed = fmt.path((fmt.STATE, fmt.RESET_SEED))  # not drawn: which reset began the episode
    keys = sorted(k for k, _, _ in ds.describe() if k.split("/")[0] == fmt.STATE and k != seed)
    values = [recorded(path, row, key) for key in keys or [fmt.OBSERVATION]]
    env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    env.reset(seed=0)
    out = []
    for step in zip(*values, strict=True):
        put(env.unwrapped, *step)
        out.append(video.rgb(env.unwrapped.render()))
    env.close()
    return out


def mujoco_renders() -> bool:
    """Whether MuJoCo can render here (its package, and a GL: EGL or OSMesa)."""
    render.headless_defaults()
    try:
        import gymnasium as gym

        env = gym.make("HalfCheetah-v5", render_mode="rgb_array", width=16, height=16)
        env.reset(seed=0)
        env.render()
        env.close()
    except Exception:
        return False
    return True


def test_mujoco_renders_from_the_recorded_state_or_the_observation(tmp_path):
    if not mujoco_renders():
        pytest.skip("MuJoCo cannot render here (pip install 'rlcollect[mujoco]'; a GL: "
                    f"MUJOCO_GL={os.environ.get('MUJOCO_GL')})")  # fmt: skip
    cheetah = ("env=gym", "env.id=HalfCheetah-v5", "+env.kwargs.max_episode_steps=10",
               "total_frames=20", "frames_per_batch=20")  # fmt: skip
    size = {"width": 96, "height": 64}
    for name, state, source in (("state", "true", "state"), ("obs", "false", "observation")):
        ds = collect(tmp_path / f"{name}.h5", *cheetah, f"record.state={state}")
        res = run_cli("render", str(ds), "--best", "--out", f"{name}.mp4", "--size", "96x64",
                      "--no-overlay", cwd=tmp_path)  # fmt: skip
        assert res.code == 0, res.stderr
        summary = json.loads(res.stdout)
        assert summary["source"] == source and summary["size"] == [96, 64]
        assert summary["fps"] == 20 and summary["frames"] == summary["length"] == 10
        decoded = decode(tmp_path / f"{name}.mp4")
        assert len(decoded) == 10
        if state == "true":  # qpos, qvel as recorded
            want = reference(ds, summary["episode"], "HalfCheetah-v5", size,
                             lambda u, qpos, qvel: u.set_state(qpos, qvel))  # fmt: skip
        else:  # the observation is qpos[1:] and qvel: x at 0 (the camera follows the body)
            want = reference(ds, summary["episode"], "HalfCheetah-v5", size,
                             lambda u, o: u.set_state(np.r_[0.0, o[:8]], o[8:]))  # fmt: skip
        quality = [psnr(g, w) for g, w in zip(decoded, want, strict=True)]
        assert min(quality) >= 30, quality


def test_video_helpers():
    assert video.parse_size("320x240") == (320, 240) and video.parse_size(None) is None
    for text in ("320", "0x10", "axb", "1x2x3", "9000x10"):
        with pytest.raises(video.UsageError):
            video.parse_size(text)
    frame = np.arange(5 * 3 * 3, dtype=np.uint8).reshape(5, 3, 3)
    padded = video.even(frame)
    assert padded.shape == (6, 4, 3)
    np.testing.assert_array_equal(padded[:5, :3], frame)
    np.testing.assert_array_equal(padded[5, :3], frame[4])  # the edge repeated
    assert video.rgb(np.zeros((4, 6), np.uint8)).shape == (4, 6, 3)
    assert video.rgb(np.zeros((4, 6, 4), np.uint8)).shape == (4, 6, 3)
    assert render.viewable(np.zeros((3, 8, 10), np.uint8)).shape == (8, 10, 3)  # CxHxW
    rows = {
        "traj_id": np.arange(3),
        "return": np.array([1.0, 5.0, 9.0]),
        "complete": np.array([True, True, False]),
    }
    assert render.select(rows, None, True, False) == 1  # the cut row 2 is not ranked
    assert render.select(rows, None, False, True) == 0
    assert render.select(rows, 2, False, False) == 2
