"""The step floor of the encoder modes (`min_run_steps`, `simtune.train.run_steps`): the passes
it adds by hand-computed steps, and one real run of the train stage that trains them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simtune import params as P
from simtune.export.model_card import CardInputs
from simtune.export.stage import export
from simtune.train import run_steps
from tests.conftest import repo_params
from tests.train_helpers import project, set_schedule, train_top_layers


def _t(mode: str = "full", devices: int = 1, **schedule: Any) -> P.TrainParams:
    raw = repo_params()
    raw["train"]["devices"] = devices
    set_schedule(raw, mode, **schedule)
    return P.effective(P.validate(raw).train, mode)


def test_few_shot_epochs_pass_over_the_data_until_the_run_reaches_the_floor() -> None:
    # TREC coarse at 16 per label: 96 examples; batch 64 shrinks to 32 (4 steps an epoch
    # wanted, not below 32): 3 steps a pass, 4 epochs of one pass = 12 steps < 50 -> 5 passes
    # an epoch (ceil(50 / 12)), 60 steps; epochs and patience unchanged (5 validations)
    t = run_steps.floor(_t(min_run_steps=50, batch_size=64, max_epochs=4, patience=2), 96)
    assert (t.run.passes, t.run.max_epochs, t.run.patience) == (5, 4, 2)
    assert t.run.steps_reason == (
        "train.schedule.full.min_run_steps 50: a pass over the data is 3 steps (96 training "
        "examples, batch 32), so each of the 4 epochs makes 5 passes (60 steps at most)")
    # 48 is reached exactly: 4 passes of 3 steps, 4 epochs
    assert run_steps.floor(_t(min_run_steps=48, batch_size=64, max_epochs=4, patience=2),
                           96).run.passes == 4
    # two processes share a pass: 96 / (32 x 2) -> 2 steps each, 8 an epoch -> 7 passes
    two = run_steps.floor(_t(devices=2, min_run_steps=50, batch_size=64, max_epochs=4,
                             patience=2), 96)
    assert (two.run.passes, two.run.max_epochs) == (7, 4)


@pytest.mark.parametrize(("mode", "n", "floor"), [
    ("top_layers", 4305, 50),  # TREC: 68 steps an epoch, 272 in 4 epochs
    ("full", 96, 12),          # exactly reached: 3 steps x 4 epochs
    ("full", 96, 0),           # off
    ("head", 96, 50),          # head mode has no floor (150 cheap epochs)
])
def test_runs_that_reach_the_floor_or_have_none_are_unchanged(mode: str, n: int,
                                                              floor: int) -> None:
    extra = {"min_run_steps": floor} if mode != "head" else {}
    t = _t(mode, batch_size=64, max_epochs=4, patience=2, **extra)
    assert run_steps.floor(t, n) is t


@pytest.mark.integration
def test_the_train_stage_trains_the_floors_epochs_and_says_why(tmp_path: Path,
                                                               tiny_bert: Path) -> None:
    """80 texts (half of them train: 40), batch 8 -> 5 steps a pass: for a floor of 12 steps the
    one epoch makes 3 passes, 15 steps (Lightning's global step counts them); the report, the
    saved model's training.json and the model card say why."""
    raw, params_file = project(tmp_path, tiny_bert, n=80)
    raw["train"]["mode"] = "top_layers"
    set_schedule(raw, "top_layers", layers=1, max_epochs=1, patience=1, batch_size=8,
                 min_run_steps=12)
    raw["train"]["min_steps"] = 0
    raw["train"]["frozen_candidate"] = False  # a trained epoch is kept: the card names the run
    p = train_top_layers(tmp_path, raw, params_file)
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["in_force"]["train.schedule.top_layers.max_epochs"] == 1
    assert report["epochs"] == 1 and report["steps"] == 15
    assert report["steps_reason"] == (
        "train.schedule.top_layers.min_run_steps 12: a pass over the data is 5 steps (40 "
        "training examples, batch 8), so each of the 1 epochs makes 3 passes (15 steps at "
        "most)")
    saved = json.loads((tmp_path / "head" / "training.json").read_text())
    assert saved["steps_reason"] == report["steps_reason"]
    export(tmp_path / "head", tmp_path / "export", CardInputs(params=p))
    assert report["steps_reason"] in (tmp_path / "export" / "README.md").read_text()
