"""Render :class:`collect_cli.report.Stats` as PNG figures (matplotlib, Agg) and one HTML page.

Several datasets share each figure, one colour per dataset, so that a medium and
an expert dataset read side by side. Histograms are drawn as fractions of each
dataset's own total, so datasets of different sizes compare. The page is
self-contained: every figure is embedded as a base64 PNG (episode clips: GIF), no
script, no network.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from collect_cli import __version__
from collect_cli.dataformat import ACTION, OBSERVATION
from collect_cli.dataset.fsio import publish
from collect_cli.dataset.ownership import Identity, check_destination, remove_output, staging_name
from collect_cli.errors import UsageError, WriteError
from collect_cli.report.render import clips_html, viewable  # viewable: as imshow takes it
from collect_cli.report.stats import MAX_DIMS, Stats

MATPLOTLIB_INSTALL = "pip install 'rlcollect[report]'"
DPI = 100
COLUMNS = 4  # subplots per row in the per-dimension grids
MAX_LANE_BARS = 64  # more lanes are drawn as a line
# (section id, title) in page order; a section without figures for any dataset is left out
SECTIONS = (
    ("summary", "Summary"),
    ("episodes", "Episodes: return and length"),
    ("actions", "Actions"),
    ("observations", "Observations"),
    ("images", "Image observations"),
    ("clips", "Episode clips"),
    ("padding", "Padding, mask and lanes"),
)
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; padding: 0 1.5em;
       max-width: 1180px; color: #222; }
h1 { margin-bottom: 0.1em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
.meta { color: #666; margin-top: 0; }
.note { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.5em 0.8em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { font-variant-numeric: tabular-nums; }
img { max-width: 100%; display: block; margin: 0.6em 0; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; }
"""


def require_matplotlib():
    """matplotlib's Figure class on the Agg backend, or the install hint as a usage error."""
    try:
        import matplotlib
    except ImportError as exc:
        raise UsageError(
            f"rlcollect report needs matplotlib ({exc}): {MATPLOTLIB_INSTALL}"
        ) from None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure


def colour(i: int) -> str:
    return f"C{i % 10}"  # matplotlib's default cycle, the same in every figure and the table


def labels(stats: list[Stats]) -> list[str]:
    """Dataset names for legends: the file name, or the path where names repeat."""
    names = [s.name for s in stats]
    return [s.name if names.count(s.name) == 1 else s.path for s in stats]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)  # figures use constrained layout: no tight bbox pass
    return buf.getvalue()


def _fraction(counts: list[int]) -> np.ndarray:
    counts = np.asarray(counts, np.float64)
    return counts / counts.sum() if counts.sum() else counts


# the file stems of the figures (``--format png``): what an overwrite may replace
FIGURE_STEMS = ("episodes", "drift", ACTION, OBSERVATION, "image_strip", "lanes")


def figures(stats: list[Stats]) -> list[tuple[str, str, bytes]]:
    """``(section id, file stem, PNG bytes)`` of every figure, in page order."""
    Figure = require_matplotlib()
    names = labels(stats)
    out = []
    if any(s.episodes["return_hist"]["counts"] for s in stats):
        out.append(("episodes", "episodes", _png(_episodes(Figure, stats, names))))
        out.append(("episodes", "drift", _png(_drift(Figure, stats, names))))
    for section, group in (("actions", ACTION), ("observations", OBSERVATION)):
        if any(s.dims[group] for s in stats):
            out.append((section, group, _png(_dims(Figure, stats, names, group))))
    if any(s.strip_frames for s in stats):
        out.append(("images", "image_strip", _png(_strips(Figure, stats, names))))
    if any(s.lanes for s in stats):
        out.append(("padding", "lanes", _png(_lanes(Figure, stats, names))))
    return out


