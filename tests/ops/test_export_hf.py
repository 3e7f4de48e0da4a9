"""``rlcollect export --format hf``: Parquet read back by Hugging Face ``datasets``
(and pyarrow) against the native dataset's episodes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from collect_cli.ops import export_hf, frames
from collect_cli.ops.export import export
from tests.ops.test_export import native_episodes
from tests.support.cli_runner import SUPPORT, out_path, run_cli

# 2 lanes x 250 steps of Pendulum (200-step episodes): per lane one whole episode
# and one of 50 steps cut by the end of the run
PENDULUM = ("env=Pendulum", "env.num_envs=2", "total_frames=500", "frames_per_batch=250")


def load(folder, tmp_path):
    import datasets

    cache = tmp_path / "hf-cache"
    return datasets.load_dataset("parquet", data_dir=str(folder), split="train", cache_dir=cache)


def collect(tmp_path, backend="hdf5", *overrides):
    out = out_path(tmp_path, backend, "src")
    args = (*PENDULUM, f"writer={backend}", "progress=none", *overrides, f"out={out}")
    res = run_cli("run", *args, cwd=tmp_path)
    assert res.code == 0, res.stderr
    return out


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_datasets_loads_every_episode_as_recorded(tmp_path, backend):
    src = collect(tmp_path, backend)
    dest = tmp_path / "hf"
    res = run_cli("export", str(src), "--format", "hf", "--out", str(dest), cwd=tmp_path)
    assert res.code == 0, res.stderr
    assert json.loads(res.stdout)["episodes"] == 4
    rows = load(dest, tmp_path)
    assert rows.column_names[:6] == [
        "observations", "actions", "rewards", "dones", "terminals", "timeouts",
    ]  # fmt: skip
    native = native_episodes(src)
    assert len(rows) == len(native) == 4
    for row, ep in zip(rows, native, strict=True):
        n = len(ep["collector/traj_ids"])
        assert [len(row[c]) for c in ("observations", "actions", "rewards", "dones")] == [n] * 4
        np.testing.assert_array_equal(np.array(row["observations"], np.float32), ep["observation"])
        np.testing.assert_array_equal(np.array(row["actions"], np.float32), ep["action"])
        np.testing.assert_array_equal(np.array(row["rewards"], np.float32), ep["next/reward"][:, 0])
        assert set(row["infos.traj_id"]) == {ep["traj_id"]}
        # an episode ends at its last step: terminated, or a timeout (truncated or cut)
        assert row["dones"] == [False] * (n - 1) + [True]
        assert row["timeouts"][-1] == (not ep["terminated"])
        flags = zip(row["terminals"], row["timeouts"], strict=True)
        assert row["dones"] == [t or o for t, o in flags]
    assert sorted(len(r) for r in rows["rewards"]) == [50, 50, 200, 200]
    card = (dest / "README.md").read_text()
    assert card.startswith("---\n") and "Pendulum-v1" in card


def test_dict_observations_and_tuple_actions_become_columns_per_leaf(tmp_path):
    out = tmp_path / "nested.h5"
    args = ("env=gym", "env.id=toyenvs:Nested-v0", "env.num_envs=2", "total_frames=28")
    assert run_cli("run", *args, "progress=none", f"out={out}", cwd=tmp_path).code == 0
    dest = tmp_path / "hf"
    assert run_cli("export", str(out), "-f", "hf", "-o", str(dest), cwd=tmp_path).code == 0
    table = pq.read_table(next((dest / "data").glob("*.parquet")))
    names = set(table.column_names)
    assert {"observations.pos", "observations.mode", "observations.flags"} <= names
    assert {"actions.0", "actions.1", "actions.2"} <= names
    shapes = json.loads(table.schema.metadata[b"rlcollect"])["shapes"]
    assert shapes["observations.pos"] == [2] and shapes["actions.1"] == [3]
    first = table.to_pylist()[0]
    assert len(first["observations.pos"]) == 7  # the env's 7-step episodes
    assert first["observations.pos"][2] == pytest.approx([0.2, -0.2])
    assert first["observations.mode"][:4] == [0, 1, 2, 0]


def test_shards_and_row_groups_stream_with_the_same_rows(tmp_path, monkeypatch):
    src = collect(tmp_path)
    whole, streamed = tmp_path / "whole", tmp_path / "streamed"
    export(src, "hf", whole)
    monkeypatch.setattr(export_hf, "ROW_GROUP_BYTES", 1)  # a row group per block read
    monkeypatch.setattr(export_hf, "SHARD_BYTES", 1)  # a file per row group
    export(src, "hf", streamed)
    shards = sorted(p.name for p in (streamed / "data").iterdir())
    assert len(shards) == 2  # a block per lane here, each holding whole episodes
    assert shards == [f"train-{i:05d}-of-00002.parquet" for i in range(2)]
    assert load(streamed, tmp_path).to_list() == load(whole, tmp_path).to_list()


def test_episodes_spanning_many_read_blocks_are_whole_rows(tmp_path, monkeypatch):
    src = collect(tmp_path)
    whole, streamed = tmp_path / "whole", tmp_path / "streamed"
    export(src, "hf", whole)
    monkeypatch.setattr(frames, "BLOCK_BYTES", 1000)  # blocks of ~30 frames: episodes span them
    monkeypatch.setattr(export_hf, "ROW_GROUP_BYTES", 3000)  # row groups end inside blocks
    export(src, "hf", streamed)
    groups = pq.ParquetFile(next((streamed / "data").glob("*.parquet"))).num_row_groups
    assert groups == 4  # the bytes cross the line inside each episode: an episode a group
    assert load(streamed, tmp_path).to_list() == load(whole, tmp_path).to_list()


def test_the_same_dataset_exports_the_same_bytes(tmp_path):
    src = collect(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    export(src, "hf", a)
    export(src, "hf", b)
    name = "data/train-00000-of-00001.parquet"
    first, second = pq.read_table(a / name), pq.read_table(b / name)
    assert first.equals(second)


def test_bad_requests_exit_2_and_leave_everything_as_it_was(tmp_path):
    src = collect(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")

    def refused(*args: str, env=None) -> str:
        res = run_cli("export", str(src), "--format", "hf", *args, cwd=tmp_path, env=env)
        assert res.code == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        return lines[0]

    assert "exists" in refused("--out", str(mine))
    assert "not an hf export: not replacing it" in refused("--out", str(mine), "--overwrite")
    assert (mine / "notes.txt").read_text() == "keep me"
    assert "--compression applies to --format d4rl only" in refused(
        "--out", str(tmp_path / "x"), "--compression", "gzip"
    )
    assert "which this command reads" in refused("--out", str(src), "--overwrite")
    blocker = tmp_path / "nopyarrow"
    blocker.mkdir()
    (blocker / "pyarrow.py").write_text("raise ImportError('No module named pyarrow')\n")
    env = {"PYTHONPATH": f"{blocker}:{SUPPORT}"}
    assert "pip install 'rlcollect[export]'" in refused("--out", str(tmp_path / "y"), env=env)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert src.exists() and run_cli("validate", str(src), cwd=tmp_path).code == 0


def test_an_hf_export_is_replaced_only_with_overwrite(tmp_path):
    src = collect(tmp_path)
    dest = tmp_path / "hf"
    assert run_cli("export", str(src), "-f", "hf", "-o", str(dest), cwd=tmp_path).code == 0
    again = run_cli("export", str(src), "-f", "hf", "-o", str(dest), cwd=tmp_path)
    assert again.code == 2 and "--overwrite" in again.stderr
    res = run_cli("export", str(src), "-f", "hf", "-o", str(dest), "--overwrite", cwd=tmp_path)
    assert res.code == 0, res.stderr
    assert len(load(dest, tmp_path)) == 4
