"""``rlcollect report`` and ``rlcollect card`` on real datasets, through the real CLI.

Datasets are collected once per session in process (``run``, the code path of
``rlcollect run``); the commands run in subprocesses, and their pages, PNGs,
JSON and cards are read back and checked against numbers computed here from
the dataset itself.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from matplotlib.image import imread
from typer.testing import CliRunner

from collect_cli import config, specs
from collect_cli.cli import app
from collect_cli.collectors import SyncCollector
from collect_cli.dataset import make_writer, open_dataset
from collect_cli.envs import env_factory
from collect_cli.ops.merge import merge
from collect_cli.report import stats as report
from collect_cli.report.html import viewable
from collect_cli.report.stats import HIST_BINS
from collect_cli.run import run
from tests.helpers import write_preempted
from tests.support.cli_runner import Result, run_cli

REFS = {"ref_min_score": -1600.0, "ref_max_score": 0.0}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str) -> Result:
    """The CLI in this process (fast: torch is imported once); exit codes are
    checked in subprocesses in the error tests."""
    res = CliRunner().invoke(app, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return Result(res.exit_code, res.stdout, res.stderr)


def collect(out: Path, *overrides: str, extra: dict | None = None) -> Path:
    settings = config.load(
        config.compose([f"out={out}", "progress=none", "frames_per_batch=200", *overrides])
    )
    run(dataclasses.replace(settings, extra_metadata=extra or {}))
    return out


@pytest.fixture(scope="session")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    made = {
        # 2 lanes x 500 steps: 4 complete Pendulum episodes (200 steps) and 2 cut ones
        "pend": collect(
            root / "pend.h5",
            "env=Pendulum",
            "env.num_envs=2",
            "total_frames=1000",
            "seed=1",
            extra={"dataset": {"author": "Ada <ada@example.org>", **REFS}},
        ),
        "cart": collect(
            root / "cart", "env=CartPole", "env.num_envs=3", "total_frames=600", "writer=memmap"
        ),
        "pixels": collect(
            root / "pixels.h5",
            "env=gym",
            "env.id=pixelenvs:Pixels-v0",
            "+env.kwargs.size=16",
            "+env.kwargs.length=12",
            "env.num_envs=2",
            "total_frames=80",
            "frames_per_batch=40",
        ),
    }
    shards = [
        collect(root / f"shard{i}.h5", "env=Pendulum", "env.num_envs=1", "total_frames=400",
                f"seed={i}")
        for i in range(2)
    ]  # fmt: skip
    merge(shards, root / "merged.h5")
    made["merged"] = root / "merged.h5"
    made["nested"] = collect(
        root / "nested", "env=gym", "env.id=toyenvs:Nested-v0", "env.num_envs=2",
        "total_frames=100", "frames_per_batch=50", "writer=memmap",
    )  # fmt: skip
    made["padded"] = write_preempted(root / "padded.h5", "hdf5", {}, 7, 60, 300)
    return made


class Page(HTMLParser):
    """Sections (by id), images (src), and the summary table's rows, from the page."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: list[str] = []
        self.images: list[str] = []
        self.notes: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self._in_note = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs["id"])
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "p" and attrs.get("class") == "note":
            self._in_note = True
            self.notes.append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "p":
            self._in_note = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_note:
            self.notes[-1] += data


def decode_png(data: bytes) -> np.ndarray:
    assert data.startswith(PNG_MAGIC)
    pixels = imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50
    assert pixels.std() > 0, "a blank figure"
    return pixels


def expected(path: Path) -> dict:
    """Numbers computed straight from the dataset's arrays."""
    ds = open_dataset(path)
    count = int(ds.meta["episodes"])
    rows = {k: v[:count] for k, v in ds.episodes().items()}
    returns = rows["return"][rows["complete"]]
    mask = ds.array("collector/mask").reshape(ds.array("collector/mask").shape[:2])
    return {
        "meta": ds.meta,
        "rows": rows,
        "returns": returns,
        "mask": mask,
        "obs": ds.array("observation")[mask],
        "action": ds.array("action")[mask],
    }


def table(page: Page) -> dict[str, list[str]]:
    head, *rows = page.tables[0]
    return {"": head[1:], **{row[0]: row[1:] for row in rows}}


