"""The pictures of a LeRobot export: MP4 video (H.264 through ``libx264``, or AV1
through SVT-AV1's ``libsvtav1``), or PNG in the Parquet rows (``--images``)."""

from __future__ import annotations

import importlib
import io
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli.errors import UsageError

CHUNKS_SIZE = 1000  # files per chunk folder
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DEFAULT_CODEC = "h264"
# per --video-codec: the encoder, and its options. A key frame every 2 frames (quick
# random access), no B-frames where the encoder has them (frame i of a file shows at
# i / fps s either way: the timestamps are the frames' own). x264's veryfast preset:
# 1.28x its default's speed on Pong at the same size (2,542 vs 1,988 frames/s measured)
CODECS: dict[str, tuple[str, dict[str, str]]] = {
    "h264": ("libx264", {"crf": "18", "g": "2", "bf": "0", "preset": "veryfast"}),
    "av1": ("libsvtav1", {"crf": "30", "preset": "8", "g": "2"}),
}


def is_picture(shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """An observation exported as a picture (video or PNG): ``HxWx3`` uint8."""
    return np.dtype(dtype) == np.uint8 and len(shape) == 3 and shape[2] == 3


def check_pictures(pictures: list[tuple[int, ...]], images: bool, codec: str | None) -> list[str]:
    """The modules the pictures need (``pictures``: their shapes); a UsageError where
    ``--images``/``--video-codec`` do not fit the dataset or each other."""
    if codec is not None and codec not in CODECS:
        raise UsageError(f"unknown --video-codec {codec!r}: choose from {', '.join(CODECS)}")
    if images and codec is not None:
        raise UsageError("--images (PNG) and --video-codec (video) exclude each other: pass one")
    if not pictures:
        if images or codec is not None:
            used = "--images" if images else "--video-codec"
            raise UsageError(
                f"{used}: the dataset has no image observation (HxWx3 uint8) to store; leave it out"
            )
        return []
    codec = codec or DEFAULT_CODEC
    if codec == "av1" and any(s[0] % 2 or s[1] % 2 for s in pictures):
        raise UsageError(
            "--video-codec av1: SVT-AV1 holds 4:2:0 frames only, and an image here has "
            "an odd side: pass --video-codec h264 or --images"
        )
    return ["PIL.Image" if images else "av"]


def check_encoder(codec: str | None) -> None:
    """Exit 2 where this PyAV lacks the encoder ``codec`` needs."""
    codec = codec or DEFAULT_CODEC
    encoder = CODECS[codec][0]
    if encoder not in importlib.import_module("av").codecs_available:
        raise UsageError(
            f"this PyAV has no {encoder} encoder for --video-codec {codec}: pass another "
            "--video-codec or --images (PNG)"
        )


class Video:
    """One video feature's MP4 files at ``fps``: ``yuv420p`` (H.264: ``yuv444p`` where a
    side is odd, which 4:2:0 cannot hold); frame ``i`` of a file shows at ``i / fps`` s."""

    def __init__(self, av, root: Path, name: str, shape: tuple[int, ...], fps: int, codec: str):
        self.av, self.root, self.name, self.shape, self.fps = av, root, name, shape, fps
        self.codec = codec
        height, width = shape[:2]
        self.pix_fmt = "yuv420p" if height % 2 == 0 and width % 2 == 0 else "yuv444p"
        self.number, self.container, self.stream = 0, None, None
        self.frames = self.bytes = 0
        self.file_mb = 200

    @property
    def where(self) -> tuple[int, int]:
        return divmod(self.number, CHUNKS_SIZE)

    def add(self, frames: np.ndarray) -> None:
        if self.container is None:
            chunk, file = self.where
            named = VIDEO_PATH.format(video_key=self.name, chunk_index=chunk, file_index=file)
            path = self.root / named
            path.parent.mkdir(parents=True, exist_ok=True)
            encoder, options = CODECS[self.codec]
            self.container = self.av.open(str(path), "w")
            self.stream = self.container.add_stream(encoder, rate=self.fps)
            self.stream.height, self.stream.width = self.shape[:2]
            self.stream.pix_fmt = self.pix_fmt
            self.stream.time_base = Fraction(1, self.fps)
            self.stream.options = dict(options)
        for image in frames:
            frame = self.av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = self.frames
            self.frames += 1
            self._mux(self.stream.encode(frame))

    def _mux(self, packets) -> None:
        for packet in packets:
            self.bytes += packet.size
            self.container.mux(packet)

    def next(self, force: bool = False) -> None:
        """Close the file once it holds ``file_mb`` MiB (``force``: in any case)."""
        if self.container is not None and (force or self.bytes >= self.file_mb << 20):
            self._mux(self.stream.encode())
            self.container.close()
            self.container, self.number, self.frames, self.bytes = None, self.number + 1, 0, 0

    def info(self) -> dict[str, Any]:
        height, width = self.shape[:2]
        return {
            "video.height": height, "video.width": width, "video.codec": self.codec,
            "video.pix_fmt": self.pix_fmt, "video.is_depth_map": False, "video.fps": self.fps,
            "video.channels": 3, "has_audio": False,
        }  # fmt: skip


def png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()
