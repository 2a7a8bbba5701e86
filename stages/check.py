"""`check`: the whole params file, before any stage runs (the first DVC stage)."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import file_option, require_raw_data, user_errors

app = typer.Typer(add_completion=False)


@app.command("check")
@user_errors
def check(
    params: Path = file_option("params.yaml", "params file to check whole"),
    out: Path = file_option("reports/params_checked.json",
                            "written when the file is valid (the same bytes every time)"),
) -> None:
    """Check params.yaml whole: every key known, typed and given once, every cross-key rule.

    Run by DVC before every other stage (each reads its output), because DVC deletes a stage's
    outputs before running it: a mistake refused by the stage itself would cost the last good
    model. The output holds nothing of the params, so a valid edit reruns only the stages it
    concerns.
    """
    from simtune import params as P
    from simtune.atomic import write_json

    require_raw_data(params, P.load(params).prepare)  # DVC sees only data/raw change
    write_json(out, {"params": "checked whole before any stage ran (simtune check)"})
