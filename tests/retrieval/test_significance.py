"""The lift's paired significance: hand-computed cases, and scipy.stats as the independent
implementation (permutation_test with paired 'samples' permutations; bootstrap, percentile)."""

from __future__ import annotations

import numpy as np
import pytest

from simtune.retrieval.significance import bootstrap_ci, paired, randomization_p

stats = pytest.importorskip("scipy.stats")


def _scipy_p(trained: np.ndarray, baseline: np.ndarray, resamples: int) -> float:
    """Paired permutation test of mean(trained - baseline): swaps within each query's pair."""
    res = stats.permutation_test(
        (trained, baseline), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
        permutation_type="samples", n_resamples=resamples, rng=np.random.default_rng(7))
    return float(res.pvalue)


def test_hand_computed_exact_p() -> None:
    # d = (1, 2, -1), mean 2/3: the 8 sign flips give sums 2, 4, -2, 0, 0, 2, -4, -2, so
    # P(T >= t) = 3/8, P(T <= t) = 7/8 and the two-sided p = 2 * 3/8
    assert randomization_p(np.array([1.0, 2.0, -1.0]), 10_000, 0) == 0.75


def test_no_difference_gives_p_one() -> None:
    for n in (5, 538):  # exact (2^5 flips) and randomized
        assert randomization_p(np.zeros(n), 10_000, 13) == 1.0
        assert bootstrap_ci(np.zeros(n), 1000, 13) == (0.0, 0.0)
    same = np.array([0.0, 1.0, 0.5, 1.0])
    assert paired(same, same, 1000, 1) == {"p_value": 1.0, "ci95": [0.0, 0.0]}


def test_a_consistent_lift_gives_the_smallest_p() -> None:
    # exact, 10 queries all better: only the identity flip is as extreme, on either side
    assert randomization_p(np.ones(10), 10_000, 13) == 2 / 1024
    # randomized, 538 queries: no random flip reaches it; the +1 correction keeps p > 0
    assert randomization_p(np.full(538, 0.3), 10_000, 13) == 2 / 10_001
    assert bootstrap_ci(np.full(538, 0.3), 1000, 13) == pytest.approx((0.3, 0.3))


@pytest.mark.parametrize("n", [6, 9, 13])
def test_exact_p_equals_scipy(n: int) -> None:
    """2^n <= 10,000 flips: both enumerate every flip, so the p-values are equal."""
    rng = np.random.default_rng(n)
    trained = rng.integers(0, 2, n).astype(float)  # P@1-like: many ties in the null
    baseline = rng.integers(0, 2, n).astype(float)
    graded = rng.random(n)
    assert randomization_p(trained - baseline, 10_000, 0) == pytest.approx(
        _scipy_p(trained, baseline, 10_000), abs=1e-12)
    assert randomization_p(graded - baseline, 10_000, 0) == pytest.approx(
        _scipy_p(graded, baseline, 10_000), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_randomized_p_agrees_with_scipy(seed: int) -> None:
    """538 queries (TREC's test split), a small lift: both are Monte Carlo estimates of one
    p-value from independent draws, so they agree within their sampling error: each one-sided
    share s = p/2 of 10,000 draws has sd sqrt(s(1 - s)/10,000); 4 sd of the difference."""
    rng = np.random.default_rng(seed)
    baseline = rng.random(538)
    noise = rng.normal(0, 0.15, 538)
    trained = baseline + noise - noise.mean() + 0.015  # mean lift 0.015 = 2.3 se: p ~ 0.02
    ours = randomization_p(trained - baseline, 10_000, seed)
    theirs = _scipy_p(trained, baseline, 10_000)
    assert 0.005 < theirs < 0.5  # a p-value worth comparing
    share = theirs / 2
    assert ours == pytest.approx(theirs, abs=4 * 2 * np.sqrt(2 * share * (1 - share) / 10_000))
    assert ours == randomization_p(trained - baseline, 10_000, seed)  # seeded: reproducible


@pytest.mark.parametrize("seed", [0, 1])
def test_bootstrap_ci_agrees_with_scipy(seed: int) -> None:
    """The percentile interval of the mean lift against scipy's: a 2.5 % quantile of 10,000
    resamples has a Monte Carlo sd of ~0.027 se, the difference of two ~0.04 se."""
    rng = np.random.default_rng(seed)
    diff = rng.normal(0.02, 0.3, 538)
    lo, hi = bootstrap_ci(diff, 10_000, seed)
    ref = stats.bootstrap((diff,), np.mean, method="percentile", n_resamples=10_000,
                          rng=np.random.default_rng(11)).confidence_interval
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    assert lo == pytest.approx(ref.low, abs=0.16 * se)
    assert hi == pytest.approx(ref.high, abs=0.16 * se)
    # and the normal approximation of the mean's interval, the textbook cross-check
    assert (lo, hi) == pytest.approx((diff.mean() - 1.96 * se, diff.mean() + 1.96 * se),
                                     abs=0.16 * se)
