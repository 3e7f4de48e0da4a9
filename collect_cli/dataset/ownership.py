"""Who may write a destination, and what it may replace (docs/durability.md, D17-D20).

- :func:`claim`: one writer per destination, for the whole life of the command
  that writes it: an exclusive OS lock (``flock``) on ``.<name>.lock`` beside it.
  The kernel drops the lock when its holder dies, so ``kill -9`` leaves none.
- :func:`check_destination`: the one check of a destination before anything is
  written: never an input (or what an input's virtual datasets read), never ``.``
  or an ancestor of the working directory, and an existing destination replaced
  only with overwrite, only where it is what the command writes.
- :func:`remove_leftovers`: the staging files of killed commands (``.<name>.<stage>-<pid>``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from collect_cli.dataformat import IDENTITY, MEMMAP_META_FILE
from collect_cli.errors import OutputError, UsageError

log = logging.getLogger("rlcollect")

# the sibling names commands build a destination under: `.<name>.<stage>-<pid>...`
STAGES = ("creating", "merging", "tmp")
LOCK_SUFFIX = ".lock"
# filesystems without flock (Lustre mounted without -o flock, some FUSE): not enforced
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)

_held: set[int] = set()  # lock fds this process holds: closed in forked children


def _drop_inherited() -> None:
    # a child (writer process, collector worker) must not keep its parent's claim alive
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_drop_inherited)


def lock_path(dest: Path) -> Path:
    """The lock file of ``dest``: beside it, in its real directory, so that every
    spelling of one destination (relative, through a symlinked folder) meets there."""
    return Path(os.path.realpath(dest.parent)) / f".{dest.name}{LOCK_SUFFIX}"


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process"
    where = f" on {info['host']}" if info.get("host") not in (None, socket.gethostname()) else ""
    command, since = info.get("command", "rlcollect"), info.get("since")
    return f"pid {info['pid']}{where} ({command}, since {since})"


@contextlib.contextmanager
def claim(dest: str | os.PathLike, command: str) -> Iterator[None]:
    """Hold the exclusive lock of ``dest`` while inside; a destination another live
    process holds is a usage error naming it (durability D17)."""
    dest = Path(dest)
    created = _make_folder(dest.parent)
    fd = _acquire(dest, command) if created is not None else None
    try:
        yield
    finally:
        if fd is not None:
            _release(dest, fd)
        for folder in reversed(created or []):  # the folders it made, if left empty
            with contextlib.suppress(OSError):
                folder.rmdir()


def _make_folder(folder: Path) -> list[Path] | None:
    """Make ``folder`` and its missing parents; the ones made, or None where it cannot
    be made (check_destination then says why)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    try:
        for made in reversed(missing):
            made.mkdir()
    except OSError:
        return None
    return list(reversed(missing))  # outermost first


