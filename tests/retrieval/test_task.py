"""The retrieval task: hand-computed metrics of tiny groups tasks (leave-one-out, another split's
texts) and of a tiny pairs task under both corpus policies and both gains; vectors by split
equal vectors by cache row."""

from __future__ import annotations

import math

import pytest
import torch

from simtune.examples import Data, Split
from simtune.retrieval.task import Vectors, by_rows, by_split, retrieval_task

L3 = 1 / math.log2(3)  # the nDCG discount of rank 2 (rank 1: 1, rank 3: 1 / log2(4) = 0.5)


def _split(**columns: list[float] | list[int]) -> Split:
    return Split({name: torch.tensor(v, dtype=torch.float32 if name == "scores" else torch.long)
                  for name, v in columns.items()}, {})


def _rows(table: torch.Tensor) -> Vectors:  # one table for every role
    return by_rows(lambda rows, role: table[rows])


def _groups() -> Data:
    """Unit 2-d texts: test t0 (1, 0) L0, t1 (.8, .6) L0, t2 (.6, .8) L1, t3 (0, 1) L1,
    t4 (-1, 0) L2 (alone); val v0 (1, 0) L0, v1 (0, 1) L1; train a (.6, .8) L0,
    b (.8, .6) L1, c (-.6, .8) L0."""
    table = torch.tensor([[1, 0], [.8, .6], [.6, .8], [0, 1], [-1, 0],
                          [1, 0], [0, 1], [.6, .8], [.8, .6], [-.6, .8]])
    splits = {"train": _split(labels=[0, 1, 0], rows=[7, 8, 9]),
              "val": _split(labels=[0, 1], rows=[5, 6]),
              "test": _split(labels=[0, 0, 1, 1, 2], rows=[0, 1, 2, 3, 4])}
    return Data("groups", 2, table, table, splits, 3, {}, ["L0", "L1", "L2"], {})


def test_groups_leave_one_out_by_hand() -> None:
    """Cosines t0.t1 .8, t0.t2 .6, t1.t2 .96, t1.t3 .6, t2.t3 .8 (t4 lowest for all): t0 and
    t3 find their one relevant text first; t1 and t2 second (behind each other); t4 has none."""
    data = _groups()
    task = retrieval_task(data, "test")
    assert task.corpus is None and task.corpus_size == 4
    assert retrieval_task(data, "test", "test").corpus is None  # its own name: the same
    s = task.score(_rows(data.q_vectors), ks=(1, 2))
    pair = {"p@1": 0.5, "recall@1": 0.5, "recall@2": 1.0, "mrr@10": 0.75,
            "ndcg@10": (2 + 2 * L3) / 4, "map@r": 0.5}
    assert s.metrics == pytest.approx({k: v * 4 / 5 for k, v in pair.items()}, abs=1e-6)
    assert s.no_relevant == 1
    assert s.ranked.rel[:, :2].tolist() == [[True, False], [False, True], [False, True],
                                            [True, False], [False, False]]
    assert s.per_label[0] == pytest.approx(pair, abs=1e-6)
    assert s.per_label[1] == pytest.approx(pair, abs=1e-6)
    assert s.per_label[2] == {k: 0.0 for k in pair}
    light = task.score(_rows(data.q_vectors), ks=(1, 2), upto_r=False)
    assert light.metrics == {k: v for k, v in s.metrics.items() if k != "map@r"}
    assert "map@r" not in light.per_label[0]


def test_groups_against_another_split_by_hand() -> None:
    """v0 ranks b (.8, L1), a (.6), c (-.6): relevant at 2 and 3 of R = 2. v1 ranks a and c
    (.8, a tie: lower corpus index first), then b (.6, its one relevant item, at 3)."""
    data = _groups()
    task = retrieval_task(data, "val", "train")
    assert task.corpus is not None and task.corpus_size == 3
    s = task.score(_rows(data.q_vectors), ks=(1, 2), depth=3)
    v0 = {"p@1": 0, "recall@1": 0, "recall@2": 0.5, "mrr@10": 1 / 2,
          "ndcg@10": (L3 + 0.5) / (1 + L3), "map@r": (1 / 2) / 2}
    v1 = {"p@1": 0, "recall@1": 0, "recall@2": 0, "mrr@10": 1 / 3, "ndcg@10": 0.5, "map@r": 0}
    assert s.metrics == pytest.approx({k: (v0[k] + v1[k]) / 2 for k in v0}, abs=1e-6)
    assert s.ranked.top is not None and s.ranked.top[1].tolist() == [[1, 0, 2], [0, 2, 1]]
    assert s.per_label[0] == pytest.approx(v0, abs=1e-6)
    by_sp = task.score(by_split(data, lambda sp, role: data.q_vectors[sp.tensors["rows"]]),
                       ks=(1, 2), depth=3)
    assert by_sp.metrics == s.metrics and torch.equal(by_sp.ranked.top[1], s.ranked.top[1])


def _pairs() -> Data:
    """Query table: Q0 (1, 0), Q1 (0, 1), Q5 (.6, .8) (train). Document table: D0 (.8, .6),
    D1 (.6, .8), D2 (0, 1), D3 (1, 0) (train), D4 (.28, .96) (in no split: corpus-only).
    Test: Q0-D0 score 1, Q0-D1 score 2, Q1-D2 score 1, Q1-D0 score 0 (listed, not relevant).
    Text ids interned in order: Q5 0, D3 1, Q0 2, Q1 3, D0 4, D1 5, D2 6."""
    q_table = torch.tensor([[1, 0], [0, 1], [.6, .8]])
    d_table = torch.tensor([[.8, .6], [.6, .8], [0, 1], [1, 0], [.28, .96]])
    empty: list[int] = []
    splits = {"train": _split(q_ids=[0], d_ids=[1], scores=[1], q_rows=[2], d_rows=[3]),
              "val": _split(q_ids=empty, d_ids=empty, scores=empty, q_rows=empty,
                            d_rows=empty),
              "test": _split(q_ids=[2, 2, 3, 3], d_ids=[4, 5, 4, 6], scores=[1, 2, 0, 1],
                             q_rows=[0, 0, 1, 1], d_rows=[0, 1, 0, 2])}
    return Data("pairs", 2, q_table, d_table, splits, 0, {}, [], {})


