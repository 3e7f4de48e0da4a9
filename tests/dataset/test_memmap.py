"""Memmap backend specifics: how frame files are built and what the writer maps."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from collect_cli.collectors import SyncCollector
from collect_cli.dataset import make_writer
from collect_cli.dataset.memmap.tdmeta import spare, write_json
from collect_cli.dataset.memmap.write import build_frame_file
from collect_cli.envs import env_factory


def test_build_frame_file_fills_then_copies_each_lane(tmp_path):
    src = tmp_path / "src.memmap"
    old = np.arange(3 * 5 * 2, dtype=np.int64).reshape(3, 5, 2)
    old.tofile(src)
    new = tmp_path / "new.memmap"
    row = 2 * 8
    build_frame_file(
        new, (4, 7, row), fill=np.full(1, -1, np.int64).tobytes(), source=(src, 5), lanes=3, steps=4
    )
    got = np.fromfile(new, dtype=np.int64).reshape(4, 7, 2)
    assert (got[:3, :4] == old[:, :4]).all()
    assert (got[:3, 4:] == -1).all() and (got[3:] == -1).all()
    build_frame_file(new, (2, 3, row), fill=None, source=None, lanes=0, steps=0)
    assert (np.fromfile(new, dtype=np.int64) == 0).all() and new.stat().st_size == 2 * 3 * row


def mapped_kib(file) -> int:
    """Resident KiB of this process's mappings of ``file`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                inside = line.rstrip().endswith(str(file))
            elif inside and first == "Rss:":
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_batch_maps_only_the_pages_it_writes(tmp_path):
    """Resident memory must not grow with the dataset: writing one batch into
    every lane maps a page or two per lane, not the (prefilled) files whole."""
    lanes, planned = 64, 60_000
    with SyncCollector(
        env_factory("CartPole-v1", lanes), frames_per_batch=4 * lanes, total_frames=4 * lanes
    ) as c:
        batch = next(iter(c))
    w = make_writer("memmap", tmp_path / "ds", metadata={}, planned_steps=planned).open()
    w.append(batch)
    w.commit()
    traj = tmp_path / "ds" / "collector" / "traj_ids.memmap"
    assert traj.stat().st_size == lanes * planned * 8  # 30 MiB, written -1 in bulk when created
    assert mapped_kib(traj) <= lanes * 2 * 4  # at most two 4 KiB pages per lane
    w.close("complete")


def test_episodes_meta_is_rewritten_only_when_rows_are_added(tmp_path):
    from tensordict import TensorDict

    path = tmp_path / "d"
    # capacity for the whole run: the frame files are built once, at the first batch
    w = make_writer("memmap", path, metadata={}, planned_steps=600).open()
    rewritten = []
    # Pendulum episodes last 200 steps: 50-step batches end them in one batch of four
    with SyncCollector(env_factory("Pendulum-v1", 2), frames_per_batch=100, total_frames=1200) as c:
        for batch in c:
            # w.path: the staging directory until the first commit renames it to path
            inode = (w.path / "episodes" / "meta.json").stat().st_ino
            w.append(batch)
            w.commit()
            listing = path / "episodes" / "meta.json"
            rewritten.append(listing.stat().st_ino != inode)  # replaced: a new inode
            assert TensorDict.load_memmap(path)["episodes"].batch_size == (w.episodes,)
    w.close()
    assert not list(path.rglob("*.tmp"))  # the commits' spares are gone
    assert rewritten[1:] == [False, False, True] + [False, False, False, True] * 2
    assert TensorDict.load_memmap(path)["episodes", "length"].tolist() == [200] * 6


def test_commits_swap_the_json_in_and_keep_the_old_one_as_the_spare(tmp_path):
    path = tmp_path / "m.json"
    contents = [{"a": 1}, {"a": 333333, "b": [1, 2]}, {"a": 4}]  # longer, then shorter
    for before, after in zip([None, *contents], contents, strict=False):
        write_json(path, after)
        assert json.loads(path.read_text()) == after
        if before is not None:  # exchanged: the previous content is the next spare
            assert json.loads(spare(path).read_text()) == before
    write_json(path, {"c": 5}, sync=True)
    assert json.loads(path.read_text()) == {"c": 5} and not spare(path).exists()


def test_write_back_covers_only_files_written_in_long_runs_per_lane(tmp_path, monkeypatch):
    # a lane's last page is written again by the next batch: files written in short
    # runs per lane are left to close's fsync (writing a page under I/O waits for it)
    from collect_cli.dataset.memmap import write as memmap

    w = make_writer("memmap", tmp_path / "d", metadata={}, planned_steps=200).open()
    with SyncCollector(env_factory("Pendulum-v1", 2), frames_per_batch=100, total_frames=100) as c:
        batch = next(iter(c))  # 50 steps a lane: observations 600 bytes, rewards 200
    w.append(batch)
    w.commit()
    assert w.written_back() == []
    monkeypatch.setattr(memmap, "WRITE_BACK_RUN", 500)
    assert sorted(w.written_back()) == [("next", "observation"), ("observation",)]
    w.close()


def test_without_an_exchange_commits_rename_the_json_in(tmp_path, monkeypatch):
    # filesystems without renameat2(RENAME_EXCHANGE): the spare is renamed over
    from collect_cli.dataset.memmap import tdmeta as memmap_json

    monkeypatch.setattr(memmap_json, "swap", lambda a, b: False)
    path = tmp_path / "m.json"
    for content in ({"a": 333333}, {"a": 1}):
        write_json(path, content)
        assert json.loads(path.read_text()) == content and not spare(path).exists()
