"""Filesystem steps the writers and the tools share: atomic swaps and renames, the
kernel's write-back, space reserved ahead, and publishing a built output."""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import shutil
from pathlib import Path
from typing import Any

from collect_cli.dataset.ownership import Identity, identity, remove_output
from collect_cli.errors import OutputError


# durability D10 (docs/durability.md)
def exchange(a: Path, b: Path) -> None:
    """Atomically swap two directories (Linux ``renameat2(RENAME_EXCHANGE)``).

    Where the kernel or filesystem lacks it, falls back to two renames (a crash
    between them leaves the dataset under ``<path>.resize``).
    """
    if swap(a, b):
        return
    parked = b.with_name(b.name + ".old")
    os.rename(b, parked)
    os.rename(a, b)
    os.rename(parked, a)


def swap(a: Path, b: Path) -> bool:
    """Atomically swap the names ``a`` and ``b`` (``renameat2(RENAME_EXCHANGE)``);
    False where the kernel or filesystem lacks it (nothing was done)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        raise OSError(err, os.strerror(err), str(b))
    return False


@functools.cache
def _renameat2() -> Any:
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def start_write_back(fd: int) -> None:
    """Start writing the file's dirty pages to the device, without waiting for them
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``); a no-op where it is missing:
    the fsync at close then writes them all."""
    sync_file_range = _sync_file_range()
    if sync_file_range is not None and sync_file_range(fd, 0, 0, 2) != 0:  # 2: ..._WRITE
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ESPIPE):
            raise OSError(err, os.strerror(err))


def drop_behind(fd: int, start: int, end: int) -> None:
    """Drop the file's cached pages inside bytes ``start...end`` from the OS's page
    cache where they are already on the device (``posix_fadvise(DONTNEED)``: dirty
    pages stay, nothing is lost). For data written once, once its write-back had time
    to finish: a long run then keeps only its last batches in the page cache, not
    the whole dataset (no other file's pages are evicted for it), and the kernel
    recycles those pages for the next batches instead of taking new ones, which
    costs more than the write itself on some VMs (docs/performance.md). A page that
    is written again later (HDF5's metadata among the chunks) is read back once.
    A no-op where there is no ``posix_fadvise``."""
    page = mmap.PAGESIZE
    start, end = -(-start // page) * page, end // page * page
    if end > start and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)


@functools.cache
def _sync_file_range() -> Any:
    """libc's ``sync_file_range``, or None where there is none."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


def fsync_tree(path: Path) -> None:
    """Flush a file, or every file under a directory, to the device."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


RESERVE_SLACK = 4 << 20  # bytes reserved beyond an output's estimate: metadata, headers


# durability D9 (docs/durability.md)
def reserve(path: Path, nbytes: int) -> None:
    """Allocate real blocks for ``nbytes`` (plus slack) of the file at ``path``, which
    a storage library is writing, so that a full disk fails here, with nothing half
    written, not inside HDF5 (which cannot recover from a failed write) or as a SIGBUS
    in a mapping. HDF5 cuts the file to what it used when it closes."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes + nbytes // 100 + RESERVE_SLACK)
    finally:
        os.close(fd)


def need_space(folder: Path, nbytes: int) -> None:
    """An ENOSPC ``OSError`` where ``folder``'s filesystem has less than ``nbytes``
    (plus slack) free: the check where a library writes the files (Minari)."""
    free = shutil.disk_usage(folder).free
    if free < nbytes + nbytes // 100 + RESERVE_SLACK:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device (about {_mib(nbytes)} needed, {_mib(free)} free)",
        )


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


# durability D14, D19 (docs/durability.md)
def publish(tmp: Path, dest: Path, replaces: Identity | None, sync: bool = True) -> None:
    """Move what was built at ``tmp`` (beside ``dest``) to ``dest`` in one step (after
    an fsync, with ``sync``): readers see the old or the new whole, never a part (a
    directory is swapped atomically where the kernel can). It replaces only what the
    command checked it may (``replaces``, from :func:`identity`): anything that
    appeared at ``dest`` or took its place since is an error, and is left alone."""
    if sync:
        fsync_tree(tmp)
    now = identity(dest)
    if now is None:
        if not rename_noreplace(tmp, dest):
            raise OutputError(f"{str(dest)!r} appeared while this command ran: not replacing it")
        return
    if replaces is None:
        raise OutputError(f"{str(dest)!r} appeared while this command ran: not replacing it")
    if now != replaces:
        raise OutputError(
            f"{str(dest)!r} was replaced by something else while this command ran: not replacing it"
        )
    if tmp.is_dir() and dest.is_dir() and not dest.is_symlink():
        exchange(tmp, dest)  # tmp now holds the old one
        remove_output(tmp)
    elif tmp.is_file() and dest.is_file() and not dest.is_symlink():
        os.replace(tmp, dest)
    else:
        remove_output(dest)
        os.rename(tmp, dest)


def rename_noreplace(src: Path, dest: Path) -> bool:
    """Rename ``src`` to ``dest`` unless something is there (atomically with Linux's
    ``renameat2(RENAME_NOREPLACE)``); whether it did."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        at_fdcwd, flag = -100, 1  # RENAME_NOREPLACE
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dest), flag) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dest))
    if dest.exists() or dest.is_symlink():
        return False
    os.rename(src, dest)
    return True
