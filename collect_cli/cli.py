"""The ``rlcollect`` command line. The only module that prints.

stdout carries results only (the run's JSON line, ``info`` output); progress,
logs and errors go to stderr. Heavy imports (torch, hydra) happen inside commands
so that ``--help`` and ``--version`` answer fast.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from collect_cli import __version__
from collect_cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    FAILED,
    STOP_SIGNALS,
    RlcollectError,
    exit_code,
)

app = typer.Typer(
    name="rlcollect",
    help="Collect RL rollouts into HDF5 or memory-mapped TensorDict datasets.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: rendering it with rich took 40% of --help
)


def _err(message: str) -> None:
    print(f"rlcollect: error: {message}", file=sys.stderr, flush=True)


class _StopOnce:
    """SIGINT and SIGTERM outside a run's collection loop (which traps them itself):
    the first raises KeyboardInterrupt, so the command unwinds, cleans up and exits
    130 with one line; later ones are ignored, so that they cannot break the cleanup
    (durability D21). Whatever a command then raises, it ended by that stop: an
    import or a library cut in the middle may fail in its own way."""

    fired = False  # a stop is being handled: ignore the next ones
    raised = False  # ...by this handler's KeyboardInterrupt

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.fired:
            self.fired = self.raised = True
            raise KeyboardInterrupt


_STOP = _StopOnce()


def _trap_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        _STOP.fired = _STOP.raised = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, _STOP)


def _stopped(exc: BaseException) -> bool:
    """Whether ``exc`` ended a command because a stop signal came."""
    return isinstance(exc, KeyboardInterrupt) or _STOP.raised


def _version(value: bool) -> None:
    if value:
        print(f"rlcollect {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Roll out a policy in RL environments and write the trajectories as a dataset."""
    _trap_stop_signals()  # before any heavy import: a stop at any moment exits 130


_RUN_HELP = """Collect a dataset. Arguments are Hydra overrides (key=value).

\b
Groups: env=Pendulum|CartPole|MountainCar|MountainCarContinuous|Acrobot|gym
        policy=random|mlp|torchscript|python|export|sb3
        collector=sync|multisync|multiasync|async  writer=hdf5|memmap
        postproc=none|multistep
Keys:   total_frames frames_per_batch device storing_device seed out
        overwrite resume max_frames_per_traj init_random_frames
        reset_at_each_iter reset_when_done split_trajs
        exploration_type=random|mode|mean progress=auto|rich|plain|none debug
        env.id env.num_envs env.backend=gymnasium|envpool|native env.kwargs
        env.info_keys
        policy.noise=none|gaussian|epsilon policy.noise_scale policy.epsilon
        policy.hidden policy.activation policy.checkpoint policy.path
        policy.target policy.algo policy.deterministic policy.vecnormalize
        policy.extras
        collector.workers collector.start_method collector.preemptive_threshold
        writer.layout=auto|full|compact writer.compression=none|gzip|lzf|zstd|
        lz4|blosc2|blosc2-zstd writer.compression_level writer.chunk_frames
        writer.commit_interval
        postproc.n postproc.gamma
        dataset.author dataset.author_email dataset.code_permalink
        dataset.description dataset.ref_min_score dataset.ref_max_score
\b
Example: rlcollect run env=CartPole total_frames=1e5 writer=memmap out=data/cp
Sweep:   rlcollect run -m seed=0,1,2,3 [hydra/launcher=joblib|submitit_local]
The last stdout line is a JSON summary. Exit codes: 0 done, 1 runtime failure,
2 bad usage or config, 130 interrupted (dataset flushed).
"""


@app.command(
    help=_RUN_HELP,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def run(
    ctx: typer.Context,
    cfg: Annotated[
        str | None,
        typer.Option("--cfg", "-c", help="Print the composed config (job) and exit, as Hydra's."),
    ] = None,
    multirun: Annotated[
        bool,
        typer.Option(
            "--multirun",
            "-m",
            help="Hydra multirun: one job, and one shard, per combination of swept values "
            "(seed=0,1,2), through hydra/launcher=basic|joblib|submitit_local|...",
        ),
    ] = False,
) -> None:
    overrides = list(ctx.args)
    debug = any(o.strip().lower() in ("debug=true", "debug=1", "debug=yes") for o in overrides)
    if cfg is not None:
        raise typer.Exit(_guarded(lambda: _print_cfg(cfg, overrides, multirun), debug))
    if multirun:
        raise typer.Exit(_guarded(lambda: _sweep(overrides, debug), debug))
    raise typer.Exit(_guarded(lambda: _run(overrides), debug))


def _print_cfg(which: str, overrides: list[str], multirun: bool = False) -> int:
    from omegaconf import OmegaConf

    from collect_cli import config
    from collect_cli.errors import UsageError

    if which != "job":
        raise UsageError(f"--cfg {which!r} is not supported: use --cfg job")
    if multirun:
        raise UsageError("--cfg job shows one job: drop --multirun and name one value per key")
    composed = config.compose(overrides)
    settings = config.load(composed)  # validate, so that a printed config is a runnable one
    composed.out = str(settings.out)  # where the run would write: the default resolved
    print(OmegaConf.to_yaml(composed), end="")
    return EXIT_OK


def _configure_logging(debug: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="rlcollect: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


@contextlib.contextmanager
def _stdout_for_results_only() -> Iterator[None]:
    """While envs and policies run, what they print goes to stderr: file
    descriptor 1 itself is redirected, so worker processes and C code follow."""
    sys.stdout.flush()
    kept = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        with contextlib.suppress(OSError, AttributeError):  # C's stdio buffer too
            import ctypes

            ctypes.CDLL(None).fflush(None)
        os.dup2(kept, 1)
        os.close(kept)


def _run(overrides: list[str]) -> int:
    """One run; its JSON line is printed whatever the outcome (a failure's too, with
    ``error``), so that a pipeline sees every one."""
    started = time.perf_counter()
    seen: dict[str, Any] = {"path": None, "frames": 0, "episodes": 0}
    try:
        from collect_cli import config
        from collect_cli.progress import make_progress
        from collect_cli.run import run as run_collection

        settings = config.load(config.compose(overrides))
        seen["path"] = str(settings.out)
        _configure_logging(settings.debug)
        shown = make_progress(settings.progress)

        def progress(state) -> None:  # the committed counts, for a failure's line
            seen.update(frames=state.frames, episodes=state.episodes)
            shown(state)

        try:
            with _stdout_for_results_only():
                result = run_collection(settings, progress)
        finally:
            shown.close()
    except BaseException as exc:
        if not isinstance(exc, (Exception, KeyboardInterrupt)):
            raise
        from collect_cli.dataformat import INTERRUPTED

        stopped = _stopped(exc)
        line = {
            **seen,
            **getattr(exc, "committed", {}),  # what the run had committed when it ended
            "seconds": round(time.perf_counter() - started, 3),
            "frames_per_s": 0.0,
            "status": INTERRUPTED if stopped else FAILED,
            "error": "interrupted" if stopped else str(exc),
            "exit_code": EXIT_INTERRUPTED if stopped else exit_code(exc),
        }
        print(json.dumps(line), flush=True)
        raise
    print(json.dumps(result.as_dict()), flush=True)
    return exit_code(result.status)


def _sweep(overrides: list[str], debug: bool) -> int:
    """A Hydra multirun: one shard per job; stdout gets one JSON summary of the sweep."""
    from collect_cli.sweep import run_sweep

    _configure_logging(debug)
    with _stdout_for_results_only():
        outcome = run_sweep(overrides, Path.cwd())
    for job in outcome.failed:
        if job.get("traceback"):
            print(job["traceback"], file=sys.stderr, end="")
        shard = f"; shard {job['path']}" if job["path"] else ""
        _err(
            f"job {job['job']} ({' '.join(job['overrides']) or 'no overrides'}) "
            f"exited {job['exit_code']}: {job.get('error', job['status'])}{shard}"
        )
    if outcome.kept_dir:
        print(f"rlcollect: launcher logs kept in {outcome.kept_dir}", file=sys.stderr)
    print(json.dumps(outcome.summary), flush=True)
    return outcome.exit_code


def _guarded(fn, debug: bool) -> int:
    try:
        return fn()
    except (Exception, KeyboardInterrupt) as exc:
        if debug and not isinstance(exc, KeyboardInterrupt):
            traceback.print_exc()
            worker_trace = getattr(exc, "worker_traceback", None)
            if worker_trace:
                print(f"in the worker process:\n{worker_trace}", file=sys.stderr, end="")
        if _stopped(exc):
            _err("interrupted")
            return EXIT_INTERRUPTED
        if isinstance(exc, RlcollectError):
            _err(str(exc))
        else:
            _err(f"unexpected {type(exc).__name__}: {exc} (rerun with debug=true for a traceback)")
        return exit_code(exc)


@app.command()
def info(
    path: Annotated[Path, typer.Argument(help="An rlcollect dataset (.h5 file or memmap dir).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show what is in a dataset: frames, episodes, returns, keys, size, status, config."""

    def show() -> int:
        from collect_cli.dataset import open_dataset
        from collect_cli.ops.summary import summarize

        data = summarize(open_dataset(path))
        if as_json:
            print(json.dumps(data, indent=2))
        else:
            _print_info(data)
        return EXIT_OK

    raise typer.Exit(_guarded(show, debug=False))


@app.command()
def validate(
    path: Annotated[Path, typer.Argument(help="An rlcollect dataset (.h5 file or memmap dir).")],
) -> None:
    """Check a dataset's integrity; exit 0 only if it is sound, 1 with what is wrong."""

    def check() -> int:
        from collect_cli.dataset import locate
        from collect_cli.ops.validate import check as check_dataset

        locate(path)  # nothing there, or no file or folder (a FIFO, a loop): exit 2
        problems, notes = check_dataset(path)
        for note in notes:
            print(f"rlcollect: note: {path}: {note}", file=sys.stderr)
        if not problems:
            print(f"ok: {path} is sound")
            return EXIT_OK
        for problem in problems:
            print(f"{path}: {problem}")
        return EXIT_RUNTIME

    raise typer.Exit(_guarded(check, debug=False))


_EXPORT_HELP = """Export a dataset (.h5 file or memmap dir) to D4RL or Minari.

\b
d4rl:    one HDF5 file: observations actions rewards next_observations
         terminals timeouts, infos/ (policy extras, info keys, traj_id),
         metadata/ (env id, config, seed, spaces, source...). Dict/Tuple
         spaces become groups: observations/<key>, actions/<index>.
minari:  a Minari dataset directory (pip install 'rlcollect\\[export]').
         --out ROOT/NAMESPACE/NAME-vN makes the id NAMESPACE/NAME-vN:
         MINARI_DATASETS_PATH=ROOT, then minari.load_dataset(id).
\b
Episodes are contiguous (lane by lane, in time order); padding is never
exported. An episode cut by the end of the run (or by a kill) ends with
a timeout (Minari: a truncation) at its last step; --drop-incomplete
leaves such episodes out. A running or interrupted dataset exports its
committed frames. The stdout line is a JSON summary. Exit codes: 0 done,
1 runtime failure or a dataset failing validation, 2 bad usage.
"""


@app.command(help=_EXPORT_HELP)
def export(
    path: Annotated[Path, typer.Argument(help="An rlcollect dataset (.h5 file or memmap dir).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="d4rl or minari.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="d4rl: the .hdf5 file; minari: the dataset dir.")
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
) -> None:
    def convert() -> int:
        from collect_cli.ops.export import export as export_dataset

        logging.basicConfig(format="rlcollect: %(levelname)s: %(message)s", stream=sys.stderr)
        result = export_dataset(
            path,
            fmt,
            out,
            overwrite=overwrite,
            drop_incomplete=drop_incomplete,
            compression=compression,
            dataset_id=dataset_id,
        )
        if result.source_status != "complete":
            fate = "dropped" if drop_incomplete else f"ending with a {result.incomplete}"
            print(
                f"rlcollect: note: {path} is {result.source_status}: exported its committed "
                f"frames ({result.incomplete_episodes} incomplete episodes {fate})",
                file=sys.stderr,
            )
        print(json.dumps(result.as_dict()), flush=True)
        return EXIT_OK

    raise typer.Exit(_guarded(convert, debug=False))


@app.command()
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
) -> None:
    """Merge shards into one dataset: lanes concatenated, traj ids made unique.

    HDF5 shards become virtual datasets (zero-copy; shard paths stored relative to
    the merged file) unless --copy; memmap shards are copied. Prints a JSON summary.
    """

    def go() -> int:
        from collect_cli.ops.merge import merge as merge_shards

        result = merge_shards(
            shards, out, copy=copy, allow_incomplete=allow_incomplete, overwrite=overwrite
        )
        print(json.dumps(result), flush=True)
        return EXIT_OK

    raise typer.Exit(_guarded(go, debug=False))


_REPORT_HELP = """See datasets: one self-contained HTML page of plots (or PNG files, or JSON).

\b
Sections: summary table (one column per dataset), episode return and length
histograms, return against episode order, per-dimension distributions of
actions and observations (a sample of frames), image frames of one episode,
padding/mask statistics and per-lane counts. Several PATHs are overlaid, one
colour each. Needs matplotlib (pip install 'rlcollect\\[report]') except --json.
Exit codes: 0 done, 1 unreadable dataset, 2 bad usage or missing dataset.
"""


def _datasets_stats(paths: list[Path]) -> list[Any]:
    from collect_cli.report.stats import dataset_stats

    return [dataset_stats(p) for p in paths]


@app.command(help=_REPORT_HELP)
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
) -> None:
    def go() -> int:
        from collect_cli.errors import UsageError

        if fmt not in ("html", "png"):
            raise UsageError(f"unknown report format {fmt!r}: choose from html, png")
        if as_json:
            stats = _datasets_stats(paths)
            print(json.dumps([s.as_dict() for s in stats], indent=2))
            return EXIT_OK
        from collect_cli.dataset.ownership import claim
        from collect_cli.report import html as report_html

        dest = out or Path("report.html" if fmt == "html" else "report")
        with claim(dest, "rlcollect report"):
            replaces = report_html.check_out(dest, paths, overwrite, as_dir=fmt == "png")
            report_html.require_matplotlib()  # the install hint before any dataset is read
            stats = _datasets_stats(paths)
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

    raise typer.Exit(_guarded(go, debug=False))


@app.command()
def card(
    path: Annotated[Path, typer.Argument(help="An rlcollect dataset (.h5 file or memmap dir).")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the card here (default: stdout).")
    ] = None,
    license_id: Annotated[
        str | None,
        typer.Option("--license", help="License id for the front matter (default: unknown)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out.")] = False,
) -> None:
    """Write a Markdown dataset card (Hugging Face front matter, summary, schema, loading code)."""

    def go() -> int:
        from collect_cli.dataset.ownership import check_destination, claim
        from collect_cli.report.card import is_card, render_card
        from collect_cli.report.stats import dataset_stats

        if out is None:
            print(render_card(path, dataset_stats(path), Path.cwd(), license_id), end="")
            return EXIT_OK
        from collect_cli.report.html import write_atomic

        with claim(out, "rlcollect card"):
            replaces = check_destination(
                out, overwrite=overwrite, inputs=[path], kind="a card", replaceable=is_card
            )
            text = render_card(path, dataset_stats(path), out.absolute().parent, license_id)
            write_atomic(out, text.encode("utf-8"), replaces)
        return EXIT_OK

    raise typer.Exit(_guarded(go, debug=False))


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
    keys = Table("key", "shape", "dtype", title="arrays")
    for item in data["keys"]:
        keys.add_row(item["key"], str(tuple(item["shape"])), item["dtype"])
    console.print(keys)
    if data["config"]:
        console.print("config:", style="bold")
        console.print(data["config"], markup=False, highlight=False)


@app.command()
def envs(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List env presets, the env backends available here, and whether CUDA is."""

    def show() -> int:
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

    raise typer.Exit(_guarded(show, debug=False))


def _envs_dict() -> dict[str, Any]:
    from collect_cli import config, envs
    from collect_cli.devices import cuda_devices

    devices = cuda_devices()
    return {
        "presets": config.env_presets(),
        "backends": envs.available(),
        "cuda": {"available": bool(devices), "devices": devices},
    }


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:  # a stop that reached no handler of the command's
        _err("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit as exc:
        if not (_STOP.raised and exc.code == EXIT_INTERRUPTED):
            raise
        # CPython ends a process by SIGINT, whatever its exit code, once a
        # KeyboardInterrupt ended an import's nested run, even one caught later:
        # run the exit hooks (writer, workers) and exit 130 as the command said
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(EXIT_INTERRUPTED)
