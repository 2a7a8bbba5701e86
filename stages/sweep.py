"""`sweep`: an Optuna search over `train.*` (params.yaml `sweep`) on the validation split.

A command, not a DVC stage: it proposes params; the pipeline (`dvc exp run -S ...`, printed at
the end) still trains and evaluates the chosen model. The study is a SQLite file
(`sweep.storage`): rerunning resumes it; `optuna-dashboard sqlite:///reports/sweep.db` shows it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import dir_option, file_option, user_errors

app = typer.Typer(add_completion=False)


@app.command("sweep")
@user_errors
def sweep(
    params: Path = file_option("params.yaml", "params file (`sweep`, `train`, `encoders`)"),
    prepared: Path = dir_option("data/prepared", "prepared data directory"),
    cache: Path = dir_option("cache", "embedding cache root"),
    negatives: Path = dir_option("negatives", "mined negatives (read when "
                                 "train.hard_negatives > 0)"),
    top: int = typer.Option(5, min=1, help="best trials shown in the closing table"),
    apply: bool = typer.Option(False, "--apply", help="write the best trial's values into the "
                               "params file (comments kept)"),
) -> None:
    """Search train.* with Optuna (TPE, pruned per epoch) over the loaded cache, in one process."""
    from simtune import params as P
    from simtune.train import space
    from simtune.train import sweep as lib

    p = P.load(params)
    study = lib.run(p, prepared, cache, negatives)
    print(lib.summary(study, top))
    if apply:
        space.write_yaml(params, lib.best_values(study))
        print(f"wrote the best values into {params}")