def _vectors(data: Data) -> Vectors:  # by cache row: the query or the document table
    return by_rows(lambda rows, role: _table(data, role)[rows])


def test_pairs_the_split_documents_binary_and_graded_by_hand() -> None:
    """Corpus "split": D0, D1, D2. Q0 ranks D0 (.8), D1 (.6): both relevant, R = 2 (binary:
    perfect; graded: gains 1, 2 against the ideal 2, 1). Q1 ranks D2 first (1.0)."""
    data = _pairs()
    binary = retrieval_task(data, "test")
    assert binary.corpus is not None and binary.corpus.rows.tolist() == [0, 1, 2]
    assert binary.pairs.tolist() == [[0, 0], [0, 1], [1, 2]] and binary.gains is None
    perfect = {"p@1": 1.0, "recall@1": 0.75, "recall@5": 1.0, "mrr@10": 1.0, "ndcg@10": 1.0,
               "map@r": 1.0}
    assert binary.score(_vectors(data), ks=(1, 5)).metrics == pytest.approx(perfect, abs=1e-6)
    graded = retrieval_task(data, "test", gains="graded")
    assert graded.gains is not None and graded.gains.tolist() == [1, 2, 1]
    got = graded.score(_vectors(data), ks=(1, 5)).metrics
    q0 = (1 + 2 * L3) / (2 + 1 * L3)
    assert got == pytest.approx({**perfect, "ndcg@10": (q0 + 1) / 2}, abs=1e-6)
    assert got["ndcg@10"] != binary.score(_vectors(data), ks=(1, 5)).metrics["ndcg@10"]


def test_pairs_every_document_binary_and_graded_by_hand() -> None:
    """Corpus "all": D3 (train), D0, D1, D2 (test, first appearance), then the caller's D4.
    Q0 now ranks D3 (1.0) first, then D0 (.8, gain 1), D1 (.6, gain 2), D4, D2."""
    data = _pairs()
    task = retrieval_task(data, "test", "all", "graded", extra=torch.tensor([4]))
    assert task.corpus is not None and task.corpus.rows.tolist() == [3, 0, 1, 2, 4]
    assert task.corpus_size == 5 and len(task.queries) == 2
    assert task.pairs.tolist() == [[0, 1], [0, 2], [1, 3]]
    s = task.score(_vectors(data), ks=(1, 5), depth=5)
    assert s.ranked.top[1].tolist() == [[0, 1, 2, 4, 3], [3, 4, 2, 1, 0]]
    q0 = {"p@1": 0, "recall@1": 0, "recall@5": 1, "mrr@10": 1 / 2,
          "ndcg@10": (1 * L3 + 2 * 0.5) / (2 + 1 * L3), "map@r": (1 / 2) / 2}
    assert s.metrics == pytest.approx({k: (v + 1) / 2 for k, v in q0.items()}, abs=1e-6)
    assert s.no_relevant == 0 and s.per_label == {}
    binary = retrieval_task(data, "test", "all", extra=torch.tensor([4]))
    got = binary.score(_vectors(data), ks=(1, 5)).metrics
    assert got["ndcg@10"] == pytest.approx(((L3 + 0.5) / (1 + L3) + 1) / 2, abs=1e-6)
    assert {k: v for k, v in got.items() if k != "ndcg@10"} == {
        k: v for k, v in s.metrics.items() if k != "ndcg@10"}


def test_pairs_vectors_by_split_equal_vectors_by_row() -> None:
    """Without corpus-only rows, every policy scores the same from each split's vectors
    (validation's source) as from the cache rows (evaluate's); extra rows need rows."""
    data = _pairs()

    def embed(sp: Split, role: str) -> torch.Tensor:
        return _table(data, role)[sp.tensors["d_rows" if role == "doc" else "q_rows"]]

    for corpus in ("split", "all"):
        task = retrieval_task(data, "test", corpus, "graded")
        a = task.score(by_split(data, embed), ks=(1, 5), depth=4)
        b = task.score(_vectors(data), ks=(1, 5), depth=4)
        assert a.metrics == b.metrics and torch.equal(a.ranked.top[1], b.ranked.top[1])
    with pytest.raises(ValueError, match="by cache row"):
        retrieval_task(data, "test", "all", extra=torch.tensor([4])).score(
            by_split(data, embed), ks=(1,))


def _table(data: Data, role: str) -> torch.Tensor:
    table = data.d_vectors if role == "doc" else data.q_vectors
    assert table is not None
    return table


def test_all_scores_one_is_binary_and_bad_policies_are_refused() -> None:
    data = _pairs()
    data.splits["test"].tensors["scores"] = torch.tensor([1.0, 1.0, 0.0, 1.0])
    assert retrieval_task(data, "test", gains="graded").gains is None
    with pytest.raises(ValueError, match="'split', 'all' or 'known'"):
        retrieval_task(data, "test", "train")
    with pytest.raises(ValueError, match="binary or graded"):
        retrieval_task(data, "test", gains="grades")
    with pytest.raises(ValueError, match="one split"):
        retrieval_task(_groups(), "test", "all")