def _acquire(dest: Path, command: str) -> int | None:
    path = lock_path(dest)
    for _ in range(20):  # a holder may remove the file between our open and our lock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return None  # no folder to write in: check_destination says why
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputError(
                f"{str(dest)!r} is being written by {holder}: wait for it to end, or "
                "write to another out"
            ) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in UNSUPPORTED:
                raise
            log.warning(
                "cannot lock %s (%s): this filesystem has no flock, so a second writer "
                "would not be refused (Lustre: mount with -o flock)",
                dest,
                exc.strerror,
            )
            return None
        try:  # the file we locked must still be the one at the path
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command,
            "since": time.strftime("%H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())  # at offset 0: the fd is fresh
        _held.add(fd)
        return fd
    raise OutputError(f"cannot lock {str(dest)!r}: its lock file keeps changing")


def _release(dest: Path, fd: int) -> None:
    _held.discard(fd)
    with contextlib.suppress(OSError):
        os.unlink(lock_path(dest))  # while held: a waiter re-checks the path (above)
    os.close(fd)


# -- what is at a path ----------------------------------------------------------------

Identity = tuple[int, int]  # (st_dev, st_ino): what a command checked it may replace


def identity(path: Path) -> Identity | None:
    """What is at ``path`` now (not following a final symlink), or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def remove_output(path: Path) -> None:
    """Remove what a command of rlcollect wrote (its staging files, its outputs)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def shown(path: str | os.PathLike, limit: int = 160) -> str:
    """``path`` quoted for a one-line message, its middle cut where it is very long."""
    text = repr(str(path))
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


def what_is(path: Path) -> str | None:
    """A few words for what is at ``path`` (not following a final symlink), or None."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there (a file where a folder of the path should be)
    except OSError as exc:
        raise OutputError(f"cannot use {shown(path)}: {exc.strerror or exc}") from None
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a file"


def is_dataset(path: Path) -> bool:
    """Whether ``path`` is an rlcollect dataset: a regular HDF5 file, or a directory,
    carrying rlcollect's metadata (never opened if it is anything else: a FIFO would
    block the open)."""
    kind = what_is(path)
    if kind == "a directory":
        try:
            data = json.loads((path / MEMMAP_META_FILE).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and all(key in data for key in IDENTITY)
    if kind == "a file":
        return _hdf5_attrs_hold(path, IDENTITY)
    return False


def _hdf5_attrs_hold(path: Path, names: Iterable[str], group: str = "/") -> bool:
    import h5py

    try:
        with h5py.File(path, "r", locking=False) as f:
            node = f.get(group)
            return node is not None and all(name in node.attrs or name in node for name in names)
    except (OSError, ValueError):
        return False


def is_d4rl_export(path: Path) -> bool:
    """An HDF5 file that ``rlcollect export --format d4rl`` wrote."""
    if what_is(path) != "a file" or not _hdf5_attrs_hold(path, ("exported_by",), "metadata"):
        return False
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        return bytes(f["metadata/exported_by"][()]).startswith(b"rlcollect")


# -- inputs ---------------------------------------------------------------------------


def read_by(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """The real paths of ``inputs`` and of every file their HDF5 virtual datasets read,
    transitively (a virtual merge reads its shards)."""
    seen: dict[Path, None] = {}
    todo = [Path(os.path.realpath(p)) for p in inputs]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path] = None
        todo += _virtual_sources(path)
    return list(seen)


def _virtual_sources(path: Path) -> list[Path]:
    if what_is(path) != "a file":
        return []
    import h5py

    found: set[Path] = set()

    def visit(_: str, obj) -> None:
        if isinstance(obj, h5py.Dataset) and obj.is_virtual:
            for source in obj.virtual_sources():
                name = source.file_name
                if name != ".":  # "." is the file itself
                    found.add(Path(os.path.realpath(path.parent / name)))

    try:
        with h5py.File(path, "r", locking=False) as f:
            f.visititems(visit)
    except (OSError, ValueError):
        return []
    return sorted(found)


# -- the destination check ------------------------------------------------------------


def check_destination(
    out: str | os.PathLike,
    *,
    overwrite: bool,
    inputs: Iterable[str | os.PathLike] = (),
    kind: str = "an rlcollect dataset",
    replaceable: Callable[[Path], bool] = is_dataset,
    flag: str = "--overwrite",
) -> Identity | None:
    """Refuse ``out`` before anything is written where writing it could destroy data
    the command did not write (durability D18): ``.``/``..``/an ancestor of the
    working directory; an input, an ancestor of one, inside one, or a file an input
    reads; something existing without overwrite (``flag`` names how to ask for it),
    or that is not ``kind`` (``replaceable``); then check it can be written. Returns
    the identity of what is there, which :func:`~collect_cli.dataset.fsio.publish`
    then replaces (and nothing else)."""
    out = Path(out)
    real = Path(os.path.realpath(out))
    cwd = Path.cwd().resolve()
    if out.name in ("", ".", "..") or real == cwd or real in cwd.parents:
        raise UsageError(
            f"out {str(out)!r} is the working directory or one of its parents: "
            "name a new file or folder"
        )
    for source in read_by(inputs):
        if real == source or real in source.parents or source in real.parents:
            raise UsageError(
                f"out {str(out)!r} overlaps the source dataset {str(source)!r}, which this "
                "command reads: write somewhere else"
            )
    there = what_is(out)
    if there is not None:
        if not overwrite:
            raise OutputError(f"output {str(out)!r} already exists: pass {flag} or another out")
        if there != "a file" and there != "a directory":
            raise OutputError(f"output {str(out)!r} is {there}: not replacing it")
        if not replaceable(out):
            what = there if there == "a file" else _folder_words(out)
            raise OutputError(
                f"output {str(out)!r} is {what} and not {kind}: not replacing it "
                "(remove it yourself, or choose another out)"
            )
    check_writable(out)
    return identity(out)


def check_output(path: str | os.PathLike, overwrite: bool) -> Identity | None:
    """:func:`check_destination` for ``rlcollect run``'s ``out`` (``overwrite=true``)."""
    return check_destination(path, overwrite=overwrite, flag="overwrite=true")


