"""``rlcollect validate``'s check of the ``episodes/`` table against the frames.

The frames pass (:mod:`collect_cli.ops.validate`) gives runs: the frames of one
trajectory in one lane within one window, with their sums and the flags of their
last frame. Here they become one record per trajectory, and each row of the table
must describe its trajectory (durability D13; docs/dataset.md, the done-flag rule).
"""

from __future__ import annotations

import numpy as np

from collect_cli import dataformat as fmt

Runs = list[dict[str, np.ndarray]]
RETURN_RTOL = 1e-8  # of the sum of |reward|: float64 rounding, with room


def trajectories(runs: Runs) -> tuple[dict[str, np.ndarray], list[str]]:
    """One record per traj_id (sorted) from the runs, and what is wrong with them: an
    id in two lanes, or in two places of one lane (another trajectory in between)."""
    if not runs:
        return {"traj_id": np.zeros(0, np.int64)}, []
    cols = {k: np.concatenate([r[k] for r in runs]) for k in runs[0]}
    order = np.lexsort((cols["start"], cols["lane"]))
    cols = {k: v[order] for k, v in cols.items()}
    ids, lanes = cols["traj_id"], cols["lane"]
    problems = []
    unique, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    other = np.flatnonzero(lanes != lanes[first][inverse])
    if len(other):
        problems.append(f"traj_id {ids[other[0]]} appears in more than one lane")
    pieces = np.ones(len(ids), bool)  # a run not continuing the one before in its lane
    pieces[1:] = (ids[1:] != ids[:-1]) | (lanes[1:] != lanes[:-1])
    counts = np.bincount(inverse, weights=pieces, minlength=len(unique))
    split = np.flatnonzero(counts > 1)
    if len(split) and not len(other):
        problems.append(
            f"traj_id {unique[split[0]]} is in two places of lane {lanes[first[split[0]]]}, "
            "another trajectory between them"
        )
    last = np.zeros(len(unique), np.int64)
    np.maximum.at(last, inverse, np.arange(len(ids)))
    out = {
        "traj_id": unique,
        "lane": lanes[first],
        "start": cols["start"][first],
        "length": np.bincount(inverse, weights=cols["length"], minlength=len(unique)),
        "return": np.bincount(inverse, weights=cols["return"], minlength=len(unique)),
        "size": np.bincount(inverse, weights=cols["size"], minlength=len(unique)),
        "end": cols["end"][last],
    }
    out.update({k: cols[k][last] for k in ("ended", "done", "terminated", "truncated")})
    out["length"] = out["length"].astype(np.int64)
    return out, problems


def _first(bad: np.ndarray, rows: dict, what: str, detail=None) -> str:
    """``what`` at the first row of ``bad``, named by row, traj_id and lane."""
    i = int(np.flatnonzero(bad)[0])
    more = f"; {int(bad.sum())} rows" if bad.sum() > 1 else ""
    extra = f": {detail(i)}" if detail else ""
    return f"{what} (row {i}, traj_id {rows['traj_id'][i]}, lane {rows['lane'][i]}{extra}{more})"


