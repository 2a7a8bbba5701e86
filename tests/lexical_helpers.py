"""Independent references for the lexical tests: BM25 scores straight from bm25s's documented
high-level API (`bm25s.tokenize`, `BM25.retrieve`), rankings and metrics by per-query loops, and
reciprocal-rank fusion by hand. Nothing here calls simtune."""

from __future__ import annotations

import math
from collections.abc import Sequence

import bm25s
import numpy as np
import Stemmer
from bm25s.tokenization import Tokenizer


def library_scores(corpus: Sequence[str], queries: Sequence[str]) -> np.ndarray:
    """(Q, N) BM25 scores of every corpus text for every query, by bm25s's own retrieval
    (`retrieve` over all N) with the tokenisation simtune names: the library's `Tokenizer`,
    English stopwords, Snowball English stems, no empty token (allow_empty False)."""
    tokenizer = Tokenizer(stopwords="en", stemmer=Stemmer.Stemmer("english"))
    corpus_tokens = tokenizer.tokenize(list(corpus), return_as="tuple", show_progress=False,
                                       allow_empty=False)
    query_ids = tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False,
                                   allow_empty=False)
    out = np.zeros((len(queries), len(corpus)), dtype=np.float32)
    retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    retriever.index(corpus_tokens, show_progress=False)
    asked = [q for q, ids in enumerate(query_ids) if ids]  # bm25s: no token scores 0 (and
    # its retrieve maps an empty query to the index's "" token, which a tuple index lacks)
    if asked:
        docs, scores = retriever.retrieve([query_ids[q] for q in asked], k=len(corpus),
                                          show_progress=False)
        for row, q in enumerate(asked):
            out[q, docs[row]] = scores[row]
    return out


def ranking(scores: np.ndarray, exclude: int = -1) -> list[int]:
    """The retrieved items (score > 0, not `exclude`), best first, ties by lower index."""
    return sorted((j for j in range(len(scores)) if scores[j] > 0 and j != exclude),
                  key=lambda j: (-float(scores[j]), j))


def fuse(rankings: Sequence[Sequence[int]], k: int) -> list[tuple[float, int]]:
    """RRF by hand: (sum of 1 / (k + rank), item) of every ranked item, best first, ties by
    lower item."""
    fused: dict[int, float] = {}
    for r in rankings:
        for rank, j in enumerate(r, start=1):
            fused[j] = fused.get(j, 0.0) + 1.0 / (k + rank)
    return sorted(((s, j) for j, s in fused.items()), key=lambda sj: (-sj[0], sj[1]))


def query_metrics(ranked: Sequence[int], gains: dict[int, float], ks: Sequence[int]
                  ) -> dict[str, float]:
    """One query's metrics by their definitions (trec_eval's; relevant = gain > 0; graded
    nDCG with raw gains): a ranking shorter than k counts the missing places as not relevant."""
    rel_gain = {j: g for j, g in gains.items() if g > 0}
    r = len(rel_gain)
    hits = [j in rel_gain for j in ranked]
    out = {"p@1": float(bool(hits[:1] and hits[0]))}
    for k in ks:
        out[f"recall@{k}"] = sum(hits[:k]) / r if r else 0.0
    first = next((i for i, h in enumerate(hits[:10]) if h), None)
    out["mrr@10"] = 1 / (first + 1) if first is not None else 0.0
    dcg = sum(rel_gain.get(j, 0.0) / math.log2(i + 2) for i, j in enumerate(ranked[:10]))
    ideal = sorted(rel_gain.values(), reverse=True)[:10]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    out["ndcg@10"] = dcg / idcg if idcg else 0.0
    out["map@r"] = sum(sum(hits[: i + 1]) / (i + 1) for i in range(min(r, len(hits)))
                       if hits[i]) / r if r else 0.0
    return out


def mean_metrics(per_query: Sequence[dict[str, float]]) -> dict[str, float]:
    return {k: sum(m[k] for m in per_query) / len(per_query) for k in per_query[0]}
