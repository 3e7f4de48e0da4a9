"""``rlcollect run``: one collection, a sweep (``-m``), or the composed config (``--cfg``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from collect_cli.cli.app import app, err, guard_call, was_stop
from collect_cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    FAILED,
    exit_code,
)

_RUN_HELP = """Collect a dataset. Arguments are Hydra overrides (key=value).

\b
Groups: env=Pendulum|CartPole|MountainCar|MountainCarContinuous|Acrobot|gym
        policy={policies}
        collector=sync|multisync|multiasync|async  writer={writers}
        postproc=none|multistep
Keys:   total_frames frames_per_batch device storing_device seed out
        overwrite resume max_frames_per_traj init_random_frames
        reset_at_each_iter reset_when_done split_trajs
        exploration_type=random|mode|mean progress=auto|rich|plain|none debug
        env.id env.num_envs env.backend={env_backends} env.kwargs
        env.info_keys
        policy.noise=none|gaussian|epsilon policy.noise_scale policy.epsilon
{policy_keys}
        collector.workers collector.start_method collector.preemptive_threshold
        writer.layout=auto|full|compact writer.commit_interval
{writer_keys}
        postproc.n postproc.gamma
        dataset.author dataset.author_email dataset.code_permalink
        dataset.description dataset.ref_min_score dataset.ref_max_score
        record.state
\b
Example: rlcollect run env=CartPole total_frames=1e5 writer=memmap out=data/cp
Sweep:   rlcollect run -m seed=0,1,2,3 [hydra/launcher=joblib|submitit_local]
The last stdout line is a JSON summary. Exit codes: 0 done, 1 runtime failure,
2 bad usage or config, 130 interrupted (dataset flushed).
"""


def _run_help() -> str:
    """``run --help`` with each registry's plug-ins and their options (imported only
    when the help is shown: ``--version`` and the other commands stay fast)."""
    import dataclasses
    import textwrap

    from collect_cli import envs, schema
    from collect_cli.dataset.backend import BACKENDS
    from collect_cli.policies.registry import KINDS

    def keys(group: str, classes: list[type], base: type) -> str:
        shared = {f.name for f in dataclasses.fields(base)}
        names = dict.fromkeys(
            f"{group}.{f.name}"
            for c in classes
            for f in dataclasses.fields(c)
            if f.name not in shared
        )
        return textwrap.fill(" ".join(names), 72, initial_indent=" " * 8, subsequent_indent=" " * 8)

    return _RUN_HELP.format(
        policies="|".join(KINDS),
        writers="|".join(BACKENDS),
        env_backends="|".join(envs.BACKENDS),
        policy_keys=keys("policy", [k.config for k in KINDS.values()], schema.PolicyConfig),
        writer_keys=keys("writer", [b.options for b in BACKENDS.values()], schema.WriterConfig),
    )


class _RunCommand(TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.help = _run_help()
        super().format_help(ctx, formatter)


@app.command(
    cls=_RunCommand,
    help="Collect a dataset. Arguments are Hydra overrides (key=value).",
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
        raise typer.Exit(guard_call(lambda: _print_cfg(cfg, overrides, multirun), debug))
    if multirun:
        raise typer.Exit(guard_call(lambda: _sweep(overrides, debug), debug))
    raise typer.Exit(guard_call(lambda: _run(overrides), debug))


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

        stopped = was_stop(exc)
        line = {
            **seen,
            **getattr(exc, "committed", {}),  # what the run had committed when it ended
            "seconds": round(time.perf_counter() - started, 3),
            "frames_per_s": 0.0,
            "status": INTERRUPTED if stopped else FAILED,
            "error": INTERRUPTED if stopped else str(exc),
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
        err(
            f"job {job['job']} ({' '.join(job['overrides']) or 'no overrides'}) "
            f"exited {job['exit_code']}: {job.get('error', job['status'])}{shard}"
        )
    if outcome.kept_dir:
        print(f"rlcollect: launcher logs kept in {outcome.kept_dir}", file=sys.stderr)
    print(json.dumps(outcome.summary), flush=True)
    return outcome.exit_code
