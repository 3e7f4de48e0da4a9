"""An episode as video (``rlcollect render``) and the report's clips.

The clip of an episode has one frame per recorded step: the state ``s_t`` the
step's action was taken in, so exactly ``length`` frames (the final next state is
not shown). Its frames come from the first of:

1. ``images``: the recorded image observation (the first uint8 image leaf of the
   observation, or ``--key``; channels first or last, grey, a frame stack's last);
2. ``state``: the recorded simulator state (``record.state=true``): MuJoCo's
   ``state/qpos`` and ``state/qvel`` set with ``unwrapped.set_state``, classic
   control's ``state/values`` as ``unwrapped.state``, then ``render()``;
3. ``observation``: the state rebuilt from an observation that holds it (classic
   control; HalfCheetah's ``qpos[1:]`` and ``qvel``, x at 0: the camera follows).

2 and 3 are ``validate --replay``'s rules (:mod:`collect_cli.ops.replay`), reused.
The env of 2 and 3 is made from the dataset's ``env_id`` and ``env.kwargs`` with
``render_mode="rgb_array"`` (MuJoCo: ``width``/``height`` from ``--size``).
"""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from collect_cli import dataformat as fmt
from collect_cli.dataset import Dataset, open_dataset
from collect_cli.errors import DatasetError, UsageError
from collect_cli.ops.replay import MUJOCO_REBUILD, REBUILD
from collect_cli.ops.replay import state_setter as replay_setter
from collect_cli.ops.summary import episode_rows
from collect_cli.report import video

IMAGES, STATE, OBSERVATION = "images", "state", "observation"  # where frames come from
DEFAULT_FPS = 30  # image observations (an env made to render says its own render_fps)
BLOCK_STEPS = 64  # time steps read at once
CLIP_FRAMES = 100  # report clips: at most this many frames (every k-th step)...
CLIP_WIDTH = 160  # ...this many pixels wide
QPOS_KEY = fmt.path((fmt.STATE, fmt.QPOS))


def viewable(frame: np.ndarray) -> np.ndarray:
    """An image frame as a picture: HxW, HxWx3 or HxWx4 (channels first or last; a
    stack of frames shows its last one)."""
    while frame.ndim > 3:
        frame = frame[-1]
    if frame.ndim == 3 and frame.shape[-1] not in (1, 3, 4):
        # channels first (1 or 3), or a stack of grey frames (Atari's 4 x 84 x 84)
        frame = np.moveaxis(frame, 0, -1) if frame.shape[0] in (1, 3) else frame[-1]
    if frame.ndim == 3 and frame.shape[-1] == 1:
        frame = frame[..., 0]
    return frame


# -- which episode ---------------------------------------------------------------------
def one_selector(episode: int | None, best: bool, worst: bool) -> None:
    if (episode is not None) + best + worst != 1:
        raise UsageError(
            "name one episode: --episode K (a row of the episodes table), --best or --worst"
        )


def select(rows: fmt.Rows, episode: int | None, best: bool, worst: bool) -> int:
    """The row of the episodes table that ``--episode K`` / ``--best`` / ``--worst`` names."""
    one_selector(episode, best, worst)
    count = len(rows["traj_id"])
    if episode is not None:
        if not 0 <= episode < count:
            raise UsageError(
                f"--episode {episode} is out of range: the dataset has {count} episodes "
                f"(rows 0 to {count - 1})"
                if count
                else "the dataset holds no episode yet"
            )
        return episode
    complete = np.flatnonzero(rows["complete"])
    if not len(complete):
        raise UsageError("no complete episode to rank: name one with --episode K")
    returns = rows["return"][complete]
    return int(complete[np.argmax(returns) if best else np.argmin(returns)])


# -- where its frames come from ----------------------------------------------------------
@dataclass
class Plan:
    """How frames are made: ``keys`` read at each step, then ``draw`` (their values) -> frame."""

    source: str  # IMAGES | STATE | OBSERVATION
    keys: list[str]
    draw: Callable[[list[np.ndarray]], np.ndarray]
    fps: float = DEFAULT_FPS
    env: Any = None

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


