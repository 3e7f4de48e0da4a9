"""``rlcollect run -m``: a Hydra multirun, one job and one shard per combination.

The CLI process plans the sweep: it splits Hydra's own overrides from the jobs',
expands the jobs with Hydra's basic sweeper, and composes and validates every
job (bad overrides, duplicate or existing shard paths: a usage error before any
job starts). It then hands the sweep to Hydra's multirun machinery (the same
``Hydra.multirun`` that ``@hydra.main`` calls, entered through the compose API's
``initialize_config_dir``), which runs :class:`SweepJob` through whichever
launcher plugin is configured: ``basic`` (in process, one after the other),
``joblib``, ``submitit_local``, ``submitit_slurm``, ``ray``...

:class:`SweepJob` is a picklable callable (launchers ship it to other processes
or machines) that never raises: each job returns a result dict (its shard,
frames, status, exit code, error), so one failed job leaves the other shards
and the sweep's summary intact (on Ray, also a job whose process or node died:
:func:`_on_ray`). Nothing here prints; plain progress lines go through
:mod:`collect_cli.progress`, as for a single run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from collect_cli import config
from collect_cli.dataformat import COMPLETE, INTERRUPTED
from collect_cli.dataset.backend import BACKENDS
from collect_cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    FAILED,
    CollectionError,
    ConfigError,
    RlcollectError,
    exit_code,
)

log = logging.getLogger("rlcollect")

# Hydra settings of a sweep unless the user sets them: no Hydra logging or log
# files, no .hydra/ directories, and jobs run in the caller's directory
HYDRA_DEFAULTS = {
    "hydra/job_logging": "none",
    "hydra/hydra_logging": "none",
    "hydra.output_subdir": "null",
    "hydra.job.chdir": "false",
}
SWEEP_DIR = "hydra.sweep.dir"
RAY_PLUGIN = "hydra_plugins.hydra_ray_launcher"  # hydra/launcher=ray, ray_cluster
_interrupted = False  # a job of this process was interrupted: start no more jobs


def new_sweep_id() -> str:
    return f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def shard_out(
    settings: config.Settings, user_out: Any, sweep_id: str, job: int, count: int
) -> Path:
    """The shard path of job ``job``: ``out`` as configured (with its interpolations,
    e.g. ``data/pend_s${seed}.h5``), else
    ``data/<sweep id>/<env id>_<policy>_s<seed>_job<N>[.h5]``."""
    if user_out:
        return settings.out
    name = config.default_out(
        settings.env.id, settings.policy.name, settings.seed, settings.writer.name
    ).name
    suffix = BACKENDS[settings.writer.name].suffix
    stem = name[: -len(suffix)] if suffix else name
    width = len(str(max(count - 1, 0)))
    return Path("data") / sweep_id / f"{stem}_job{job:0{width}d}{suffix}"


@dataclass
class Plan:
    """What a sweep will run, validated in the CLI process before any job starts."""

    sweep_id: str
    overrides: list[str]  # the user's overrides, as typed
    hydra_overrides: list[str]  # hydra.* and hydra/... among them
    jobs: list[list[str]]  # each job's overrides (Hydra's basic sweeper order = job numbers)
    outs: list[Path]  # each job's shard path, relative to the caller's directory if relative
    sweep_dir_given: bool = False
    launcher: str = ""  # the launcher plugin's class


@dataclass
class Outcome:
    summary: dict[str, Any]
    exit_code: int
    failed: list[dict[str, Any]] = field(default_factory=list)
    kept_dir: str | None = None  # launcher files kept for a post-mortem


def _parse(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for line in overrides:  # one at a time, to name the one that does not parse
        try:
            parsed += parser.parse_overrides([line])
        except HydraException as exc:
            raise ConfigError(f"{line}: {config.hydra_error(exc)}") from None
    return parsed


def plan(overrides: list[str], cwd: Path) -> Plan:
    """Expand and validate a sweep (raises UsageError subclasses, exit 2)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    parsed = _parse(overrides)
    hydra_side = [o for o in parsed if o.is_hydra_override()]
    for o in hydra_side:
        if o.key_or_group == "hydra/sweeper":
            raise ConfigError(
                f"{o.input_line}: rlcollect sweeps with Hydra's basic sweeper only "
                "(a grid over comma-separated values); choose a launcher with hydra/launcher="
            )
        if o.is_sweep_override():
            raise ConfigError(f"{o.input_line}: Hydra's own settings cannot be swept")
    try:
        jobs = BasicSweeper.split_arguments([o for o in parsed if not o.is_hydra_override()], None)
    except HydraException as exc:
        raise config.hydra_error(exc) from None
    jobs = [job for batch in jobs for job in batch]
    sweep_id = new_sweep_id()
    hydra_overrides = [o.input_line for o in hydra_side]
    outs, launcher = _validate_jobs(jobs, hydra_overrides, sweep_id, cwd)

    seen: dict[Path, int] = {}
    for num, out in enumerate(outs):
        where = (cwd / out).resolve()
        if where in seen:
            raise ConfigError(
                f"jobs {seen[where]} and {num} would both write {str(out)!r}: put a swept key in "
                "out (e.g. out='data/run_s${seed}.h5') or leave out unset for one shard per job"
            )
        seen[where] = num
    return Plan(
        sweep_id=sweep_id,
        overrides=list(overrides),
        hydra_overrides=hydra_overrides,
        jobs=jobs,
        outs=outs,
        sweep_dir_given=any(o.key_or_group == SWEEP_DIR for o in hydra_side),
        launcher=launcher,
    )


