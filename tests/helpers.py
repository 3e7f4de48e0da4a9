"""Dataset checks and process-tree helpers shared by the tests."""

from __future__ import annotations

import os
from pathlib import Path

from collect_cli.validate import validate
from collect_cli.writers import open_dataset


def assert_consistent(path: Path | str) -> dict:
    """The dataset reopened from disk passes ``rlcollect validate``; return its metadata."""
    problems = validate(path)
    assert not problems, problems
    return open_dataset(path).meta


def descendants(pid: int) -> set[int]:
    """Live descendant pids of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.add(child)
            stack.append(child)
    return out


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line contains ``text`` (leftover workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
