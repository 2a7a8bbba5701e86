"""The default run's figures for the docs: `docs/run/<report>.json`, copies of its reports.

The site quotes the default pipeline's figures (`{{ run.<report>.<key> }}`, docs/hooks/generate.py)
from these copies, not from numbers typed into a page: `make run` refreshes them after `dvc repro`
when `params.yaml` is the checked-in one, and tests/test_figures.py fails when a copy is not the
output `dvc.lock` records (a rerun whose copies were not committed with its `dvc.lock`).
Run as a script (`python docs/hooks/run_figures.py`): copies, or says why not.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "run"
# the reports the pages quote: the run's counts, the training log, the headline and evaluate's
REPORTS = ("prepare", "train", "train_metrics", "metrics", "evaluate")


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def recorded(lock: Path = ROOT / "dvc.lock") -> dict[str, str]:
    """Each `reports/<name>.json` output of dvc.lock with the md5 it records."""
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    return {out["path"]: out["md5"] for stage in stages.values()
            for out in stage.get("outs", []) if "md5" in out}


def mismatches(run: Path = RUN, lock: Path = ROOT / "dvc.lock") -> list[str]:
    """One line per copy that is not the output dvc.lock records (or is missing)."""
    outs, out = recorded(lock), []
    for name in REPORTS:
        copy, want = run / f"{name}.json", outs.get(f"reports/{name}.json")
        if want is None:
            out.append(f"dvc.lock records no reports/{name}.json")
        elif not copy.is_file():
            out.append(f"{copy.relative_to(ROOT)} is missing")
        elif md5(copy) != want:
            out.append(f"{copy.relative_to(ROOT)} is not the reports/{name}.json dvc.lock "
                       f"records (md5 {md5(copy)}, dvc.lock {want})")
    return out


def refresh(root: Path = ROOT) -> str:
    """Copies the workspace's reports into docs/run/ when they are the default run's: params.yaml
    as committed and every report the one dvc.lock records. Returns what it did, in words."""
    diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "params.yaml"], cwd=root,
                          check=False)
    if diff.returncode != 0:
        return "docs/run/ left as it is: params.yaml differs from the commit (not the default run)"
    outs = recorded(root / "dvc.lock")
    for name in REPORTS:
        report = root / "reports" / f"{name}.json"
        if not report.is_file() or outs.get(f"reports/{name}.json") != md5(report):
            return f"docs/run/ left as it is: reports/{name}.json is not the output of dvc.lock"
    (root / "docs" / "run").mkdir(exist_ok=True)
    for name in REPORTS:
        shutil.copyfile(root / "reports" / f"{name}.json", root / "docs" / "run" / f"{name}.json")
    return (f"docs/run/: the default run's {', '.join(REPORTS)} reports (the docs' figures; "
            "commit them with dvc.lock)")


if __name__ == "__main__":
    print(refresh(), file=sys.stderr)
