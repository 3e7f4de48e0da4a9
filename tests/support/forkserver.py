"""``rlcollect`` processes forked from one warmed process, for the CLI and crash tests.

    python forkserver.py WARM_ARGS...        then one JSON request a line on stdin:

    {"run": [ARGS...], "log": PATH}  ->  {"pid": PID}
        fork a child that runs ``rlcollect run ARGS`` in its own session (so
        ``killpg(PID)`` reaches it and its workers), its output going to PATH
    {"cli": [ARGS...], "cwd": DIR, "env": {...}, "out": PATH, "err": PATH}  ->  {"pid": PID}
        fork a child that runs ``rlcollect ARGS`` in DIR with ``env`` added to its
        environment, stdout to ``out`` and stderr to ``err``
    {"poll": PID}  ->  {"code": CODE or null}     its exit status if it has ended
    {"wait": PID}  ->  {"code": CODE}             wait for it (negative: the signal)

    python forkserver.py --listen SOCKET WARM_ARGS...

serves ``support/bin/rlcollect`` (the docs test's ``rlcollect`` on PATH) on a unix
socket instead: a client sends its stdin, stdout and stderr (SCM_RIGHTS) with one
JSON line ``{"cli": ARGS, "cwd": DIR, "env": {...}}``, and gets the line
``{"pid": PID}`` (where to send the signals it receives), then ``{"code": CODE}``
when the command ends. The server exits when its stdin closes.

A new interpreter spends about two seconds importing torch, tensordict and
Hydra and making a run's first calls; ``warm_up`` pays that once, with one whole
run of WARM_ARGS, and each child inherits it done. The children are real
processes running the real CLI, killed with real signals.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import sys
import tempfile
import traceback

from collect_cli.cli import app


def warm_up(args: list[str]) -> None:
    """One whole run of ``args`` here (400 frames, into a temporary directory)."""
    args = [a for a in args if not a.startswith(("total_frames=", "out="))]
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        try:
            app(args=["run", *args, "total_frames=400", f"out={tmp}/warm"], prog_name="rlcollect")
        except SystemExit as exc:
            if exc.code:
                raise RuntimeError(f"the warm-up run failed ({exc.code})") from None


def run_child(args: list[str], out: str | None, err: str | None = None, cwd=None, env=None) -> None:
    """In a forked child: ``rlcollect args``, then exit with its status (the exit
    hooks run first, as at a normal interpreter exit). ``out=None``: fds 0-2 are
    already the command's."""
    code = 1
    try:
        os.setsid()
        if cwd:
            os.chdir(cwd)
        os.environ.update(env or {})
        if out is not None:
            stdout = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            stderr = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if err else stdout
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
        app(args=args, prog_name="rlcollect")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if "run" in request or "cli" in request:
            pid = os.fork()
            if pid == 0:
                if "run" in request:
                    run_child(["run", *request["run"]], request["log"])
                run_child(
                    request["cli"], request["out"], request["err"], request["cwd"], request["env"]
                )
            reply: dict = {"pid": pid}
        else:
            pid = request.get("poll", request.get("wait"))
            done, status = os.waitpid(pid, os.WNOHANG if "poll" in request else 0)
            reply = {"code": os.waitstatus_to_exitcode(status) if done else None}
        print(json.dumps(reply), flush=True)


def listen(path: str) -> None:
    """The ``--listen`` mode: one forked child per connection, its exit status
    sent back; single-threaded (children are forked from this thread only). A
    child whose client is gone (killed), or still running when the test ends, is
    killed with its process group: no run outlives the test."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    waiting: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([server, sys.stdin, *waiting.values()], [], [], 0.01)
        if sys.stdin in ready and not sys.stdin.readline():
            for pid in waiting:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            return  # the test is over
        for pid, conn in waiting.items():
            if conn in ready and not conn.recv(1):  # the client hung up before the end
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        if server in ready:
            conn, _ = server.accept()
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            while not data.endswith(b"\n"):
                data += conn.recv(1 << 16)
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                server.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                run_child(request["cli"], None, cwd=request["cwd"], env=request["env"])
            for fd in fds:
                os.close(fd)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = conn
        for pid in list(waiting):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                conn = waiting.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                with contextlib.suppress(OSError):  # the client may be gone
                    conn.sendall(json.dumps({"code": code}).encode() + b"\n")
                conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "--listen":
        warm_up(sys.argv[3:])
        listen(sys.argv[2])
    else:
        warm_up(sys.argv[1:])
        serve()