def image_keys(meta: dict) -> list[str]:
    """The image leaves of the observation (``observation``, ``observation/<leaf>``)."""
    return [
        fmt.path((fmt.OBSERVATION, *key))
        for key, desc in fmt.described_leaves(meta.get("observation_space"))
        if desc.get("type") == "Box" and fmt.is_image(tuple(desc["shape"]), desc["dtype"])
    ]


def plan(ds: Dataset, key: str | None = None, size: tuple[int, int] | None = None) -> Plan:
    """Where the dataset's frames come from (the module's order), as a :class:`Plan`."""
    images = image_keys(ds.meta)
    if key is not None:
        full = key if key.split("/")[0] == fmt.OBSERVATION else f"{fmt.OBSERVATION}/{key}"
        if full not in images:
            shown = ", ".join(images) or "none"
            raise UsageError(f"--key {key!r} is not an image observation (image leaves: {shown})")
        images = [full]
    if images:
        return Plan(IMAGES, [images[0]], lambda v: video.rgb(viewable(np.asarray(v[0]))))
    env_id = str(ds.meta.get("env_id"))
    stored = {name for name, _, _ in ds.describe()}
    try:  # validate --replay's rules: the recorded state, else one the observation holds
        setter, state_keys = replay_setter(env_id, stored)
    except UsageError:
        raise UsageError(
            f"nothing to render in {env_id}: no image observation, no recorded simulator "
            "state (collect with record.state=true), and its observation does not hold its "
            f"state (it does for {', '.join((*REBUILD, *MUJOCO_REBUILD))})"
        ) from None
    mujoco = QPOS_KEY in state_keys or env_id.rpartition(":")[2] in MUJOCO_REBUILD
    env = make_env(ds.meta, size, mujoco=mujoco)
    # the state's keys, or the (Box) observation it is rebuilt from; a plain action too
    keys = [*(state_keys or [fmt.OBSERVATION]), *([fmt.ACTION] if fmt.ACTION in stored else [])]
    source = STATE if state_keys else OBSERVATION
    return Plan(source, keys, _drawer(env, setter, keys), _fps(env), env)


def _fps(env: Any) -> float:
    return float(env.metadata.get("render_fps") or DEFAULT_FPS)


def headless_defaults() -> None:
    """Rendering without a screen: pygame quiet and windowless; MuJoCo's GL backend
    (unless the user chose one): EGL where a GPU device is seen, else OSMesa."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # it prints to stdout
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        gpu = os.path.exists("/dev/nvidia0") or glob("/dev/dri/renderD*")
        os.environ.setdefault("MUJOCO_GL", "egl" if gpu else "osmesa")


def make_env(meta: dict, size: tuple[int, int] | None, mujoco: bool = False) -> Any:
    """The dataset's env (its id and ``env.kwargs``) rendering to arrays, reset once."""
    headless_defaults()
    import gymnasium as gym

    env_id = str(meta.get("env_id"))
    try:
        config = yaml.safe_load(meta.get("config") or "") or {}
    except yaml.YAMLError:
        config = {}
    env_cfg = config.get("env") if isinstance(config, dict) else None
    kwargs = dict((env_cfg.get("kwargs") or {}) if isinstance(env_cfg, dict) else {})
    kwargs.pop("max_episode_steps", None)
    if mujoco and size is not None:
        kwargs.update(width=size[0], height=size[1])
    try:
        env = gym.make(env_id, render_mode="rgb_array", **kwargs)
        env.reset(seed=0)
    except Exception as exc:
        raise UsageError(f"cannot make {env_id} to render it: {_one_line(exc)}") from None
    return env


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."


def _rendered(env: Any) -> np.ndarray:
    try:
        frame = env.unwrapped.render()
    except Exception as exc:
        hint = ""
        if "MUJOCO_GL" in os.environ:
            hint = (
                f" (MUJOCO_GL={os.environ['MUJOCO_GL']}: try egl with a GPU, or osmesa "
                "with libosmesa6 installed)"
            )
        raise UsageError(f"cannot render {env.spec.id} here: {_one_line(exc)}{hint}") from None
    if frame is None:
        raise UsageError(f"{env.spec.id} rendered nothing (render_mode rgb_array)")
    return video.rgb(np.asarray(frame))


