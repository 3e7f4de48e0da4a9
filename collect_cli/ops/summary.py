"""ONE summary of a dataset: what ``info`` prints, and what ``report`` and ``card``
label and show. Everything comes from the dataset itself (its metadata, episodes
table and files), never from the config a run was given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import dataformat as fmt
from collect_cli.dataset import Dataset
from collect_cli.policies import provenance


def disk_bytes(path: Path) -> int:
    """Bytes the file, or the directory's files, take on disk (blocks, not lengths)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(f.stat().st_blocks * 512 for f in files)


def size_bytes(ds: Dataset) -> int:
    """The dataset's bytes on disk, with the shard files a virtual merge reads from."""
    size = disk_bytes(ds.path)
    merged = ds.meta.get("merged") if isinstance(ds.meta.get("merged"), dict) else {}
    if merged.get("mode") == "virtual":
        shards = [ds.path.parent / s["path"] for s in ds.meta.get("shards") or []]
        size += sum(disk_bytes(p) for p in shards if p.exists())
    return size


def episode_rows(ds: Dataset) -> fmt.Rows:
    """The committed rows of the episodes table."""
    count = int(ds.meta.get("episodes") or 0)
    if not count:
        return fmt.empty_rows()
    return {name: np.asarray(column)[:count] for name, column in ds.episodes().items()}


def summarize(ds: Dataset, rows: fmt.Rows | None = None) -> dict[str, Any]:
    """The dataset's summary as JSON-ready data (``rlcollect info --json``)."""
    meta = ds.meta
    rows = episode_rows(ds) if rows is None else rows
    stats = fmt.return_stats(rows)
    return {
        "path": str(ds.path),
        "backend": ds.backend,
        "status": meta.get("status"),
        "env_id": meta.get("env_id"),
        "policy": meta.get("policy"),
        "seed": meta.get("seed"),
        "frames": int(meta.get("frames") or 0),
        "lanes": meta.get("lanes"),
        "steps": meta.get("steps"),
        "episodes": len(rows["traj_id"]),
        "complete_episodes": int(rows["complete"].sum()),
        "return": stats,
        "keys": [{"key": k, "shape": list(s), "dtype": d} for k, s, d in ds.describe()],
        "layout": meta.get(fmt.LAYOUT, fmt.FULL),
        "codec": meta.get(fmt.CODEC),
        "size_bytes": size_bytes(ds),
        "shards": len(meta.get("shards") or []),
        "start_time": meta.get("start_time"),
        "end_time": meta.get("end_time"),
        "rlcollect_version": meta.get("rlcollect_version"),
        **provenance.info_fields(meta, stats["mean"] if stats else None),
        "config": meta.get("config"),
    }


def codec_words(summary: dict[str, Any]) -> str:
    """The codec in words; a memmap dataset's files are raw by design."""
    if summary["backend"] == "memmap":
        return "none (raw memory-mapped files)"
    return fmt.codec_text(summary["codec"])


def layout_words(summary: dict[str, Any]) -> str:
    if summary["layout"] == fmt.COMPACT:
        return "compact (each image frame stored once: next/observation rebuilt on read)"
    return summary["layout"]