def _validate_jobs(
    jobs: list[list[str]], hydra_overrides: list[str], sweep_id: str, cwd: Path
) -> tuple[list[Path], str]:
    """Compose every job as its launcher will, with ``hydra.job.num`` set (so that
    ``${hydra:job.num}`` resolves); return each job's shard path, and the launcher."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException

    from collect_cli.dataset import check_output

    config.register()
    outs = []
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    try:
        with initialize_config_dir(
            config_dir=str(config.conf_dir()), version_base=None, job_name="rlcollect"
        ):
            try:  # Hydra's own settings first: their errors concern no job in particular
                cfg = compose("config", overrides=hydra_overrides, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as exc:
                raise _missing_ray(hydra_overrides) or config.hydra_error(exc) from None
            launcher = str(cfg.hydra.launcher.get("_target_", ""))
            for num, job in enumerate(jobs):
                try:
                    cfg = compose(
                        "config", overrides=[*hydra_overrides, *job], return_hydra_config=True
                    )
                    with read_write(cfg.hydra.job), open_dict(cfg.hydra.job):
                        cfg.hydra.job.num = num
                    hydra_config.set_config(cfg)
                    job_cfg = _without_hydra(cfg)
                    settings = config.load(job_cfg)
                    out = shard_out(settings, job_cfg.out, sweep_id, num, len(jobs))
                    if not settings.resume:
                        check_output(cwd / out, settings.overwrite)
                except (HydraException, OmegaConfBaseException) as exc:
                    raise _job_error(num, job, config.hydra_error(exc)) from None
                except RlcollectError as exc:
                    raise _job_error(num, job, exc) from None
                if settings.resume and not job_cfg.out:  # new shards under data/<sweep id>/
                    raise ConfigError(
                        "resume=true in a sweep needs out naming each job's shard, as in the "
                        "sweep it resumes (e.g. out='/shared/data/pend_s${seed}.h5')"
                    )
                outs.append(out)
    finally:
        hydra_config.cfg = previous
    return outs, launcher


def _missing_ray(hydra_overrides: list[str]) -> ConfigError | None:
    """``hydra/launcher=ray...`` without hydra-ray-launcher: say what to install."""
    picked = [o for o in hydra_overrides if re.match(r"[+~]*hydra/launcher=ray", o)]
    with contextlib.suppress(ImportError):  # no hydra_plugins at all
        if not picked or importlib.util.find_spec(RAY_PLUGIN):
            return None
    return ConfigError(
        f"{picked[0]}: the Ray launcher is not installed: pip install 'rlcollect[sweep]' "
        "(hydra-ray-launcher and ray), on every node of the cluster"
    )


def _without_hydra(cfg: DictConfig) -> DictConfig:
    job_cfg = copy.deepcopy(cfg)
    with read_write(job_cfg), open_dict(job_cfg):
        del job_cfg["hydra"]
    return job_cfg


def readable(override: str) -> str:
    """An override as typed: Hydra hands job overrides back with ``\\`` escapes."""
    return re.sub(r"\\(.)", r"\1", override)


def _job_error(num: int, job: list[str], exc: RlcollectError) -> RlcollectError:
    shown = " ".join(readable(o) for o in job) or "no overrides"
    return type(exc)(f"job {num} ({shown}): {exc}")


@dataclass(frozen=True)
class SweepJob:
    """Hydra's task function for one job of a sweep; picklable, never raises."""

    sweep_id: str
    overrides: tuple[str, ...]  # the whole sweep's overrides
    count: int
    cwd: str  # relative shard paths resolve here, wherever the launcher runs the job

    def __call__(self, cfg: DictConfig) -> dict[str, Any]:
        global _interrupted
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get()
        num = int(hydra_cfg.job.num)
        result = failed_result(num, [readable(str(o)) for o in hydra_cfg.overrides.task])
        if _interrupted:
            result.update(
                status="skipped",
                exit_code=EXIT_INTERRUPTED,
                error="not started: the sweep was interrupted",
            )
            return result
        debug = False
        try:
            debug = bool(cfg.get("debug", False))
            settings = config.load(cfg)
            out = shard_out(settings, cfg.out, self.sweep_id, num, self.count)
            result["path"] = str(out)
            sweep = {
                "id": self.sweep_id,
                "overrides": list(self.overrides),
                "job": num,
                "jobs": self.count,
                "job_overrides": result["overrides"],
            }
            settings = dataclasses.replace(
                settings,
                out=out if out.is_absolute() else Path(self.cwd) / out,
                extra_metadata={"sweep": sweep},
            )
            done = self._collect(settings, num)
            code = exit_code(done.status)
            result.update(
                frames=done.frames,
                episodes=done.episodes,
                seconds=done.seconds,
                frames_per_s=done.frames_per_s,
                status=done.status,
                exit_code=code,
            )
        except RlcollectError as exc:
            result.update(exit_code=exit_code(exc), error=str(exc))
            worker_trace = getattr(exc, "worker_traceback", None)
            if debug:
                result["traceback"] = traceback.format_exc() + (worker_trace or "")
        except OmegaConfBaseException as exc:
            usage = config.hydra_error(exc)
            result.update(exit_code=exit_code(usage), error=str(usage))
        except KeyboardInterrupt:
            result.update(status=INTERRUPTED, exit_code=EXIT_INTERRUPTED, error=INTERRUPTED)
        except Exception as exc:
            hint = "rerun with debug=true for a traceback"
            result.update(error=f"unexpected {type(exc).__name__}: {exc} ({hint})")
            if debug:
                result["traceback"] = traceback.format_exc()
        if result["exit_code"] == EXIT_INTERRUPTED:
            _interrupted = True
        return result

    @staticmethod
    def _collect(settings: config.Settings, num: int):
        from collect_cli.progress import make_progress
        from collect_cli.run import run

        if not logging.getLogger().handlers and not log.handlers:  # a launcher's process
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter(f"rlcollect: job {num}: %(levelname)s: %(message)s")
            )
            log.addHandler(handler)
            log.setLevel(logging.DEBUG if settings.debug else logging.WARNING)
            log.propagate = False
        # a sweep never draws Rich bars: jobs may run side by side, or far from a terminal
        mode = "none" if settings.progress == "none" else "plain"
        progress = make_progress(mode, label=f"job {num}")
        try:
            return run(settings, progress)
        finally:
            progress.close()


