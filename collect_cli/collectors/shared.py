"""Batch buffers in one file that several processes map: a worker and the main
process, or the main process and its writer process."""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import tempfile
from dataclasses import dataclass
from typing import Any

ALIGN = 64  # bytes: each leaf of a shared store starts on a cache line


@dataclass(frozen=True)
class SharedStores:
    """``count`` time-major batch buffers in one file mapped by every process that
    uses them: plain metadata, so sending it passes no file descriptor (passing
    those needs a helper thread in the sender, which a process forked without
    multiprocessing's after-fork hooks inherits broken). The file is on tmpfs
    where there is one with room for it (else in the temporary directory), and its
    space is allocated at once: a tmpfs that fills up later would kill a process
    touching the buffers (SIGBUS), here it fails with an error. The main process
    removes the file once the other processes have mapped it.
    """

    path: str
    batch_size: tuple[int, ...]
    leaves: tuple[tuple[tuple[str, ...], Any, tuple[int, ...], int], ...]  # key, dtype, shape, at
    count: int
    stride: int  # bytes from one buffer to the next

    @classmethod
    def create(cls, template, count: int) -> SharedStores:
        """Room for ``count`` buffers of ``template``'s keys, dtypes and shapes."""
        leaves, offset = [], 0
        for key, value in template.items(True, True):
            key = key if isinstance(key, tuple) else (key,)
            leaves.append((key, value.dtype, tuple(value.shape), offset))
            offset += -(-value.numel() * value.element_size() // ALIGN) * ALIGN
        shared = cls("", tuple(template.batch_size), tuple(leaves), count, max(ALIGN, offset))
        shm = "/dev/shm"
        if not os.path.isdir(shm) or _free_bytes(shm) < 2 * shared.size:
            shm = None
        fd, path = tempfile.mkstemp(prefix="rlcollect-batches-", dir=shm)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, shared.size)
        except OSError:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return dataclasses.replace(shared, path=path)

    @property
    def size(self) -> int:
        """Bytes of the file: all buffers."""
        return self.stride * self.count

    def map(self) -> list:
        """The buffers, as TensorDicts over this process's mapping of the file."""
        import torch
        from tensordict import TensorDict

        data = torch.from_file(self.path, shared=True, size=self.size, dtype=torch.uint8)
        # its pages mapped now, not while the first batches are collected (numpy: a
        # process forked after torch's threads ran must not wake them, they are gone)
        data.numpy()[:: mmap.PAGESIZE] = 0
        stores = []
        for k in range(self.count):
            at = k * self.stride
            tensors = {}
            for key, dtype, shape, offset in self.leaves:
                nbytes = torch.Size(shape).numel() * dtype.itemsize
                raw = data[at + offset : at + offset + nbytes]
                tensors[key] = raw.view(dtype).view(shape)
            stores.append(TensorDict(tensors, batch_size=self.batch_size))
        return stores

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _free_bytes(directory: str) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize
