"""The learning-rate probe (`lr: auto`, `simtune.train.probe`) and the line naming what a kept
frozen encoder left behind (`validation.disagreement`): hand-made validation curves, then one
real run of the train stage on the tiny encoder."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from simtune import params as P
from simtune.train import probe
from simtune.train.probe import Probe
from simtune.train.validation import disagreement, disagreement_line
from tests.train_helpers import project, set_schedule, train_top_layers


def test_the_best_probed_rate_wins_and_a_tie_goes_to_the_lower() -> None:
    probes = [Probe(5e-5, 0.70, 20), Probe(1e-4, 0.74, 20), Probe(2e-4, 0.72, 20)]
    assert probe.choose(probes, frozen_value=0.60)[0] == 1e-4
    tied = [Probe(2e-4, 0.74, 20), Probe(5e-5, 0.74, 20), Probe(1e-4, 0.70, 20)]
    assert probe.choose(tied, frozen_value=0.60)[0] == 5e-5


def test_when_no_rate_beats_the_frozen_encoder_the_lowest_trains() -> None:
    # an already-good frozen encoder (0.85): every rate moved it down, the high ones most
    probes = [Probe(2e-4, 0.80, 20), Probe(1e-4, 0.83, 20), Probe(5e-5, 0.84, 20)]
    rate, why = probe.choose(probes, frozen_value=0.85)
    assert rate == 5e-5 and "no probed rate beat the frozen encoder" in why


def _train_params(tmp_path: Path, **top: Any) -> P.TrainParams:
    from tests.conftest import repo_params

    raw = repo_params()
    set_schedule(raw, "top_layers", **top)
    return P.effective(P.validate(raw).train, "top_layers")


class _Curve:
    """A stand-in for the stage's `fit`: each rate's probe "trains" and scores what the
    hand-made curve says (the frozen encoder: `frozen`); records the rates and steps asked."""

    def __init__(self, curve: dict[float, float], frozen: float) -> None:
        self.curve, self.frozen, self.calls = curve, frozen, []

    def __call__(self, t: P.TrainParams, *, loop_type: Any, max_steps: int, **_: Any) -> None:
        self.calls.append((t.run.encoder_lr, t.run.lr, max_steps))
        end = loop_type(None, None, t.monitor, None)
        end.frozen_value, end.value = self.frozen, self.curve[t.run.encoder_lr]


@pytest.mark.usefixtures("no_task")
def test_the_probe_trains_each_rate_its_steps_and_the_run_takes_the_best(tmp_path: Path
                                                                         ) -> None:
    t = _train_params(tmp_path, lr="auto", head_lr="auto", probe_rates=[2e-4, 5e-5, 1e-4],
                      probe_steps=7)
    fit = _Curve({5e-5: 0.61, 1e-4: 0.66, 2e-4: 0.64}, frozen=0.55)
    out = probe.run(t, data=_FakeData(), fit=fit)
    # every rate from the same start, lowest first, each `probe_steps` steps, head rate = layers'
    assert fit.calls == [(5e-5, 5e-5, 7), (1e-4, 1e-4, 7), (2e-4, 2e-4, 7)]
    assert (out.run.encoder_lr, out.run.lr) == (1e-4, 1e-4)
    assert out.run.lr_reason.startswith("lr auto: 0.0001 (best of the probe (5e-05 0.6100, "
                                        "0.0001 0.6600, 0.0002 0.6400; frozen 0.5500)")
    assert out.run.shown()["train.schedule.top_layers.lr"] == 1e-4


@pytest.mark.usefixtures("no_task")
def test_a_rate_the_user_wrote_is_never_probed(tmp_path: Path) -> None:
    t = _train_params(tmp_path, lr=3e-5, head_lr="auto")
    fit = _Curve({}, frozen=0.5)
    out = probe.run(t, data=_FakeData(), fit=fit)
    assert fit.calls == [] and out is t
    assert (out.run.encoder_lr, out.run.lr, out.run.lr_reason) == (3e-5, 3e-5, "")
    # a head rate of its own is kept beside a probed layers' rate
    t = _train_params(tmp_path, lr="auto", head_lr=1e-3, probe_rates=[1e-4], probe_steps=2)
    out = probe.run(t, data=_FakeData(), fit=_Curve({1e-4: 0.9}, frozen=0.5))
    assert (out.run.encoder_lr, out.run.lr) == (1e-4, 1e-3)


@pytest.mark.usefixtures("no_task")
def test_a_diverging_rate_scores_minus_infinity(tmp_path: Path) -> None:
    from simtune.train.module import Diverged

    t = _train_params(tmp_path, lr="auto", probe_rates=[1e-4, 5.0], probe_steps=2)

    def fit(t: P.TrainParams, *, loop_type: Any, **_: Any) -> None:
        end = loop_type(None, None, t.monitor, None)
        if t.run.encoder_lr == 5.0:
            raise Diverged("train.schedule.top_layers.lr: training diverged")
        end.frozen_value, end.value = 0.4, 0.5

    out = probe.run(t, data=_FakeData(), fit=fit)
    assert out.run.encoder_lr == 1e-4 and "5 -inf" in out.run.lr_reason


class _FakeData:
    """The probe reads the data only to build its validation task (`probe_task`)."""

    kind = "groups"


@pytest.fixture
def no_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in `fit`s need no validation task."""
    monkeypatch.setattr(probe, "probe_task", lambda data: None)


