"""`prepare`: load the configured data set, validate, normalise, deduplicate and split it."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import dir_option, file_option, require_raw_data, user_errors

app = typer.Typer(add_completion=False)


@app.command("prepare")
@user_errors
def prepare(
    params: Path = file_option("params.yaml", "params file (its `prepare` section)"),
    out: Path = dir_option("data/prepared", "output directory of the tables"),
    report: Path = file_option("reports/prepare.json",
                               "counts report (an output, not a DVC metric)"),
) -> None:
    """Load the data set (built-in or your file), split it, write data/prepared/."""
    from simtune import params as P
    from simtune.prepare import stage as lib

    p = P.load(params).prepare
    require_raw_data(params, p)  # before the file is read
    lib.run(p, out, report)
