"""Metrics on hand-made rankings; streaming top-k equals brute force with deterministic ties."""

from __future__ import annotations

import math

import pytest
import torch

from simtune import metrics


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
    s1, i1 = metrics.topk(q, c, k=10, chunk=5)
    full = torch.nn.functional.normalize(q) @ torch.nn.functional.normalize(c).T
    s2, i2 = full.topk(10, dim=1)
    assert torch.equal(i1, i2)
    assert torch.allclose(s1, s2, atol=1e-6)


def test_ties_break_by_lower_corpus_index_and_exclusion() -> None:
    c = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    _, idx = metrics.topk(q, c, k=3, chunk=1)
    assert idx.tolist() == [[0, 2, 3], [0, 2, 3]]
    _, idx = metrics.topk(q, c, k=3, exclude=torch.tensor([2, -1]))
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
