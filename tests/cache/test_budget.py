"""Issue 51 item 5: `train.auto.max_minutes`, the top layers' estimated run on this machine
(`simtune.cache.budget`), with hand-made timings injected: the head past the budget, the top
layers within it, a set `train.mode` never overridden, the measured speed kept and reused (the
same data resolves the same mode on every rerun), and the train log's estimate line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simtune import params as P
from simtune.cache import budget, modes
from simtune.train.epoch_log import estimate_line
from tests.cache_helpers import encoder_params
from tests.conftest import repo_params

TEXTS = [f"what is the name of the {w} river" for w in
         ("first", "largest", "city", "country", "ocean", "island")] * 5


def _params(tiny_bert: Path, mode: str = "auto", minutes: float = 1.0,
            epochs: int = 4) -> tuple[P.TrainParams, P.EncodersParams]:
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    raw["train"]["mode"] = mode
    raw["train"]["auto"].update(full_max_tokens=0, max_tokens=10**6, max_layer_gb=100,
                                max_minutes=minutes)
    raw["train"]["schedule"]["top_layers"].update(layers=2, max_epochs=epochs)
    p = P.validate(raw)
    return p.train, p.encoders


def _speed(per_token: float, asked: list[int] | None = None) -> modes.Speed:
    def speed(layers: int) -> tuple[float, str]:
        if asked is not None:
            asked.append(layers)
        return per_token, "injected"
    return speed


def test_auto_takes_the_head_past_the_time_budget_and_the_top_layers_within(
        tiny_bert: Path) -> None:
    t, enc = _params(tiny_bert, minutes=1.0, epochs=4)
    total = modes.estimate(enc, TEXTS).total
    # 4 epochs x total tokens x s/token = 60 s exactly at this speed: within 1 minute
    at = 59.99 / (4 * total * budget.EPOCH_FACTOR)
    asked: list[int] = []
    mode, why = modes.choose(t, enc, TEXTS, _speed(at, asked))
    assert mode == "top_layers" and asked == [2]  # the speed of the top 2 layers
    assert "run ~4 epochs x 15 s = ~1.0 min <= train.auto.max_minutes 1 on this machine" in why
    mode, why = modes.choose(t, enc, TEXTS, _speed(60.6 / (4 * total * budget.EPOCH_FACTOR)))
    assert mode == "head"
    assert "= ~1.0 min > train.auto.max_minutes 1 on this machine" in why
    # 0: no time bound, the speed never asked
    unbounded, _ = _params(tiny_bert, minutes=0)
    asked.clear()
    assert modes.choose(unbounded, enc, TEXTS, _speed(1.0, asked))[0] == "top_layers"
    assert asked == []


def test_the_time_budget_counts_the_schedules_epochs(tiny_bert: Path) -> None:
    """The same speed: 2 epochs fit a minute that 3 do not."""
    _, enc = _params(tiny_bert)
    per_token = 25.0 / modes.estimate(enc, TEXTS).total / budget.EPOCH_FACTOR  # 25 s an epoch
    two, _ = _params(tiny_bert, epochs=2)
    three, _ = _params(tiny_bert, epochs=3)
    assert modes.choose(two, enc, TEXTS, _speed(per_token))[0] == "top_layers"
    assert modes.choose(three, enc, TEXTS, _speed(per_token))[0] == "head"


@pytest.mark.parametrize("mode", ["top_layers", "full", "head"])
def test_a_set_mode_is_never_overridden_by_the_time_budget(tiny_bert: Path, mode: str) -> None:
    t, enc = _params(tiny_bert, mode=mode, minutes=1e-6)
    asked: list[int] = []
    assert modes.choose(t, enc, TEXTS, _speed(1e9, asked)) == (mode, f"train.mode: {mode}")
    assert asked == []  # nothing measured for a mode the user set


def test_the_measured_speed_is_kept_and_every_later_resolution_reads_it(
        tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs once per machine (model, layers, device): a rerun reads the record, so
    the same data resolves the same mode whatever the machine's load at the time."""
    _, enc = _params(tiny_bert)
    probes: list[int] = []

    def probe(path: Path, total: int, layers: int, device: str) -> tuple[float, int]:
        probes.append(layers)
        return 0.001 * (1 + len(probes)), 2  # a second probe would give another figure

    monkeypatch.setattr(budget, "probe", probe)
    first = budget.seconds_per_token(enc, 2, "cpu", tmp_path)
    again = budget.seconds_per_token(enc, 2, "cpu", tmp_path)
    assert probes == [2] and first == again and first[0] == 0.002
    record = json.loads((tmp_path / budget.RECORD).read_text())
    (entry,) = record.values()
    assert entry["seconds_per_token"] == 0.002 and entry["threads"] == 2
    budget.seconds_per_token(enc, 1, "cpu", tmp_path)  # another key: measured
    assert probes == [2, 1]


def test_the_probe_times_real_steps_of_the_top_layers(tiny_bert: Path) -> None:
    import torch

    before = torch.get_num_threads()
    per_token, threads = budget.probe(tiny_bert, 2, 1, "cpu")
    assert 0 < per_token < 1 and math.isfinite(per_token) and threads == before
    assert torch.get_num_threads() == before  # one thread for the probe only


def test_the_train_log_says_how_long_the_run_will_take() -> None:
    """0.5 s a step x 68 steps = 34 s + 8 s validation = 42 s an epoch; 4 epochs: 2.8 min."""
    assert estimate_line(0.5, 68, 8.0, 4, 5) == (
        "run estimate from the first 5 steps (0.50 s a step, 68 steps an epoch): ~4 epochs x "
        "42 s (34 s training + 8 s validation) = ~2.8 min at most (early stopping may end it "
        "sooner)")
    # 70,000 tokens x 0.25 ms x 2.4 = 42 s an epoch
    assert budget.EPOCH_FACTOR == 2.4
    assert budget.estimate(70_000, 4, 0.00025).text() == "~4 epochs x 42 s"
