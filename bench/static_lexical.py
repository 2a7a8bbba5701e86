"""bench.static's lexical peers, the baselines a user would pick before any model: each ranks the
test task's corpus and is scored by the same task and metric code as every other row.

  bm25    `simtune.retrieval.lexical.BM25` (bm25s, the tokenising, stopwords and Snowball
          stemming evaluate's and the negatives stage's BM25 use; Lucene k1 1.5, b 0.75): a
          document sharing no term with the query is not retrieved
  tf-idf  scikit-learn's `TfidfVectorizer` (word 1-2 grams, sublinear tf, fitted on the corpus
          texts), cosine nearest neighbours; a document with cosine 0 is not retrieved

Fit s: building the index over the corpus. Texts/s: querying, every test query transformed,
scored against the whole corpus and its top 10 taken (the search included, where the dense
rows' rates are the encoding alone), BLAS limited to one thread for the 1-thread column.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from bench.static_data import SetData, texts_of

Ranker = Callable[[slice, int, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


class TfIdf:
    """A TF-IDF index over `corpus` (item i: corpus index i) and its rankings of queries."""

    def __init__(self, corpus: list[str]) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
        self.matrix = self.vectorizer.fit_transform(corpus)  # rows L2-normalised: dot = cosine

    def scores(self, queries: list[str]) -> torch.Tensor:
        """(Q, C) float32 cosines of the queries to every corpus item."""
        sims = self.vectorizer.transform(queries) @ self.matrix.T
        return torch.from_numpy(sims.toarray()).float()

    def ranker(self, queries: list[str]) -> Ranker:
        sims = self.scores(queries)
        return lambda sel, k, exclude: top(sims[sel], k, exclude)


def top(sims: torch.Tensor, k: int, exclude: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, indices) (c, k'): the best k items with cosine > 0, ties by lower index (a
    stable sort), padded with (-inf, -1); `exclude` (c,) one index per query to leave out."""
    sims = sims.clone()
    if exclude is not None:
        rows = torch.nonzero(exclude >= 0).flatten()
        sims[rows, exclude[rows]] = 0.0
    k = min(k, sims.shape[1])
    scores, idx = torch.sort(sims, dim=1, descending=True, stable=True)
    scores, idx = scores[:, :k], idx[:, :k]
    empty = scores <= 0
    return scores.masked_fill(empty, -torch.inf), idx.masked_fill(empty, -1)


def rows(s: SetData, threads: int) -> list[dict[str, Any]]:
    """The bm25 and tf-idf rows of a set: p@1, mrr@10 on its test task, texts/s querying on
    one thread and on `threads`, fit s (module docstring)."""
    from threadpoolctl import threadpool_limits

    from simtune.retrieval.lexical import BM25

    task = s.test
    corpus, queries = texts_of(s.data, task.corpus_items), texts_of(s.data, task.queries)
    out = []
    for name, build in (("bm25", BM25), ("tf-idf", TfIdf)):
        t0 = time.perf_counter()
        index = build(corpus)
        fit_s = time.perf_counter() - t0
        got = task.score_by(index.ranker(queries), (1, 10), upto_r=False).metrics

        def query(index: Any = index) -> None:  # transform, score, top 10 of every query
            if isinstance(index, TfIdf):
                top(index.scores(queries), 10, None)
            else:
                index.top(index.tokens(queries), 10, None)
        rates = []
        for n in (1, threads):
            with threadpool_limits(n):
                best = float("inf")
                for _ in range(2):
                    t0 = time.perf_counter()
                    query()
                    best = min(best, time.perf_counter() - t0)
            rates.append(len(queries) / best)
        out.append({"row": name, "p@1": got["p@1"], "mrr@10": got["mrr@10"],
                    "texts/s 1t": rates[0], "texts/s all": rates[1], "fit s": fit_s})
    return out


def hybrid_metrics(s: SetData, encode: Callable[[list[str], str], torch.Tensor], rrf_k: int
                   ) -> dict[str, float]:
    """P@1 and MRR@10 on the test task of the reciprocal-rank fusion (`simtune.retrieval.
    lexical.hybrid`, constant `rrf_k`: evaluate's and `simtune search --hybrid`'s) of BM25's
    ranking and the cosine ranking of `encode`'s vectors (each text in its role)."""
    from bench.static_data import ROLE, Memo
    from simtune.retrieval.lexical import BM25, hybrid

    task = s.test
    corpus, queries = texts_of(s.data, task.corpus_items), texts_of(s.data, task.queries)
    memo = Memo(encode)
    dense = task.cosine(lambda items: memo(texts_of(s.data, items), ROLE[items.role]))
    fused = hybrid([dense, BM25(corpus).ranker(queries)], len(corpus), rrf_k)
    return task.score_by(fused, (1, 10), upto_r=False).metrics
