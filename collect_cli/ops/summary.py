"""ONE summary of a dataset: what ``info`` prints, and what ``report`` and ``card``
label and show. Everything comes from the dataset itself (its metadata, episodes
table and files), never from the config a run was given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collect_cli import dataformat as fmt
from collect_cli.dataset import Dataset
from collect_cli.errors import UsageError
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
    return ds.episodes() if int(ds.meta.get("episodes") or 0) else fmt.empty_rows()


def summarize(
    ds: Dataset, rows: fmt.Rows | None = None, refs: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The dataset's summary as JSON-ready data (``rlcollect info --json``); ``refs``:
    the reference scores (:func:`reference_scores`), else the dataset's own."""
    meta = ds.meta
    rows = episode_rows(ds) if rows is None else rows
    stats = fmt.return_stats(rows)
    refs = refs or provenance.ref_scores(meta)
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
        **provenance.info_fields(meta, stats["mean"] if stats else None, refs),
        fmt.SOURCES: by_source(meta, rows, refs),
        "config": meta.get("config"),
    }


def by_source(
    meta: dict[str, Any], rows: fmt.Rows, refs: tuple[float, float] | None
) -> list[dict[str, Any]]:
    """Each row of the sources table (its config left out) with its episodes, frames,
    return statistics and normalised score."""
    out = []
    for i, row in enumerate(fmt.sources(meta)):
        mine = rows[fmt.SOURCE] == i
        ret = fmt.return_stats(rows, i)
        out.append(
            {
                fmt.SOURCE: i,
                **{k: row.get(k) for k in fmt.SOURCE_FIELDS},
                "episodes": int(mine.sum()),
                "frames": int(rows["length"][mine].sum()),
                "return": ret,
                provenance.NORMALIZED_SCORE: provenance.normalized(ret and ret["mean"], refs),
            }
        )
    return out


def reference_scores(low: Path, high: Path, env_id: str | None) -> tuple[float, float]:
    """``(ref_min_score, ref_max_score)``: the mean returns of the complete episodes of
    the datasets at ``low`` and ``high`` (a family's random and expert members), which
    must be of ``env_id``."""
    from collect_cli.dataset import open_dataset

    scores = []
    for path in (low, high):
        ds = open_dataset(path)
        if env_id is not None and ds.meta.get("env_id") != env_id:
            raise UsageError(
                f"reference {str(path)!r} is of env {ds.meta.get('env_id')!r}, not {env_id!r}: "
                "take the references from the same env"
            )
        stats = fmt.return_stats(episode_rows(ds))
        if stats is None:
            raise UsageError(f"reference {str(path)!r} holds no complete episode: no score")
        scores.append(stats["mean"])
    if scores[0] == scores[1]:
        raise UsageError(f"the two references score the same ({scores[0]:g}): no scale")
    return scores[0], scores[1]


def codec_words(summary: dict[str, Any]) -> str:
    """The codec in words; a memmap dataset's files are raw by design."""
    if summary["backend"] == "memmap":
        return "none (raw memory-mapped files)"
    return fmt.codec_text(summary["codec"])


def layout_words(summary: dict[str, Any]) -> str:
    if summary["layout"] == fmt.COMPACT:
        return "compact (each image frame stored once: next/observation rebuilt on read)"
    return summary["layout"]
