"""A dataset family: a random and an SB3 run merged into a medium-expert (extras
kept), then filtered, split and taken from; every episode keeps its source, which
names the policy whose actions it holds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from collect_cli import dataformat as fmt
from collect_cli.dataset import open_dataset
from tests.helpers import assert_consistent, assert_split_on_done
from tests.support.cli_runner import run_cli

sb3 = pytest.importorskip("stable_baselines3")

FRAMES = 4000  # per member: 8 lanes x 500 steps, two Pendulum episodes and a cut one each


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> dict[str, Path]:
    from stable_baselines3 import SAC

    root = tmp_path_factory.mktemp("family")
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0,
                policy_kwargs={"net_arch": [16]}, device="cpu")  # fmt: skip
    model.learn(48)
    model.save(root / "sac.zip")
    for name, extra in (("random", []), ("sac", ["policy=sb3", f"policy.path={root}/sac.zip"])):
        args = [f"total_frames={FRAMES}", f"out={root / name}.h5", "seed=1", *extra]
        res = run_cli("run", "env=Pendulum", "progress=none", *args)
        assert res.code == 0, res.stderr
    res = run_cli(
        "merge", str(root / "random.h5"), str(root / "sac.h5"), "--out", str(root / "me.h5")
    )
    assert res.code == 0, res.stderr
    assert json.loads(res.stdout)["filled"] == [fmt.ACTION_LOG_PROB]  # SAC: no value
    assert "--keys common drops it" in res.stderr
    members = {name: root / f"{name}.h5" for name in ("random", "sac", "me")}
    return {"root": root, "model": root / "sac.zip", **members}


def episodes(path: Path) -> dict[int, dict]:
    """Each episode of ``path`` by (source, the sha256 of its observations): its row,
    and its frames read back lane by lane (valid frames of its traj id)."""
    ds = open_dataset(path)
    rows = ds.episodes()
    traj, mask = ds.array(fmt.TRAJ), ds.array(fmt.MASK).astype(bool)
    keys = [k for k, _, _ in ds.describe() if not fmt.is_episodes(k) and k != fmt.TRAJ]
    arrays = {k: ds.array(k) for k in keys}
    out = {}
    for i in range(len(rows["traj_id"])):
        lane, tid = rows["lane"][i], rows["traj_id"][i]
        sel = mask[lane] & (traj[lane] == tid)
        frames = {k: np.asarray(a[lane][sel]) for k, a in arrays.items()}
        assert len(frames[fmt.OBSERVATION]) == rows["length"][i]
        digest = hashlib.sha256(frames[fmt.OBSERVATION].tobytes()).hexdigest()
        row = {c: rows[c][i].item() for c in fmt.COLUMNS}
        out[digest] = {"row": row, "frames": frames, "source": ds.meta[fmt.SOURCES][row["source"]]}
    return out


def same_episode(a: dict, b: dict) -> None:
    for column in ("length", "return", "terminated", "truncated", "complete"):
        assert a["row"][column] == b["row"][column], column
    assert fmt.OBSERVATION in a["frames"].keys() & b["frames"].keys()
    for key in a["frames"].keys() & b["frames"].keys():  # a merge's filled keys aside
        np.testing.assert_array_equal(a["frames"][key], b["frames"][key], err_msg=key)
    assert {k: v for k, v in a["source"].items() if k != "origin"} == {
        k: v for k, v in b["source"].items() if k != "origin"
    }


def test_sources_name_the_policy_that_acted(family):
    from stable_baselines3 import SAC

    model = SAC.load(family["model"], device="cpu")
    merged = episodes(family["me"])
    meta = assert_consistent(family["me"])
    assert [s["policy"] for s in meta[fmt.SOURCES]] == ["random", "sb3"]
    sac_row = meta[fmt.SOURCES][1]
    assert sac_row["algorithm"] == "SAC" and sac_row["training_step"] == 48
    assert sac_row["sha256"] == hashlib.sha256(family["model"].read_bytes()).hexdigest()
    assert meta[fmt.FILLED] == {fmt.ACTION_LOG_PROB: [1]}
    by_source = {0: 0, 1: 0}
    for ep in merged.values():
        source = ep["row"]["source"]
        by_source[source] += 1
        want, _ = model.predict(ep["frames"][fmt.OBSERVATION], deterministic=True)
        matches = np.allclose(ep["frames"][fmt.ACTION], want, atol=1e-5)
        assert matches == (source == 1), "an episode's source is the policy that acted"
        assert np.isnan(ep["frames"][fmt.ACTION_LOG_PROB]).all() == (source == 0)
    assert by_source == {0: 24, 1: 24}
    res = run_cli("validate", str(family["me"]), "--replay")  # the SB3 policy's too
    assert res.code == 0 and "8000 of 8000 transitions in Pendulum-v1: 0 mismatches" in res.stdout
    for member, source in (("random", 0), ("sac", 1)):  # every member episode, once, same
        for digest, ep in episodes(family[member]).items():
            assert merged[digest]["row"]["source"] == source
            same_episode(merged[digest], ep)


def test_filter_keeps_exactly_what_was_asked(family, tmp_path):
    src = episodes(family["me"])
    rows = open_dataset(family["me"]).episodes()
    out = tmp_path / "top.h5"
    args = ["--complete-only", "--source", "1", "--top", "0.5", "--min-return", "-1e9"]
    res = run_cli("filter", str(family["me"]), "--out", str(out), *args)
    assert res.code == 0, res.stderr
    keep = rows["complete"] & (rows["source"] == 1)
    best = np.sort(rows["return"][keep])[::-1][: int(np.floor(keep.sum() * 0.5 + 0.5))]
    got = episodes(out)
    assert sorted(e["row"]["return"] for e in got.values()) == sorted(best.tolist())
    summary = json.loads(res.stdout)
    assert summary["episodes"] == len(best) == 8
    assert summary["frames"] == sum(e["row"]["length"] for e in got.values())
    for digest, ep in got.items():
        same_episode(src[digest], ep)
    meta = assert_consistent(out)
    assert assert_split_on_done(out) == len(best)
    assert meta[fmt.DERIVED]["op"] == "filter" and meta[fmt.SOURCES][1]["policy"] == "sb3"
    res = run_cli("run", f"out={out}", "resume=true", "env=Pendulum", "progress=none")
    assert res.code == 2 and "`rlcollect filter` made it" in res.stderr


@pytest.mark.parametrize("seed", [0, 7])
def test_split_is_a_partition_stratified_by_source_and_seeded(family, tmp_path, seed):
    src = episodes(family["me"])
    outs = []
    for again in range(2):
        out = tmp_path / f"split{again}"
        res = run_cli(
            "split", str(family["me"]), "--val", "0.25", "--seed", str(seed), "--out", str(out)
        )
        assert res.code == 0, res.stderr
        outs.append(out)
    train, val = episodes(outs[0] / "train.h5"), episodes(outs[0] / "val.h5")
    assert not set(train) & set(val)
    assert set(train) | set(val) == set(src)
    for digest, ep in (*train.items(), *val.items()):
        same_episode(src[digest], ep)
    for half in (train, val):  # stratified: 6 of each source's 24 in val
        counts = np.bincount([e["row"]["source"] for e in half.values()], minlength=2)
        assert counts.tolist() == ([18, 18] if half is train else [6, 6])
    frames = sum(int(open_dataset(outs[0] / f"{h}.h5").meta["frames"]) for h in ("train", "val"))
    assert frames == int(open_dataset(family["me"]).meta["frames"])
    for half in ("train.h5", "val.h5"):
        assert_consistent(outs[0] / half)
        assert_split_on_done(outs[0] / half)
        a, b = h5py.File(outs[0] / half), h5py.File(outs[1] / half)
        for key in [k for k in a if isinstance(a[k], h5py.Dataset)] + [
            f"episodes/{c}" for c in fmt.COLUMNS
        ]:
            np.testing.assert_array_equal(a[key][()], b[key][()], err_msg=key)
        assert a.attrs[fmt.SOURCES] == b.attrs[fmt.SOURCES]


def test_merge_take_fractions_and_the_exports_keep_sources(family, tmp_path):
    out = tmp_path / "mix.h5"
    res = run_cli("merge", str(family["random"]), str(family["sac"]), "--out", str(out),
                  "--take", "0.5,1.0", "--seed", "3")  # fmt: skip
    assert res.code == 0, res.stderr
    assert json.loads(res.stdout)["taken"] == [12, 24]
    got = episodes(out)
    counts = np.bincount([e["row"]["source"] for e in got.values()], minlength=2)
    assert counts.tolist() == [12, 24]
    members = {**episodes(family["random"]), **episodes(family["sac"])}
    for digest, ep in got.items():
        same_episode(members[digest], ep)
    assert_consistent(out)
    ds = open_dataset(out)
    sources = ds.episodes()["source"]
    d4rl = tmp_path / "mix-d4rl.h5"
    assert run_cli("export", str(out), "--format", "d4rl", "--out", str(d4rl)).code == 0
    with h5py.File(d4rl) as f:
        per_frame = f["infos/source"][()]
        table = json.loads(f["metadata/sources"][()])
        assert np.isnan(f["infos/action_log_prob"][()][per_frame == 0]).all()
    assert [t["policy"] for t in table] == ["random", "sb3"]
    lengths = ds.episodes()["length"]
    assert np.bincount(per_frame).tolist() == [int(lengths[sources == s].sum()) for s in (0, 1)]
    pq = pytest.importorskip("pyarrow.parquet")
    hf = tmp_path / "mix-hf"
    assert run_cli("export", str(out), "--format", "hf", "--out", str(hf)).code == 0
    table = pq.read_table(sorted((hf / "data").glob("*.parquet")))
    assert sorted(table["source"].to_pylist()) == sorted(sources.tolist())


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["filter", "{me}", "--out", "{out}", "--source", "5"],
            "--source 5: the dataset has sources 0..1",
        ),
        (["filter", "{me}", "--out", "{out}", "--top", "1.5"], "not a fraction in (0, 1]"),
        (["filter", "{me}", "--out", "{out}", "--min-return", "1e9"], "no episode is left"),
        (["filter", "{me}", "--out", "{me}", "--overwrite"], "overlaps the source dataset"),
        (["split", "{me}", "--out", "{out}", "--val", "0"], "not a fraction in (0, 1]"),
        (["split", "{me}", "--out", "{out}", "--val", "1"], "leaves the train half empty"),
        (["merge", "{me}", "{me}", "--out", "{out}", "--take", "0.5"], "1 fractions for 2 shards"),
        (["merge", "{me}", "{random}", "--out", "{out}", "--take", "0.5,-1"], "not a fraction"),
    ],
)
def test_bad_requests_exit_2_and_create_nothing(family, tmp_path, args, words):
    before = sorted(p.name for p in family["root"].iterdir())
    out = tmp_path / "out.h5"
    paths = {"me": family["me"], "random": family["random"], "out": out}
    res = run_cli(*(a.format(**paths) for a in args))
    assert res.code == 2, res.stderr
    assert words in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in family["root"].iterdir()) == before


def test_minari_export_keeps_each_episodes_source(family, tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    out = tmp_path / "minari" / "rlcollect" / "pendulum-me-v0"
    res = run_cli("export", str(family["me"]), "--format", "minari", "--out", str(out))
    assert res.code == 0, res.stderr
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    dataset = minari.load_dataset("rlcollect/pendulum-me-v0")
    rows = open_dataset(family["me"]).episodes()
    source_of = dict(zip(rows["traj_id"].tolist(), rows["source"].tolist(), strict=True))
    metadata = list(dataset.storage.get_episode_metadata(range(dataset.total_episodes)))
    assert [m["rlcollect_source"] for m in metadata] == [
        source_of[m["rlcollect_traj_id"]] for m in metadata
    ]
    assert sorted({m["rlcollect_source"] for m in metadata}) == [0, 1]
    table = dataset.storage.metadata["rlcollect"][fmt.SOURCES]
    assert [row["policy"] for row in table] == ["random", "sb3"]


@pytest.mark.parametrize("delay", [0.3, 0.6, 0.9, 1.2])
def test_ctrl_c_at_any_moment_leaves_the_whole_output_or_nothing(family, tmp_path, delay):
    """SIGINT while filter or split runs: exit 130 with nothing at --out, or it had
    finished (exit 0, a sound output); never a part, never a leftover."""
    import signal
    import subprocess
    import sys
    import time

    for command, out in (("filter", tmp_path / "f.h5"), ("split", tmp_path / "s")):
        extra = ["--top", "0.5"] if command == "filter" else ["--val", "0.5"]
        args = [command, str(family["me"]), "--out", str(out), *extra]
        proc = subprocess.Popen(
            [sys.executable, "-m", "collect_cli", *args], cwd=tmp_path, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 130), err
        if proc.returncode == 130:
            assert not out.exists() and err.strip().splitlines()[-1].endswith("interrupted")
        else:
            for path in [out] if command == "filter" else [out / "train.h5", out / "val.h5"]:
                assert_consistent(path)
        left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
        assert not left, f"leftovers {left}"
