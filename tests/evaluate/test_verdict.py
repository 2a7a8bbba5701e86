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


def test_the_verdict_names_every_metric_that_disagrees_with_its_own() -> None:
    """Issue 43 item 4: MAP@R up by 0.49 with p < 0.05 while MRR@10 (the verdict's) is down
    0.035 with p < 0.05: the verdict stays MRR@10's (worse) and names MAP@R, its lift and
    p-value; a metric that the test cannot tell from chance disagrees with nothing."""
    from simtune.evaluate.report import every_metric, with_others

    lift = {"p@1": -0.02, "mrr@10": -0.035, "ndcg@10": 0.01, "map@r": 0.49}
    p = {"p@1": 0.3, "mrr@10": 0.01, "ndcg@10": 0.5, "map@r": 0.0001}
    result = {"lift": lift, "significance": {m: {"p_value": v} for m, v in p.items()}}
    metrics = every_metric(result, 0.05)
    assert {m: r["verdict"] for m, r in metrics.items()} == {
        "p@1": "no better", "mrr@10": "worse", "ndcg@10": "no better", "map@r": "better"}
    v = with_others(verdict(-0.035, 0.01, [-0.06, -0.01], "mrr@10", 0.05), metrics)
    assert v["verdict"] == "worse" and v["disagree"] == ["map@r"]
    assert v["says"] == ("worse than the frozen encoder: lift of mrr@10 -0.0350, 95 % CI "
                         "[-0.0600, -0.0100], p = 0.01 < 0.05; but map@r +0.4900 (p = 0.0001) "
                         "better (see docs/evaluation.md: which metric fits which use)")
    agree = with_others(verdict(0.2, 0.001, [0.1, 0.3], "mrr@10", 0.05),
                        every_metric({"lift": dict.fromkeys(lift, 0.2), "significance": {
                            m: {"p_value": 0.001} for m in p}}, 0.05))
    assert agree["disagree"] == [] and "but" not in agree["says"]
