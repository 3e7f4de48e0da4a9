"""``rlcollect render``: one episode of a dataset as an MP4 or a GIF."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from collect_cli.cli.app import app, guarded
from collect_cli.cli.datasets import DatasetPath
from collect_cli.errors import EXIT_OK


@app.command()
@guarded
def render(
    path: DatasetPath,
    out: Annotated[Path, typer.Option("--out", "-o", help="The video to write: .mp4 or .gif.")],
    episode: Annotated[
        int | None,
        typer.Option("--episode", help="Row K of the episodes table, 0 first (in recorded order)."),
    ] = None,
    best: Annotated[
        bool, typer.Option("--best", help="The complete episode with the highest return.")
    ] = False,
    worst: Annotated[
        bool, typer.Option("--worst", help="The complete episode with the lowest return.")
    ] = False,
    size: Annotated[
        str | None, typer.Option("--size", help="WIDTHxHEIGHT in pixels (default: as recorded).")
    ] = None,
    fps: Annotated[
        float | None, typer.Option("--fps", help="Frames per second (default: the env's, or 30).")
    ] = None,
    overlay: Annotated[
        bool, typer.Option("--overlay/--no-overlay", help="Write the step and return on frames.")
    ] = True,
    key: Annotated[
        str | None, typer.Option("--key", help="The image observation leaf (Dict observations).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace --out (a video this wrote).")
    ] = False,
) -> int:
    """Render one episode of PATH as a video: one frame per step (its length in frames).

    Frames come from the image observations, else from the recorded simulator state
    (record.state=true: MuJoCo qpos/qvel, classic control), else from the state
    rebuilt from an observation that holds it (classic control, HalfCheetah), as
    validate --replay does. Needs pip install 'rlcollect[video]'. Prints a JSON summary. Exit codes:
    0 done, 1 an unreadable dataset, 2 bad usage (no such episode, --out exists or is
    the dataset, nothing to render).
    """

    from collect_cli.dataset.ownership import check_destination, claim
    from collect_cli.report import video
    from collect_cli.report.html import write_atomic
    from collect_cli.report.render import check_options, render_video

    kind = video.video_format(out)
    wanted = video.parse_size(size)
    check_options(episode, best, worst, fps)
    with claim(out, "rlcollect render"):
        replaces = check_destination(
            out,
            overwrite=overwrite,
            inputs=[path],
            replaceable=video.is_video,
            kind="a video file rlcollect renders (.mp4 or .gif)",
        )
        video.require_pil()  # the install hints before any dataset is read
        if kind == "mp4":
            video.require_av()
        data, result = render_video(
            path, kind, episode_row=episode, best=best, worst=worst, size=wanted, fps=fps,
            overlay=overlay, key=key,
        )  # fmt: skip
        write_atomic(out, data, replaces)
    print(json.dumps({"path": str(out), **result}), flush=True)
    return EXIT_OK
