"""Paired significance of a lift over the same queries: is trained - baseline more than noise?

Both statistics work on the per-query differences d_i = trained_i - baseline_i of one metric:

- `randomization_p`: the paired randomization test (Fisher; Smucker et al. 2007 for IR). Under the
  null hypothesis the two systems are exchangeable on every query, so each d_i is as likely to
  carry either sign; the p-value is the share of sign flips whose mean is at least as extreme as
  the observed mean (two-sided, as `scipy.stats.permutation_test` defines it: twice the smaller
  one-sided share, at most 1). Exact over all 2^n flips when 2^n <= `resamples`, otherwise over
  `resamples` seeded random flips with the +1 correction (Phipson & Smyth 2010), so p > 0.
- `bootstrap_ci`: the 95 % percentile interval of the mean difference over `resamples` paired
  bootstrap resamples of the queries (seeded).

numpy only; deterministic for a seed. Memory is bounded: flips and resamples go in batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

_TOLERANCE = np.finfo(np.float64).eps * 100  # scipy's: equal in theory, unequal by rounding
_CELLS = 1 << 22  # flips x queries held at once (32 MB of float64)


def _flips(n: int, resamples: int, rng: np.random.Generator, exact: bool
           ) -> Iterator[np.ndarray]:
    """Batches of sign vectors (b, n) of +-1: all 2^n of them (exact) or `resamples` random."""
    total = 1 << n if exact else resamples
    batch = max(1, _CELLS // max(n, 1))
    for start in range(0, total, batch):
        b = min(batch, total - start)
        if exact:
            codes = np.arange(start, start + b)[:, None] >> np.arange(n)[None]
            yield (codes & 1) * 2.0 - 1.0
        else:
            yield rng.integers(0, 2, size=(b, n)) * 2.0 - 1.0


def randomization_p(diff: np.ndarray, resamples: int, seed: int) -> float:
    """Two-sided p-value of the paired randomization (sign-flip) test of mean(`diff`) = 0."""
    d = np.asarray(diff, dtype=np.float64)
    n = len(d)
    if n == 0:
        return 1.0
    exact = n < 63 and (1 << n) <= resamples
    observed = float(np.ones(n) @ d) / n  # the same arithmetic as each flip's mean
    gamma = abs(observed) * _TOLERANCE
    less = greater = 0
    for signs in _flips(n, resamples, np.random.default_rng((seed, 1)), exact):
        means = signs @ d / n
        less += int(np.count_nonzero(means <= observed + gamma))
        greater += int(np.count_nonzero(means >= observed - gamma))
    plus = 0 if exact else 1
    total = (1 << n) if exact else resamples
    return min(1.0, 2 * min(less + plus, greater + plus) / (total + plus))


def bootstrap_ci(diff: np.ndarray, resamples: int, seed: int, level: float = 0.95
                 ) -> tuple[float, float]:
    """Percentile interval (`level`) of the mean of `diff` over paired bootstrap resamples."""
    d = np.asarray(diff, dtype=np.float64)
    n = len(d)
    if n == 0:
        return 0.0, 0.0
    rng = np.random.default_rng((seed, 2))
    batch = max(1, _CELLS // n)
    means = np.concatenate([d[rng.integers(0, n, size=(min(batch, resamples - s), n))].mean(1)
                            for s in range(0, resamples, batch)])
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def paired(trained: np.ndarray, baseline: np.ndarray, resamples: int, seed: int
           ) -> dict[str, float | list[float]]:
    """`{"p_value": p, "ci95": [lo, hi]}` of the mean lift trained - baseline (per query)."""
    diff = np.asarray(trained, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    lo, hi = bootstrap_ci(diff, resamples, seed)
    return {"p_value": randomization_p(diff, resamples, seed), "ci95": [lo, hi]}
