"""Frames to a video file: resizing, the step/return overlay, and the encoders.

Frames are ``HxWx3`` uint8 RGB arrays. MP4 is H.264 (``libx264``, inside PyAV's
wheel; MPEG-4 part 2 where a build lacks it), ``yuv420p`` so that every player
opens it; that pixel format needs even sizes, so an odd width or height is padded
by one pixel (the edge repeated). GIF is written by Pillow, one palette a frame.
Both are encoded in memory: the caller writes the bytes atomically. Pillow and
PyAV are imported only here, on use: ``pip install 'rlcollect[video]'``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import numpy as np

from collect_cli.errors import UsageError

VIDEO_INSTALL = "pip install 'rlcollect[video]'"
FORMATS = {".mp4": "mp4", ".gif": "gif"}  # --out's suffix -> what is written
CRF = 18  # libx264's constant quality: visually lossless on rendered scenes
MAX_SIDE = 8192
MIN_FONT = 6


def require_pil():
    """Pillow's Image, ImageDraw and ImageFont modules, or the install hint as a usage error."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as exc:
        raise UsageError(f"rendering needs Pillow ({exc}): {VIDEO_INSTALL}") from None
    return Image, ImageDraw, ImageFont


def require_av():
    """The PyAV module (FFmpeg's libraries, bundled in its wheel), or the install hint."""
    try:
        import av
    except ImportError as exc:
        raise UsageError(f"writing MP4 needs PyAV ({exc}): {VIDEO_INSTALL}") from None
    return av


def video_format(out: Path) -> str:
    """``mp4`` or ``gif``, from ``out``'s suffix; anything else is a usage error."""
    kind = FORMATS.get(out.suffix.lower())
    if kind is None:
        raise UsageError(f"--out {str(out)!r}: name an .mp4 or a .gif file")
    return kind


def parse_size(text: str | None) -> tuple[int, int] | None:
    """``WxH`` as ``(width, height)`` pixels; None for None."""
    if text is None:
        return None
    parts = text.lower().split("x")
    try:
        width, height = (int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--size {text!r}: give WIDTHxHEIGHT in pixels, e.g. 320x240") from None
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise UsageError(f"--size {text!r}: each side from 1 to {MAX_SIDE} pixels")
    return width, height


def is_video(path: Path) -> bool:
    """A video file ``render`` could have written: an .mp4 (ISO media: ``ftyp`` at byte
    4) or a .gif (its signature), by suffix and content. What ``--overwrite`` may replace."""
    kind = FORMATS.get(path.suffix.lower())
    if kind is None or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return head[4:8] == b"ftyp" if kind == "mp4" else head[:6] in (b"GIF87a", b"GIF89a")


def rgb(frame: np.ndarray) -> np.ndarray:
    """An ``HxW``, ``HxWx1``, ``HxWx3`` or ``HxWx4`` uint8 frame as ``HxWx3`` (alpha dropped)."""
    if frame.ndim == 2:
        frame = frame[..., None]
    if frame.shape[-1] == 1:
        frame = np.repeat(frame, 3, axis=-1)
    return np.ascontiguousarray(frame[..., :3], np.uint8)


def resize(frame: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """``frame`` at ``size`` (width, height) by Pillow: nearest neighbour where both
    sides grow (pixel observations stay sharp), area averaging (``BOX``) otherwise."""
    if size is None or (frame.shape[1], frame.shape[0]) == tuple(size):
        return frame
    Image, _, _ = require_pil()
    grow = size[0] >= frame.shape[1] and size[1] >= frame.shape[0]
    how = Image.Resampling.NEAREST if grow else Image.Resampling.BOX
    return np.asarray(Image.fromarray(frame).resize(tuple(size), how))


def overlay(frame: np.ndarray, step: int, ret: float) -> np.ndarray:
    """``frame`` with ``step N`` and ``return R`` written at its top left (white,
    outlined in black, in Pillow's bundled font sized to the frame)."""
    Image, ImageDraw, ImageFont = require_pil()
    image = Image.fromarray(frame)
    lines = f"step {step}\nreturn {ret:.4g}"
    height, width = frame.shape[:2]
    size = max(MIN_FONT, min(height // 12, 20))
    while True:  # the largest font whose text fits the frame's width
        font = ImageFont.load_default(size=size)
        box = ImageDraw.Draw(image).multiline_textbbox((0, 0), lines, font=font, stroke_width=1)
        if box[2] + 4 <= width or size <= MIN_FONT:
            break
        size -= 1
    draw = ImageDraw.Draw(image)
    draw.multiline_text(
        (2, 1), lines, font=font, fill=(255, 255, 255), stroke_width=1, stroke_fill=(0, 0, 0)
    )
    return np.asarray(image)


def even(frame: np.ndarray) -> np.ndarray:
    """``frame`` padded to an even width and height (its last row/column repeated)."""
    pad_h, pad_w = frame.shape[0] % 2, frame.shape[1] % 2
    if not (pad_h or pad_w):
        return frame
    return np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def encode(kind: str, frames: Iterable[np.ndarray], fps: float) -> tuple[bytes, int, list[int]]:
    """The video file's bytes, its frame count and ``[width, height]``."""
    return (encode_mp4 if kind == "mp4" else encode_gif)(frames, fps)


def encode_mp4(frames: Iterable[np.ndarray], fps: float) -> tuple[bytes, int, list[int]]:
    """H.264 (or MPEG-4) in an MP4 container, ``yuv420p``, one frame per array."""
    av = require_av()
    buf = io.BytesIO()
    count, size = 0, [0, 0]
    with av.open(buf, mode="w", format="mp4") as container:
        stream = None
        for frame in frames:
            frame = even(frame)
            if stream is None:
                codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
                stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
                size = [frame.shape[1], frame.shape[0]]
                stream.width, stream.height = size
                stream.pix_fmt = "yuv420p"
                if codec == "libx264":
                    stream.options = {"crf": str(CRF)}
                else:
                    stream.bit_rate = max(200_000, math.prod(size) * 4 * int(fps))
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
            count += 1
        if stream is not None:
            for packet in stream.encode():
                container.mux(packet)
    return buf.getvalue(), count, size


def encode_gif(frames: Iterable[np.ndarray], fps: float) -> tuple[bytes, int, list[int]]:
    """An animated GIF looping forever (Pillow holds its frames: 1 byte a pixel each;
    identical consecutive frames become one, shown for their total time)."""
    Image, _, _ = require_pil()
    images = [Image.fromarray(f).quantize(256, method=Image.Quantize.MEDIANCUT) for f in frames]
    if not images:
        return b"", 0, [0, 0]
    buf = io.BytesIO()
    duration = max(20, round(1000 / fps))  # milliseconds; GIF keeps hundredths of a second
    images[0].save(
        buf, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0
    )
    # Pillow merges identical consecutive frames into one shown longer: count what it wrote
    return buf.getvalue(), Image.open(buf).n_frames, list(images[0].size)
