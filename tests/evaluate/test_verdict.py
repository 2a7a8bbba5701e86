"""Issue 34 item 5: the verdict on the trained model against the frozen encoder (better / no
better / worse), from the lift and its paired significance, with hand-computed p-values."""

from __future__ import annotations

import numpy as np
import pytest

from simtune.errors import UserError
from simtune.evaluate.report import verdict
from simtune.export.model_card import _metrics_table
from simtune.retrieval.significance import paired


def _judged(trained: list[float], baseline: list[float], alpha: float = 0.05) -> dict:
    sig = paired(np.array(trained), np.array(baseline), resamples=10000, seed=13)
    lift = float(np.mean(trained) - np.mean(baseline))
    return verdict(lift, float(sig["p_value"]), sig["ci95"], "p@1", alpha)  # type: ignore[arg-type]


def test_a_model_worse_than_frozen_with_significance_is_worse() -> None:
    """8 queries, the frozen encoder right on all, the trained model on none: every difference
    is -1; of the 2^8 = 256 sign flips exactly one (no flip) has mean <= -1, all have mean
    >= -1, so the exact two-sided p = 2 * 1 / 256 = 0.0078125 < 0.05: worse."""
    v = _judged([0.0] * 8, [1.0] * 8)
    assert (v["verdict"], v["lift"], v["p_value"]) == ("worse", -1.0, 2 / 256)
    assert v["says"] == ("worse than the frozen encoder: lift of p@1 -1.0000, 95 % CI "
                         "[-1.0000, -1.0000], p = 0.007812 < 0.05")


def test_a_model_better_than_frozen_with_significance_is_better() -> None:
    v = _judged([1.0] * 8, [0.0] * 8)
    assert (v["verdict"], v["lift"], v["p_value"]) == ("better", 1.0, 2 / 256)


def test_an_equal_model_is_no_better() -> None:
    """Every difference 0: every flip's mean equals the observed 0, p = min(1, 2) = 1."""
    v = _judged([1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0])
    assert (v["verdict"], v["lift"], v["p_value"]) == ("no better", 0.0, 1.0)
    assert v["says"].endswith("p = 1 (the same p@1 as the frozen encoder)")


def test_a_lift_the_queries_cannot_tell_from_chance_is_no_better() -> None:
    """Differences [1, 1, -1, 0], mean +0.25: of the 16 flips, 8 have a mean >= 0.25 and 14 a
    mean <= 0.25 (s1 + s2 - s3 is 1, 3, -1, 1, -1, 1, -3, -1 over the 8 signs of the non-zero
    ones, each twice), p = 2 * 8 / 16 = 1: a positive lift, no better."""
    v = _judged([1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0])
    assert (v["verdict"], v["lift"], v["p_value"]) == ("no better", 0.25, 1.0)
    assert "not below 0.05: the test queries cannot tell it from chance" in v["says"]


@pytest.mark.parametrize(("alpha", "want"), [(0.0078125, "no better"), (0.0079, "worse")])
def test_the_significance_level_is_strict(alpha: float, want: str) -> None:
    """p = 2/256 is not below alpha = 2/256 (no better), and is below 0.0079 (worse)."""
    assert _judged([0.0] * 8, [1.0] * 8, alpha)["verdict"] == want


METRICS = {"trained": {"p@1": 0.5}, "baseline": {"p@1": 0.75}, "lift": {"p@1": -0.25},
           "significance": {"p@1": {"p_value": 0.01, "ci95": [-0.4, -0.1]}},
           "queries": 16, "corpus": 40}


def test_the_model_card_states_the_verdict() -> None:
    v = verdict(-0.25, 0.01, [-0.4, -0.1], "p@1", 0.05)
    card = "\n".join(_metrics_table({**METRICS, "verdict": v}))
    assert ("**Verdict: worse than the frozen encoder: lift of p@1 -0.2500, 95 % CI "
            "[-0.4000, -0.1000], p = 0.01 < 0.05.**") in card
    assert "the frozen encoder alone ranks better than this model" in card
    same = "\n".join(_metrics_table({**METRICS, "verdict": verdict(0.0, 1.0, [0, 0], "p@1",
                                                                   0.05)}))
    assert "**Verdict: no better than the frozen encoder" in same
    assert "cannot be told apart from the frozen encoder" in same
    assert "Verdict" not in "\n".join(_metrics_table(METRICS))  # a report without a verdict


def test_a_damaged_verdict_in_the_report_is_one_line() -> None:
    with pytest.raises(UserError, match="`verdict` is not one of better / no better / worse"):
        _metrics_table({**METRICS, "verdict": {"verdict": "great"}})
