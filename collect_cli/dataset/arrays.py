"""Leaf copies: a batch's leaves as ``[lanes, time, ...]`` numpy arrays, and copies
of the collectors' time-major views at the speed of the faster library."""

from __future__ import annotations

import math

import numpy as np
import torch
from tensordict import TensorDictBase

from collect_cli.dataformat import MASK_KEY
from collect_cli.dataset.episodes import TRACKED_KEYS


# durability D5 (docs/durability.md)
def leaf_items(batch: TensorDictBase) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """``(key tuple, numpy array)`` for every leaf of a batch, the mask last (a frame
    whose mask is on disk has all its other entries on disk too). Each array is
    ``[lanes, time, ...]``: C-contiguous (:func:`lane_major`) for the keys the
    episode tracker reads, a view of the batch (strided where the collector's buffer
    is time-major) for the others, which the backends copy piece by piece (HDF5:
    chunk by chunk, in cache; a whole transposed copy first cost ~25% of a native
    run's speed, measured)."""
    out = []
    for key, value in batch.items(True, True):
        key = key if isinstance(key, tuple) else (key,)
        value = value.detach().cpu()
        out.append((key, lane_major(value) if key in TRACKED_KEYS else value.numpy()))
    out.sort(key=lambda item: item[0] == MASK_KEY)
    return out


def lane_major(value: torch.Tensor) -> np.ndarray:
    """``value`` (``[lanes, time, ...]``) as a C-contiguous array (see :func:`contiguous`)."""
    return contiguous(value.numpy())


def _by_torch(array: np.ndarray) -> bool:
    """Whether torch copies ``array`` (``[lanes, time, ...]`` or a piece of it, not
    contiguous) faster than numpy. The collectors' buffers are time-major, so a
    batch's leaves are transposed views. Torch copies them 1.5-3x faster where a
    frame is small (under 16 KiB) and the array is not (32 KiB and more); numpy is
    faster for tiny arrays and for larger frames (measured: 3x on Pong's)."""
    # torch's wider unsigned ints have few kernels (copy_ may lack them)
    if not (array.dtype.kind in "bif" or array.dtype == np.uint8) or array.ndim < 2:
        return False
    size = array.itemsize
    return math.prod(array.shape[2:]) * size < 16 << 10 and array.size * size >= 32 << 10


def contiguous(array: np.ndarray) -> np.ndarray:
    """``array`` C-contiguous, copied if it is not."""
    if array.flags.c_contiguous:
        return array
    out = np.empty(array.shape, array.dtype)
    copy_into(out, array)
    return out


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``, for arrays of the same shape and dtype."""
    if not src.flags.c_contiguous and _by_torch(src):
        _torch_copy(dst, src)
    else:
        dst[...] = src


def _torch_copy(dst: np.ndarray, src: np.ndarray) -> None:
    a, b = torch.from_numpy(dst), torch.from_numpy(src)
    if math.prod(src.shape[2:]) == 1:  # [lanes, time, 1...]: torch's 2-d transpose is 2x faster
        a, b = a.view(a.shape[:2]), b.view(b.shape[:2])
    a.copy_(b)