def test_html_page_two_datasets(datasets, tmp_path):
    out = tmp_path / "page.html"
    res = run_cli("report", str(datasets["pend"]), str(datasets["cart"]), "--out", str(out))
    assert res.code == 0, res.stderr
    assert json.loads(res.stdout)["path"] == str(out)
    assert not list(tmp_path.glob(".page.html*")), "a temporary file was left behind"
    page = Page(out.read_text())
    assert page.sections == ["summary", "episodes", "actions", "observations", "clips", "padding"]
    pngs = [src for src in page.images if src.startswith("data:image/png;base64,")]
    assert len(pngs) == 5  # the figures; the clips: the best and worst episode of each, GIF
    assert len(page.images) - len(pngs) == 4
    for src in pngs:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        decode_png(base64.b64decode(src[len(prefix) :], validate=True))
    rows = table(page)
    assert [name.strip() for name in rows[""]] == ["pend.h5", "cart"]
    for column, name in enumerate(("pend", "cart")):
        want = expected(datasets[name])
        assert rows["frames"][column] == f"{want['meta']['frames']:,}"
        assert rows["episodes"][column] == f"{len(want['rows']['traj_id']):,}"
        cut = int((~want["rows"]["complete"]).sum())
        assert rows["cut episodes"][column] == f"{cut:,}"
        assert rows["return mean"][column] == f"{want['returns'].mean():.4g}"
        assert rows["return max"][column] == f"{want['returns'].max():.4g}"
    assert rows["backend"] == ["hdf5", "memmap"]
    assert "author: Ada <ada@example.org>" in rows["provenance"][0]
    pend = expected(datasets["pend"])["returns"].mean()
    assert rows["normalised score"][0] == f"{100 * (pend + 1600) / 1600:.4g}"
    assert rows["normalised score"][1] == ""  # cart has no reference scores
    # sources table: one source each, holding all of its dataset's episodes
    sources = page.tables[1]
    assert [row[:3] for row in sources[1:]] == [["pend.h5", "0", "random"], ["cart", "0", "random"]]
    for row, name in zip(sources[1:], ("pend", "cart"), strict=True):
        episodes = len(expected(datasets[name])["rows"]["traj_id"])
        assert row[sources[0].index("episodes")] == f"{episodes:,}"
    # padding table: valid frames per dataset, counted from the mask here
    padding = {row[0]: row[1:] for row in page.tables[2]}
    assert padding["valid frames"] == [
        f"{int(expected(datasets[n])['mask'].sum()):,}" for n in ("pend", "cart")
    ]
    assert page.notes == []  # both complete


def test_json_numbers_equal_the_dataset(datasets):
    res = invoke("report", str(datasets["pend"]), str(datasets["cart"]), "--json")
    assert res.code == 0, res.stderr
    pend, cart = json.loads(res.stdout)
    want = expected(datasets["pend"])
    r = want["returns"]
    assert pend["return"] == pytest.approx(
        {"mean": r.mean(), "std": r.std(), "min": r.min(), "max": r.max()}, rel=1e-12
    )
    assert pend["summary"]["normalised score"] == pytest.approx(100 * (r.mean() + 1600) / 1600)
    assert pend["summary"]["frames"] == want["meta"]["frames"] == int(want["mask"].sum())
    hist = pend["episodes"]["return_hist"]
    counts, edges = np.histogram(r, bins=HIST_BINS)
    assert hist["counts"] == counts.tolist()
    np.testing.assert_allclose(hist["edges"], edges)
    lengths = want["rows"]["length"][want["rows"]["complete"]]
    assert sum(pend["episodes"]["length_hist"]["counts"]) == len(lengths)
    drift = pend["episodes"]["drift"]
    np.testing.assert_allclose(drift["mean"], r)  # fewer episodes than points: one each
    assert pend["lanes"]["frames"] == want["mask"].sum(axis=1).tolist()
    assert pend["lanes"]["episodes"] == np.bincount(want["rows"]["lane"]).tolist()
    assert pend["padding"]["valid_frames"] == int(want["mask"].sum())
    assert pend["padding"]["padding_frames"] == 0
    # fewer frames than the sample size: every frame is in the distributions
    assert pend["sample"] == {
        "frames": 1000, "of": 1000, "every": 1, "action_dims_shown": 1, "action_dims": 1,
        "observation_dims_shown": 3, "observation_dims": 3,
    }  # fmt: skip
    for d, dim in enumerate(pend["dims"]["observation"]):
        assert dim["label"] == f"observation[{d}]" and dim["kind"] == "continuous"
        counts, edges = np.histogram(want["obs"][:, d].astype(np.float64), bins=HIST_BINS)
        assert dim["counts"] == counts.tolist()
        np.testing.assert_allclose(dim["edges"], edges)
    # CartPole's discrete action: bars, counted over every valid frame
    want = expected(datasets["cart"])
    (action,) = cart["dims"]["action"]
    values, counts = np.unique(want["action"], return_counts=True)
    assert action["kind"] == "discrete"
    assert action["values"] == values.tolist() and action["counts"] == counts.tolist()
    assert cart["summary"]["cut episodes"] == int((~want["rows"]["complete"]).sum()) > 0


