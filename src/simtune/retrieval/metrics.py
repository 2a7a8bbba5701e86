"""Exact retrieval metrics over the streamed top-k (`topk`): memory O(tile), never queries x corpus.

Definitions (trec_eval and the metric-learning literature; relevant = gain > 0):
- P@1: 1 if the first result is relevant.
- Recall@k: relevant items in the top k / relevant items in the corpus (R).
- MRR@10: 1 / rank of the first relevant item within the top 10, else 0.
- nDCG@10: sum over the top 10 of gain_i / log2(i + 1), divided by the same for the ideal ranking
  (the query's 10 largest gains). Binary data: gain = rel_i (0/1); graded pairs (BEIR qrels): the
  raw grade, as trec_eval's `ndcg_cut` does by default (not 2^grade - 1).
- MAP@R (Musgrave et al. 2020): (1 / R) * sum over the top R of P@i * rel_i.
A query with no relevant item in the corpus scores 0 on every metric and is counted, never
dropped. Ties in score are broken by corpus index (lower first), so rankings are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from simtune.retrieval.topk import topk

HEADLINE = ("p@1", "mrr@10", "ndcg@10", "map@r")  # the metrics whose lift gets a significance
Relevance = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Ranker = Callable[[slice, int, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]
"""(queries `sel`, k, exclude (c,) or None) -> (scores, corpus indices), each (c, k'), of the
selected c queries: their best k' = min(k, candidates) items, best first, ties by lower corpus
index; `exclude` as in `topk` (one index per query to leave out, or -1). A ranker that
retrieves fewer items (BM25: only documents sharing a term) pads with index -1, score -inf."""


@dataclass
class Ranked:
    """Binary relevance of each query's top-k (Q, k) and its number of relevant items (Q,);
    graded data adds `gain` (Q, k), the gains of the ranked items, and `ideal` (Q, 10), each
    query's largest gains in descending order. `top`: (scores, corpus indices) of the top
    `depth` when `rank` was asked for them (TREC run files)."""

    rel: torch.Tensor
    n_relevant: torch.Tensor
    gain: torch.Tensor | None = None
    ideal: torch.Tensor | None = None
    top: tuple[torch.Tensor, torch.Tensor] | None = None


def cosine(queries: torch.Tensor, corpus: torch.Tensor, chunk: int = 1024) -> Ranker:
    """The `Ranker` of exact cosine similarity (`topk`) of `queries` (Q, D) against `corpus`."""
    return lambda sel, k, exclude: topk(queries[sel], corpus, k, chunk, exclude)


def rank(queries: torch.Tensor, corpus: torch.Tensor, relevant: Relevance,
         n_relevant: torch.Tensor, k: int, exclude: torch.Tensor | None = None,
         chunk: int = 1024, gain: Relevance | None = None, ideal: torch.Tensor | None = None,
         depth: int = 0) -> Ranked:
    """`rank_by` the cosine similarity of `queries` to `corpus`."""
    return rank_by(cosine(queries, corpus, chunk), relevant, n_relevant, k, exclude, chunk, gain,
                   ideal, depth)


def rank_by(ranker: Ranker, relevant: Relevance, n_relevant: torch.Tensor, k: int,
            exclude: torch.Tensor | None = None, chunk: int = 1024,
            gain: Relevance | None = None, ideal: torch.Tensor | None = None,
            depth: int = 0) -> Ranked:
    """Top-k of every query (`ranker`; Q = len(n_relevant)), mapped to relevance by
    `relevant(query_idx (c,), idx (c, k))` (and to gains by `gain`, graded data); a place the
    ranker left empty (index -1) is neither relevant nor a gain. `depth` > 0 also keeps the top
    `depth` (scores, indices): the top-k is the first k of the top max(k, depth), so the
    metrics do not depend on it."""
    top_s, top_i = ranker(slice(0, len(n_relevant)), max(k, depth), exclude)
    idx = top_i[:, :k]
    found, at = idx >= 0, idx.clamp_min(0)

    def over(fn: Relevance) -> torch.Tensor:
        return torch.cat([fn(torch.arange(s, min(s + chunk, len(at))), at[s : s + chunk])
                          for s in range(0, len(at), chunk)]) if len(at) else at.float()

    return Ranked(over(relevant).bool() & found, n_relevant,
                  None if gain is None else over(gain).float() * found, ideal,
                  (top_s[:, :depth], top_i[:, :depth]) if depth else None)


def per_query(r: Ranked, ks: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Each query's P@1, Recall@k for each k, MRR@10, nDCG@10, MAP@R: name -> (Q,)."""
    rel, n = r.rel.float(), r.n_relevant.float()
    k = rel.shape[1]
    pos = torch.arange(1, k + 1, dtype=torch.float32)
    out = {"p@1": rel[:, 0] if k else torch.zeros(len(rel))}
    for kk in ks:
        out[f"recall@{kk}"] = rel[:, :kk].sum(1) / n.clamp_min(1)
    top10 = rel[:, :10]
    first = torch.where(top10.any(1), top10.argmax(1).float() + 1, torch.inf)
    out["mrr@10"] = 1 / first
    width = top10.shape[1]
    discount = (1 / torch.log2(pos[:10] + 1))[:width]
    if r.gain is None or r.ideal is None:  # binary: the ideal ranking puts the R relevant first
        dcg = (top10 * discount).sum(1)
        ideal = (torch.arange(width)[None] < n[:, None]).float() * discount
    else:
        dcg = (r.gain[:, :10] * discount).sum(1)
        ideal = r.ideal[:, :width].float() * discount
    out["ndcg@10"] = dcg / ideal.sum(1).clamp_min(1e-12)
    within_r = (pos[None] <= n[:, None]).float()
    precision_at = rel.cumsum(1) / pos
    out["map@r"] = (precision_at * rel * within_r).sum(1) / n.clamp_min(1)
    return out


def scores(r: Ranked, ks: tuple[int, ...]) -> dict[str, float]:
    """Mean P@1, Recall@k for each k, MRR@10, nDCG@10, MAP@R over all queries."""
    out = {name: v.mean().item() for name, v in per_query(r, ks).items()}
    if not r.rel.shape[1]:
        out["p@1"] = 0.0
    return out


def group_scores(queries: torch.Tensor, q_labels: torch.Tensor, corpus: torch.Tensor | None,
                 c_labels: torch.Tensor | None, ks: tuple[int, ...], chunk: int = 1024,
                 upto_r: bool = True) -> tuple[dict[str, float], int]:
    """Groups retrieval: relevant = same label. `corpus` None: leave-one-out over `queries`.
    `upto_r` False: only the top max(ks, 10) is ranked and MAP@R (which needs each query's top
    R) is left out; the other metrics are the same (the top-k is exact, ties by index).

    Returns (metrics, number of queries without any relevant item in the corpus).
    """
    ranked = group_ranked(queries, q_labels, corpus, c_labels, ks, chunk, upto_r=upto_r)
    return without_r(scores(ranked, ks), upto_r), int((ranked.n_relevant == 0).sum())


def group_ranked(queries: torch.Tensor, q_labels: torch.Tensor, corpus: torch.Tensor | None,
                 c_labels: torch.Tensor | None, ks: tuple[int, ...], chunk: int = 1024,
                 depth: int = 0, upto_r: bool = True) -> Ranked:
    """The ranking behind `group_scores` (`depth`: also the top `depth`, as in `rank`)."""
    leave_one_out = corpus is None
    ranker = cosine(queries, queries if corpus is None else corpus, chunk)
    return group_ranking(ranker, q_labels, q_labels if c_labels is None else c_labels,
                         leave_one_out, ks, chunk, depth, upto_r)


def group_ranking(ranker: Ranker, q_labels: torch.Tensor, c_labels: torch.Tensor,
                  leave_one_out: bool, ks: tuple[int, ...], chunk: int = 1024, depth: int = 0,
                  upto_r: bool = True) -> Ranked:
    """`group_ranked` of any `ranker` of the queries (labels `q_labels`) against a corpus
    labelled `c_labels` (`leave_one_out`: the queries themselves, each leaving itself out)."""
    counts = torch.bincount(c_labels, minlength=int(max(q_labels.max(), c_labels.max())) + 1)
    n_rel = counts[q_labels] - (1 if leave_one_out else 0)
    k = max(*ks, 10, int(n_rel.max()) if len(n_rel) and upto_r else 1)
    exclude = torch.arange(len(q_labels)) if leave_one_out else None

    def relevant(qi: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return c_labels[idx] == q_labels[qi][:, None]

    return rank_by(ranker, relevant, n_rel, k, exclude, chunk, depth=depth)


def by_label(r: Ranked, labels: torch.Tensor, ks: tuple[int, ...]
             ) -> dict[int, dict[str, float]]:
    """`scores` of each label's queries: class index -> metrics (`labels` (Q,) of the queries)."""
    return {lab: scores(Ranked(r.rel[labels == lab], r.n_relevant[labels == lab]), ks)
            for lab in torch.unique(labels).tolist()}


def without_r(out: dict[str, float], upto_r: bool) -> dict[str, float]:
    """`out` less MAP@R when the ranking stopped short of each query's R (`upto_r` False)."""
    return out if upto_r else {name: v for name, v in out.items() if name != "map@r"}


def pair_scores(queries: torch.Tensor, corpus: torch.Tensor, pairs: torch.Tensor,
                ks: tuple[int, ...], chunk: int = 1024, gains: torch.Tensor | None = None,
                upto_r: bool = True) -> tuple[dict[str, float], int]:
    """Pairs retrieval: `pairs` (P, 2) rows of (query index, relevant corpus index); `gains`
    (P,) their graded gains (None: binary); `upto_r` as in `group_scores`.
    Returns (metrics, queries without a relevant item)."""
    ranked = pair_ranked(queries, corpus, pairs, ks, chunk, gains, upto_r=upto_r)
    return without_r(scores(ranked, ks), upto_r), int((ranked.n_relevant == 0).sum())


def pair_ranked(queries: torch.Tensor, corpus: torch.Tensor, pairs: torch.Tensor,
                ks: tuple[int, ...], chunk: int = 1024, gains: torch.Tensor | None = None,
                depth: int = 0, upto_r: bool = True) -> Ranked:
    """The ranking behind `pair_scores` (per query; `depth`: also the top `depth`; `upto_r`
    False: down to max(ks, 10) only, not each query's R). A pair listed twice counts once (its
    largest gain); a gain <= 0 is not relevant."""
    return pair_ranking(cosine(queries, corpus, chunk), queries.shape[0], corpus.shape[0], pairs,
                        ks, chunk, gains, depth, upto_r)


def pair_ranking(ranker: Ranker, n_q: int, n: int, pairs: torch.Tensor, ks: tuple[int, ...],
                 chunk: int = 1024, gains: torch.Tensor | None = None, depth: int = 0,
                 upto_r: bool = True) -> Ranked:
    """`pair_ranked` of any `ranker` of `n_q` queries against a corpus of `n` items."""
    keys = pairs[:, 0] * n + pairs[:, 1]
    gain = ideal = None
    if gains is None:
        keys = torch.unique(keys)
    else:
        keys, inverse = torch.unique(keys, return_inverse=True)
        g = torch.zeros(len(keys)).scatter_reduce_(0, inverse, gains.float(), "amax",
                                                   include_self=False)
        keys, g = keys[g > 0], g[g > 0]
        ideal = _ideal_gains(keys // n, g, n_q)

        def gain(qi: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            key = qi[:, None] * n + idx
            at = torch.searchsorted(keys, key).clamp_max(max(len(keys) - 1, 0))
            return torch.where(keys[at] == key, g[at], 0.0) if len(keys) else key * 0.0

    n_rel = torch.bincount(keys // n, minlength=n_q)
    k = max(*ks, 10, int(n_rel.max()) if len(n_rel) and upto_r else 1)

    def relevant(qi: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return torch.isin(qi[:, None] * n + idx, keys)

    return rank_by(ranker, relevant, n_rel, k, None, chunk, gain, ideal, depth)


def _ideal_gains(query: torch.Tensor, gains: torch.Tensor, n_q: int) -> torch.Tensor:
    """(n_q, 10): each query's 10 largest gains, descending, zero-padded."""
    order = torch.argsort(gains, descending=True, stable=True)
    order = order[torch.argsort(query[order], stable=True)]  # by query, gains still descending
    q = query[order]
    counts = torch.bincount(query, minlength=n_q)
    place = torch.arange(len(order)) - (counts.cumsum(0) - counts)[q]
    keep = place < 10
    out = torch.zeros(n_q, 10)
    out[q[keep], place[keep]] = gains[order][keep]
    return out
