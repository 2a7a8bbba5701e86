"""Hard-negative mining itself (torch): each query's top-ranked unlisted documents below its
false-negative threshold, exactly (`mine`). Imported by the negatives stage for pairs data only,
so the stage on groups data (an empty table) starts without torch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from simtune.retrieval.topk import topk


@dataclass
class Mined:
    """`index` (Q, count) corpus indices, best first, -1 where fewer were found; `score`
    (Q, count) their cosines (NaN there); `skipped` (Q,) documents passed over as likely false
    negatives (scoring above the threshold, not listed); `threshold` (Q,)."""

    index: torch.Tensor
    score: torch.Tensor
    skipped: torch.Tensor
    threshold: torch.Tensor


def thresholds(queries: torch.Tensor, corpus: torch.Tensor, listed: torch.Tensor,
               positive: torch.Tensor, margin: float, relative: bool) -> torch.Tensor:
    """(Q,) the highest score a negative may have: from each query's lowest positive cosine p,
    p - margin or p - |p| * margin; -inf for a query without a positive."""
    pos = listed[positive]
    cos = (F.normalize(queries[pos[:, 0]].float(), dim=-1)
           * F.normalize(corpus[pos[:, 1]].float(), dim=-1)).sum(1)
    low = torch.full((len(queries),), torch.inf).scatter_reduce(0, pos[:, 0], cos, "amin")
    thr = low - (low.abs() * margin if relative else margin)
    return torch.where(torch.isinf(low), -torch.inf, thr)


def mine(queries: torch.Tensor, corpus: torch.Tensor, listed: torch.Tensor,
         positive: torch.Tensor, count: int, margin: float, relative: bool,
         chunk: int = 1024) -> Mined:
    """Hard negatives of (Q, D) `queries` among (N, D) `corpus` (cosine).

    `listed` (P, 2): (query, corpus index) of every known pair, never a negative; `positive`
    (P,) bool: which of them set the threshold (`thresholds`). Exact: each query's first `count`
    documents by descending cosine (ties: lower index) among the unlisted ones scoring <= its
    threshold."""
    n_q, n = len(queries), len(corpus)
    index = torch.full((n_q, count), -1, dtype=torch.long)
    score = torch.full((n_q, count), torch.nan)
    skipped = torch.zeros(n_q, dtype=torch.long)
    thr = thresholds(queries, corpus, listed, positive, margin, relative)
    keys = torch.unique(listed[:, 0] * n + listed[:, 1])
    most_listed = int(torch.bincount(listed[:, 0], minlength=1).max()) if len(listed) else 0
    todo = torch.arange(n_q)[thr > -torch.inf]  # a query without a positive gets none
    k = min(n, 2 * count + most_listed)
    while count and len(todo):
        s, i = topk(queries[todo], corpus, k, chunk)
        key = todo[:, None] * n + i
        at = torch.searchsorted(keys, key).clamp_max(len(keys) - 1)
        own = (keys[at] == key) | (i < 0)  # listed with the query (or no document)
        above = s > thr[todo, None]
        keep = ~own & ~above
        done = (keep.sum(1) >= count) | (k >= n)
        rank = keep.cumsum(1)
        rows, cols = torch.nonzero(keep & (rank <= count) & done[:, None], as_tuple=True)
        index[todo[rows], rank[rows, cols] - 1] = i[rows, cols]
        score[todo[rows], rank[rows, cols] - 1] = s[rows, cols]
        skipped[todo[done]] = (~own & above)[done].sum(1)
        todo, k = todo[~done], min(n, 4 * k)
    return Mined(index, score, skipped, thr)
