"""Where CPU work runs: ``CpuFollower`` on real processes and threads (Linux)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from collect_cli.threads import CpuFollower, last_cpu
from tests.helpers import CAN_PIN, on_two_cpus

pytestmark = pytest.mark.skipif(not CAN_PIN, reason="needs Linux's CPU affinity and two CPUs")

SLEEPER = "import time\nwhile True: time.sleep(0.002)"


@pytest.fixture
def two_cpus():
    with on_two_cpus() as two:
        yield two


@pytest.fixture
def helper():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="helper")
    thread.start()
    yield thread.native_id
    stop.set()
    thread.join()


def ran_on(pid: int, cpu: int, timeout: float = 5.0) -> None:
    """Wait until process ``pid`` has last run on ``cpu`` (after being pinned there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            if last_cpu(fh.read()) == cpu:
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never ran on CPU {cpu}")


def test_the_thread_moves_to_the_cpu_the_followed_process_last_ran_on(two_cpus, helper):
    procs = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(2)]
    try:
        follower = CpuFollower.where_needed(helper, [p.pid for p in procs])
        assert follower is not None
        for index, cpu in [(0, two_cpus[1]), (1, two_cpus[0]), (0, two_cpus[0])]:
            os.sched_setaffinity(procs[index].pid, {cpu})
            ran_on(procs[index].pid, cpu)
            follower.follow(index)
            assert os.sched_getaffinity(helper) == {cpu}
        follower.close()
        assert os.sched_getaffinity(helper) == set(two_cpus)  # its CPUs given back
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_thread_is_left_where_the_os_puts_it_unless_each_cpu_has_one_process(two_cpus, helper):
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        one, three = [sleeper.pid], [sleeper.pid] * 3
        assert CpuFollower.where_needed(helper, one) is None  # a CPU to spare
        assert CpuFollower.where_needed(helper, three) is None  # the CPUs shared already
        assert CpuFollower.where_needed(None, one * 2) is None
        follower = CpuFollower.where_needed(helper, one * 2)
        assert follower is not None
        follower.close()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_gone_ends_the_following_and_gives_the_cpus_back(two_cpus, helper):
    procs = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(2)]
    follower = CpuFollower.where_needed(helper, [p.pid for p in procs])
    os.sched_setaffinity(procs[0].pid, {two_cpus[1]})
    ran_on(procs[0].pid, two_cpus[1])
    follower.follow(0)
    assert os.sched_getaffinity(helper) == {two_cpus[1]}
    for p in procs:
        p.kill()
        p.wait()  # reaped: its /proc entry is gone
    follower.follow(1)
    assert os.sched_getaffinity(helper) == set(two_cpus)
    follower.follow(0)  # closed: nothing more happens
    assert os.sched_getaffinity(helper) == set(two_cpus)