def test_png_format_and_image_strip(datasets, tmp_path):
    out = tmp_path / "figs"
    res = invoke("report", str(datasets["pixels"]), "--format", "png", "--out", str(out))
    assert res.code == 0, res.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["action.png", "drift.png", "episodes.png", "image_strip.png", "lanes.png"]
    for file in out.iterdir():
        decode_png(file.read_bytes())
    # the strip shows the frames themselves: compare with the stored episode
    stats = json.loads(invoke("report", str(datasets["pixels"]), "--json").stdout)[0]
    strip = stats["image_strip"]
    assert strip["key"] == "observation" and strip["shape"] == [16, 16, 3]
    assert strip["steps"][0] == 0 and strip["steps"][-1] == strip["episode_length"] - 1
    assert stats["dims"]["observation"] == []  # images are shown as frames, not per dim
    page = tmp_path / "pixels.html"
    assert invoke("report", str(datasets["pixels"]), "--out", str(page)).code == 0
    assert "images" in Page(page.read_text()).sections


def test_viewable_puts_channels_last():
    chw = np.zeros((3, 8, 10), np.uint8)
    assert viewable(chw).shape == (8, 10, 3)
    stack = np.zeros((4, 84, 84), np.uint8)  # 4 stacked grey frames: the last one
    assert viewable(stack).shape == (84, 84)
    assert viewable(np.zeros((2, 8, 10, 3), np.uint8)).shape == (8, 10, 3)


def test_merged_and_running_datasets(datasets, tmp_path):
    res = invoke("report", str(datasets["merged"]), "--json")
    assert res.code == 0, res.stderr
    (merged,) = json.loads(res.stdout)
    assert merged["summary"]["merged from"] == "2 shards"
    files = [datasets["merged"], *(datasets["merged"].parent / f"shard{i}.h5" for i in (0, 1))]
    # a virtual merge links the shards' frames: they count
    assert merged["summary"]["bytes on disk"] == sum(f.stat().st_blocks * 512 for f in files)
    assert merged["summary"]["frames"] == 800 == sum(merged["lanes"]["frames"])
    # a run still going (committed, not closed): the page says so at the top
    running = tmp_path / "running.h5"
    with SyncCollector(env_factory("Pendulum-v1", 2), frames_per_batch=100, total_frames=300) as c:
        meta = {
            "env_id": c.env_id,
            "observation_space": specs.describe(c.observation_space),
            "action_space": specs.describe(c.action_space),
        }
        writer = make_writer("hdf5", running, metadata=meta).open()
        for batch in c:
            writer.append(batch)
            writer.commit()
    out = tmp_path / "r.html"
    try:
        assert open_dataset(running).meta["status"] == "running"
        res = invoke("report", str(running), "--out", str(out))
    finally:
        writer.close()
    assert res.code == 0, res.stderr
    assert "running.h5 is running" in res.stderr
    page = Page(out.read_text())
    assert page.notes and page.notes[0].startswith("running.h5 is running: this report shows")


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, re.S)


def run_snippet(code: str, where: Path, monkeypatch, capsys) -> str:
    """Run a card's Python block as written, from ``where``; what it printed."""
    monkeypatch.chdir(where)
    capsys.readouterr()
    exec(compile(code, "<card>", "exec"), {"__name__": "__card__"})
    return capsys.readouterr().out