def _folder_words(path: Path) -> str:
    try:
        count = sum(1 for _ in path.iterdir())
    except OSError:
        return "a directory"
    if not count:
        return "an empty directory"
    return f"a directory with {count} {'entry' if count == 1 else 'entries'}"


def check_writable(path: Path) -> None:
    """Fail early (before any env starts) if ``path``'s nearest existing folder cannot
    be written (a real file, not os.access: root passes that on read-only mounts)."""
    existing = path.parent
    while not existing.exists():
        existing = existing.parent
    why = "not a directory"
    if existing.is_dir():
        try:
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe-", dir=existing)
            os.close(fd)
            os.unlink(probe)
            return
        except OSError as exc:
            why = exc.strerror or str(exc)
    raise OutputError(
        f"cannot write output {str(path)!r}: {str(existing)!r} is not writable ({why})"
    )


# -- staging leftovers ----------------------------------------------------------------


def staging_name(dest: Path, stage: str, pid: int | None = None) -> Path:
    """Where a command builds ``dest`` before publishing it."""
    return dest.with_name(f".{dest.name}.{stage}-{pid or os.getpid()}")


def leftovers(dest: Path, stages: Iterable[str] = STAGES) -> list[tuple[Path, int]]:
    """``(sibling, pid)`` of each staging file of ``dest`` (``.<name>.<stage>-<pid>``,
    also with a suffix such as memmap's ``.resize``)."""
    found = []
    for stage in stages:
        prefix = f".{dest.name}.{stage}-"
        for sibling in sorted(dest.parent.glob(f"{glob.escape(prefix)}*")):
            pid = sibling.name[len(prefix) :].split(".", 1)[0]
            if pid.isdigit():
                found.append((sibling, int(pid)))
    return found


# durability D2 (docs/durability.md)
def missing_dataset(path: Path) -> OutputError:
    """The error for no dataset at ``path``, naming a run that has not committed
    (or was killed before its first commit) if its staging dataset is there."""
    for staging, pid in leftovers(path, ("creating",)):
        if staging.name.endswith(".resize"):
            continue
        if alive(pid):
            return OutputError(
                f"no dataset at {str(path)!r} yet: the run with pid {pid} is creating it "
                "and it appears at its first commit"
            )
        return OutputError(
            f"no dataset at {str(path)!r}: the run with pid {pid} was killed before its "
            f"first commit, so nothing was saved (the next run to it removes {staging.name})"
        )
    return OutputError(f"no dataset at {str(path)!r}")


# durability D2, D20 (docs/durability.md)
def remove_leftovers(dest: Path, owner: int | None = None) -> None:
    """Remove what commands that are gone (and ``owner``'s own) left building ``dest``:
    called by the holder of its claim."""
    owner = owner or os.getpid()
    for leftover, pid in leftovers(dest):
        if pid != owner and alive(pid):
            continue  # a live process's (an rlcollect without locks, or a recycled pid)
        with contextlib.suppress(OSError):
            remove_output(leftover)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
