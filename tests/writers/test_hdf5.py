"""HDF5 backend: commit records, and kills inside a commit (fault injection)."""

from __future__ import annotations

import h5py
import pytest

from collect_cli.collectors import SyncCollector
from collect_cli.envs import env_factory
from collect_cli.validate import validate
from collect_cli.writers import make_writer, open_dataset
from collect_cli.writers.hdf5 import COMMIT_SLOTS, read_commit

META = {"env_id": "CartPole-v1", "config": {}}


@pytest.fixture(scope="module")
def batches():
    with SyncCollector(env_factory("CartPole-v1", 3), frames_per_batch=60, total_frames=300) as c:
        return [b for b in c]


def test_commit_records_alternate_and_carry_the_counters(tmp_path, batches):
    path = tmp_path / "d.h5"
    w = make_writer("hdf5", path, metadata={}).open()
    for b in batches[:3]:
        w.append(b)
        w.commit()
    with h5py.File(path, "r", locking=False) as f:
        record = read_commit(f.attrs)
        assert record == {
            "seq": 3,
            "frames": 180,
            "steps": 60,
            "episodes": w.episodes,
            "lane_steps": [60, 60, 60],
        }
        assert set(COMMIT_SLOTS) <= set(f.attrs)
    w.close()
    assert not set(COMMIT_SLOTS) & set(open_dataset(path).meta)  # not shown as metadata


def test_a_torn_record_falls_back_to_the_previous_commit(tmp_path, batches):
    path = tmp_path / "d.h5"
    w = make_writer("hdf5", path, metadata=META).open()
    for b in batches[:2]:
        w.append(b)
        w.commit()
    episodes_then = w.episodes
    w.append(batches[2])
    w.commit()  # record 3
    w._file.close()  # dies without closing the writer
    with h5py.File(path, "r+", locking=False) as f:
        newest = COMMIT_SLOTS[3 % 2]
        torn = f.attrs[newest].copy()
        torn[-1] ^= 1  # its checksum no longer matches
        f.attrs.modify(newest, torn)
        f.attrs.modify("frames", 999)  # the loose counters are not trusted
    meta = open_dataset(path).meta
    assert (meta["frames"], meta["steps"], meta["episodes"]) == (120, 40, episodes_then)
    assert meta["lane_steps"] == [40, 40, 40]
    assert validate(path) == []
    resumed = make_writer("hdf5", path, metadata=META).reopen()  # continues after commit 2
    assert resumed.frames == 120 and list(resumed.cursor) == [40, 40, 40]
    resumed.close()
    meta = open_dataset(path).meta
    assert meta["frames"] == 120 and meta["status"] == "complete"
    with h5py.File(path, "r", locking=False) as f:  # the loose counters are right again
        assert f.attrs["frames"] == 120 and read_commit(f.attrs)["seq"] > 3
    assert validate(path) == []