@pytest.mark.parametrize("name", ["pend", "cart"])
def test_card_front_matter_and_snippets_run(datasets, name, monkeypatch, capsys):
    path = datasets[name]
    card = path.parent / f"README-{name}.md"
    res = invoke("card", str(path), "--out", str(card), "--license", "cc-by-4.0")
    assert res.code == 0, res.stderr
    text = card.read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["license"] == "cc-by-4.0"
    assert front["task_categories"] == ["reinforcement-learning"]
    assert front["size_categories"] == ["n<1K" if name == "cart" else "1K<n<10K"]
    assert "rlcollect" in front["tags"]
    assert "## Schema" in text and "| `collector/mask` |" in text
    meta = open_dataset(path).meta
    assert f"| frames | {meta['frames']} |" in text
    printed = run_snippet(python_blocks(text)[0], card.parent, monkeypatch, capsys)
    assert f"{meta['frames']} valid frames, {meta['episodes']} episodes" in printed


def test_card_minari_snippet_runs(datasets, tmp_path, monkeypatch, capsys):
    """The card's Minari lines, as written: export from the card's folder, then load."""
    monkeypatch.chdir(tmp_path)  # a printed card names the dataset relative to the cwd
    monkeypatch.setenv("MINARI_DATASETS_PATH", "unset")  # restored: the snippet sets it
    res = invoke("card", str(datasets["pend"]))
    assert res.code == 0, res.stderr
    assert res.stdout.startswith("---\nlicense: unknown\n")
    shell = re.search(r"```bash\n(.*?)\n```", res.stdout, re.S).group(1)
    assert shell.startswith("rlcollect export ")
    exported = invoke(*shell.split()[1:])
    assert exported.code == 0, exported.stderr
    printed = run_snippet(python_blocks(res.stdout)[1], tmp_path, monkeypatch, capsys)
    assert printed.strip() == f"{open_dataset(datasets['pend']).meta['episodes']} episodes"


def one_error_line(res, code: int, text: str) -> None:
    assert res.code == code, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlcollect: error: "), res.stderr
    assert text in lines[0], lines[0]
    assert res.stdout == ""


def test_errors_are_one_line(datasets, tmp_path):
    missing = tmp_path / "nope.h5"
    # a damaged dataset: its metadata opens, a frame key is gone
    damaged = tmp_path / "damaged.h5"
    shutil.copy(datasets["pend"], damaged)
    with h5py.File(damaged, "r+") as f:
        del f["observation"]
    # the two processes side by side: each spends its time importing torch
    with ThreadPoolExecutor(2) as pool:
        gone = pool.submit(run_cli, "report", str(missing))
        broken = pool.submit(run_cli, "report", str(damaged), "--json")
    one_error_line(gone.result(), 2, "no dataset at")
    one_error_line(broken.result(), 1, "cannot read")
    # in process: the same answers from card, and the usage errors
    one_error_line(invoke("card", str(missing)), 2, "no dataset at")
    one_error_line(invoke("card", str(damaged)), 1, "rlcollect validate")
    bogus = tmp_path / "bogus.h5"
    bogus.write_text("not hdf5")
    one_error_line(invoke("card", str(bogus)), 2, "not a readable HDF5 dataset")
    one_error_line(invoke("report", str(bogus), "--json"), 2, "not a readable HDF5 dataset")
    pend = str(datasets["pend"])
    one_error_line(invoke("report", pend, "--format", "svg"), 2, "choose from html, png")
    taken = tmp_path / "taken.html"
    taken.write_text("keep me")
    one_error_line(invoke("report", pend, "--out", str(taken)), 2, "pass --overwrite")
    one_error_line(invoke("card", pend, "--out", str(taken)), 2, "pass --overwrite")
    assert taken.read_text() == "keep me"
    one_error_line(invoke("report", pend, "--out", pend, "--overwrite"), 2, "overlaps")
    # --overwrite replaces a page the report wrote, never a file of the user's
    res = invoke("report", pend, "--out", str(taken), "--overwrite")
    one_error_line(res, 2, "is a file and not a report page")
    assert taken.read_text() == "keep me"
    page = tmp_path / "page.html"
    assert invoke("report", pend, "--out", str(page)).code == 0
    res = invoke("report", pend, "--out", str(page), "--overwrite")
    assert res.code == 0 and page.read_text().startswith("<!DOCTYPE html>")


def test_without_matplotlib_says_what_to_install(datasets, tmp_path):
    # a matplotlib package that fails to import stands in for one not installed
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {"PYTHONPATH": str(shadow.parent)}
    out = tmp_path / "r.html"
    res = run_cli("report", str(datasets["pend"]), "--out", str(out), env=env)
    one_error_line(res, 2, "pip install 'rlcollect[report]'")
    assert not out.exists()


