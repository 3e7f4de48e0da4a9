"""Export a dataset to the flat D4RL HDF5 layout, a Minari dataset, Hugging Face
Parquet (``export_hf.py``) or a LeRobot v3.0 dataset (``export_lerobot.py``).

Both formats export the same frames in the same order: every valid, committed
frame (``collector/mask`` True, within its lane's committed steps), lane by
lane, in time order, so each episode is contiguous. Padding is never exported,
including the padding a preempted worker leaves inside an episode's time span.

An episode cut by the end of the run (``complete`` False), or left running by a
killed run (no ``episodes/`` row yet), is exported with ``timeouts`` (Minari:
``truncations``) True at its last step, and counted in the metadata; with
``drop_incomplete`` it is left out. Outputs are built in a hidden sibling of
``out`` and renamed into place, so ``out`` is either absent, the old file, or
the whole new export.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from collect_cli import __version__, specs
from collect_cli import dataformat as fmt
from collect_cli.dataset import open_dataset
from collect_cli.dataset.fsio import need_space, publish, reserve
from collect_cli.dataset.ownership import (
    check_destination,
    claim,
    is_d4rl_export,
    remove_leftovers,
    remove_output,
    staging_name,
)
from collect_cli.errors import DatasetError, UsageError, WriteError
from collect_cli.ops.export_hf import is_hf_export, require_pyarrow, write_hf
from collect_cli.ops.export_lerobot import INCOMPLETE as LEROBOT_END
from collect_cli.ops.export_lerobot import is_lerobot_export, write_lerobot
from collect_cli.ops.export_lerobot import require as require_lerobot
from collect_cli.ops.frames import (
    BLOCK_BYTES,
    INCOMPLETE_END,
    REWARD,
    TRAJ,
    Plan,
    Source,
    blocks,
    d4rl_name,
    episodes,
)
from collect_cli.policies import provenance

log = logging.getLogger("rlcollect")

FORMATS = ("d4rl", "minari", "hf", "lerobot")
ENDS = {**INCOMPLETE_END, "lerobot": LEROBOT_END}  # how an incomplete episode ends
COMPRESSIONS = ("none", "gzip", "lzf")
MINARI_INSTALL = "pip install 'rlcollect[export]'"
CHUNK_BYTES = 512 << 10  # D4RL output chunks
NAME_RE = re.compile(r"[-_\w]+-v\d+")
NAMESPACE_RE = re.compile(r"[-_\w]+")


@dataclass
class ExportResult:
    path: str
    format: str
    source: str
    source_status: str
    episodes: int
    frames: int
    incomplete_episodes: int
    incomplete: str  # "dropped", or how exported ones end: INCOMPLETE_END
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        return {**out, **self.extra}


def export(
    source: str | os.PathLike,
    fmt: str,
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    drop_incomplete: bool = False,
    compression: str = "none",
    dataset_id: str | None = None,
    readme: Callable[[], str] | None = None,
    images: bool = False,
    fps: int | None = None,
    video_codec: str | None = None,
) -> ExportResult:
    """Export the dataset at ``source`` as ``fmt`` (``d4rl`` | ``minari`` | ``hf`` |
    ``lerobot``) to ``out``; ``readme``: makes the hf export's card (README.md), once
    the checks passed; ``images`` (PNG, not video), ``fps`` and ``video_codec`` (``h264``
    | ``av1``; None: h264): lerobot's."""
    from collect_cli.ops.validate import validate

    source, out = Path(source), Path(out)
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format {fmt!r}: choose from {', '.join(FORMATS)}")
    if compression not in COMPRESSIONS:
        raise UsageError(f"unknown compression {compression!r}: choose from none, gzip, lzf")
    if fmt != "d4rl" and compression != "none":
        raise UsageError("--compression applies to --format d4rl only")
    if fmt == "hf":
        require_pyarrow()
    if fmt == "minari":
        _require_minari()
        dataset_id, root = minari_location(out, dataset_id)
    elif dataset_id is not None:
        raise UsageError("--dataset-id applies to --format minari only")
    if fmt != "lerobot" and (images or fps is not None or video_codec is not None):
        raise UsageError("--images, --fps and --video-codec apply to --format lerobot only")
    ds = open_dataset(source)
    if fmt == "lerobot":
        require_lerobot(ds, images, fps, video_codec)
    postproc = ds.meta.get("postproc") or {}
    if postproc.get("name", "none") != "none":
        raise UsageError(
            f"{str(source)!r} holds {postproc['name']} transitions (postproc="
            f"{postproc['name']}); {fmt} holds 1-step transitions: export a dataset "
            "collected with postproc=none"
        )
    with claim(out, "rlcollect export"):  # durability D17
        replaces = _check_out(source, out, fmt, overwrite)
        problems = validate(source)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise DatasetError(
                f"{str(source)!r} fails validation: {problems[0]}{more}; "
                f"`rlcollect validate {source}` lists what is wrong"
            )
        remove_leftovers(out)
        src = Source(ds)
        tmp = staging_name(out, "tmp")
        try:
            plan = Plan.build(src, drop_incomplete)
            out.parent.mkdir(parents=True, exist_ok=True)
            extra: dict[str, Any] = {}
            if fmt == "d4rl":
                _write_d4rl(src, plan, tmp, compression)
            elif fmt == "hf":
                write_hf(src, plan, tmp, readme() if readme else None)
            elif fmt == "lerobot":
                extra = write_lerobot(src, plan, tmp, images=images, fps=fps, codec=video_codec)
            else:
                _write_minari(src, plan, tmp, dataset_id)
                extra = {"dataset_id": dataset_id, "minari_datasets_path": str(root)}
            publish(tmp, out, replaces)
        except OSError as exc:
            raise WriteError(
                f"exporting to {str(out)!r} failed: {exc.strerror or exc}; nothing was written"
            ) from None
        finally:
            src.close()
            with contextlib.suppress(OSError):
                remove_output(tmp)
    return ExportResult(
        path=str(out),
        format=fmt,
        source=str(source),
        source_status=str(ds.meta.get("status")),
        episodes=len(plan.starts),
        frames=plan.frames,
        incomplete_episodes=plan.incomplete,
        incomplete="dropped" if drop_incomplete else ENDS[fmt],
        extra=extra,
    )


