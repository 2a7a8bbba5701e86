"""Validation on a schedule: which epochs compute which metrics, when training stops, which
epoch is kept; validation vectors reused where the weights cannot change them equal recomputed
ones; the top-10 validation gives the full one's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simtune import heads
from simtune import params as P
from simtune.examples import Data, Split
from simtune.retrieval.task import Embed, by_split, retrieval_task
from simtune.train import represent
from simtune.train.data import load_data
from simtune.train.validation import Schedule, Validator, frozen
from tests.train_helpers import project


def split_metrics(data: Data, split: str, embed: Embed, corpus: str | None = None
                  ) -> tuple[dict[str, float], int]:
    """The task's metrics recomputed from scratch (validation's policies, ks 1, 5, 10)."""
    scored = retrieval_task(data, split, corpus or "split").score(by_split(data, embed),
                                                                  (1, 5, 10))
    return scored.metrics, scored.no_relevant


def _drive(values: list[float], every: int, patience: int) -> tuple[list[int], int, int]:
    """The train loop over scripted monitored values (epoch e: values[e - 1]). Returns (epochs
    computing every metric, last epoch, kept epoch)."""
    s = Schedule(every, patience, len(values))
    full, last = [], len(values)
    for epoch in range(1, len(values) + 1):
        if s.full(epoch):
            full.append(epoch)
        better, stop = s.record(epoch, values[epoch - 1])
        assert better == (s.best_epoch == epoch)
        if stop:
            last = epoch
            break
    assert s.best_value == values[s.best_epoch - 1]
    return full, last, s.best_epoch


# a noisy plateau: the best (epoch 7, 0.7) sits between multiples of 3, and a later equal
# value (epoch 12) is not better
CURVE = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.55, 0.5, 0.4, 0.3, 0.7, 0.2, 0.2, 0.65, 0.2]


def test_every_metric_every_n_epochs_and_the_same_stop_and_kept_epoch() -> None:
    """val_every 3: every metric at 3, 6, 9, 12 (the top 10 only at the others); the
    monitored value every epoch, so patience 6 stops at 13 (7 + 6) and epoch 7 is kept, exactly
    as with val_every 1."""
    assert _drive(CURVE, every=3, patience=6) == ([3, 6, 9, 12], 13, 7)
    assert _drive(CURVE, every=1, patience=6) == (list(range(1, 14)), 13, 7)


def test_the_last_epoch_computes_every_metric() -> None:
    """max_epochs 16 is not a multiple of 5; patience beyond the run: no early stop."""
    assert _drive(CURVE, every=5, patience=100) == ([5, 10, 15, 16], 16, 7)


def test_lightning_early_stopping_semantics() -> None:
    """Patience 0 stops at the first epoch that is not better; patience 2 after two of them
    (an equal value is not better)."""
    assert _drive([0.1, 0.3, 0.3, 0.9], every=1, patience=0)[1:] == (3, 2)
    assert _drive([0.1, 0.3, 0.2, 0.3, 0.9], every=1, patience=2)[1:] == (4, 2)


def test_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="bad schedule"):
        Schedule(0, 1, 10)


# --- reused validation vectors -------------------------------------------------------------


@pytest.fixture
def data(tmp_path: Path, tiny_bert: Path) -> Data:
    """4 labels, 100 training texts: R = 25 relevant per query, more than the top 10."""
    _, params_file = project(tmp_path, tiny_bert, n=200)
    p = P.load(params_file)
    return load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")


def _rep(data: Data) -> tuple[represent.CachedVectors, list[int]]:
    """The head-mode representation, counting its whole-split embeddings."""
    rep = represent.CachedVectors(data.tables["query"], data.tables["doc"])
    calls = [0]
    plain = rep.embed_split

    def counted(sp: Split, role: str) -> torch.Tensor:
        calls[0] += 1
        return plain(sp, role)

    rep.embed_split = counted  # type: ignore[method-assign]
    return rep, calls


@pytest.mark.parametrize("corpus", ["train", None])
def test_reused_vectors_give_the_recomputed_metrics(data: Data, corpus: str | None
                                                    ) -> None:
    """The cached vectors are read once; as the head's weights change, the validator's metrics
    equal split_metrics recomputed from scratch, exactly."""
    rep, calls = _rep(data)
    head = heads.build("mlp", data.dim, 2, 0.0).eval()
    assert frozen(rep) and not frozen(head)
    validator = Validator(data, retrieval_task(data, "val", corpus or "split"),
                          rep.embed_split, head, rep_frozen=frozen(rep))
    seen = []
    for step in range(3):
        with torch.no_grad():
            for w in head.parameters():
                w.add_(0.05 * torch.randn_like(w))
            got, finite = validator()
            want, _ = split_metrics(data, "val", lambda sp, role: head(
                data.q_vectors[sp.tensors["rows"]].float()), corpus=corpus)
        assert finite and _ranked(got) == want, step
        seen.append(got["mrr@10"])
    assert calls[0] == (2 if corpus else 1)  # val (and train): once, not once per validation
    assert len(set(seen)) > 1  # the weights did change the metrics


def _ranked(scores: dict[str, float]) -> dict[str, float]:
    """The validator's metrics but the separation (a tie-breaker, not a ranking metric)."""
    assert "separation" in scores
    return {k: v for k, v in scores.items() if k != "separation"}