def test_sampled_distributions_take_every_kth_valid_frame(datasets, monkeypatch):
    """Past SAMPLE_FRAMES valid frames, the per-dimension plots use every k-th one."""
    monkeypatch.setattr(report, "SAMPLE_FRAMES", 100)
    stats = report.dataset_stats(datasets["pend"])
    want = expected(datasets["pend"])
    assert stats.sample["every"] == 10 and stats.sample["frames"] == 100
    # one block holds the whole small dataset: valid frames in lane-major order
    sample = want["obs"][::10]
    for d, dim in enumerate(stats.dims["observation"]):
        counts, _ = np.histogram(sample[:, d].astype(np.float64), bins=HIST_BINS)
        assert dim["counts"] == counts.tolist()


def test_image_strip_frames_are_the_stored_frames(datasets):
    stats = report.dataset_stats(datasets["pixels"])
    ds = open_dataset(datasets["pixels"])
    strip = stats.strip
    start = ds.episodes()["start"][ds.episodes()["traj_id"] == strip["traj_id"]][0]
    stored = ds.array("observation")[strip["lane"]]
    assert len(stats.strip_frames) == len(strip["steps"]) > 1
    for step, frame in zip(strip["steps"], stats.strip_frames, strict=True):
        np.testing.assert_array_equal(frame, stored[start + step])


def test_padding_and_per_lane_counts(datasets):
    res = invoke("report", str(datasets["padded"]), "--json")
    assert res.code == 0, res.stderr
    (stats,) = json.loads(res.stdout)
    ds = open_dataset(datasets["padded"])
    mask = ds.array("collector/mask").reshape(ds.array("collector/mask").shape[:2])
    committed = np.arange(mask.shape[1])[None, :] < np.asarray(ds.meta["lane_steps"])[:, None]
    padding = committed & ~mask
    assert padding.any(), "no padding: the test is void"
    assert stats["padding"]["padding_frames"] == int(padding.sum())
    assert stats["padding"]["valid_frames"] == int((mask & committed).sum())
    assert stats["lanes"]["padding"] == padding.sum(axis=1).tolist()
    assert stats["lanes"]["frames"] == (mask & committed).sum(axis=1).tolist()
    assert stats["padding"]["lanes_with_padding"] == int(padding.any(axis=1).sum())


def test_page_of_padded_and_nested_datasets(datasets, tmp_path):
    out = tmp_path / "figs"
    paths = [str(datasets["padded"]), str(datasets["nested"])]
    res = invoke("report", *paths, "--format", "png", "--out", str(out))
    assert res.code == 0, res.stderr
    for file in out.iterdir():
        decode_png(file.read_bytes())
    assert {f.name for f in out.iterdir()} >= {"action.png", "observation.png", "lanes.png"}


def test_nested_spaces(datasets):
    res = invoke("report", str(datasets["nested"]), "--json")
    assert res.code == 0, res.stderr
    (stats,) = json.loads(res.stdout)
    actions = {d["label"]: d for d in stats["dims"]["action"]}
    # Tuple action (Discrete, Box(3), MultiDiscrete(2)): 6 dims, the discrete ones as bars
    assert list(actions) == [
        "action/0", "action/1[0]", "action/1[1]", "action/1[2]", "action/2[0]", "action/2[1]",
    ]  # fmt: skip
    assert [d["kind"] for d in actions.values()] == [
        "discrete",
        *["continuous"] * 3,
        *["discrete"] * 2,
    ]
    ds = open_dataset(datasets["nested"])
    mask = ds.array("collector/mask")
    values, counts = np.unique(ds.array("action/0")[mask], return_counts=True)
    assert actions["action/0"]["values"] == values.tolist()
    assert actions["action/0"]["counts"] == counts.tolist()
    # Dict observation, in the space's key order: all 7 dims (under MAX_DIMS)
    observations = {d["label"]: d["kind"] for d in stats["dims"]["observation"]}
    assert observations == {
        **{f"observation/flags[{i}]": "discrete" for i in range(4)},
        "observation/mode": "discrete",
        "observation/pos[0]": "continuous",
        "observation/pos[1]": "continuous",
    }
    assert stats["sample"]["observation_dims"] == 7


def test_help_imports_neither_torch_nor_matplotlib():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from collect_cli.cli import app\n"
        "for command in ('report', 'card'):\n"
        "    assert CliRunner().invoke(app, [command, '--help']).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
