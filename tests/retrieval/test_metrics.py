"""Metrics on hand-made rankings; streaming top-k equals brute force with deterministic ties."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from simtune.retrieval import metrics
from simtune.retrieval import topk as engine
from simtune.retrieval.topk import topk


def test_scores_by_hand() -> None:
    rel = torch.tensor([[0, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    n = torch.tensor([3, 1, 0])  # query 2 has no relevant item: counts as 0
    got = metrics.scores(metrics.Ranked(rel, n), ks=(1, 5))
    l2 = math.log2
    ndcg0 = (1 / l2(3) + 1 / l2(5)) / (1 / l2(2) + 1 / l2(3) + 1 / l2(4))
    want = {"p@1": 1 / 3, "recall@1": 1 / 3, "recall@5": (2 / 3 + 1) / 3,
            "mrr@10": (1 / 2 + 1) / 3, "ndcg@10": (ndcg0 + 1) / 3,
            "map@r": ((1 / 2) / 3 + 1) / 3}
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-6), k


def test_map_at_r_counts_only_the_first_r() -> None:
    # R = 2: relevant at ranks 1 and 3; rank 3 is past R so MAP@R = (1/1 * 1) / 2
    got = metrics.scores(metrics.Ranked(torch.tensor([[1, 0, 1]], dtype=torch.bool),
                                        torch.tensor([2])), ks=(3,))
    assert got["map@r"] == pytest.approx(0.5)
    assert got["recall@3"] == pytest.approx(1.0)


def test_topk_streaming_equals_brute_force() -> None:
    torch.manual_seed(0)
    q, c = torch.randn(37, 8), torch.randn(101, 8)
    s1, i1 = topk(q, c, k=10, chunk=5)
    full = torch.nn.functional.normalize(q) @ torch.nn.functional.normalize(c).T
    s2, i2 = full.topk(10, dim=1)
    assert torch.equal(i1, i2)
    assert torch.allclose(s1, s2, atol=1e-6)


def test_ties_break_by_lower_corpus_index_and_exclusion() -> None:
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    _, idx = topk(q, c, k=3, chunk=1)
    assert idx.tolist() == [[0, 2, 3], [0, 2, 3]]
    _, idx = topk(q, c, k=3, exclude=torch.tensor([2, -1]))
    assert idx.tolist() == [[0, 3, 4], [0, 2, 3]]


def test_group_scores_leave_one_out_by_hand() -> None:
    # 1-d directions: 0,1 close (label 0); 2 (label 1) near 1; 3 (label 2) alone
    v = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.3], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 2])
    got, no_rel = metrics.group_scores(v, labels, None, None, ks=(1,))
    # query 0 -> 1 (rel); query 1 -> 0 (rel); query 2: R=0; query 3: R=0
    assert no_rel == 2
    assert got["p@1"] == pytest.approx(0.5)
    assert got["mrr@10"] == pytest.approx(0.5)


def test_pair_scores_by_hand() -> None:
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c = torch.tensor([[0.0, 1.0], [1.0, 0.1], [0.7, 0.7]])
    pairs = torch.tensor([[0, 2], [1, 0], [1, 1]])
    got, no_rel = metrics.pair_scores(q, c, pairs, ks=(1, 2))
    # q0 ranking: 1, 2, 0 -> relevant 2 at rank 2; q1 ranking: 0, 2, 1 -> relevant at 1 and 3
    assert no_rel == 0
    assert got["p@1"] == pytest.approx(0.5)
    assert got["mrr@10"] == pytest.approx((0.5 + 1) / 2)
    assert got["recall@2"] == pytest.approx((1 + 0.5) / 2)
    assert got["map@r"] == pytest.approx((0 + 0.5) / 2)  # q0: R=1, top1 miss; q1: R=2, P@1=1


# --- graded gains (BEIR qrels), per-query values, deeper top lists ------------------------------


def test_graded_ndcg_by_hand() -> None:
    # ranked gains 0, 2, 1, 0; the query's gains are 3, 2, 1 (the 3 is not retrieved)
    r = metrics.Ranked(torch.tensor([[0, 1, 1, 0]], dtype=torch.bool), torch.tensor([3]),
                       gain=torch.tensor([[0.0, 2.0, 1.0, 0.0]]),
                       ideal=torch.tensor([[3.0, 2.0, 1.0] + [0.0] * 7]))
    l2 = math.log2
    want = (2 / l2(3) + 1 / l2(4)) / (3 / l2(2) + 2 / l2(3) + 1 / l2(4))
    got = metrics.scores(r, ks=(4,))
    assert got["ndcg@10"] == pytest.approx(want, abs=1e-6)
    # the other metrics stay binary (relevant = gain > 0), as trec_eval's relevance_level 1
    assert got["mrr@10"] == pytest.approx(1 / 2) and got["recall@4"] == pytest.approx(2 / 3)


def _graded_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, list[dict[int, int]]]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    q, c = torch.randn(25, 6), torch.randn(60, 6)
    judged = [{d: rng.randint(0, 3) for d in rng.sample(range(60), rng.randint(1, 14))}
              for _ in range(25)]
    return q, c, judged


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_graded_metrics_match_trec_eval(seed: int) -> None:
    """Graded qrels (0-3, 0 = judged non-relevant): nDCG@10 with the grade as gain, and the
    binary metrics with relevant = grade >= 1, against trec_eval (pytrec_eval)."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    q, c, judged = _graded_case(seed)
    pos = [(qi, d, g) for qi, j in enumerate(judged) for d, g in sorted(j.items()) if g > 0]
    got, no_rel = metrics.pair_scores(q, c, torch.tensor([(a, b) for a, b, _ in pos]), ks=(5,),
                                      gains=torch.tensor([float(g) for *_, g in pos]))
    scores = torch.nn.functional.normalize(q) @ torch.nn.functional.normalize(c).T
    qrels = {f"q{i}": {f"d{d}": g for d, g in j.items()} for i, j in enumerate(judged)}
    run = {f"q{i}": {f"d{d}": float(scores[i, d]) for d in range(60)} for i in range(25)}
    top10 = {qid: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:10])
             for qid, docs in run.items()}
    full = pytrec_eval.RelevanceEvaluator(qrels, {"P_1", "recall_5", "ndcg_cut_10"}).evaluate(run)
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    mean = lambda res, key: sum(v[key] for v in res.values()) / len(res)  # noqa: E731
    assert no_rel == sum(1 for j in judged if not any(j.values()))
    assert len({g for j in judged for g in j.values()}) == 4  # really graded, zeros included
    assert got["ndcg@10"] == pytest.approx(mean(full, "ndcg_cut_10"), abs=1e-6)
    assert got["p@1"] == pytest.approx(mean(full, "P_1"), abs=1e-6)
    assert got["recall@5"] == pytest.approx(mean(full, "recall_5"), abs=1e-6)
    assert got["mrr@10"] == pytest.approx(mean(mrr, "recip_rank"), abs=1e-6)
    binary, _ = metrics.pair_scores(q, c, torch.tensor([(a, b) for a, b, _ in pos]), ks=(5,))
    assert binary["ndcg@10"] != pytest.approx(got["ndcg@10"], abs=1e-4)  # the grades matter


