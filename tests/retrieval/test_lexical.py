"""BM25 (bm25s) rankings and metrics against the library's own retrieval, and reciprocal-rank
fusion against fusion by hand: ties, empty texts and queries, duplicates, leave-one-out."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from simtune.retrieval import lexical, metrics
from simtune.retrieval.task import Items, RetrievalTask
from tests.lexical_helpers import fuse, library_scores, mean_metrics, query_metrics, ranking

WORDS = ["cat", "cats", "dog", "dogs", "running", "runs", "bird", "fish", "sea", "river",
         "stone", "stones", "light", "dark", "quick", "slow", "red", "blue", "green", "tree",
         "trees"]
STOP = ["the", "of", "and", "a", "to", "in", "is", "it"]


def _texts(rng: random.Random, n: int) -> list[str]:
    out = [" ".join(rng.choice(WORDS + STOP) for _ in range(rng.randint(1, 9))) for _ in range(n)]
    out[3] = out[1]  # a duplicate: equal scores, ranked by index
    out[5] = "the of and"  # only stopwords: no token, length 0
    out[6] = "?! 7"  # no token at all (one character is not a token)
    return out


def _as_lists(top: tuple[torch.Tensor, torch.Tensor]) -> list[list[tuple[float, int]]]:
    scores, idx = top
    return [[(float(s), int(i)) for s, i in zip(rs, ri, strict=True) if i >= 0]
            for rs, ri in zip(scores.tolist(), idx.tolist(), strict=True)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bm25_rankings_equal_the_librarys(seed: int) -> None:
    """Every query's ranking is the library's scores > 0, best first, ties by index; the
    scores are the library's exactly; an empty or stopword-only query retrieves nothing."""
    rng = random.Random(seed)
    corpus = _texts(rng, 40)
    queries = [*_texts(rng, 15), "", "the and of", "unknownword", "cat cat dogs", corpus[1]]
    want = library_scores(corpus, queries)
    got = _as_lists(lexical.BM25(corpus).ranker(queries)(slice(0, len(queries)), 40, None))
    for q, row in enumerate(got):
        order = ranking(want[q])
        assert [j for _, j in row] == order
        assert [s for s, _ in row] == [float(want[q, j]) for j in order]
    assert got[15] == got[16] == got[17] == []  # empty, stopwords only, no known word
    assert len(got[18]) > 0 and got[18][0][0] > 0
    dup = got[19]  # the text of items 1 and 3: both tie at the top, 1 first
    assert [j for _, j in dup[:2]] == [1, 3] and dup[0][0] == dup[1][0]
    assert all(j not in (5, 6) for row in got for _, j in row)  # no token: never retrieved


def test_bm25_k_exclude_and_empty_corpora() -> None:
    corpus = ["red cat", "red dog", "blue cat", "red red cat"]
    index = lexical.BM25(corpus)
    rank = index.ranker(["red cat", "cat", "dog"])
    scores, idx = rank(slice(0, 3), 2, torch.tensor([3, -1, 1]))
    want = library_scores(corpus, ["red cat", "cat", "dog"])
    assert idx.tolist() == [ranking(want[0], 3)[:2], ranking(want[1])[:2], [-1, -1]]
    assert scores[2].tolist() == [-torch.inf, -torch.inf]
    assert rank(slice(1, 2), 9, None)[1].tolist() == [[*ranking(want[1]), -1]]  # k: 4 items
    assert rank(slice(1, 2), 9, torch.tensor([0]))[1].shape == (1, 3)  # 3 candidates
    nothing = lexical.BM25(["the", "of and", ""])  # no token in the whole corpus
    assert nothing.ranker(["the cat"])(slice(0, 1), 3, None)[1].tolist() == [[-1, -1, -1]]
    assert lexical.BM25([]).ranker(["cat"])(slice(0, 1), 3, None)[1].shape == (1, 0)


def test_best_breaks_ties_by_index_and_keeps_positive_scores() -> None:
    s = np.array([0.5, 2.0, 0.0, 2.0, 0.5, -1.0, 0.5], dtype=np.float32)
    assert lexical.best(s, 10).tolist() == [1, 3, 0, 4, 6]
    assert lexical.best(s, 3).tolist() == [1, 3, 0]  # the partition keeps every tied 0.5
    assert lexical.best(s, 0).tolist() == []


def test_rrf_equals_fusion_by_hand() -> None:
    a = torch.tensor([[2, 0, 1, 3], [0, 1, 2, 3]])
    b = torch.tensor([[0, 3, -1, -1], [1, 0, -1, -1]])  # BM25 retrieved two of four
    got = lexical.rrf([a, b], 60, 4)
    by_hand = torch.tensor([[1 / 62 + 1 / 61, 1 / 63, 1 / 61, 1 / 64 + 1 / 62],
                            [1 / 61 + 1 / 62, 1 / 62 + 1 / 61, 1 / 63, 1 / 64]],
                           dtype=torch.float64)
    assert torch.equal(got, by_hand)
    assert torch.equal(lexical.rrf([a], 0, 5)[0], torch.tensor(
        [1 / 2, 1 / 3, 1.0, 1 / 4, 0.0], dtype=torch.float64))  # item 4: ranked by none
    with pytest.raises(ValueError, match="k must be >= 0"):
        lexical.rrf([a], -1, 4)