def _episodes(Figure, stats, names):
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    for i, (s, name) in enumerate(zip(stats, names, strict=True)):
        for ax, key in zip(axes, ("return_hist", "length_hist"), strict=True):
            hist = s.episodes[key]
            if hist["counts"]:
                ax.stairs(
                    _fraction(hist["counts"]),
                    hist["edges"],
                    color=colour(i),
                    label=name,
                    fill=len(stats) == 1,
                    alpha=0.8,
                    linewidth=1.5,
                )
    axes[0].set(
        title="episode return (complete episodes)", xlabel="return", ylabel="fraction of episodes"
    )
    axes[1].set(
        title="episode length (complete episodes)", xlabel="frames", ylabel="fraction of episodes"
    )
    axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))  # lengths are whole frames
    edges = [e for s in stats for e in s.episodes["length_hist"]["edges"]]
    if edges and max(edges) - min(edges) <= 10:  # a few lengths (fixed-length episodes)
        axes[1].set_xticks(range(math.ceil(min(edges)), math.floor(max(edges)) + 1))
    axes[0].legend(fontsize="small")
    return fig


def _drift(Figure, stats, names):
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    ax = fig.subplots()
    for i, (s, name) in enumerate(zip(stats, names, strict=True)):
        d = s.episodes["drift"]
        if d["episode"]:
            grouped = d["min"] != d["max"]  # more episodes than points: a band
            ax.plot(
                d["episode"], d["mean"], color=colour(i), label=f"{name}: mean" if grouped else name
            )
            if grouped:
                ax.fill_between(
                    d["episode"],
                    d["min"],
                    d["max"],
                    color=colour(i),
                    alpha=0.15,
                    linewidth=0,
                    label=f"{name}: min..max",
                )
    ax.set(
        title="return against episode order (drift over the collection)",
        xlabel="complete episode, in recorded order",
        ylabel="return",
    )
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _dims(Figure, stats, names, group):
    from matplotlib.ticker import MaxNLocator

    order: list[str] = []  # dimension labels in first-seen order, overlaid by label
    for s in stats:
        order += [d["label"] for d in s.dims[group] if d["label"] not in order]
    order = order[:MAX_DIMS]
    rows = -(-len(order) // COLUMNS)
    cols = min(COLUMNS, len(order))
    fig = Figure(figsize=(2.9 * cols, 2.4 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, label in zip(axes, order, strict=False):
        found = [(i, d) for i, s in enumerate(stats) for d in s.dims[group] if d["label"] == label]
        width = 0.8 / max(1, len(found))
        for j, (i, d) in enumerate(found):
            if d["kind"] == "discrete":
                x = np.asarray(d["values"], np.float64) - 0.4 + width * (j + 0.5)
                ax.bar(x, _fraction(d["counts"]), width=width, color=colour(i), label=names[i])
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # the values themselves
            elif d["counts"]:
                ax.stairs(
                    _fraction(d["counts"]),
                    d["edges"],
                    color=colour(i),
                    label=names[i],
                    fill=len(stats) == 1,
                    alpha=0.8,
                )
        ax.set_title(label, fontsize="medium")
        ax.tick_params(labelsize="small")
    for ax in axes[len(order) :]:
        ax.set_visible(False)
    axes[0].set_ylabel("fraction of frames")
    if len(stats) > 1:
        axes[0].legend(fontsize="x-small")
    return fig


def _strips(Figure, stats, names):
    shown = [(i, s) for i, s in enumerate(stats) if s.strip_frames]
    cols = max(len(s.strip_frames) for _, s in shown)
    fig = Figure(figsize=(1.5 * cols, 1.75 * len(shown)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(shown), cols, squeeze=False))
    for row, (i, s) in enumerate(shown):
        for col in range(cols):
            ax = axes[row, col]
            ax.set_xticks([])
            ax.set_yticks([])
            if col >= len(s.strip_frames):
                ax.set_visible(False)
                continue
            ax.imshow(viewable(s.strip_frames[col]), cmap="gray", interpolation="nearest")
            ax.set_title(f"step {s.strip['steps'][col]}", fontsize="small")
            for spine in ax.spines.values():
                spine.set_color(colour(i))
                spine.set_linewidth(2)
        axes[row, 0].set_ylabel(f"{names[i]}\nepisode {s.strip['traj_id']}", fontsize="small")
    return fig


def _lanes(Figure, stats, names):
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 3.2), layout="constrained")
    axes = fig.subplots(1, 2)
    shown = [(i, s) for i, s in enumerate(stats) if s.lanes]
    bars = all(len(s.lanes["frames"]) <= MAX_LANE_BARS for _, s in shown)
    width = 0.8 / len(shown)
    for j, (i, s) in enumerate(shown):
        padding = np.asarray(s.lanes["padding"])
        for ax, key in zip(axes, ("frames", "episodes"), strict=True):
            values = np.asarray(s.lanes[key])
            x = np.arange(len(values))
            if bars:  # few lanes: one bar each, datasets side by side, padding stacked on top
                x = x - 0.4 + width * (j + 0.5)
                ax.bar(x, values, width, color=colour(i), label=names[i])
                if key == "frames" and padding.any():
                    ax.bar(
                        x,
                        padding,
                        width,
                        bottom=values,
                        color=colour(i),
                        alpha=0.3,
                        hatch="//",
                        label=f"{names[i]}: padding",
                    )
            else:
                ax.step(x, values, where="mid", color=colour(i), label=names[i])
                if key == "frames" and padding.any():
                    ax.step(
                        x,
                        padding,
                        where="mid",
                        color=colour(i),
                        linestyle=":",
                        label=f"{names[i]}: padding",
                    )
    for ax, what in zip(axes, ("frames", "episodes"), strict=True):
        ax.set(title=f"{what} per lane", xlabel="lane", ylabel=what)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, names_ = axes[0].get_legend_handles_labels()
    fig.legend(handles, names_, loc="outside upper center", ncol=4, fontsize="small")
    return fig


def _cell(value: Any) -> str:
    if isinstance(value, dict):
        if not value:
            return '<span class="meta">(none recorded)</span>'
        return "<br>".join(
            f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in value.items()
        )
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.6g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return html.escape(str(value))


def summary_table(stats: list[Stats]) -> str:
    from matplotlib.colors import to_hex  # the plots' colours, for the column headers

    names = labels(stats)
    head = "".join(
        f'<th><span class="swatch" style="background:{to_hex(colour(i))}"></span>'
        f"{html.escape(n)}</th>"
        for i, n in enumerate(names)
    )
    fields: list[str] = []
    for s in stats:
        fields += [f for f in s.summary if f not in fields]
    body = []
    for f in fields:
        cells = []
        for s in stats:
            value = s.summary.get(f)
            num = isinstance(value, (int, float)) and not isinstance(value, bool)
            cells.append(f"<td{' class=num' if num else ''}>{_cell(value)}</td>")
        body.append(f"<tr><th>{html.escape(f)}</th>{''.join(cells)}</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(body)}</table>"


SOURCE_COLUMNS = ("policy", "algorithm", "checkpoint", "training_step", "seed", "origin")


def sources_table(stats: list[Stats]) -> str:
    """One row per source of each dataset: who acted, and what its episodes hold."""
    head = ["dataset", "source", *SOURCE_COLUMNS, "episodes", "frames", "mean return", "score"]
    body = []
    for name, s in zip(labels(stats), stats, strict=True):
        for row in s.sources:
            ret = row["return"] or {}
            cells = [name, row["source"], *(row[c] for c in SOURCE_COLUMNS), row["episodes"]]
            cells += [row["frames"], ret.get("mean"), row["normalized_score"]]
            body.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>")
    titles = "".join(f"<th>{html.escape(h.replace('_', ' '))}</th>" for h in head)
    return f"<h3>Sources</h3><table><tr>{titles}</tr>{''.join(body)}</table>" if body else ""


def _padding_table(stats: list[Stats]) -> str:
    names = labels(stats)
    shown = [(n, s) for n, s in zip(names, stats, strict=True) if s.padding]
    if not shown:
        return ""
    fields = list(shown[0][1].padding)
    head = "".join(f"<th>{html.escape(n)}</th>" for n, _ in shown)
    body = "".join(
        f"<tr><th>{html.escape(f.replace('_', ' '))}</th>"
        + "".join(f"<td class=num>{_cell(s.padding[f])}</td>" for _, s in shown)
        + "</tr>"
        for f in fields
    )
    return f"<table><tr><th></th>{head}</tr>{body}</table>"


def _sample_note(stats: list[Stats], group: str) -> str:
    parts = []
    for name, s in zip(labels(stats), stats, strict=True):
        if s.dims[group]:
            every = s.sample["every"]
            frames = (
                f"all {s.sample['of']:,} valid frames"
                if every == 1
                else f"{s.sample['frames']:,} frames sampled (every {every:,}-th valid frame "
                f"of {s.sample['of']:,})"
            )
            parts.append(
                f"{html.escape(name)}: {frames}, the first {s.sample[f'{group}_dims_shown']} "
                f"of {s.sample[f'{group}_dims']} dimensions"
            )
    return '<p class="meta">Distributions over ' + "; ".join(parts) + ".</p>"


def render_html(stats: list[Stats]) -> str:
    """The whole report page, every figure embedded."""
    figs = figures(stats)
    names = ", ".join(labels(stats))
    parts = [
        f"<h1>rlcollect report: {html.escape(names)}</h1>",
        f'<p class="meta">made {html.escape(time.strftime("%Y-%m-%d %H:%M %Z"))} by rlcollect '
        f"{html.escape(__version__)}</p>",
    ]
    parts += [f'<p class="note">{html.escape(n)}</p>' for s in stats for n in s.notes]
    for section, title in SECTIONS:
        images = [png for sid, _, png in figs if sid == section]
        body = []
        if section == "summary":
            body += [summary_table(stats), sources_table(stats)]
        elif section in ("actions", "observations") and images:
            body.append(_sample_note(stats, ACTION if section == "actions" else OBSERVATION))
        elif section == "images" and images:
            body.append(
                '<p class="meta">Frames evenly spaced over one episode (the first complete '
                "one) of each dataset.</p>"
            )
        elif section == "clips":  # the best and worst episode of each, animated
            body += [part for part in [clips_html(stats)] if part]
        elif section == "padding":
            body.append(_padding_table(stats))
        if not body and not images:
            continue
        body += [
            f'<img alt="{html.escape(title)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode("ascii")}">'
            for png in images
        ]
        parts.append(
            f'<section id="{section}"><h2>{html.escape(title)}</h2>{"".join(body)}</section>'
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>rlcollect report: {html.escape(names)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


PAGE_MARK = b"<title>rlcollect report"  # in the first bytes of every page render_html makes


def is_page(path: Path) -> bool:
    """A report page rlcollect wrote."""
    try:
        with open(path, "rb") as f:
            return f.read(4096).find(PAGE_MARK) >= 0
    except OSError:
        return False


def is_png_folder(path: Path) -> bool:
    """A folder of report figures rlcollect wrote: only PNG files named as its figures."""
    names = {f"{stem}.png" for stem in FIGURE_STEMS}
    try:
        return all(p.is_file() and p.name in names for p in path.iterdir())
    except OSError:
        return False


# durability D18 (docs/durability.md)
def check_out(out: Path, inputs: list[Path], overwrite: bool, as_dir: bool) -> Identity | None:
    """Refuse an ``--out`` that is a dataset being read, exists without ``--overwrite``,
    or is not what the report wrote (a page, or a folder of its PNG files)."""
    if not as_dir:
        return check_destination(
            out, overwrite=overwrite, inputs=inputs, kind="a report page", replaceable=is_page
        )
    return check_destination(
        out,
        overwrite=overwrite,
        inputs=inputs,
        kind="a folder of report figures",
        replaceable=is_png_folder,
    )


def write_atomic(out: Path, files: dict[str, bytes] | bytes, replaces: Identity | None) -> None:
    """Write one file (``bytes``) or a folder of files under a hidden sibling name,
    then publish it in place of ``replaces`` (and nothing else): ``out`` is never seen
    half-written."""
    tmp = staging_name(out, "tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(files, bytes):
            tmp.write_bytes(files)
        else:
            tmp.mkdir()
            for name, data in files.items():
                (tmp / name).write_bytes(data)
        publish(tmp, out, replaces)
    except OSError as exc:
        raise WriteError(f"writing {str(out)!r} failed: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            remove_output(tmp)


def render_pngs(stats: list[Stats]) -> dict[str, bytes]:
    """The figures as ``{file name: PNG bytes}``."""
    return {f"{stem}.png": png for _, stem, png in figures(stats)}
