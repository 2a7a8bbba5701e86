"""The default run's figures for the docs: `docs/run/<report>.json`, copies of its reports.

The site quotes the default pipeline's figures (`{{ run.<report>.<key> }}`, docs/hooks/generate.py)
from these copies, not from numbers typed into a page. They are the maintainers' to refresh:
`make figures` runs the pipeline and then this script, which copies the reports when
`params.yaml` is the checked-in one; commit `docs/run/` with `dvc.lock`. `make run` (a user's
run) leaves them as they are, so a user's clone stays clean but for what DVC writes.
tests/test_figures.py fails when a copy is not the output the *committed* `dvc.lock` records
(a rerun committed without its copies); a user's own run changes only the workspace's.
Run as a script (`python docs/hooks/run_figures.py`): copies, or says why not and exits 1.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# the reports the pages quote: the run's counts, the training log, the headline and evaluate's
REPORTS = ("prepare", "train", "train_metrics", "metrics", "evaluate")


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def recorded(lock_text: str) -> dict[str, str]:
    """Each output of a dvc.lock (its text) with the md5 it records."""
    stages = (yaml.safe_load(lock_text) or {}).get("stages", {})
    return {out["path"]: out["md5"] for stage in stages.values()
            for out in stage.get("outs", []) if "md5" in out}


def committed_lock(root: Path = ROOT) -> str:
    """The text of dvc.lock as the checkout's HEAD commit holds it: the run whose copies
    docs/run/ must be (a user's `make run` rewrites the workspace's dvc.lock, not this). Outside
    a git checkout (an unpacked archive), the workspace's file."""
    proc = subprocess.run(["git", "show", "HEAD:dvc.lock"], cwd=root, capture_output=True,
                          text=True, check=False)
    return proc.stdout if proc.returncode == 0 else (root / "dvc.lock").read_text()


def mismatches(root: Path = ROOT) -> list[str]:
    """One line per copy in `root`/docs/run/ that is not the output the committed dvc.lock
    records (or is missing)."""
    outs, out = recorded(committed_lock(root)), []
    for name in REPORTS:
        copy, want = root / "docs" / "run" / f"{name}.json", outs.get(f"reports/{name}.json")
        where = copy.relative_to(root)
        if want is None:
            out.append(f"dvc.lock records no reports/{name}.json")
        elif not copy.is_file():
            out.append(f"{where} is missing")
        elif md5(copy) != want:
            out.append(f"{where} is not the reports/{name}.json the committed dvc.lock records "
                       f"(md5 {md5(copy)}, dvc.lock {want}): `make figures`, then commit "
                       "docs/run/ with dvc.lock")
    return out


def refresh(root: Path = ROOT) -> tuple[bool, str]:
    """Copies the workspace's reports into docs/run/ when they are the default run's: params.yaml
    as committed and every report the one the workspace's dvc.lock records. Returns whether it
    copied, and what it did in words."""
    diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "params.yaml"], cwd=root,
                          check=False)
    if diff.returncode != 0:
        return False, ("docs/run/ left as it is: params.yaml differs from the commit (not the "
                       "default run)")
    outs = recorded((root / "dvc.lock").read_text())
    for name in REPORTS:
        report = root / "reports" / f"{name}.json"
        if not report.is_file() or outs.get(f"reports/{name}.json") != md5(report):
            return False, (f"docs/run/ left as it is: reports/{name}.json is not the output of "
                           "dvc.lock")
    (root / "docs" / "run").mkdir(exist_ok=True)
    for name in REPORTS:  # each copy whole or not at all: a temporary file, then a rename
        target = root / "docs" / "run" / f"{name}.json"
        shutil.copyfile(root / "reports" / f"{name}.json", target.with_suffix(".json.tmp"))
        os.replace(target.with_suffix(".json.tmp"), target)
    return True, (f"docs/run/: the default run's {', '.join(REPORTS)} reports (the docs' "
                  "figures; commit them with dvc.lock)")


if __name__ == "__main__":
    copied, said = refresh()
    print(said, file=sys.stderr)
    sys.exit(0 if copied else 1)
