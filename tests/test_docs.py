"""The commands in README.md and docs/*.md run as written, at tiny sizes.

Every fenced block of README.md and of each ``docs/*.md`` (found by glob, so a
file added later is covered) is one of:

- ``bash`` or ``console``: run. Each command (one line, ``\\`` continuations
  joined; a leading ``$ `` prompt, blank lines and ``#`` comment lines skipped)
  must exit 0, or N where the line ends with ``# exit N``.
- ``python``: run with this interpreter, in the same directory (blocks in a
  row, with no shell command between them, in one interpreter, each in a
  fresh namespace: torch is imported once).
- ``bash norun``, ``python norun`` (any info string with the word ``norun``):
  shown, never run here: make targets, installs, cron lines, GPU, SLURM or Ray
  recipes, endless runs.
- anything else (``text``, ``json``, ``yaml``...): not run, and it may not hold
  a line starting with ``rlcollect `` (so a command cannot hide from this test).

A fence without an info string is an error. Each file runs in a temporary
directory of its own, its runnable blocks in document order in one bash script
(``set -o pipefail``), so later commands read what earlier ones wrote. Before
running, three rewrite rules shrink the work; nothing else is changed:

1. ``total_frames=N`` becomes ``total_frames=min(N, 2000)`` (``-1`` is kept);
2. ``frames_per_batch=N`` becomes ``frames_per_batch=min(N, 1000)``;
3. ``num_envs=N`` (also ``env.num_envs=N``) becomes ``num_envs=min(N, 8)``.

The rules apply to Python blocks too (keyword arguments of the same names).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli_runner import STARTUP_VARS

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "support"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LONG_PAGES = ("policies.md", "dataset.md")  # 15 s and more: scheduled first
RUNNABLE = [pytest.param(p, marks=pytest.mark.slow) if p.name in LONG_PAGES else p for p in DOCS]
README_MAX_LINES = 200
SHELL, PYTHON = ("bash", "console"), ("python",)
RULES = (
    (re.compile(r"\b(total_frames=)(-?[0-9][0-9.e+]*)"), 2000),
    (re.compile(r"\b(frames_per_batch=)([0-9][0-9.e+]*)"), 1000),
    (re.compile(r"\b(num_envs=)([0-9]+)"), 8),
)
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
FENCE = re.compile(r"^```(.*)$")
RUN_PY = (  # python -c: run each block file in a fresh namespace
    "import runpy, sys\nfor file in sys.argv[1:]:\n    runpy.run_path(file, run_name='__main__')"
)


@dataclass
class Block:
    info: str
    line: int  # of the opening fence, 1-based
    text: str

    @property
    def lang(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def runs(self) -> bool:
        return "norun" not in self.info.split() and self.lang in (*SHELL, *PYTHON)


def blocks(path: Path) -> list[Block]:
    found, current, body = [], None, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if current is None and match:
            current, body = Block(match.group(1).strip(), number, ""), []
        elif current is not None and line.strip() == "```":
            current.text = "\n".join(body) + "\n"
            found.append(current)
            current = None
        elif current is not None:
            body.append(line)
    assert current is None, f"{path.name}:{current.line}: fence never closed"
    return found


def shrink(text: str) -> str:
    for pattern, cap in RULES:

        def capped(match: re.Match, cap: int = cap) -> str:
            value = int(float(match.group(2)))
            return match.group(0) if value == -1 else f"{match.group(1)}{min(value, cap)}"

        text = pattern.sub(capped, text)
    return text


def commands(block: Block) -> list[tuple[str, int]]:
    """``(command, expected exit code)`` of each command of a shell block."""
    out, pending = [], ""
    for raw in block.text.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        expected = EXIT.search(line)
        code = int(expected.group(1)) if expected else 0
        out.append((EXIT.sub("", line) if expected else line, code))
    assert not pending, f"line {block.line}: a continuation never ends"
    return out


def script(path: Path, workdir: Path) -> str:
    """One bash script running the file's blocks in order, stopping at the first
    command whose exit code is not the expected one. Python blocks in a row run
    in one interpreter (each in a fresh namespace): torch is imported once."""
    steps: list[tuple[str, str, int]] = []  # (label, command, expected exit code)
    group: list[tuple[Block, Path]] = []

    def run_group() -> None:
        if group:
            where = ", ".join(f"{path.name}:{block.line}" for block, _ in group)
            files = " ".join(file.name for _, file in group)
            steps.append(
                (f"python blocks at {where}", f"python -c {shlex.quote(RUN_PY)} {files}", 0)
            )
            group.clear()

    for n, block in enumerate(b for b in blocks(path) if b.runs):
        if block.lang in PYTHON:
            file = workdir / f"_block{n}.py"
            file.write_text(shrink(block.text))
            group.append((block, file))
            continue
        run_group()
        where = f"{path.name}:{block.line}"
        steps += [(f"{where}: {shrink(cmd)}", shrink(cmd), code) for cmd, code in commands(block)]
    run_group()
    lines = ["set -o pipefail"]
    for label, cmd, code in steps:
        shown = shlex.quote(label)
        fail = f'{{ echo "exit $rc, expected {code}:" {shown} >&2; exit 97; }}'
        lines += [f"echo + {shown} >&2", cmd, "rc=$?", f'[ "$rc" -eq {code} ] || {fail}']
    return "\n".join(lines) + "\n"


def environment() -> dict[str, str]:
    """This interpreter's ``bin`` first on ``PATH``: ``rlcollect`` and ``python`` are ours."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("MINARI_DATASETS_PATH", None)
    return env


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """:func:`environment` with ``rlcollect`` served by a warmed fork server
    (support/bin/rlcollect): each command is a real process running the real
    CLI, without the two seconds of imports a new interpreter pays."""
    env = environment()
    sock = tmp_path_factory.mktemp("docs-server") / "socket"
    server = subprocess.Popen(
        [sys.executable, str(SUPPORT / "forkserver.py"), "--listen", str(sock), "progress=none"],
        cwd=sock.parent,
        env=env,
        stdin=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not sock.exists():
        assert server.poll() is None and time.monotonic() < deadline, "the fork server failed"
        time.sleep(0.05)
    startup = {k: env.get(k) for k in sorted(STARTUP_VARS)}  # the shim compares these
    yield dict(
        env,
        PATH=f"{SUPPORT / 'bin'}{os.pathsep}{env['PATH']}",
        RLCOLLECT_DOCS_SERVER=str(sock),
        RLCOLLECT_DOCS_SERVER_ENV=json.dumps(startup),
    )
    server.stdin.close()
    server.wait(timeout=60)


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_block_is_labelled_and_no_command_hides(path):
    for line in path.read_text().splitlines():
        assert not re.match(r"^\s+```", line), f"{path.name}: indented fence {line!r}"
    for block in blocks(path):
        assert block.info, f"{path.name}:{block.line}: a fence needs an info string"
        if block.lang not in (*SHELL, *PYTHON):
            hidden = [ln for ln in block.text.splitlines() if ln.lstrip().startswith("rlcollect ")]
            assert not hidden, f"{path.name}:{block.line}: a command in a {block.lang} block"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(path):
    text = re.sub(r"(?s)```.*?```", "", path.read_text())
    for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        resolved = (path.parent / target).resolve()
        assert resolved.exists(), f"{path.name}: broken link {target}"


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.name)
def test_commands_run_as_written(path, tmp_path, served):
    if not any(b.runs for b in blocks(path)):
        pytest.skip("nothing to run")
    body = script(path, tmp_path)
    if re.search(r"\bjq\b", body) and shutil.which("jq") is None:
        pytest.skip("needs jq")
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", body],
        cwd=tmp_path,
        env=served,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.monotonic() - start
    assert proc.returncode == 0, f"after {seconds:.0f} s:\n{proc.stderr[-6000:]}"


def test_the_rewrite_rules_only_shrink():
    text = "total_frames=1e6 total_frames=-1 frames_per_batch=409600 env.num_envs=4096 num_envs=4"
    assert shrink(text) == (
        "total_frames=2000 total_frames=-1 frames_per_batch=1000 env.num_envs=8 num_envs=4"
    )


def test_the_runner_checks_exit_codes_and_skips_norun(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\ntrue\nfalse  # exit 1\necho \\\n  joined > out.txt\n```\n\n"
        "```bash norun\nexit 3\n```\n\n```python\nprint(open('out.txt').read())\n```\n"
    )
    run = subprocess.run(
        ["bash", "-c", script(page, tmp_path)], cwd=tmp_path, env=environment(), capture_output=True
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out.txt").read_text() == "joined\n"
    page.write_text("```bash\ntrue  # exit 1\n```\n")
    run = subprocess.run(
        ["bash", "-c", script(page, tmp_path)], cwd=tmp_path, env=environment(), capture_output=True
    )
    assert run.returncode == 97 and b"exit 0, expected 1" in run.stderr
