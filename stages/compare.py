"""`compare`: the experiments of this DVC repository side by side, in the terminal's width."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from stages._common import file_option, user_errors

app = typer.Typer(add_completion=False)


@app.command("compare")
@user_errors
def compare(
    rev: list[str] = typer.Option(
        [], "--rev", help="commits (or branches) whose experiments to show, repeatable; "
        "default: the current commit's"),
    num: int = typer.Option(1, "--num", min=1,
                            help="also the experiments of this many commits back from each rev"),
    width: int = typer.Option(0, min=0, help="characters per line; 0: the terminal's width "
                              "($COLUMNS; 120 when not a terminal)"),
    params: Path = file_option("params.yaml", "params file (its keys are the param columns)"),
) -> None:
    """Experiments side by side: the params that differ between them and the trained model's
    P@1 and MRR@10 (then the kept epoch and the training seconds while they fit).

    The same records as `dvc exp show` (DVC's Python API), without its dependency hashes and
    unchanged params, so the comparison fits the width; params that do not fit beside the
    metrics follow in a further table. Experiments of an older commit: `--rev <commit>`.
    """
    import dvc.api

    from simtune import params as P
    from simtune.errors import UserError
    from simtune.evaluate.compare import flat_keys, render, stale_files

    if not params.is_file():
        raise UserError(f"{params}: no such params file (run simtune compare in the "
                        "project's folder)")
    raw = P.read_yaml(params)  # a key given twice: one line naming it
    from dvc.exceptions import DvcException

    if not Path(".dvc").is_dir():
        raise UserError(f"{Path.cwd()}: not a DVC project (no .dvc/ here): run simtune compare "
                        "in the project's folder")
    try:
        records = dvc.api.exp_show(repo=".", revs=rev or None, num=num)
    except DvcException as err:  # an unknown rev, no commit yet: DVC's own one line
        raise UserError(f"dvc exp show: {str(err).splitlines()[0] or type(err).__name__}"
                        ) from None
    width = width or shutil.get_terminal_size((120, 24)).columns
    from stages._runlock import last_run_start

    # a failed run's workspace: its state, not figures
    stale = stale_files(Path("."), params, last_run_start())
    records, notes = _ran_otherwise(records)
    for line in render(records, flat_keys(raw or {}), width, stale):
        print(line)
    for line in notes:
        print(line)


def _ran_otherwise(records: list[dict]) -> tuple[list[dict], list[str]]:
    """`records` with `ran_otherwise` set on each finished experiment whose committed
    params.yaml is not what its committed dvc.lock says it ran
    (`simtune.evaluate.compare.ran_otherwise`), and one line per such experiment."""
    import subprocess

    import yaml

    from simtune.evaluate.compare import ran_otherwise

    def committed(rev: str, name: str) -> object:
        proc = subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, text=True,
                              check=False)
        try:
            return yaml.safe_load(proc.stdout) if proc.returncode == 0 else None
        except yaml.YAMLError:
            return None

    out, notes = [], []
    for record in records:
        rev, name = str(record.get("rev") or ""), record.get("Experiment")
        if (not name or record.get("typ") == "baseline" or rev in ("", "workspace")
                or str(record.get("State") or "success").lower() != "success"):
            out.append(record)
            continue
        keys = ran_otherwise(committed(rev, "params.yaml"), committed(rev, "dvc.lock"))
        out.append({**record, "ran_otherwise": keys} if keys else record)
        if keys:
            shown = "; ".join(f"{k} {a} (it ran {b})" for k, a, b in keys[:3])
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            notes.append(f"{name}: mismatch: its params.yaml says {shown}{more}: another `dvc "
                         "exp run -S` wrote params.yaml after its last stage, before DVC "
                         "recorded it (its dvc.lock has what it ran); run it again")
    return out, notes
