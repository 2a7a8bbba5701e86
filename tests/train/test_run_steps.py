"""The step floor of the encoder modes (`min_run_steps`, `simtune.train.run_steps`): the epochs
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


def test_few_shot_epochs_grow_until_the_run_reaches_the_floor() -> None:
    # TREC coarse at 16 per label: 96 examples; batch 64 shrinks to 32 (4 steps an epoch
    # wanted, not below 32): 3 steps an epoch, 4 epochs = 12 steps < 50 -> 17 epochs (51 steps);
    # patience 2 of 4 epochs -> ceil(2 x 17 / 4) = 9
    t = run_steps.floor(_t(min_run_steps=50, batch_size=64, max_epochs=4, patience=2), 96)
    assert (t.run.max_epochs, t.run.patience) == (17, 9)
    assert t.run.steps_reason == (
        "train.schedule.full.min_run_steps 50: an epoch is 3 steps (96 training examples, "
        "batch 32), so max_epochs 4 -> 17 and patience 2 -> 9 (51 steps at most)")
    # two processes share an epoch: 96 / (32 x 2) -> 2 steps each, so 25 epochs, patience 13
    two = run_steps.floor(_t(devices=2, min_run_steps=50, batch_size=64, max_epochs=4,
                             patience=2), 96)
    assert (two.run.max_epochs, two.run.patience) == (25, 13)


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
    """80 texts (half of them train: 40), batch 8 -> 5 steps an epoch: max_epochs 1 becomes 3
    for a floor of 12 steps, patience 3 x 1 -> 3; patience never ends it early (3 >= 3), so
    3 epochs train; the report, in_force and the saved model's training.json agree."""
    raw, params_file = project(tmp_path, tiny_bert, n=80)
    raw["train"]["mode"] = "top_layers"
    set_schedule(raw, "top_layers", layers=1, max_epochs=1, patience=1, batch_size=8,
                 min_run_steps=12)
    raw["train"]["min_steps"] = 0
    raw["train"]["frozen_candidate"] = False  # a trained epoch is kept: the card names the run
    p = train_top_layers(tmp_path, raw, params_file)
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["in_force"]["train.schedule.top_layers.max_epochs"] == 3
    assert report["in_force"]["train.schedule.top_layers.patience"] == 3
    assert report["epochs"] == 3
    assert report["steps_reason"] == (
        "train.schedule.top_layers.min_run_steps 12: an epoch is 5 steps (40 training "
        "examples, batch 8), so max_epochs 1 -> 3 and patience 1 -> 3 (15 steps at most)")
    saved = json.loads((tmp_path / "head" / "training.json").read_text())
    assert saved["steps_reason"] == report["steps_reason"]
    export(tmp_path / "head", tmp_path / "export", CardInputs(params=p))
    assert report["steps_reason"] in (tmp_path / "export" / "README.md").read_text()
