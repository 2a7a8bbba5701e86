"""The lexical baseline, BM25 (`bm25s`), and reciprocal-rank fusion (RRF) of rankings.

BM25 is the library's, with fixed settings (`SETTINGS`, written into the evaluate report): texts
lower-cased, split by scikit-learn's token pattern (runs of two or more word characters), the
library's English stopwords removed, Snowball English stems (PyStemmer, as BEIR's Elasticsearch
BM25 stems); Lucene's BM25 with k1 1.5, b 0.75. A query is its raw text (no prompt).

Retrieved means score > 0. Lucene's IDF is positive, so a document scores above 0 exactly when it
shares a term with the query; every other document is left out of the ranking (index -1, score
-inf, `metrics.Ranker`): it counts as not relevant in every metric, and adds nothing to a fusion.
A text with no token left (empty, only stopwords or punctuation) has length 0 and matches nothing;
a query with none retrieves nothing and scores 0 on every metric. Equal scores (duplicate texts,
equal term statistics) rank by lower corpus index, as the dense top-k does.

`rrf`: each item's fused score is the sum over the rankings of 1 / (k + its rank there) (Cormack
et al. 2009; rank from 1; nothing from a ranking that left it out), in float64; `hybrid` fuses
the full rankings of several rankers, so its top-k is exact RRF, not RRF of truncated lists.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import bm25s
import numpy as np
import Stemmer
import torch
from bm25s.tokenization import Tokenized, Tokenizer

from simtune.params import RRF_K_MAX, rrf_k_bound
from simtune.retrieval.metrics import Ranker

# bm25s sets its own logger to DEBUG: its per-index lines would reach every stage's log
logging.getLogger("bm25s").setLevel(logging.WARNING)
SETTINGS = {"library": f"bm25s {bm25s.__version__}", "method": "lucene", "k1": 1.5, "b": 0.75,
            "stopwords": "en", "stemmer": "english"}
_CELLS = 1 << 22  # queries x corpus fused scores held at once by `hybrid` (32 MB of float64)


class BM25:
    """A bm25s index over `corpus` (item i: corpus index i), and its rankings of queries."""

    def __init__(self, corpus: Sequence[str]) -> None:
        self.size = len(corpus)
        self._tokenizer = Tokenizer(lower=True, stopwords=SETTINGS["stopwords"],
                                    stemmer=Stemmer.Stemmer(SETTINGS["stemmer"]))
        # allow_empty False: a text without tokens is [] (length 0), not the token "" that
        # would make a stopword-only query match every stopword-only document
        corpus_tokens = self._tokenizer.tokenize(list(corpus), update_vocab=True,
                                                 return_as="tuple", show_progress=False,
                                                 allow_empty=False)
        self._index = bm25s.BM25(method=SETTINGS["method"], k1=SETTINGS["k1"], b=SETTINGS["b"])
        self._indexed = any(corpus_tokens.ids)  # no token in the whole corpus: nothing matches
        if self._indexed:  # a copy of the vocabulary: indexing adds "" to the one it is given
            self._index.index(Tokenized(corpus_tokens.ids, dict(corpus_tokens.vocab)),
                              show_progress=False)

    def tokens(self, queries: Sequence[str]) -> list[list[int]]:
        """Each query's token ids in the corpus vocabulary (words the corpus lacks dropped)."""
        return self._tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids",
                                        show_progress=False, allow_empty=False)

    def scores(self, tokens: list[int]) -> np.ndarray:
        """(size,) float32: the library's BM25 score of every corpus item for one query."""
        if not tokens or not self._indexed:
            return np.zeros(self.size, dtype=np.float32)
        return self._index.get_scores_from_ids(tokens)

    def ranker(self, queries: Sequence[str]) -> Ranker:
        """The `metrics.Ranker` of `queries` (query i: texts[i]) over the corpus."""
        tokens = self.tokens(queries)
        return lambda sel, k, exclude: self.top(tokens[sel], k, exclude)

    def top(self, tokens: list[list[int]], k: int, exclude: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores, indices) (len(tokens), k'), k' = min(k, candidates): the retrieved items
        (score > 0) best first, ties by lower index, padded with (-inf, -1)."""
        k = max(0, min(k, self.size - (exclude is not None)))
        out_s = torch.full((len(tokens), k), -torch.inf)
        out_i = torch.full((len(tokens), k), -1, dtype=torch.long)
        for q, toks in enumerate(tokens):
            s = self.scores(toks)
            if exclude is not None and int(exclude[q]) >= 0:
                s = s.copy()
                s[int(exclude[q])] = 0  # left out: as if it matched nothing
            order = best(s, k)
            out_s[q, : len(order)] = torch.from_numpy(s[order].astype(np.float32))
            out_i[q, : len(order)] = torch.from_numpy(order)
        return out_s, out_i


def best(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the (at most) `k` largest positive `scores`, largest first, ties by lower
    index: O(n) selection, then a sort of the candidates only."""
    hit = np.flatnonzero(scores > 0) if k > 0 else np.empty(0, dtype=np.int64)
    if len(hit) > k:
        kth = np.partition(scores[hit], len(hit) - k)[len(hit) - k]
        hit = hit[scores[hit] >= kth]
    return hit[np.lexsort((hit, -scores[hit]))][:k].astype(np.int64)


def rrf(rankings: Sequence[torch.Tensor], k: int, n: int) -> torch.Tensor:
    """(Q, n) float64 fused scores of rankings (Q, m_r) of corpus indices, best first (each index
    at most once per row; -1: an empty place): item j gets sum_r 1 / (k + rank of j in r)."""
    if k < 0:
        raise ValueError(f"the RRF constant k must be >= 0, not {k}")
    if k > RRF_K_MAX:  # params refuse it; a library caller too
        raise ValueError(f"the RRF constant k: {k}: {rrf_k_bound()}")
    out = torch.zeros(len(rankings[0]) if rankings else 0, n, dtype=torch.float64)
    for r in rankings:
        weight = 1.0 / (k + torch.arange(1, r.shape[1] + 1, dtype=torch.float64))
        out.scatter_add_(1, r.clamp_min(0),
                         torch.where(r >= 0, weight.expand(r.shape), 0.0))
    return out


def hybrid(rankers: Sequence[Ranker], n: int, k: int) -> Ranker:
    """The `metrics.Ranker` of the `rrf` (constant `k`) of the full rankings of `rankers`, all
    of the same queries over the same `n` corpus items: best first, ties by lower index, an
    item no ranker retrieved (fused score 0) and the excluded one left out. Memory: O(n) per
    query, queries in batches of `_CELLS` / n."""
    def rank(sel: slice, depth: int, exclude: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        start, stop, _ = sel.indices(1 << 62)
        full = max(0, n - (exclude is not None))
        step = max(1, _CELLS // max(n, 1))
        parts = []
        for s in range(start, stop, step):
            e = min(s + step, stop)
            ex = None if exclude is None else exclude[s - start : e - start]
            fused = rrf([r(slice(s, e), full, ex)[1] for r in rankers], k, n)
            parts.append(_top(fused, min(depth, full), ex))
        if not parts:
            return torch.empty(0, min(depth, full)), torch.empty(0, min(depth, full),
                                                                  dtype=torch.long)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return rank


def _top(fused: torch.Tensor, k: int, exclude: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of fused scores (c, n), ties by lower index (a stable sort), the items scored 0 and
    `exclude` (c,) (or -1) padded as (-inf, -1)."""
    if exclude is not None:
        rows = torch.nonzero(exclude >= 0).flatten()
        fused[rows, exclude[rows]] = 0.0
    scores, idx = torch.sort(fused, dim=1, descending=True, stable=True)
    scores, idx = scores[:, :k], idx[:, :k]
    empty = scores <= 0
    return scores.masked_fill(empty, -torch.inf), idx.masked_fill(empty, -1)
