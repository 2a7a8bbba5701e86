"""BM25 beside the dense models in evaluate's report, and the RRF hybrid when it is on.

BM25 (`simtune.retrieval.lexical`) ranks exactly the task the dense models rank: the same queries
(their raw prepared text, no prompt), the same corpus items in the same order (leave-one-out and
BEIR's corpus-only documents included), the same relevance and gains, so its per-query metrics
pair with the trained model's. The report gets `bm25` (every metric), `lift_over_bm25` (trained -
bm25), `significance_over_bm25` (paired, as the lift over the frozen baseline) and
`bm25_settings`; with `evaluate.hybrid.enabled`, `hybrid` (RRF of BM25 and the trained model's
full rankings), `hybrid_lift` (hybrid - trained) and `hybrid_significance`.
"""

from __future__ import annotations

from typing import Any

import torch

from simtune.examples import Data
from simtune.params import EvaluateParams
from simtune.retrieval import lexical, metrics, significance
from simtune.retrieval.metrics import HEADLINE
from simtune.retrieval.task import Items, RetrievalTask, Scored, Vectors

PerQuery = dict[str, torch.Tensor]  # metric -> (Q,) (`metrics.per_query`)


def texts(data: Data, items: Items, text_map: dict[str, str]) -> list[str]:
    """The prepared text of each item, in order (by its cache row's text id)."""
    if items.rows is None:
        raise ValueError("these items have no cache rows")
    ids = data.row_ids["doc" if items.role == "doc" else "query"]  # groups: one table
    return [text_map[ids[r]] for r in items.rows.tolist()]


def bm25(data: Data, task: RetrievalTask, text_map: dict[str, str]) -> metrics.Ranker:
    """The BM25 ranker of the task's queries over its corpus items."""
    index = lexical.BM25(texts(data, task.corpus_items, text_map))
    return index.ranker(texts(data, task.queries, text_map))


def paired(a: PerQuery, b: PerQuery, p: EvaluateParams) -> dict[str, Any]:
    """The paired significance of the lift a - b of each `HEADLINE` metric (same queries)."""
    sig = p.significance
    return {m: significance.paired(a[m].numpy(), b[m].numpy(), sig.resamples, sig.seed)
            for m in HEADLINE}


def lift(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """a - b of every metric of a."""
    return {k: a[k] - b[k] for k in a}


def scored(data: Data, task: RetrievalTask, text_map: dict[str, str], trained: Scored,
           trained_vectors: Vectors, p: EvaluateParams, ks: tuple[int, ...],
           corpus_vectors: Vectors | None = None) -> tuple[dict[str, Any], dict[str, Scored]]:
    """(the report's BM25 and hybrid parts, {"bm25": .., "hybrid": ..} each system scored):
    the hybrid only when `p.hybrid.enabled`, fusing the cosine ranking of `trained_vectors`
    (`trained` scored them; memoise them to embed the test texts once; `corpus_vectors`: the
    corpus side's own, a query-side head's frozen documents)."""
    t_q = metrics.per_query(trained.ranked, ks)
    ranker = bm25(data, task, text_map)
    b = task.score_by(ranker, ks)
    out: dict[str, Any] = {"bm25": b.metrics, "lift_over_bm25": lift(trained.metrics, b.metrics),
                           "significance_over_bm25": paired(
                               t_q, metrics.per_query(b.ranked, ks), p),
                           "bm25_settings": lexical.SETTINGS}
    systems = {"bm25": b}
    if p.hybrid.enabled:
        fused = lexical.hybrid([task.cosine(trained_vectors, corpus_vectors), ranker],
                               len(task.corpus_items), p.hybrid.rrf_k)
        h = task.score_by(fused, ks)
        out.update(hybrid=h.metrics, hybrid_lift=lift(h.metrics, trained.metrics),
                   hybrid_significance=paired(metrics.per_query(h.ranked, ks), t_q, p))
        systems["hybrid"] = h
    return out, systems