def _launch_overrides(sweep: Plan, sweep_dir: str | None) -> list[str]:
    given = {o.split("=", 1)[0].lstrip("+~") for o in sweep.hydra_overrides}
    out = [f"{k}={v}" for k, v in HYDRA_DEFAULTS.items() if k not in given]
    if sweep_dir is not None:
        out.append(f"{SWEEP_DIR}='{sweep_dir}'")
    return out + sweep.overrides


def run_sweep(overrides: list[str], cwd: Path) -> Outcome:
    """Plan, launch and summarise a sweep (usage errors raise before any job starts)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    sweep = plan(overrides, cwd)
    # Hydra needs a sweep directory (job dirs, multirun.yaml; submitit's pickles and
    # logs). Unless hydra.sweep.dir is given, a temporary one, removed afterwards
    # unless a job failed and it holds launcher logs.
    temp_dir = (
        None if sweep.sweep_dir_given else tempfile.mkdtemp(prefix=f"rlcollect-{sweep.sweep_id}-")
    )
    job = SweepJob(sweep.sweep_id, tuple(overrides), len(sweep.jobs), str(cwd))
    try:
        with (
            _on_ray(sweep.launcher),
            initialize_config_dir(
                config_dir=str(config.conf_dir()), version_base=None, job_name="rlcollect"
            ),
        ):
            hydra = GlobalHydra.instance().hydra
            returns = hydra.multirun(
                config_name="config",
                task_function=job,
                overrides=_launch_overrides(sweep, temp_dir),
                with_log_configuration=False,
            )
    except (HydraException, OmegaConfBaseException) as exc:
        _cleanup(temp_dir, keep=False)
        raise config.hydra_error(exc) from None
    except Exception as exc:
        kept = temp_dir if temp_dir and _has_logs(temp_dir) else None
        _cleanup(temp_dir, keep=kept is not None)
        where = f"; launcher files in {kept}" if kept else ""
        raise CollectionError(
            f"the sweep's launcher failed: {type(exc).__name__}: {exc}{where}"
        ) from exc
    returned = enumerate(r for batch in returns for r in batch)
    results = [_result(ret, num, sweep) for num, ret in returned]
    failed = [r for r in results if r["exit_code"] != 0]
    keep = bool(failed) and temp_dir is not None and _has_logs(temp_dir)
    _cleanup(temp_dir, keep=keep)
    interrupted = all(r["exit_code"] == EXIT_INTERRUPTED for r in failed)
    status = FAILED if not interrupted else INTERRUPTED if failed else COMPLETE
    summary = {
        "sweep": sweep.sweep_id,
        "status": status,
        "jobs": len(results),
        "failed": len(failed),
        "frames": sum(r["frames"] or 0 for r in results),
        "shards": [{k: v for k, v in r.items() if k != "traceback"} for r in results],
    }
    return Outcome(
        summary=summary,
        exit_code=failed[0]["exit_code"] if failed else 0,
        failed=failed,
        kept_dir=temp_dir if keep else None,
    )


def _result(ret: Any, num: int, sweep: Plan) -> dict[str, Any]:
    """A job's result dict; a job whose task function raised anyway, or whose process
    died (:class:`Lost`), counts as failed."""
    try:
        value = ret.return_value
        error = "the job returned nothing" if value is None else f"unexpected result {value!r}"
    except Exception as exc:
        value, error = None, f"{type(exc).__name__}: {exc}"
    if isinstance(value, dict):
        return value
    result = failed_result(num, [readable(o) for o in sweep.jobs[num]])
    result.update(path=str(sweep.outs[num]), error=getattr(value, "error", error))
    return result


@dataclass(frozen=True)
class Lost:
    """What a launcher returns for a job whose process or node died."""

    error: str


@dataclass(frozen=True)
class _RayJobs:
    """``ray`` as hydra-ray-launcher's ``_core`` sees it during a sweep: its ``get`` of
    a job whose process or node died returns :class:`Lost` instead of raising."""

    _ray: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ray, name)

    def get(self, ref: Any, *args: Any, **kwargs: Any) -> Any:
        from hydra.core.utils import JobReturn, JobStatus

        try:
            return self._ray.get(ref, *args, **kwargs)
        except self._ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None) or exc  # RayTaskError: what the job raised
            what = (str(cause).strip() or type(cause).__name__).splitlines()[0]
            error = Lost(
                f"its Ray task failed ({type(exc).__name__}: {what}); its shard keeps "
                "what it committed: run the sweep again with resume=true"
            )
            return JobReturn(status=JobStatus.COMPLETED, _return_value=error)


@contextlib.contextmanager
def _on_ray(launcher: str) -> Iterator[None]:
    """hydra-ray-launcher 1.2 waits for its jobs with ``ray.get`` one after the other: a
    job whose process or node died raises there, and the launcher loses every result
    (the jobs still running die with the driver). During a sweep on Ray that ``get``
    gives the job's :class:`Lost` failure instead; worker log lines reach stderr
    uncoloured, one per job (unless RAY_COLOR_PREFIX, RAY_DEDUP_LOGS are set)."""
    if not launcher.startswith(RAY_PLUGIN):
        yield
        return
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # read when ray is imported
    import ray
    from hydra_plugins.hydra_ray_launcher import _core

    plain, joined = _core.ray, not ray.is_initialized()  # else: the caller's connection
    _core.ray = _RayJobs(ray)
    try:
        yield
    finally:
        _core.ray = plain
        if joined and ray.is_initialized():
            time.sleep(0.5)  # the jobs' last log lines: Ray's log monitor polls at 10 Hz
            ray.shutdown()


def failed_result(num: int, overrides: list[str]) -> dict[str, Any]:
    """A job's result before (or without) a run: failed, exit code 1."""
    unknown = dict.fromkeys(("path", "frames", "episodes", "seconds", "frames_per_s"))
    failed = {"status": FAILED, "exit_code": EXIT_RUNTIME}
    return {"job": num, "overrides": overrides, **unknown, **failed}


def _has_logs(directory: str) -> bool:
    return (Path(directory) / ".submitit").exists()


def _cleanup(directory: str | None, keep: bool) -> None:
    if directory and not keep:
        shutil.rmtree(directory, ignore_errors=True)
