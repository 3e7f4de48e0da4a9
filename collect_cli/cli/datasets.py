"""The commands on datasets: ``info``, ``validate``, ``export``, ``merge``, ``report``,
``card``, and ``envs`` (what this machine can collect from)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from collect_cli.cli.app import app, guarded
from collect_cli.errors import EXIT_OK, EXIT_RUNTIME, UsageError

DatasetPath = Annotated[Path, typer.Argument(help="An rlcollect dataset (.h5 file or memmap dir).")]
RefMin = Annotated[
    Path | None,
    typer.Option("--ref-min", help="A dataset whose mean return scores 0 (e.g. the random one)."),
]
RefMax = Annotated[
    Path | None,
    typer.Option("--ref-max", help="A dataset whose mean return scores 100 (the expert one)."),
]


def _references(low: Path | None, high: Path | None, path: Path) -> tuple[float, float] | None:
    """The reference scores ``--ref-min``/``--ref-max`` name, of ``path``'s env."""
    if low is None and high is None:
        return None
    if low is None or high is None:
        raise UsageError("give both --ref-min and --ref-max (the datasets scoring 0 and 100)")
    from collect_cli.dataset import open_dataset
    from collect_cli.ops.summary import reference_scores

    return reference_scores(low, high, open_dataset(path).meta.get("env_id"))


@app.command()
@guarded
def info(
    path: DatasetPath,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ref_min: RefMin = None,
    ref_max: RefMax = None,
) -> int:
    """Show what is in a dataset: frames, episodes, returns per source, keys, size, status,
    config."""

    from collect_cli.dataset import open_dataset
    from collect_cli.ops.summary import summarize

    data = summarize(open_dataset(path), refs=_references(ref_min, ref_max, path))
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        _print_info(data)
    return EXIT_OK


@app.command()
@guarded
def validate(
    path: DatasetPath,
    replay: Annotated[
        bool,
        typer.Option(
            "--replay", help="Also step recorded transitions again in the env and compare."
        ),
    ] = False,
    samples: Annotated[
        int | None,
        typer.Option("--samples", help="--replay: how many (default: all, or 10000 sampled)."),
    ] = None,
) -> int:
    """Check a dataset's integrity; exit 0 only if it is sound, 1 with what is wrong."""

    from collect_cli.dataset import locate
    from collect_cli.ops.validate import check as check_dataset

    locate(path)  # nothing there, or no file or folder (a FIFO, a loop): exit 2
    if samples is not None and (not replay or samples < 1):
        raise UsageError("--samples N (N >= 1) goes with --replay")
    problems, notes = check_dataset(path)
    for note in notes:
        print(f"rlcollect: note: {path}: {note}", file=sys.stderr)
    for problem in problems:
        print(f"{path}: {problem}")
    if problems:
        return EXIT_RUNTIME
    if not replay:
        print(f"ok: {path} is sound")
        return EXIT_OK
    from collect_cli.ops.replay import SHOWN
    from collect_cli.ops.replay import replay as replay_dataset

    result = replay_dataset(path, samples)
    for note in result.notes:
        print(f"rlcollect: note: {path}: {note}", file=sys.stderr)
    for kind, where in result.mismatches.items():
        if where:
            first = ", ".join(f"(lane {lane}, step {t})" for lane, t in where[:SHOWN])
            print(f"{path}: {kind}: {len(where)} mismatches, at {first}")
    said = f"replayed {result.replayed} of {result.of} transitions in {result.env_id}"
    if result.found:
        print(f"{path}: {said}: {result.found} mismatches")
        return EXIT_RUNTIME
    print(f"ok: {path} is sound; {said}: 0 mismatches")
    return EXIT_OK