def _drawer(env: Any, setter: Callable, keys: list[str]) -> Callable:
    """A frame from one step's values of ``keys``: the env put into its state by
    ``setter`` (Pendulum also draws the torque applied: ``last_u``), then rendered."""

    def draw(values: list[np.ndarray]) -> np.ndarray:
        step = {key: np.asarray(value) for key, value in zip(keys, values, strict=True)}
        unwrapped = env.unwrapped
        setter(unwrapped, step)
        action = step.get(fmt.ACTION, np.zeros(0, np.int64))
        if hasattr(unwrapped, "last_u") and action.dtype.kind == "f" and action.size:
            unwrapped.last_u = float(action.reshape(-1)[0])
        return _rendered(env)

    return draw


# -- an episode's frames -------------------------------------------------------------------
@dataclass
class Episode:
    row: int
    traj_id: int
    lane: int
    length: int
    ret: float
    complete: bool
    times: np.ndarray  # the lane's time index of each step (padding may sit inside)
    running: np.ndarray  # the return up to and including each step's reward


def episode(ds: Dataset, rows: fmt.Rows, row: int, read: Callable[[str], Any]) -> Episode:
    tid, lane = int(rows["traj_id"][row]), int(rows["lane"][row])
    start, length = int(rows["start"][row]), int(rows["length"][row])
    ends = fmt.lane_steps(ds.meta)
    end = int(ends[lane]) if lane < len(ends) else start + length
    ids = np.asarray(read(fmt.TRAJ)[lane, start:end]).reshape(-1)
    valid = np.asarray(read(fmt.MASK)[lane, start:end]).reshape(-1).astype(bool)
    times = np.flatnonzero((ids == tid) & valid)[:length] + start
    if len(times) < length:
        raise DatasetError(
            f"episode row {row} (traj {tid}) has {len(times)} frames on disk, its row says "
            f"{length}: `rlcollect validate {ds.path}` says what is wrong"
        )
    stored = {name for name, _, _ in ds.describe()}
    own = fmt.path(fmt.ORIGINAL_REWARD_KEY)
    reward_key = own if own in stored else fmt.path(fmt.REWARD_KEY)
    lo, hi = (int(times[0]), int(times[-1]) + 1) if length else (0, 0)
    rewards = np.asarray(read(reward_key)[lane, lo:hi], np.float64).reshape(-1)[times - lo]
    return Episode(
        row,
        tid,
        lane,
        length,
        float(rows["return"][row]),
        bool(rows["complete"][row]),
        times,
        np.cumsum(rewards),
    )


def frames(
    read: Callable[[str], Any],
    plan_: Plan,
    ep: Episode,
    steps: np.ndarray,
    size: tuple[int, int] | None = None,
    width: int | None = None,
    overlay: bool = True,
) -> Iterator[np.ndarray]:
    """The frames of the episode's ``steps`` (indices into it), ``HxWx3`` uint8, at
    ``size`` (or scaled to ``width``), with the step and running return written on."""
    for i in range(0, len(steps), BLOCK_STEPS):
        chunk = steps[i : i + BLOCK_STEPS]
        times = ep.times[chunk]
        lo, hi = int(times[0]), int(times[-1]) + 1
        blocks = [np.asarray(read(key)[ep.lane, lo:hi]) for key in plan_.keys]
        for step, t in zip(chunk.tolist(), (times - lo).tolist(), strict=True):
            frame = plan_.draw([b[t] for b in blocks])
            if size is None and width is not None:
                height = max(1, round(width * frame.shape[0] / frame.shape[1]))
                frame = video.resize(frame, (width, height))
            else:
                frame = video.resize(frame, size)
            yield video.overlay(frame, step, float(ep.running[step])) if overlay else frame


# -- rlcollect render ----------------------------------------------------------------------
def check_options(episode_row: int | None, best: bool, worst: bool, fps: float | None) -> None:
    """The options' own errors, before anything is opened."""
    if fps is not None and not 0 < fps <= 1000:
        raise UsageError(f"--fps {fps:g}: give frames per second, more than 0 and at most 1000")
    one_selector(episode_row, best, worst)


