"""`negatives`: hard negatives of each training query, mined from the cached vectors (pairs)."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import dir_option, file_option, user_errors

app = typer.Typer(add_completion=False)


@app.command("negatives")
@user_errors
def negatives(
    params: Path = file_option("params.yaml", "params file (`negatives`, `encoders`)"),
    prepared: Path = dir_option("data/prepared", "prepared data directory"),
    cache: Path = dir_option("cache", "embedding cache root"),
    out: Path = dir_option("negatives", "output directory of the mined negatives"),
    report: Path = file_option("reports/negatives.json",
                               "counts and seconds (an output, not a DVC metric)"),
) -> None:
    """Mine each training query's top-ranked non-positive documents from the cache, skipping
    likely false negatives (groups data: an empty table)."""
    from simtune import params as P
    from simtune.negatives import stage as lib

    lib.run(P.load(params), prepared, cache, out, report)