def _fixed(rows: list[list[int]]) -> metrics.Ranker:
    table = torch.tensor(rows)
    return lambda sel, k, exclude: (torch.zeros(len(table[sel]), k), table[sel][:, :k])


def test_hybrid_ties_and_exclusion() -> None:
    """Two items with mirrored ranks tie exactly: the lower index first; the excluded item and
    an item no ranker retrieved are left out (-1)."""
    fused = lexical.hybrid([_fixed([[1, 0, 2, 3]]), _fixed([[0, 1, -1, -1]])], 4, 60)
    scores, idx = fused(slice(0, 1), 4, None)
    assert idx.tolist() == [[0, 1, 2, 3]]
    assert scores[0, 0] == scores[0, 1] == 1 / 61 + 1 / 62
    loo = lexical.hybrid([_fixed([[1, 2, 3]]), _fixed([[2, -1, -1]])], 5, 60)
    scores, idx = loo(slice(0, 1), 4, torch.tensor([0]))
    assert idx.tolist() == [[2, 1, 3, -1]]  # item 4: in no ranking; 0: the query itself
    assert scores[0, 3] == -torch.inf


@pytest.mark.parametrize("cells", [1 << 22, 7])  # 7: one query per batch
def test_hybrid_equals_fusion_by_hand(cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hybrid of the cosine and BM25 rankings is RRF of both full rankings by hand, with
    leave-one-out, in whatever batches."""
    monkeypatch.setattr(lexical, "_CELLS", cells)
    rng = random.Random(5)
    texts = _texts(rng, 30)
    torch.manual_seed(5)
    vectors = torch.randn(30, 8)
    vectors[12] = vectors[4]  # a cosine tie
    dense = metrics.cosine(vectors, vectors)
    bm25 = lexical.BM25(texts).ranker(texts)
    fused = lexical.hybrid([dense, bm25], 30, 60)
    scores, idx = fused(slice(0, 30), 29, torch.arange(30))
    lex = library_scores(texts, texts)
    unit = torch.nn.functional.normalize(vectors, dim=1)
    cos = (unit @ unit.T).tolist()
    for q in range(30):
        by_cosine = sorted((j for j in range(30) if j != q), key=lambda j: (-cos[q][j], j))
        want = fuse([by_cosine, ranking(lex[q], q)], 60)
        assert [j for _, j in want] == idx[q].tolist()
        assert scores[q].tolist() == [s for s, _ in want]


def _groups_task(labels: list[int], corpus_labels: list[int] | None) -> RetrievalTask:
    q = Items("text", (("test", None),), None, len(labels))
    if corpus_labels is None:
        return RetrievalTask(q, None, torch.tensor(labels))
    c = Items("text", (("train", None),), None, len(corpus_labels))
    return RetrievalTask(q, c, torch.tensor(labels), torch.tensor(corpus_labels))


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_groups_task_bm25_metrics_equal_the_librarys(leave_one_out: bool) -> None:
    """The task's metrics of the BM25 ranker are the definitions' over the library's rankings:
    same label relevant; leave-one-out leaves the query out of its own ranking and of R."""
    rng = random.Random(3)
    queries = _texts(rng, 24)
    q_labels = [rng.randrange(3) for _ in queries]
    corpus = queries if leave_one_out else _texts(rng, 50)
    c_labels = q_labels if leave_one_out else [rng.randrange(3) for _ in corpus]
    task = _groups_task(q_labels, None if leave_one_out else c_labels)
    ks = (1, 5, 10, 50)
    got = task.score_by(lexical.BM25(corpus).ranker(queries), ks)
    lib = library_scores(corpus, queries)
    per_query = []
    for q in range(len(queries)):
        own = q if leave_one_out else -1
        gains = {j: 1.0 for j, lab in enumerate(c_labels) if lab == q_labels[q] and j != own}
        per_query.append(query_metrics(ranking(lib[q], own), gains, ks))
    assert got.metrics == pytest.approx(mean_metrics(per_query), abs=1e-6)
    assert got.metrics["map@r"] > 0 and got.metrics["p@1"] > 0  # the check can fail


def test_pairs_task_bm25_metrics_with_graded_gains() -> None:
    rng = random.Random(4)
    corpus, queries = _texts(rng, 40), _texts(rng, 12)
    queries[0] = ""  # a query that retrieves nothing: 0 on every metric, still counted
    pairs = [(q, d, float(g)) for q in range(12) for d, g in
             ((rng.randrange(40), rng.choice([1, 2, 3])) for _ in range(3))]
    task = RetrievalTask(Items("query", (("test", None),), None, 12),
                         Items("doc", (("test", None),), None, 40),
                         pairs=torch.tensor([(q, d) for q, d, _ in pairs]),
                         gains=torch.tensor([g for _, _, g in pairs]))
    ks = (1, 5, 10)
    got = task.score_by(lexical.BM25(corpus).ranker(queries), ks)
    lib = library_scores(corpus, queries)
    per_query = []
    for q in range(12):
        gains: dict[int, float] = {}
        for qq, d, g in pairs:
            if qq == q:
                gains[d] = max(g, gains.get(d, 0.0))
        per_query.append(query_metrics(ranking(lib[q]), gains, ks))
    assert per_query[0]["map@r"] == 0 and got.ranked.rel[0].sum() == 0
    assert got.metrics == pytest.approx(mean_metrics(per_query), abs=1e-6)
    assert got.metrics["ndcg@10"] > 0