_EXPORT_HELP = """Export a dataset (.h5 file or memmap dir) to D4RL, Minari, Hugging Face
or LeRobot.

\b
d4rl:    one HDF5 file: observations actions rewards next_observations
         terminals timeouts, infos/ (policy extras, info keys, traj_id),
         metadata/ (env id, config, seed, spaces, source...). Dict/Tuple
         spaces become groups: observations/<key>, actions/<index>.
minari:  a Minari dataset directory (pip install 'rlcollect\\[export]').
         --out ROOT/NAMESPACE/NAME-vN makes the id NAMESPACE/NAME-vN:
         MINARI_DATASETS_PATH=ROOT, then minari.load_dataset(id).
hf:      Parquet, one row per episode (observations actions rewards dones
         terminals timeouts infos.*) in DIR/data/, the card in DIR/README.md:
         datasets.load_dataset("parquet", data_dir=DIR) (pip install
         'rlcollect\\[export]').
lerobot: a LeRobot v3.0 dataset dir: LeRobotDataset(repo_id, root=DIR).
         observation.state (Dict leaves: observation.<key>), HxWx3 uint8
         images as MP4 video (--video-codec h264|av1; --images: PNG),
         action, next.reward, next.done/terminated/truncated; a Text
         observation (MiniGrid's mission) names each episode's task;
         --fps (default: the env's render_fps, else 30) (pip install
         'rlcollect\\[export]').
\b
Episodes are contiguous (lane by lane, in time order); padding is never
exported. An episode cut by the end of the run (or by a kill) ends with
a timeout (Minari, LeRobot: a truncation) at its last step; --drop-incomplete
leaves such episodes out. A running or interrupted dataset exports its
committed frames. The stdout line is a JSON summary. Exit codes: 0 done,
1 runtime failure or a dataset failing validation, 2 bad usage.
"""


@app.command(help=_EXPORT_HELP)
@guarded
def export(
    path: DatasetPath,
    fmt: Annotated[str, typer.Option("--format", "-f", help="d4rl, minari, hf or lerobot.")],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="d4rl: the .hdf5 file; minari, hf, lerobot: the dir."),
    ],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing --out.")
    ] = False,
    drop_incomplete: Annotated[
        bool, typer.Option("--drop-incomplete", help="Leave out episodes cut by the end.")
    ] = False,
    compression: Annotated[
        str, typer.Option("--compression", help="d4rl: none, gzip or lzf.")
    ] = "none",
    dataset_id: Annotated[
        str | None,
        typer.Option("--dataset-id", help="minari: the id (default: the last 2 parts of --out)."),
    ] = None,
    images: Annotated[
        bool, typer.Option("--images", help="lerobot: images as PNG (lossless), not MP4 video.")
    ] = False,
    fps: Annotated[
        int | None,
        typer.Option("--fps", help="lerobot: frames per second (default: the env's, else 30)."),
    ] = None,
    video_codec: Annotated[
        str | None,
        typer.Option("--video-codec", help="lerobot: the videos' codec, h264 (default) or av1."),
    ] = None,
) -> int:
    from collect_cli.dataformat import COMPLETE
    from collect_cli.ops.export import export as export_dataset

    logging.basicConfig(format="rlcollect: %(levelname)s: %(message)s", stream=sys.stderr)

    def readme() -> str:  # the hf export's card, rendered once its checks have passed
        from collect_cli.report.card import render_card
        from collect_cli.report.stats import dataset_stats

        return render_card(path, dataset_stats(path, frames=False), out.absolute())

    result = export_dataset(
        path,
        fmt,
        out,
        overwrite=overwrite,
        drop_incomplete=drop_incomplete,
        compression=compression,
        dataset_id=dataset_id,
        readme=readme if fmt == "hf" else None,
        images=images,
        fps=fps,
        video_codec=video_codec,
    )
    if result.source_status != COMPLETE:
        fate = "dropped" if drop_incomplete else f"ending with a {result.incomplete}"
        print(
            f"rlcollect: note: {path} is {result.source_status}: exported its committed "
            f"frames ({result.incomplete_episodes} incomplete episodes {fate})",
            file=sys.stderr,
        )
    print(json.dumps(result.as_dict()), flush=True)
    return EXIT_OK