def test_gains_of_one_are_binary_bit_for_bit() -> None:
    q, c, judged = _graded_case(3)
    pairs = torch.tensor([(qi, d) for qi, j in enumerate(judged) for d in sorted(j)])
    binary = metrics.pair_scores(q, c, pairs, ks=(1, 5))
    assert metrics.pair_scores(q, c, pairs, ks=(1, 5), gains=torch.ones(len(pairs))) == binary
    # a gain of 0 is judged non-relevant: the same as leaving the pair out
    zero = torch.ones(len(pairs))
    zero[::3] = 0
    assert metrics.pair_scores(q, c, pairs, ks=(1, 5), gains=zero) == metrics.pair_scores(
        q, c, pairs[zero > 0], ks=(1, 5))


def test_per_query_values_average_to_the_scores_and_depth_changes_nothing() -> None:
    q, c, judged = _graded_case(4)
    pos = [(qi, d) for qi, j in enumerate(judged) for d in sorted(j)]
    shallow = metrics.pair_ranked(q, c, torch.tensor(pos), ks=(1, 5))
    deep = metrics.pair_ranked(q, c, torch.tensor(pos), ks=(1, 5), depth=40)
    assert shallow.top is None and deep.top is not None
    assert torch.equal(deep.rel, shallow.rel)
    assert metrics.scores(deep, (1, 5)) == metrics.scores(shallow, (1, 5))
    per = metrics.per_query(deep, (1, 5))
    assert {k: v.mean().item() for k, v in per.items()} == metrics.scores(deep, (1, 5))
    assert per["p@1"].shape == (25,)
    scores, idx = deep.top
    assert scores.shape == idx.shape == (25, 40)
    want_s, want_i = topk(q, c, 40)
    assert torch.equal(idx, want_i) and torch.equal(scores, want_s)


def _dyadic(n: int, seed: int) -> torch.Tensor:
    """(n, 4) unit vectors with entries in {0, +-1/2, +-1}: every dot product is exact in float32,
    so ties are real ties whatever the summation order; many rows are duplicates."""
    pool = torch.tensor([[a, b, c, d] for a in (-.5, .5) for b in (-.5, .5) for c in (-.5, .5)
                         for d in (-.5, .5)] + torch.eye(4).tolist() + (-torch.eye(4)).tolist())
    return pool[torch.randint(len(pool), (n,), generator=torch.Generator().manual_seed(seed))]


