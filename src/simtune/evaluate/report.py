"""What evaluate reports: the headline (`reports/metrics.json`, the DVC metrics `dvc exp show`
lists) cut from the full report (`reports/evaluate.json`), and the matryoshka prefixes of each
model's vectors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from simtune.retrieval.metrics import HEADLINE

Vectors = Callable[[torch.Tensor, str], torch.Tensor]  # (rows, role) -> (n, D)


def truncated(vectors: Vectors, dim: int) -> Vectors:
    """(rows, role) -> (n, dim): the first `dim` coordinates, re-normalised to unit length."""
    return lambda rows, role: F.normalize(vectors(rows, role)[:, :dim], dim=-1)



def remember(vectors: Vectors) -> Vectors:
    """`vectors`, computed once per (rows tensor, role): every dim reuses the full vectors."""
    memo: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def cached(rows: torch.Tensor, role: str) -> torch.Tensor:
        key = (id(rows), role)
        if key not in memo:  # the rows tensor is kept, so its id is not reused meanwhile
            memo[key] = (rows, vectors(rows, role))
        return memo[key][1]

    return cached



def matryoshka(dims: Sequence[int], metrics_of: Callable[[Vectors], dict[str, float]],
           trained: Vectors, baseline: Vectors, names: Sequence[str]
           ) -> dict[str, dict[str, dict[str, float]]]:
    """{"<dim>": {trained, baseline, lift: {name: value}}} for each dim, largest first: the
    metrics `names` of both models with their vectors cut to that dim (`truncated`)."""
    out = {}
    for m in sorted(dims, reverse=True):
        t, b = metrics_of(truncated(trained, m)), metrics_of(truncated(baseline, m))
        out[str(m)] = {"trained": {k: t[k] for k in names}, "baseline": {k: b[k] for k in names},
                       "lift": {k: t[k] - b[k] for k in names}}
    return out


def headline(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The DVC metrics of a full evaluate report: the trained model's `HEADLINE` metrics, the
    frozen encoder's (`baseline`) and the lift (p-values, recall@k, counts: the full report
    only), so `dvc exp show` stays one screen wide and holds "trained vs frozen"."""
    return {part: {m: result[part][m] for m in HEADLINE}
            for part in ("trained", "baseline", "lift")}


def every_metric(result: dict[str, Any], alpha: float) -> dict[str, dict[str, Any]]:
    """{metric: {lift, p_value, verdict}} of every `HEADLINE` metric of a report with
    `lift` and `significance`: each metric's own better / no better / worse at `alpha`."""
    out = {}
    for m in HEADLINE:
        lift, p = result["lift"][m], result["significance"][m]["p_value"]
        outcome = ("better" if lift > 0 else "worse" if lift < 0 else "no better") \
            if p < alpha else "no better"
        out[m] = {"lift": lift, "p_value": p, "verdict": outcome}
    return out


def with_others(v: dict[str, Any], metrics: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The verdict `v` with `metrics` (`every_metric`) and `disagree`: the metrics whose own
    significant verdict differs from `v`'s (MAP@R better while MRR@10, the verdict's, is
    worse: a head for clustering or classification, not for the top of a ranking); `says`
    names them with their lifts and p-values."""
    disagree = [m for m, r in metrics.items() if r["verdict"] != "no better"
                and r["verdict"] != v["verdict"]]
    says = v["says"]
    if disagree:
        says += "; but " + ", ".join(
            f"{m} {metrics[m]['lift']:+.4f} (p = {metrics[m]['p_value']:.4g}) "
            f"{metrics[m]['verdict']}" for m in disagree)
        says += " (see docs/evaluation.md: which metric fits which use)"
    return {**v, "metrics": metrics, "disagree": disagree, "says": says}


VERDICTS = ("better", "no better", "worse")  # than the frozen encoder


def verdict(lift: float, p_value: float, ci95: Sequence[float], metric: str, alpha: float
            ) -> dict[str, Any]:
    """The verdict on the trained model against the frozen encoder from one metric's test lift
    and its paired p-value: `better` when lift > 0 and p < `alpha`, `worse` when lift < 0 and
    p < `alpha`, else `no better` (equal, or a difference the test queries cannot tell from
    chance). Returns {verdict, metric, lift, p_value, ci95, alpha, says} (`says`: one line)."""
    significant = p_value < alpha
    outcome = ("better" if lift > 0 else "worse" if lift < 0 else "no better") if significant \
        else "no better"
    why = (f"lift of {metric} {lift:+.4f}, 95 % CI [{ci95[0]:+.4f}, {ci95[1]:+.4f}], "
           f"p = {p_value:.4g}")
    if outcome == "no better":
        why += (f" (not below {alpha:g}: the test queries cannot tell it from chance)"
                if lift != 0 else f" (the same {metric} as the frozen encoder)")
    else:
        why += f" < {alpha:g}"
    return {"verdict": outcome, "metric": metric, "lift": lift, "p_value": p_value,
            "ci95": [float(ci95[0]), float(ci95[1])], "alpha": alpha,
            "says": f"{outcome} than the frozen encoder: {why}"}