def render_video(
    path: Path,
    kind: str,
    *,
    episode_row: int | None = None,
    best: bool = False,
    worst: bool = False,
    size: tuple[int, int] | None = None,
    fps: float | None = None,
    overlay: bool = True,
    key: str | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """One episode of the dataset at ``path`` as a video file of ``kind`` (``mp4`` or
    ``gif``): its bytes, and the JSON-ready summary of what it holds."""
    check_options(episode_row, best, worst, fps)
    ds = open_dataset(path)
    rows = episode_rows(ds)
    row = select(rows, episode_row, best, worst)
    how = plan(ds, key, size)
    try:
        with ds.reader(by_lane=True) as read:
            ep = episode(ds, rows, row, read)
            made = frames(read, how, ep, np.arange(ep.length), size, overlay=overlay)
            data, count, shape = video.encode(kind, made, fps or how.fps)
    finally:
        how.close()
    if not count:
        raise DatasetError(f"episode row {row} has no frames: nothing to render")
    return data, {
        "format": kind,
        "episode": row,
        "traj_id": ep.traj_id,
        "lane": ep.lane,
        "length": ep.length,
        "return": ep.ret,
        "complete": ep.complete,
        "frames": count,
        "size": shape,
        "fps": float(fps or how.fps),
        "source": how.source,
        "keys": [k for k in how.keys if k != fmt.ACTION],
        "overlay": overlay,
    }


# -- the report's clips --------------------------------------------------------------------
def clip(ds: Dataset, rows: fmt.Rows, row: int, how: Plan) -> tuple[bytes, int, int]:
    """A report clip of one episode: a GIF of at most ``CLIP_FRAMES`` frames (every
    k-th step), ``CLIP_WIDTH`` wide; its bytes, frame count and k."""
    with ds.reader(by_lane=True) as read:
        ep = episode(ds, rows, row, read)
        every = max(1, math.ceil(ep.length / CLIP_FRAMES))
        made = frames(read, how, ep, np.arange(0, ep.length, every), width=CLIP_WIDTH)
        data, count, _ = video.encode_gif(made, min(how.fps, DEFAULT_FPS))
    return data, count, every


def dataset_clips(path: str, name: str) -> tuple[list[str], list[str]]:
    """The ``<figure>`` of the best and the worst complete episode of one dataset,
    and notes for what could not be shown."""
    ds = open_dataset(path)
    rows = episode_rows(ds)
    complete = np.flatnonzero(rows["complete"])
    if not len(complete) or not ds.meta.get("frames"):
        return [], [f"{name}: no complete episode to show"]
    picks = {"best": select(rows, None, True, False), "worst": select(rows, None, False, True)}
    how = plan(ds)
    figures = []
    try:
        for which, row in picks.items():
            if which == "worst" and row == picks["best"]:
                continue  # one complete episode: it is both
            data, count, every = clip(ds, rows, row, how)
            src = "data:image/gif;base64," + base64.b64encode(data).decode("ascii")
            steps = f"one step in {every}, " if every > 1 else ""
            caption = (
                f"{name}: {which} complete episode (row {row}, traj "
                f"{int(rows['traj_id'][row])}): return {float(rows['return'][row]):.4g}, "
                f"{int(rows['length'][row])} steps; {count} frames ({steps}from {how.source})"
            )
            figures.append(
                f'<figure style="margin:0"><img alt="{html.escape(caption)}" src="{src}">'
                f'<figcaption class="meta">{html.escape(caption)}</figcaption></figure>'
            )
    finally:
        how.close()
    return figures, []


def clips_html(stats: list[Any]) -> str:
    """The report's clips section body: each dataset's best and worst complete episode
    as an animated GIF, where its frames can be rendered (else a note)."""
    figures, notes = [], []
    for s in stats:
        try:
            found, said = dataset_clips(s.path, s.name)
        except Exception as exc:  # a clip never fails the report: it says why it is missing
            found, said = [], [f"{s.name}: no clips ({_one_line(exc)})"]
        figures += found
        notes += said
    if not figures and not notes:
        return ""
    lead = (
        '<p class="meta">The best and the worst complete episode of each dataset, one frame '
        f"per step (at most {CLIP_FRAMES}: every k-th step of longer ones), with the step and "
        "the return so far; <code>rlcollect render</code> writes a whole episode.</p>"
    )
    box = f'<div style="display:flex;flex-wrap:wrap;gap:1em">{"".join(figures)}</div>'
    said = "".join(f'<p class="meta">{html.escape(n)}</p>' for n in notes)
    return lead + (box if figures else "") + said