@app.command()
@guarded
def merge(
    shards: Annotated[
        list[Path], typer.Argument(help="Datasets to merge (the shards of a sweep), in order.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="The merged dataset to write.")],
    copy: Annotated[
        bool,
        typer.Option(
            "--copy", help="HDF5: copy the frames (a self-contained file), not link them."
        ),
    ] = False,
    allow_incomplete: Annotated[
        bool,
        typer.Option("--allow-incomplete", help="Merge shards that did not complete, too."),
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace --out if it exists.")
    ] = False,
    keys: Annotated[
        str,
        typer.Option(
            "--keys", help="all: keep policy outputs some shards lack (NaN/0 there); common."
        ),
    ] = "all",
    take: Annotated[
        str | None,
        typer.Option("--take", help="Fractions of each shard's episodes, e.g. 1.0,0.5 (copies)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="--take: seed of the choice.")] = 0,
) -> int:
    """Merge shards into one dataset: lanes concatenated, traj ids made unique.

    HDF5 shards become virtual datasets (zero-copy; shard paths stored relative to
    the merged file) unless --copy or --take; memmap shards are copied. Shards may
    differ in policy outputs and info keys (a random and an SB3 shard): --keys all
    keeps them, with NaN (or 0) where a shard lacks one (metadata `filled` names the
    sources that hold it); --keys common drops them. Prints a JSON summary.
    """

    if take is not None:
        from collect_cli.cli.app import import_torch_held

        import_torch_held()  # the writer's
        from collect_cli.ops.derive import take as take_from

        try:
            fractions = [float(x) for x in take.split(",")]
        except ValueError:
            raise UsageError(f"--take {take!r}: give fractions like 1.0,0.5") from None
        result = take_from(
            shards, out, fractions, seed=seed, which=keys,
            allow_incomplete=allow_incomplete, overwrite=overwrite,
        )  # fmt: skip
    else:
        from collect_cli.ops.merge import merge as merge_shards

        result = merge_shards(
            shards, out, copy=copy, allow_incomplete=allow_incomplete, overwrite=overwrite,
            which=keys,
        )  # fmt: skip
    for key in result.get("filled", []):
        print(
            f"rlcollect: note: {key!r} is not in every shard: kept, NaN (or 0) where a shard "
            "lacks it (--keys common drops it)",
            file=sys.stderr,
        )
    print(json.dumps(result), flush=True)
    return EXIT_OK


_REPORT_HELP = """See datasets: one self-contained HTML page of plots (or PNG files, or JSON).

\b
Sections: summary table (one column per dataset), episode return and length
histograms, return against episode order, per-dimension distributions of
actions and observations (a sample of frames), image frames of one episode,
clips of the best and the worst episode, padding/mask statistics and per-lane
counts. Several PATHs are overlaid, one
colour each. Needs matplotlib (pip install 'rlcollect\\[report]') except --json.
Exit codes: 0 done, 1 unreadable dataset, 2 bad usage or missing dataset.
"""


def _datasets_stats(paths: list[Path], refs: tuple[float, float] | None) -> list[Any]:
    from collect_cli.report.stats import dataset_stats

    return [dataset_stats(p, refs) for p in paths]


@app.command(help=_REPORT_HELP)
@guarded
def report(
    paths: Annotated[list[Path], typer.Argument(help="Datasets (.h5 files or memmap dirs).")],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="html: the page (report.html); png: a folder (report)."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="html or png.")] = "html",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the numbers behind the plots; write nothing.")
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out.")] = False,
    ref_min: RefMin = None,
    ref_max: RefMax = None,
) -> int:
    if fmt not in ("html", "png"):
        raise UsageError(f"unknown report format {fmt!r}: choose from html, png")
    refs = _references(ref_min, ref_max, paths[0]) if paths else None
    if as_json:
        stats = _datasets_stats(paths, refs)
        print(json.dumps([s.as_dict() for s in stats], indent=2))
        return EXIT_OK
    from collect_cli.dataset.ownership import claim
    from collect_cli.report import html as report_html

    dest = out or Path("report.html" if fmt == "html" else "report")
    with claim(dest, "rlcollect report"):
        replaces = report_html.check_out(dest, paths, overwrite, as_dir=fmt == "png")
        report_html.require_matplotlib()  # the install hint before any dataset is read
        stats = _datasets_stats(paths, refs)
        if fmt == "html":
            page = report_html.render_html(stats).encode("utf-8")
            report_html.write_atomic(dest, page, replaces)
        else:
            report_html.write_atomic(dest, report_html.render_pngs(stats), replaces)
    for s in stats:
        for note in s.notes:
            print(f"rlcollect: note: {note}", file=sys.stderr)
    print(json.dumps({"path": str(dest), "format": fmt, "datasets": [str(p) for p in paths]}))
    return EXIT_OK


@app.command()
@guarded
def card(
    path: DatasetPath,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the card here (default: stdout).")
    ] = None,
    license_id: Annotated[
        str | None,
        typer.Option("--license", help="License id for the front matter (default: unknown)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out.")] = False,
    ref_min: RefMin = None,
    ref_max: RefMax = None,
) -> int:
    """Write a Markdown dataset card (Hugging Face front matter, summary, schema, loading code)."""

    from collect_cli.dataset.ownership import check_destination, claim
    from collect_cli.report.card import is_card, render_card
    from collect_cli.report.stats import dataset_stats

    refs = _references(ref_min, ref_max, path)
    if out is None:
        stats = dataset_stats(path, refs, frames=False)  # the card shows no per-frame plot
        print(render_card(path, stats, Path.cwd(), license_id), end="")
        return EXIT_OK
    from collect_cli.report.html import write_atomic

    with claim(out, "rlcollect card"):
        replaces = check_destination(
            out, overwrite=overwrite, inputs=[path], kind="a card", replaceable=is_card
        )
        stats = dataset_stats(path, refs, frames=False)
        text = render_card(path, stats, out.absolute().parent, license_id)
        write_atomic(out, text.encode("utf-8"), replaces)
    return EXIT_OK


def _print_info(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(show_header=False, box=None)
    for field in (
        "path",
        "backend",
        "status",
        "env_id",
        "policy",
        "seed",
        "frames",
        "lanes",
        "steps",
        "episodes",
        "complete_episodes",
        "size_bytes",
        "start_time",
        "end_time",
    ):
        summary.add_row(field, str(data[field]))
    from collect_cli.ops.summary import codec_words, layout_words

    summary.add_row("layout", layout_words(data))
    codec = data["codec"] or {}
    plugin = f" (other readers: import {codec['plugin']})" if codec.get("plugin") else ""
    summary.add_row("codec", codec_words(data) + plugin)
    if data["return"]:
        r = data["return"]
        summary.add_row(
            "return",
            f"mean {r['mean']:.3f}  std {r['std']:.3f}  min {r['min']:.3f}  max {r['max']:.3f}",
        )
    if data.get("normalized_score") is not None:
        summary.add_row(
            "normalized_score", f"{data['normalized_score']:.1f} (D4RL: 0 min, 100 max)"
        )
    record = {k: v for k, v in (data.get("provenance") or {}).items() if k != "policy"}
    for key, value in (*record.items(), *(data.get("dataset") or {}).items()):
        if isinstance(value, dict):
            value = "  ".join(f"{k} {v}" for k, v in value.items())
        summary.add_row(key, str(value))
    console.print(summary)
    columns: dict[str, list[str]] = {}  # the columns some source fills, in order
    for row in data["sources"]:
        mean, score = (row["return"] or {}).get("mean"), row["normalized_score"]
        cells = {k: row[k] for k in ("source", "policy", "algorithm", "checkpoint")}
        cells.update(step=row["training_step"], seed=row["seed"], episodes=row["episodes"])
        cells.update(frames=row["frames"], mean_return=mean and round(mean, 3))
        cells["score"] = None if score is None else round(score, 1)
        for name, value in cells.items():
            columns.setdefault(name, []).append("" if value is None else str(value))
    shown = {k: v for k, v in columns.items() if any(v)}
    sources = Table(*(k.replace("_", " ") for k in shown), title="sources")
    for cells in zip(*shown.values(), strict=True):
        sources.add_row(*cells)
    console.print(sources)
    keys = Table("key", "shape", "dtype", title="arrays")
    for item in data["keys"]:
        keys.add_row(item["key"], str(tuple(item["shape"])), item["dtype"])
    console.print(keys)
    if data["config"]:
        console.print("config:", style="bold")
        console.print(data["config"], markup=False, highlight=False)


@app.command()
@guarded
def envs(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> int:
    """List env presets, the env backends available here, and whether CUDA is."""

    data = _envs_dict()
    if as_json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table("preset", "env id", "usage", title="env presets")
    for p in data["presets"]:
        table.add_row(p["name"], p["id"] or "(any: env.id=...)", p["usage"])
    console = Console()
    console.print(table)
    for b in data["backends"]:
        state = "available" if b["available"] else f"missing ({b['detail']})"
        console.print(f"backend {b['name']}: {state}", highlight=False)
    cuda = data["cuda"]
    devices = ", ".join(cuda["devices"]) or "none"
    console.print(
        f"cuda: {'available' if cuda['available'] else 'not available'} (devices: {devices})",
        highlight=False,
    )
    return EXIT_OK


def _envs_dict() -> dict[str, Any]:
    from collect_cli import config, envs
    from collect_cli.devices import cuda_devices

    devices = cuda_devices()
    return {
        "presets": config.env_presets(),
        "backends": envs.available(),
        "cuda": {"available": bool(devices), "devices": devices},
    }
