"""The commands that make a dataset family's members from others: ``filter`` and
``split`` (``merge --take`` is ``merge``'s); ``docs/levels.md`` is the recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from collect_cli.cli.app import app, guarded, import_torch_held
from collect_cli.cli.datasets import DatasetPath
from collect_cli.errors import EXIT_OK

Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace --out (one this wrote).")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random choices.")]


@app.command(name="filter")
@guarded
def filter_(
    path: DatasetPath,
    out: Annotated[Path, typer.Option("--out", "-o", help="The dataset to write.")],
    min_return: Annotated[
        float | None, typer.Option("--min-return", help="Keep episodes returning at least this.")
    ] = None,
    max_return: Annotated[
        float | None, typer.Option("--max-return", help="Keep episodes returning at most this.")
    ] = None,
    complete_only: Annotated[
        bool, typer.Option("--complete-only", help="Leave out episodes the dataset cut.")
    ] = False,
    source: Annotated[
        list[int] | None,
        typer.Option("--source", help="Keep these sources' episodes (repeat; `info` lists them)."),
    ] = None,
    top: Annotated[
        float | None,
        typer.Option("--top", help="Then keep this fraction of the rest, best returns first."),
    ] = None,
    max_episodes: Annotated[
        int | None, typer.Option("--max-episodes", help="Then keep at most this many, at random.")
    ] = None,
    seed: Seed = 0,
    overwrite: Overwrite = False,
) -> int:
    """Write a dataset of the whole episodes of PATH that meet the conditions.

    Conditions apply in order: --complete-only, --source, --min/--max-return, then
    --top of what is left, then --max-episodes drawn with --seed. The output is an
    ordinary dataset (validate, export, report), written beside --out and renamed
    into place. Prints a JSON summary. Exit codes: 0 done, 1 a PATH that fails
    validation, 2 bad usage (an unknown source, a fraction outside (0, 1], nothing
    left, --out an input).
    """

    import_torch_held()  # the writer's
    from collect_cli.ops.derive import filter_dataset
    from collect_cli.ops.select import Conditions

    conditions = Conditions(
        min_return=min_return,
        max_return=max_return,
        complete_only=complete_only,
        sources=tuple(source or ()),
        top=top,
        max_episodes=max_episodes,
        seed=seed,
    )
    result = filter_dataset(path, out, conditions, overwrite=overwrite)
    print(json.dumps(result), flush=True)
    return EXIT_OK


@app.command()
@guarded
def split(
    path: DatasetPath,
    out: Annotated[Path, typer.Option("--out", "-o", help="The folder to write train and val in.")],
    val: Annotated[float, typer.Option("--val", help="The fraction of episodes for val.")],
    seed: Seed = 0,
    overwrite: Overwrite = False,
) -> int:
    """Split PATH's whole episodes into OUT/train and OUT/val (.h5 for HDF5).

    Each source gives --val of its episodes (the nearest whole number) to val, drawn
    with --seed, so both halves keep the mixture; the same seed gives the same
    halves. Prints a JSON summary. Exit codes as for filter.
    """

    import_torch_held()  # the writer's
    from collect_cli.ops.derive import split_dataset

    result = split_dataset(path, out, val, seed=seed, overwrite=overwrite)
    print(json.dumps(result), flush=True)
    return EXIT_OK
