"""What the pipeline and its commands write beside their DVC outputs never lands in git: the
README's `git add -A` commits the project (params, code, dvc.lock, the user's data), not a
binary sweep study, a resumable checkpoint, a lock file or a killed run's temp folder."""

from __future__ import annotations

import subprocess

import pytest

from simtune import params as P
from tests.conftest import ROOT


def _ignored(rel: str) -> bool:
    """Whether git ignores `rel` (tracked or not: `--no-index`) by the project's .gitignore."""
    proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT)
    assert proc.returncode in (0, 1), proc
    return proc.returncode == 0


def test_the_sweep_study_is_not_committed() -> None:
    storage = P.load(ROOT / "params.yaml").sweep.storage
    assert storage == "reports/sweep.db"
    # SQLite's side files (rollback journal, write-ahead log) too
    for rel in (storage, f"{storage}-journal", f"{storage}-wal", f"{storage}-shm"):
        assert _ignored(rel), rel


@pytest.mark.parametrize("rel", [
    "checkpoints/train/last.pt",  # train's resumable checkpoint
    "models/.head.lock", "reports/.evaluate.json.lock",  # `simtune.atomic.lock_file`
    # `simtune.atomic`: a run killed mid-write leaves its temp (or the replaced) output
    "models/.head.tmp-k3j2h1/model.safetensors", "models/.export.old-9a8b7c/export/README.md",
    "reports/.evaluate.json.tmp-x1y2z3", "data/.prepared.tmp-abcd/texts.parquet",
    "cache/minilm/manifest.json", "negatives/negatives.parquet",
    "models/export/encoder/model.safetensors",  # the export stage's folder: not in DVC's cache
])
def test_side_files_of_the_pipeline_are_ignored(rel: str) -> None:
    assert _ignored(rel)


@pytest.mark.parametrize("rel", ["params.yaml", "dvc.yaml", "dvc.lock", "data/raw/mine.csv"])
def test_what_the_project_is_made_of_is_not_ignored(rel: str) -> None:
    """The user's files (and DVC's outputs, which DVC's own per-folder .gitignore files list
    once they exist) stay for git."""
    assert not _ignored(rel)