def episodes_problems(
    rows: dict,
    runs: Runs,
    tails: np.ndarray,
    meta: dict,
    conf: dict,
    notes: list[str],
    unflagged_tails: int,
) -> list[str]:
    """What is wrong with the ``episodes/`` rows given the frames' trajectories.

    ``tails``: each lane's last trajectory (-2: none); ``unflagged_tails``: how many
    lanes' last frame lacks next/done (a killed run's cuts, flagged by resume)."""
    traj, problems = trajectories(runs)
    unique = traj["traj_id"]
    ep_ids = rows["traj_id"]
    if len(np.unique(ep_ids)) != len(ep_ids):
        problems.append("episodes/traj_id has duplicates")
    pos = np.searchsorted(unique, ep_ids)
    known = (pos < len(unique)) & (unique[np.minimum(pos, len(unique) - 1)] == ep_ids)
    if not known.all():
        problems.append(f"{int((~known).sum())} episodes rows name traj_ids absent from the frames")
        return problems
    t = {k: v[pos] for k, v in traj.items()}  # each row's trajectory as the frames have it
    for column in ("lane", "length", "start"):
        bad = rows[column] != t[column]
        if bad.any():
            problems.append(
                _first(bad, rows, f"episodes/{column} disagrees with the frames",
                       lambda i, c=column: f"{rows[c][i]}, the frames say {t[c][i]}")
            )  # fmt: skip
    # the writer sums the stored rewards widened to float64 (running sums over each
    # batch): only float64 rounding differs, ~1e-13 of the sum of |reward| measured
    ret = np.asarray(rows["return"], np.float64)
    off = ~(np.abs(ret - t["return"]) <= RETURN_RTOL * t["size"] + 1e-9)
    if off.any():
        problems.append(
            _first(off, rows, "episodes/return disagrees with the frames' rewards",
                   lambda i: f"{ret[i]:.10g}, the rewards sum to {t['return'][i]:.10g}")
        )  # fmt: skip
    complete, term, trunc = rows["complete"], rows["terminated"], rows["truncated"]
    split = bool(conf["reset_when_done"])
    if (complete & ~t["ended"]).any():
        problems.append(
            _first(complete & ~t["ended"], rows,
                   "episodes/complete disagrees with the frames' done flags",
                   lambda i: f"complete, but step {t['end'][i]} does not end it")
        )  # fmt: skip
    bad = complete & ((term != t["terminated"]) | (trunc != t["truncated"]))
    if bad.any():
        problems.append(_first(bad, rows, "episodes terminated/truncated disagree with the frames"))
    # an env ending is complete and says which flag; a cut by the dataset says neither
    bad = complete != (term | trunc)
    if bad.any():
        problems.append(
            _first(bad, rows, "episodes/complete disagrees with episodes/terminated|truncated",
                   lambda i: f"complete {bool(complete[i])}, terminated {bool(term[i])}, "
                   f"truncated {bool(trunc[i])}")
        )  # fmt: skip
    cut = ~complete
    # a cut is the dataset's: never where the env terminated the episode (with resets
    # at episode ends), nor, without resets between batches nor resume points, before
    # the lane's last trajectory (the end of the run is the one place it cuts)
    # (own step: a multistep kill's cut keeps the lookahead its run computed, docs/dataset.md)
    by_env = cut & t["terminated"] & t["ended"] & split
    if by_env.any():
        problems.append(
            _first(by_env, rows, "episodes/complete is False for an episode the env ended",
                   lambda i: f"next/terminated at step {t['end'][i]}")
        )  # fmt: skip
    if not (conf["reset_at_each_iter"] or meta.get("resumed") or "shards" in meta):
        bad = cut & ~by_env & (tails[np.clip(rows["lane"], 0, len(tails) - 1)] != ep_ids)
        if bad.any():
            problems.append(
                _first(bad, rows, "episodes/complete is False for an episode the env ended",
                       lambda i: "the dataset cuts only a lane's last trajectory, and "
                       f"another follows this one after step {t['end'][i]}")
            )  # fmt: skip
    # the dataset's own cuts end with next/truncated and next/done, like an env's
    flagged = t["truncated"] & t["done"]
    unflagged = cut & ~flagged & split & (meta["format_version"] >= fmt.FLAGGED_CUTS_SINCE)
    missing = np.setdiff1d(unique, ep_ids)
    if meta["status"] == fmt.RUNNING:
        # a killed run has not yet recorded (nor flagged) the trajectory of each lane
        # that the kill cut: resume=true does both
        missing = np.setdiff1d(missing, tails)
        if unflagged_tails:
            notes.append(
                f"{unflagged_tails} trajectories cut by the kill end without next/done: "
                "resume=true flags them"
            )
        unflagged &= ~np.isin(ep_ids, tails)
    if unflagged.any():
        problems.append(
            f"{int(unflagged.sum())} trajectories cut by the dataset end without next/truncated "
            + _first(unflagged, rows, "").strip()
        )
    if len(missing):
        problems.append(f"{len(missing)} trajectories have no episodes row (e.g. {missing[0]})")
    return problems
