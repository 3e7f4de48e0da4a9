"""Who may write a destination and what it may replace (dataset/ownership.py; D17-D20)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from tensordict import TensorDict

from collect_cli.dataset import make_writer, open_dataset
from collect_cli.dataset.ownership import (
    check_destination,
    claim,
    lock_path,
    read_by,
    remove_leftovers,
)
from collect_cli.errors import OutputError, UsageError
from collect_cli.ops.merge import merge
from tests.helpers import assert_consistent
from tests.support.cli_runner import out_path

META = {"env_id": "Toy-v0", "observation_space": None, "action_space": None, "config": ""}


def batch(lanes: int = 2, steps: int = 5, start: int = 0) -> TensorDict:
    shape = (lanes, steps)
    traj = torch.arange(lanes)[:, None].expand(shape).contiguous() + start
    states = torch.randn(lanes, steps + 1, 3)  # one trajectory per lane: s_t, then s_t+1
    return TensorDict(
        {
            "observation": states[:, :-1],
            "action": torch.randn(*shape, 1),
            "done": torch.zeros(*shape, 1, dtype=torch.bool),
            "terminated": torch.zeros(*shape, 1, dtype=torch.bool),
            "truncated": torch.zeros(*shape, 1, dtype=torch.bool),
            "next": {
                "observation": states[:, 1:],
                "reward": torch.randn(*shape, 1),
                "done": torch.zeros(*shape, 1, dtype=torch.bool),
                "terminated": torch.zeros(*shape, 1, dtype=torch.bool),
                "truncated": torch.zeros(*shape, 1, dtype=torch.bool),
            },
            "collector": {"traj_ids": traj, "mask": torch.ones(shape, dtype=torch.bool)},
        },
        batch_size=shape,
    )


def write(path, backend: str, steps: int = 5) -> None:
    writer = make_writer(backend, path, metadata=META, overwrite=True).open()
    writer.append(batch(steps=steps))
    writer.commit()
    writer.close()


# -- claim (D17) ---------------------------------------------------------------------


def test_a_claimed_destination_refuses_a_second_writer_naming_the_first(tmp_path):
    dest = tmp_path / "ds.h5"
    with claim(dest, "rlcollect run"):
        assert lock_path(dest).is_file()
        refused = pytest.raises(OutputError, match=rf"is being written by pid {os.getpid()} ")
        with refused, claim(dest, "rlcollect merge"):
            pass
    assert not lock_path(dest).exists()
    with claim(dest, "rlcollect run"):  # free again
        pass


def test_every_spelling_of_a_destination_meets_at_one_lock(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    with claim(tmp_path / "real" / "ds.h5", "rlcollect run"):
        for spelling in ("real/ds.h5", "link/ds.h5", "real/../real/ds.h5"):
            refused = pytest.raises(OutputError, match="is being written by")
            with refused, claim(spelling, "rlcollect export"):
                pass


def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path):
    dest = tmp_path / "ds.h5"
    code = f"""
        import sys, time
        from collect_cli.dataset.ownership import claim
        with claim({str(dest)!r}, "rlcollect run"):
            print("held", flush=True)
            time.sleep(60)
    """
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(OutputError, match=f"pid {holder.pid} "), claim(dest, "rlcollect run"):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with claim(dest, "rlcollect run"):  # the kernel let go of it
        pass


def test_a_forked_child_does_not_keep_its_parents_claim(tmp_path):
    dest = tmp_path / "ds.h5"
    with claim(dest, "rlcollect run"):
        pid = os.fork()
        if pid == 0:  # the child sleeps on with every fd it inherited
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with claim(dest, "rlcollect run"):  # the parent let go: free, child or not
            pass
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_claim_makes_the_missing_folders_and_removes_them_if_left_empty(tmp_path):
    dest = tmp_path / "a" / "b" / "ds.h5"
    with claim(dest, "rlcollect run"):
        assert dest.parent.is_dir()
    assert not (tmp_path / "a").exists()


# -- check_destination (D18) ---------------------------------------------------------


def test_check_destination_refuses_inputs_their_folders_and_what_they_hold(tmp_path, backend):
    source = out_path(tmp_path, backend)
    write(source, backend)
    inside = [source / "x.h5"] if backend == "memmap" else []
    for out in [source, tmp_path, *inside]:
        with pytest.raises(UsageError, match="overlaps the source dataset"):
            check_destination(out, overwrite=True, inputs=[source])


def test_read_by_follows_virtual_merges_transitively(tmp_path):
    for name in ("a.h5", "b.h5", "c.h5"):
        write(tmp_path / name, "hdf5")
    merge([tmp_path / "a.h5", tmp_path / "b.h5"], tmp_path / "ab.h5")
    merge([tmp_path / "ab.h5", tmp_path / "c.h5"], tmp_path / "abc.h5")
    found = {p.name for p in read_by([tmp_path / "abc.h5"])}
    assert found == {"abc.h5", "ab.h5", "a.h5", "b.h5", "c.h5"}
    with pytest.raises(UsageError, match=r"overlaps the source dataset '.*a\.h5'"):
        merge([tmp_path / "abc.h5"], tmp_path / "a.h5", overwrite=True)
    assert_consistent(tmp_path / "abc.h5")


# -- the first commit replaces only what open() checked (D19) -------------------------


def test_the_first_commit_never_replaces_what_appeared_at_out_since_open(tmp_path, backend):
    out = out_path(tmp_path, backend)
    writer = make_writer(backend, out, metadata=META).open()
    out.write_text("someone else's")  # appeared after the run started
    writer.append(batch())
    with pytest.raises(OutputError, match="appeared while this command ran"):
        writer.commit()
    assert out.read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_overwrite_replaces_the_dataset_it_checked_and_nothing_that_took_its_place(
    tmp_path, backend
):
    out = out_path(tmp_path, backend)
    write(out, backend, steps=3)
    writer = make_writer(backend, out, metadata=META, overwrite=True).open()
    assert open_dataset(out).meta["steps"] == 3  # the old one stays until the first commit
    writer.append(batch(steps=7))
    writer.commit()
    writer.close()
    assert assert_consistent(out)["steps"] == 7
    writer = make_writer(backend, out, metadata=META, overwrite=True).open()
    moved = tmp_path / "moved"
    os.rename(out, moved)
    out.write_text("someone else's")
    writer.append(batch())
    with pytest.raises(OutputError, match="was replaced by something else"):
        writer.commit()
    assert out.read_text() == "someone else's"
    assert_consistent(moved)


def test_remove_leftovers_keeps_what_live_processes_are_building(tmp_path):
    dest = tmp_path / "ds.h5"
    dead = 2**22 + 4321  # above the default pid_max
    live = os.getppid()
    names = [f".ds.h5.creating-{dead}", f".ds.h5.merging-{dead}", f".ds.h5.tmp-{dead}.resize"]
    for name in [*names, f".ds.h5.tmp-{live}", ".other.h5.tmp-1"]:
        (tmp_path / name).write_text("x")
    remove_leftovers(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".ds.h5.tmp-" + str(live),
        ".other.h5.tmp-1",
    ]