def _require_minari() -> None:
    try:
        importlib.import_module("minari")
        importlib.import_module("PIL")  # Minari's HDF5 storage imports Pillow
    except ImportError as exc:
        raise UsageError(
            f"--format minari needs Minari and Pillow ({exc}): {MINARI_INSTALL}"
        ) from None


def minari_location(out: Path, dataset_id: str | None) -> tuple[str, Path]:
    """The Minari dataset id for a dataset at ``out``, and the ``MINARI_DATASETS_PATH``
    under which ``minari.load_dataset(id)`` finds it (``out`` = that root / the id)."""
    full = out.absolute()
    parts = dataset_id.strip("/").split("/") if dataset_id else [full.parent.name, full.name]
    ident = "/".join(parts)
    if not NAME_RE.fullmatch(parts[-1]) or not all(NAMESPACE_RE.fullmatch(p) for p in parts[:-1]):
        raise UsageError(
            f"{ident!r} is not a Minari dataset id (namespace/name-vN): name --out like "
            "minari/rlcollect/cartpole-v0, or pass --dataset-id"
        )
    if list(full.parts[-len(parts) :]) != parts:
        raise UsageError(
            f"--out {str(out)!r} must end with the dataset id {ident!r}, the layout "
            "minari.load_dataset expects under MINARI_DATASETS_PATH"
        )
    return ident, full.parents[len(parts) - 1]


