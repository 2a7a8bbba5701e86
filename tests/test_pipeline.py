"""The real pipeline: `dvc repro` in a temp git copy of the project, then a no-op rerun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dvc_project import DvcProject

pytestmark = pytest.mark.integration


def test_dvc_repro_prepare_then_nothing_to_do(tmp_path: Path) -> None:
    project = DvcProject(tmp_path / "project")
    first = project.dvc("repro", "prepare")
    assert "Running stage 'prepare'" in first.stdout
    report = json.loads((project.path / "reports" / "prepare.json").read_text())
    assert report["texts"] == 5380
    assert report["examples"] == {"train": 4306, "val": 536, "test": 538}
    assert sorted(p.name for p in (project.path / "data" / "prepared").iterdir()) == [
        "examples.parquet", "meta.json", "texts.parquet"]
    assert (project.path / "dvc.lock").is_file()

    second = project.dvc("repro", "prepare")
    assert "Running stage" not in second.stdout
    assert "Stage 'prepare' didn't change, skipping" in second.stdout

    # editing a key of its section reruns it
    params = project.path / "params.yaml"
    params.write_text(params.read_text().replace("seed: 13", "seed: 14"))
    third = project.dvc("repro", "prepare")
    assert "Running stage 'prepare'" in third.stdout
    status = project.dvc("status", "--json")
    assert json.loads(status.stdout) == {}
