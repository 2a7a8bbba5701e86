"""`prepare`: load the configured data set, validate, normalise, deduplicate and split it."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import user_errors


@user_errors
def prepare(
    params: Path = typer.Option(Path("params.yaml"), help="params file (its `prepare` section)"),
    out: Path = typer.Option(Path("data/prepared"), help="output directory of the tables"),
    report: Path = typer.Option(Path("reports/prepare.json"), help="counts report (DVC metrics)"),
) -> None:
    """Load the data set (built-in or your file), split it, write data/prepared/."""
    from simtune import params as P
    from simtune import prepare as lib

    lib.run(P.load(params).prepare, out, report)
