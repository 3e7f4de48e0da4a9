"""Where a dataset came from: the policy's checkpoint (name, size, sha256), its
algorithm and library versions, and the ``dataset.`` fields the user gives
(Minari's names). Recorded in the metadata by ``run``; read back by ``info``,
``merge`` and the D4RL/Minari exports. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from collect_cli.dataformat import DATASET, PROVENANCE, REF_MAX, REF_MIN, SOURCES, source_row
from collect_cli.policies.registry import kind_of
from collect_cli.schema import DatasetConfig, PolicyConfig

# metadata keys
NORMALIZED_SCORE = "normalized_score"  # info: D4RL-normalised mean return
# dataset.* fields Minari's metadata has under the same names
MINARI_FIELDS = ("author", "author_email", "code_permalink", "description", REF_MIN, REF_MAX)
MINARI_SETS = ("author", "author_email")  # Minari holds these as sets of names


def policy_provenance(cfg: PolicyConfig) -> dict[str, Any]:
    """What produced the actions: kind, checkpoint file, algorithm, library versions."""
    return {"policy": cfg.name, **kind_of(cfg).provenance(cfg)}


def metadata(
    policy: PolicyConfig, dataset: DatasetConfig, seed: int | None = None, config: str | None = None
) -> dict[str, Any]:
    """The provenance entries of a new dataset's metadata: its one source is the policy."""
    fields = {k: v for k, v in asdict(dataset).items() if v is not None}
    record = policy_provenance(policy)
    row = source_row(policy.name, record, seed=seed, config=config)
    return {PROVENANCE: record, DATASET: fields, SOURCES: [row]}


def ref_scores(meta: dict[str, Any]) -> tuple[float, float] | None:
    """The dataset's ``(ref_min_score, ref_max_score)``, None unless both are set."""
    fields = meta.get(DATASET) or {}
    low, high = fields.get(REF_MIN), fields.get(REF_MAX)
    if low is None or high is None or high == low:
        return None
    return float(low), float(high)


def normalized(mean_return: float | None, refs: tuple[float, float] | None) -> float | None:
    """D4RL's normalised score ``100 * (R - min) / (max - min)``; None without reference
    scores or without a complete episode."""
    if mean_return is None or refs is None:
        return None
    return 100.0 * (mean_return - refs[0]) / (refs[1] - refs[0])


def info_fields(
    meta: dict[str, Any], mean_return: float | None, refs: tuple[float, float] | None = None
) -> dict[str, Any]:
    """What ``info`` shows of the provenance; ``refs`` replace the dataset's own
    reference scores."""
    refs = refs or ref_scores(meta)
    return {
        PROVENANCE: meta.get(PROVENANCE),
        DATASET: meta.get(DATASET) or {},
        NORMALIZED_SCORE: normalized(mean_return, refs),
        "reference_scores": list(refs) if refs else None,
    }


def minari_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Minari's own metadata fields filled from the dataset's provenance."""
    fields = meta.get(DATASET) or {}
    out: dict[str, Any] = {k: fields[k] for k in MINARI_FIELDS if fields.get(k) is not None}
    for key in MINARI_SETS:
        if key in out:
            out[key] = {out[key]}
    record = meta.get(PROVENANCE) or {}
    if record.get("algorithm"):
        checkpoint = (record.get("checkpoint") or {}).get("name", "?")
        out["algorithm_name"] = f"{record['algorithm']} ({checkpoint}) via rlcollect"
    return out


def d4rl_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Flat ``metadata/`` entries of a D4RL export (scalars and text only)."""
    out: dict[str, Any] = dict(meta.get(DATASET) or {})
    record = meta.get(PROVENANCE) or {}
    for key in ("algorithm", "target", "zoo_folder"):
        if record.get(key) is not None:
            out[f"policy_{key}"] = record[key]
    for what in ("checkpoint", "vecnormalize"):
        for key, value in (record.get(what) or {}).items():
            out[f"{what}_{key}"] = value
    for dist, ver in (record.get("library_versions") or {}).items():
        out[f"version_{dist}"] = ver
    return out


def merged(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """Provenance of shards merged into one dataset: each shard's stays in its
    ``shards`` entry; the merge keeps one only where all shards agree."""
    out: dict[str, Any] = {}
    records = [m.get(PROVENANCE) for m in metas]
    if records[0] is not None and all(r == records[0] for r in records):
        out[PROVENANCE] = records[0]
    fields = [m.get(DATASET) or {} for m in metas]
    out[DATASET] = {k: v for k, v in fields[0].items() if all(f.get(k) == v for f in fields[1:])}
    return out
