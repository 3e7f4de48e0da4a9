"""Load a LeRobot dataset with LeRobot's own reader and print what it gives, as JSON.

Runs in the reader venv (``make .venv-lerobot/.installed``), not in the project's:
``python lerobot_reader.py ROOT --items 0,5,9 [--delta]``. Prints one JSON object:
``num_episodes``, ``num_frames``, ``fps``, ``features``, ``tasks``, ``episodes``
(each row of ``meta.episodes``), ``stats`` (feature -> stat names) and ``items``: for
each index, ``LeRobotDataset.__getitem__``'s values (tensors as ``{"shape", "values"}``;
images as ``{"shape", "uint8"}``: the float [0, 1] pixels times 255, rounded, base64).
``--delta`` loads it again with ``delta_timestamps`` (one frame back for observations,
one ahead for actions) and adds each item's ``*_is_pad`` flags as ``pads``.

torchvision stand-in: lerobot 0.4.4 imports torchvision, uses ``transforms.ToTensor``
for PNG images and ``torchvision.io.VideoReader`` for its ``pyav`` video backend. No
torchvision wheel on PyPI loads into the CPU build of torch (they link its CUDA
libraries), and the releases matching torch 2.13 no longer have ``VideoReader``
(removed after 0.25). Where torchvision cannot be imported, :func:`stand_in` puts in
``sys.modules`` a module with just those three names, written here over PyAV with
torchvision's documented behaviour (``VideoReader.seek(t, keyframes_only)`` then
frames as ``{"data": uint8 CxHxW, "pts": seconds}``). Everything else, the checks of
the files, the index, the timestamps and the choice of video frame by timestamp
(``decode_video_frames_torchvision``), is LeRobot's code.
"""

from __future__ import annotations

import argparse
import base64
import importlib.machinery
import json
import sys
import types


def stand_in() -> None:
    """The torchvision names LeRobot's dataset reader calls (see the module doc)."""
    import av
    import numpy as np
    import torch

    def package(name: str) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        sys.modules[name] = module
        return module

    root = package("torchvision")
    transforms, io = package("torchvision.transforms"), package("torchvision.io")
    root.transforms, root.io, root.__version__ = transforms, io, "stand-in"
    root.set_video_backend = lambda backend: None
    root.get_video_backend = lambda: "pyav"

    class ToTensor:
        """A PIL image as float32 CxHxW in [0, 1]."""

        def __call__(self, image):
            array = np.asarray(image)
            if array.ndim == 2:
                array = array[:, :, None]
            return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div(255)

    class VideoReader:
        """A video stream's frames through PyAV, from a seek point on."""

        def __init__(self, path: str, stream: str = "video"):
            self.container = av.open(path)
            self._stream = self.container.streams.video[0]
            self._frames = self.container.decode(self._stream)

        def seek(self, seconds: float, keyframes_only: bool = False):
            offset = int(seconds / self._stream.time_base)
            self.container.seek(
                offset, backward=True, any_frame=not keyframes_only, stream=self._stream
            )
            self._frames = self.container.decode(self._stream)
            return self

        def __iter__(self):
            return self

        def __next__(self):
            frame = next(self._frames)
            data = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
            return {"data": data, "pts": float(frame.pts * frame.time_base)}

    transforms.ToTensor = ToTensor
    io.VideoReader = VideoReader


def torchvision_or_stand_in() -> str:
    try:
        import torchvision

        torchvision.io.VideoReader  # noqa: B018  (absent from torchvision >= 0.26)
        return f"torchvision {torchvision.__version__}"
    except Exception:  # not importable here (CUDA-linked), or without VideoReader
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        stand_in()
        return "stand-in (torchvision cannot load here)"


def value(x, image: bool):
    import torch

    if isinstance(x, torch.Tensor):
        if image:
            pixels = (x.float() * 255).round().clamp(0, 255).to(torch.uint8)
            raw = pixels.permute(1, 2, 0).contiguous().numpy().tobytes()
            return {"shape": list(pixels.shape), "uint8": base64.b64encode(raw).decode()}
        return {"shape": list(x.shape), "values": x.reshape(-1).tolist()}
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--items", default="")
    parser.add_argument("--delta", action="store_true")
    args = parser.parse_args()
    reader = torchvision_or_stand_in()
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("rlcollect/export", root=args.root, video_backend="pyav")
    items = [int(i) for i in args.items.split(",") if i]
    cameras = set(ds.meta.camera_keys)
    features = ds.features.items()
    out = {
        "lerobot": lerobot.__version__,
        "torchvision": reader,
        "num_episodes": ds.num_episodes,
        "num_frames": ds.num_frames,
        "len": len(ds),
        "fps": ds.fps,
        "features": {k: {"dtype": f["dtype"], "shape": list(f["shape"])} for k, f in features},
        "camera_keys": sorted(cameras),
        "tasks": list(ds.meta.tasks.index),
        "episodes": [dict(row) for row in ds.meta.episodes],
        "stats": {k: sorted(v) for k, v in (ds.meta.stats or {}).items()},
        "items": {i: {k: value(v, k in cameras) for k, v in ds[i].items()} for i in items},
    }
    if args.delta:
        step = 1 / ds.fps
        deltas = {k: [-step, 0.0] for k in ds.features if k.startswith("observation")}
        deltas["action"] = [0.0, step]
        again = LeRobotDataset(
            "rlcollect/export", root=args.root, video_backend="pyav", delta_timestamps=deltas
        )
        out["pads"] = {
            i: {k: v.tolist() for k, v in again[i].items() if k.endswith("_is_pad")} for i in items
        }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
