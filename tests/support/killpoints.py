"""Fault injection for crash tests: ``rlcollect run`` killed just before its K-th
``pwrite64``, for many K, with the imports paid once.

    python killpoints.py STRACE_EXE OUT_TEMPLATE K [K ...] -- RUN_ARGS...

runs once (the imports and first calls paid), then for each K forks a child that
waits until strace is attached to it, with ``inject=pwrite64:signal=KILL:when=K``,
and runs ``rlcollect run RUN_ARGS out=OUT_TEMPLATE.format(k=K)``. K = 0 traces
the whole run instead and counts its writes. Prints one JSON line: each K's
exit status (negative: the signal) or, for K = 0, the number of writes.

Tracing a process from its start stops it at every system call (ptrace), and a
Python that imports torch makes tens of thousands: that made each run about
four times slower than the run itself. strace's ``--seccomp-bpf``, which stops
only at the traced calls, does not inject.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from forkserver import run_child, warm_up  # this script's folder is on sys.path


def traced(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        return any(line.startswith("TracerPid:") and line.split()[1] != "0" for line in f)


def run_once(strace: str, k: int, args: list[str]) -> int:
    """Fork, attach strace, let the child run; its exit status, or writes for k = 0."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the tracer, then run the CLI
        os.close(ready_w)
        os.read(ready_r, 1)
        run_child(["run", *args], os.devnull)
    os.close(ready_r)
    with tempfile.NamedTemporaryFile("r", suffix=".trace") as trace:
        cmd = [strace, "-f", "-qq", "-e", "trace=pwrite64", "-p", str(pid)]
        cmd += ["-o", trace.name] if k == 0 else ["-o", os.devnull]
        cmd += [] if k == 0 else ["-e", f"inject=pwrite64:signal=KILL:when={k}"]
        tracer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not traced(pid):
            if time.monotonic() > deadline or tracer.poll() is not None:
                os.kill(pid, 9)
                raise RuntimeError(f"strace did not attach to {pid}")
            time.sleep(0.005)
        os.write(ready_w, b"x")
        os.close(ready_w)
        _, status = os.waitpid(pid, 0)
        tracer.wait(timeout=30)
        if k == 0:
            return sum("pwrite64(" in line for line in trace)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    strace, template, *rest = sys.argv[1:]
    split = rest.index("--")
    points, args = [int(k) for k in rest[:split]], rest[split + 1 :]
    warm_up(args)
    results = {k: run_once(strace, k, [*args, f"out={template.format(k=k)}"]) for k in points}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