def _check_out(source: Path, out: Path, fmt: str, overwrite: bool):
    """durability D18: what ``--out`` may replace (an export of the same format)."""
    if fmt == "d4rl":
        return check_destination(
            out,
            overwrite=overwrite,
            inputs=[source],
            kind="a D4RL file rlcollect exported",
            replaceable=is_d4rl_export,
        )

    if fmt == "hf":
        return check_destination(
            out, overwrite=overwrite, inputs=[source], kind="an hf export", replaceable=is_hf_export
        )
    if fmt == "lerobot":
        return check_destination(
            out, overwrite=overwrite, inputs=[source], kind="a LeRobot dataset",
            replaceable=is_lerobot_export,
        )  # fmt: skip

    def minari_dir(path: Path) -> bool:
        meta = path / "data" / "metadata.json"
        return path.is_dir() and (meta.is_file() or not any(path.iterdir()))

    return check_destination(
        out, overwrite=overwrite, inputs=[source], kind="a Minari dataset", replaceable=minari_dir
    )


def _write_d4rl(src: Source, plan: Plan, path: Path, compression: str) -> None:
    names = {k: d4rl_name(k) for k in src.keys}
    keys = [k for k, name in names.items() if name is not None]
    total = plan.frames
    with h5py.File(path, "w", locking=False) as f:
        # durability D9: the space first, so that a full disk fails before HDF5 writes
        rows = sum(src.read(k, 0, 0, 1)[0].nbytes for k in keys) + 2  # + terminals, timeouts
        reserve(path, total * rows)
        outputs = {}
        for key in keys:
            first = src.read(key, 0, 0, 1)  # its dtype: a bytes scalar's drops the padding
            feat = () if names[key] == "rewards" else first.shape[1:]
            row_bytes = max(1, int(np.prod(feat, dtype=np.int64)) * first.dtype.itemsize)
            outputs[key] = f.create_dataset(
                names[key],
                shape=(total, *feat),
                dtype=first.dtype,
                chunks=(max(1, min(total, CHUNK_BYTES // row_bytes)), *feat),
                compression=None if compression == "none" else compression,
            )
        f.create_dataset("terminals", data=plan.terminals)
        f.create_dataset("timeouts", data=plan.timeouts)
        # each frame's row of metadata/sources (the policy that acted)
        f.create_dataset("infos/source", data=np.repeat(plan.sources, plan.lengths))
        offset = 0
        for block in blocks(src, keys, plan.keep):
            count = len(next(iter(block.values())))
            for key, array in block.items():
                outputs[key][offset : offset + count] = array.reshape(
                    count, *outputs[key].shape[1:]
                )
            offset += count
        meta = src.meta
        group = f.create_group("metadata")
        values = {
            "format": "d4rl",
            "exported_by": f"rlcollect {__version__}",
            "rlcollect_version": meta.get("rlcollect_version"),
            "env_id": meta.get("env_id"),
            "policy": meta.get("policy"),
            "seed": meta.get("seed"),
            "config": meta.get("config"),
            "observation_space": json.dumps(meta.get("observation_space")),
            "action_space": json.dumps(meta.get("action_space")),
            "source": str(src.ds.path.absolute()),
            "source_backend": src.ds.backend,
            "source_status": meta.get("status"),
            "episodes": len(plan.starts),
            "frames": total,
            "incomplete_episodes": plan.incomplete,
            "incomplete": "dropped" if plan.dropped else INCOMPLETE_END["d4rl"],
            "episode_order": "lane, then time",
            fmt.SOURCES: json.dumps(fmt.sources(meta)),
        }
        for name, value in {**values, **provenance.d4rl_metadata(meta)}.items():
            if value is not None:
                group.create_dataset(name, data=value)
        f.flush()
        used = f.id.get_filesize()  # HDF5's end of allocated space
    os.truncate(path, used)  # give back what was reserved beyond it


def _env_spec(meta: dict[str, Any]):
    """The gymnasium EnvSpec of the dataset's env with its config kwargs, or None when
    this process cannot look it up or serialise it (Minari then records no env spec)."""
    import gymnasium as gym
    import yaml

    env_id = str(meta.get("env_id") or "")
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        spec = gym.spec(name)
        entry = spec.entry_point
        if callable(entry):  # a class: by name, so that the spec serialises
            entry = f"{entry.__module__}:{entry.__qualname__}"
        config = yaml.safe_load(meta.get("config") or "") or {}
        kwargs = dict((config.get("env") or {}).get("kwargs") or {})
        spec = dataclasses.replace(spec, entry_point=entry, kwargs={**spec.kwargs, **kwargs})
        spec.to_json()
    except (gym.error.Error, ImportError, ValueError, TypeError, yaml.YAMLError) as exc:
        log.warning("no env spec recorded for %r: %s", env_id, exc)
        return None
    return spec


def _write_minari(src: Source, plan: Plan, path: Path, dataset_id: str) -> None:
    import minari
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    meta = src.meta
    obs_space = specs.rebuild(meta["observation_space"])
    act_space = specs.rebuild(meta["action_space"])
    obs_keys = [fmt.path((fmt.OBSERVATION, *leaf.key)) for leaf in specs.leaves(obs_space)]
    next_keys = [fmt.path((fmt.NEXT, key)) for key in obs_keys]
    act_keys = [fmt.path((fmt.ACTION, *leaf.key)) for leaf in specs.leaves(act_space)]
    core = {*obs_keys, *next_keys, *act_keys, REWARD, TRAJ}
    extras = {
        k: name.removeprefix("infos/")
        for k in src.keys
        if k not in core and (name := d4rl_name(k)) is not None
    }
    path.mkdir()
    rows = sum(src.read(k, 0, 0, 1)[0].nbytes for k in [*obs_keys, *act_keys, REWARD, *extras])
    need_space(path, plan.frames * rows)  # Minari's writer: checked, not reserved
    storage = MinariStorage.new(
        (path / "data").absolute(),
        observation_space=obs_space,
        action_space=act_space,
        env_spec=_env_spec(meta),
        data_format="hdf5",
        jpeg_encoding=False,  # lossless, like the source
    )
    keys = [*obs_keys, *next_keys, *act_keys, REWARD, *extras]
    buffers, size = [], 0
    stream = episodes(blocks(src, keys, plan.keep), plan.lengths)
    for start, length, frames in zip(plan.starts, plan.lengths, stream, strict=True):
        last = [frames[k][-1:] for k in next_keys]
        observations = [np.concatenate([frames[k], x]) for k, x in zip(obs_keys, last, strict=True)]
        end = start + length
        buffers.append(
            EpisodeBuffer(
                observations=specs.join(observations, obs_space),
                actions=specs.join([frames[k] for k in act_keys], act_space),
                rewards=frames[REWARD].reshape(length),
                terminations=plan.terminals[start:end],
                truncations=plan.timeouts[start:end],
                infos={name: frames[k] for k, name in extras.items()} or None,
            )
        )
        size += sum(v.nbytes for v in frames.values())
        if size >= BLOCK_BYTES:
            storage.update_episodes(buffers)
            buffers, size = [], 0
    if buffers:
        storage.update_episodes(buffers)
    storage.update_episode_metadata(
        {"rlcollect_traj_id": int(i), "rlcollect_complete": bool(c), "rlcollect_source": int(s)}
        for i, c, s in zip(plan.traj_ids, plan.complete, plan.sources, strict=True)
    )
    storage.update_metadata(
        {
            "dataset_id": dataset_id,
            "minari_version": minari.__version__,
            "algorithm_name": f"rlcollect policy={meta.get('policy')}",
            "description": (
                f"Exported by rlcollect {__version__} from {src.ds.path.absolute()} "
                f"({meta.get('status')}): env {meta.get('env_id')}, seed {meta.get('seed')}."
            ),
            "rlcollect": {
                "source": str(src.ds.path.absolute()),
                "source_status": meta.get("status"),
                "rlcollect_version": meta.get("rlcollect_version"),
                "env_id": meta.get("env_id"),
                "seed": meta.get("seed"),
                "config": meta.get("config"),
                "incomplete_episodes": plan.incomplete,
                "incomplete": "dropped" if plan.dropped else INCOMPLETE_END["minari"],
                "episode_order": "lane, then time",
                provenance.PROVENANCE: meta.get(provenance.PROVENANCE),
                fmt.SOURCES: fmt.sources(meta),  # rlcollect_source of an episode: its row
            },
            **provenance.minari_metadata(meta),
        }
    )