def test_the_disagreement_names_the_epoch_and_metric_of_the_largest_other_lift() -> None:
    history = {0: {"val/mrr@10": 0.85, "val/p@1": 0.80, "val/map@r": 0.30},
               1: {"val/mrr@10": 0.84, "val/p@1": 0.79, "val/map@r": 0.45},
               2: {"val/mrr@10": 0.84, "val/p@1": 0.81, "val/map@r": 0.61},
               3: {"val/mrr@10": 0.83}}  # a top-10 validation: no MAP@R
    d = disagreement(history, kept=0, monitor="mrr@10")
    assert d is not None and (d["epoch"], d["metric"]) == (2, "map@r")
    assert d["lifts"] == pytest.approx({"mrr@10": -0.01, "p@1": 0.01, "map@r": 0.31})
    assert disagreement_line(d) == ("epoch 2: map@r +0.3100, p@1 +0.0100, mrr@10 -0.0100 on "
                                    "validation against the frozen encoder; "
                                    "`train.monitor: map@r` keeps it")
    # a trained epoch kept, or no other metric rose: nothing to say
    assert disagreement(history, kept=2, monitor="mrr@10") is None
    flat = {0: {"val/mrr@10": 0.9, "val/map@r": 0.5}, 1: {"val/mrr@10": 0.8, "val/map@r": 0.4}}
    assert disagreement(flat, kept=0, monitor="mrr@10") is None


@pytest.mark.integration
@pytest.mark.parametrize("monitor", ["mrr@10", "map@r"])
def test_the_train_stage_probes_then_reports_the_rate_and_why(tmp_path: Path, tiny_bert: Path,
                                                              monitor: str) -> None:
    """A real probe on the tiny encoder: the run trains at one of the probed rates, and the
    report, the saved model's training.json and `in_force` agree on it. MAP@R (which needs
    each query's whole ranking, not the top 10) is probed too: it once raised KeyError."""
    raw, params_file = project(tmp_path, tiny_bert, n=80)
    raw["train"]["mode"] = "top_layers"
    raw["train"]["monitor"] = monitor
    set_schedule(raw, "top_layers", layers=1, lr="auto", head_lr="auto", max_epochs=1,
                 batch_size=8, probe_rates=[1e-4, 1e-2], probe_steps=2)
    train_top_layers(tmp_path, raw, params_file)
    report = json.loads((tmp_path / "train.json").read_text())
    rate = report["in_force"]["train.schedule.top_layers.lr"]
    assert rate in (1e-4, 1e-2) and report["in_force"]["train.schedule.top_layers.head_lr"] == rate
    assert report["lr_reason"].startswith(f"lr auto: {rate:g} (")
    saved = json.loads((tmp_path / "head" / "training.json").read_text())
    assert saved["lr_reason"] == report["lr_reason"]
    # both rates were scored (a finite value each), and the frozen encoder too
    scored = re.findall(r"(0\.0001|0\.01) (\d\.\d{4})", report["lr_reason"])
    assert [r for r, _ in scored] == ["0.0001", "0.01"]
    assert re.search(r"frozen (encoder \()?\d\.\d{4}", report["lr_reason"])