def _brute(q: torch.Tensor, c: torch.Tensor, k: int, exclude: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Full score matrix, then a stable sort: ties in corpus-index order."""
    s = torch.nn.functional.normalize(q) @ torch.nn.functional.normalize(c).T
    if exclude is not None:
        rows = torch.nonzero(exclude >= 0).squeeze(1)
        s[rows, exclude[rows]] = -torch.inf
    order = torch.sort(s, dim=1, descending=True, stable=True).indices[:, :k]
    return s.gather(1, order), order


@pytest.mark.parametrize("k", [1, 3, 10, 40])
def test_tiled_topk_equals_brute_force_with_ties(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    monkeypatch.setattr(engine, "_CORPUS_BLOCK", 7)  # tiles of max(7, 8k), the first 3 or 2k
    monkeypatch.setattr(engine, "_FIRST_BLOCK", 3)
    q, c = _dyadic(50, 0), _dyadic(300, 1)
    for scale_q, scale_c in ((1.0, 1.0), (2.0, 0.25)):  # non-unit rows: scaled, still exact
        s1, i1 = topk(q * scale_q, c * scale_c, k=k, chunk=8)
        s2, i2 = _brute(q, c, k)
        assert torch.equal(i1, i2)
        assert torch.equal(s1, s2)


def test_tiled_topk_when_every_tile_beats_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # corpus sorted by ascending score for the (repeated) query: each tile is all candidates
    monkeypatch.setattr(engine, "_CORPUS_BLOCK", 16)
    q = _dyadic(1, 2).repeat(20, 1)
    c = _dyadic(400, 3)
    c = c[torch.sort(c @ q[0], stable=True).indices]
    s1, i1 = topk(q, c, k=5, chunk=4)
    s2, i2 = _brute(q, c, 5)
    assert torch.equal(i1, i2)
    assert torch.equal(s1, s2)


def test_tiled_topk_leave_one_out_and_k_beyond_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_CORPUS_BLOCK", 5)
    monkeypatch.setattr(engine, "_FIRST_BLOCK", 2)
    v = _dyadic(200, 4)  # tiles of 24, then 96 columns
    ex = torch.arange(200)
    ex[::3] = -1  # some queries exclude nothing
    s1, i1 = topk(v, v, k=12, chunk=7, exclude=ex)
    s2, i2 = _brute(v, v, 12, ex)
    assert torch.equal(i1, i2)
    assert torch.equal(s1, s2)
    assert not (i1 == torch.arange(200)[:, None])[ex >= 0].any()
    small = v[:4]
    _, idx = topk(v[:9], small, k=50)
    assert idx.shape == (9, 4)
    assert torch.equal(idx, _brute(v[:9], small, 4)[1])
    _, idx = topk(small, small, k=50, exclude=torch.arange(4))
    assert idx.shape == (4, 3)
    assert torch.equal(idx, _brute(small, small, 3, torch.arange(4))[1])


def test_tiled_topk_random_floats_any_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_CORPUS_BLOCK", 64)
    g = torch.Generator().manual_seed(5)
    q, c = torch.randn(70, 16, generator=g), torch.randn(1000, 16, generator=g)
    s1, i1 = topk(q, c, k=10, chunk=16)
    s2, i2 = _brute(q, c, 10)
    assert torch.equal(i1, i2)
    assert torch.allclose(s1, s2, atol=1e-6)
    # float64, non-contiguous inputs give the same ranking
    s3, i3 = topk(q.double().T.contiguous().T, c.double()[::1], k=10, chunk=16)
    assert torch.equal(i3, i1)
    assert torch.allclose(s3, s1, atol=1e-6)


def test_desc_key_orders_rows_then_scores_descending_and_ties_signed_zeros() -> None:
    rows = np.array([1, 0, 0, 0, 0, 0, 1])
    v = np.array([5.0, -1.0, -0.0, 0.0, 2.5, -np.inf, -3.0], dtype=np.float32)
    order = np.argsort(engine._desc_key(rows, v), kind="stable")
    assert order.tolist() == [4, 2, 3, 1, 5, 0, 6]  # -0.0 and 0.0 tie: input order kept


@pytest.mark.parametrize("k", [1, 10, 40])
def test_dense_topk_in_budgeted_blocks_equals_brute_force(monkeypatch: pytest.MonkeyPatch,
                                                          k: int) -> None:
    """The accelerators' path, run here on the CPU: blocks of 16 query rows (the budget's
    floor), ties by index, leave-one-out, unit and non-unit rows alike."""
    monkeypatch.setattr(engine, "_DENSE_BLOCK_BYTES", 1)
    q, c = _dyadic(50, 6), _dyadic(300, 7)
    ex = torch.randint(-1, 300, (50,), generator=torch.Generator().manual_seed(8))
    for scale in (1.0, 2.0):
        s1, i1 = engine._topk_dense(q * scale, c, k, ex)
        s2, i2 = _brute(q, c, k, ex)
        assert torch.equal(i1, i2)
        assert torch.equal(s1, s2)
