"""`sweep`: an Optuna search over `train.*` (params.yaml `sweep`) on the validation split.

A command, not a DVC stage: it proposes params; the pipeline (`dvc exp run -S ...`, printed at
the end) still trains and evaluates the chosen model. The study is a SQLite file
(`sweep.storage`): rerunning resumes it; `optuna-dashboard sqlite:///reports/sweep.db` shows it.
`--trials` and `--study` replace `sweep.trials` and `sweep.study` for one run (a quick search
without editing params.yaml); a trial that failed in this run makes the exit status 1.
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
    trials: int | None = typer.Option(None, "--trials", min=1, help="finished trials the study "
                                      "should hold, for this run (instead of sweep.trials)"),
    study_name: str | None = typer.Option(None, "--study", help="the study to run or resume, "
                                          "for this run (instead of sweep.study)"),
    apply_tie: bool = typer.Option(False, "--apply-tie", help="with --apply: write the first "
                                   "best trial's values even when other trials tie with it "
                                   "(by default a tie keeps the params file as it is)"),
) -> None:
    """Search train.* with Optuna (TPE, pruned per epoch) over the loaded cache, in one process."""
    from simtune import params as P
    from simtune.errors import UserError
    from simtune.train import space
    from simtune.train import sweep as lib
    from simtune.train import sweep_report as report

    # the bytes the trials run from, kept to refuse --apply into a file edited meanwhile
    P.read_yaml(params)  # a missing or non-UTF-8 file: its own line
    ran_from = params.read_bytes()
    p = P.validate(P.parse_yaml(ran_from.decode("utf-8"), str(params)), str(params))
    if study_name is not None and (problem := P.study_problem(study_name)):
        raise UserError(f"--study: {problem}")
    update = {k: v for k, v in (("trials", trials), ("study", study_name)) if v is not None}
    p = p.model_copy(update={"sweep": p.sweep.model_copy(update=update)})
    failures = report.Failures()
    study = lib.run(p, prepared, cache, negatives, callbacks=[failures])
    print(report.summary(study, top, p.sweep.trials))
    if failures.numbers:
        numbers = ", ".join(map(str, failures.numbers))
        raise UserError(f"sweep: {len(failures.numbers)} trial(s) failed in this run (trial "
                        f"{numbers}, see its line above); run the sweep again for the missing "
                        "ones" + ("; nothing applied" if apply else ""))
    if apply:
        def unchanged(now: bytes) -> None:  # edited while the sweep ran: one line, no write
            report.check_unchanged(params, ran_from, now)

        unchanged(params.read_bytes())
        values = report.best_values(study)  # no complete trial: one line
        ties = report.tied(study)
        if len(ties) > 1 and not apply_tie:
            print(f"not applied: {len(ties)} trials tie at the best value, so {params} keeps "
                  "its values (--apply --apply-tie writes the first of them anyway)")
            return
        space.write_yaml(params, values, unchanged)  # checked again at the write
        print(f"wrote the best values into {params}")