def _validator(data: Data, head: torch.nn.Module, rep_frozen: bool
               ) -> tuple[Validator, list[int]]:
    """A validator of the val split against train, and the counter of `embed_split` calls."""
    rep, calls = _rep(data)
    return Validator(data, retrieval_task(data, "val", "train"), rep.embed_split, head,
                     rep_frozen=rep_frozen), calls


def test_top10_validation_gives_the_full_metrics_but_map_at_r(data: Data) -> None:
    """The monitored metric from the top 10 equals the full validation's, exactly."""
    head = heads.build("mlp", data.dim, 2, 0.0).eval()
    validator, _ = _validator(data, head, rep_frozen=True)
    with torch.no_grad():
        for w in head.parameters():
            w.add_(0.05 * torch.randn_like(w))
        full, _ = validator(True)
        light, _ = validator(False)
    assert set(full) - set(light) == {"map@r", "separation"}
    assert int(torch.bincount(data.splits["train"].tensors["labels"]).max()) > 10
    assert light == {k: v for k, v in full.items() if k not in ("map@r", "separation")}


def test_a_frozen_head_reuses_its_outputs_too(data: Data) -> None:
    """Identity head over frozen vectors: the head runs once per split, its outputs reused."""
    head = heads.build("identity", data.dim, 2, 0.0)
    runs = [0]
    head.register_forward_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    validator, calls = _validator(data, head, rep_frozen=True)
    first, _ = validator()
    again, _ = validator()
    want, _ = split_metrics(data, "val", lambda sp, role: data.q_vectors[sp.tensors["rows"]]
                            .float(), corpus="train")
    assert first == again and _ranked(first) == want and calls[0] == 2 and runs[0] == 2


def test_a_trainable_representation_is_recomputed(data: Data) -> None:
    head = heads.build("mlp", data.dim, 2, 0.0).eval()
    validator, calls = _validator(data, head, rep_frozen=False)
    with torch.no_grad():
        validator()
        validator()
    assert calls[0] == 4


def test_pairs_task_is_computed_once_and_scores_as_split_metrics() -> None:
    """Pairs: the task's first rows and relevant pairs are fixed; scores as split_metrics."""
    g = torch.Generator().manual_seed(0)
    table = torch.nn.functional.normalize(torch.randn(12, 8, generator=g), dim=-1)
    val = Split({"q_ids": torch.tensor([0, 0, 1, 2, 2, 3]),
                 "d_ids": torch.tensor([4, 5, 6, 7, 4, 8]),
                 "scores": torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0]),
                 "q_rows": torch.tensor([0, 0, 1, 2, 2, 3]),
                 "d_rows": torch.tensor([4, 5, 6, 7, 4, 8])}, {})
    data = Data("pairs", 8, table, table, {"val": val}, 0, {}, [], {})

    def embed(sp: Split, role: str) -> torch.Tensor:
        return table[sp.tensors["q_rows" if role == "query" else "d_rows"]]

    task = retrieval_task(data, "val")
    q_first = task.queries.parts[0][1]
    assert task.pairs is not None and q_first is not None
    assert q_first.tolist() == [0, 2, 3, 5] and task.pairs.tolist() == [
        [0, 0], [0, 1], [1, 2], [2, 0], [3, 4]]
    scored = task.score(by_split(data, embed), (1, 5, 10))
    assert (scored.metrics, scored.no_relevant) == split_metrics(data, "val", embed)
