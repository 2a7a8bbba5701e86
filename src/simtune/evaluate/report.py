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
    """The DVC metrics of a full evaluate report: the trained model's `HEADLINE` metrics and
    their lift over the frozen baseline (p-values, recall@k, counts: the full report only), so
    `dvc exp show` stays one screen wide."""
    return {part: {m: result[part][m] for m in HEADLINE} for part in ("trained", "lift")}
