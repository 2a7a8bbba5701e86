"""The real pipeline: `dvc repro` in a temp git copy of the project, then a no-op rerun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

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
    status = project.dvc("status", "prepare", "--json")
    assert json.loads(status.stdout) == {}


def test_cache_stage_reruns_only_for_vector_changes(tmp_path: Path) -> None:
    from tests.cache_helpers import encoder_params, sentences
    from tests.conftest import save_tiny_bert



    project = DvcProject(tmp_path / "project")
    model = save_tiny_bert(tmp_path / "tiny-bert")
    data = project.path / "data" / "raw" / "mine.csv"
    rows = [f'"{s}",L{i % 3}' for i, s in enumerate(sentences(60))]
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    params = project.path / "params.yaml"
    raw = yaml.safe_load(params.read_text())
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"]["path"] = "data/raw/mine.csv"
    raw["encoders"] = encoder_params(model)
    raw["cache"]["device"] = "cpu"
    raw["train"].update(batch_size=8, max_epochs=2)
    params.write_text(yaml.safe_dump(raw, sort_keys=False))

    first = project.dvc("repro")
    assert "Running stage 'prepare'" in first.stdout and "Running stage 'cache'" in first.stdout
    assert "cache tiny: 0 cached, 60 to embed" in first.stderr
    assert project.dvc("status", "--json").stdout.strip() == "{}"

    assert "Running stage 'train'" in first.stdout
    assert (project.path / "models" / "head" / "model.safetensors").is_file()

    # a train key reruns train only, and no encoder is loaded
    raw["train"]["lr"] = 0.002
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    retrain = project.dvc("repro")
    assert "Running stage 'train'" in retrain.stdout
    assert "Running stage 'cache'" not in retrain.stdout
    assert "Running stage 'prepare'" not in retrain.stdout
    assert "loaded encoder" not in retrain.stderr

    # a fill knob changes no vector: nothing reruns
    raw["cache"]["batch_size"] = 7
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    knob = project.dvc("repro")
    assert "Running stage" not in knob.stdout

    # 5 new rows: prepare and cache rerun, exactly 5 texts embedded
    data.write_text(data.read_text() + "".join(f'"{s}",L0\n' for s in sentences(5, 500)))
    grown = project.dvc("repro")
    assert "Running stage 'prepare'" in grown.stdout and "Running stage 'cache'" in grown.stdout
    assert "cache tiny: 60 cached, 5 to embed" in grown.stderr

    # pooling changes every vector: cache reruns and rebuilds, saying why
    raw["encoders"]["models"]["tiny"]["pooling"] = "max"
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    rebuilt = project.dvc("repro")
    assert "Running stage 'prepare'" not in rebuilt.stdout
    assert "Running stage 'cache'" in rebuilt.stdout
    assert "encoder changed (pooling: 'mean' -> 'max')" in rebuilt.stderr
    assert "cache tiny: 0 cached, 65 to embed" in rebuilt.stderr
