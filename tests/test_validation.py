"""Validation on a schedule: which epochs validate, when training stops, which epoch is kept;
validation vectors reused where the weights cannot change them equal recomputed ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simtune import heads, represent
from simtune import params as P
from simtune.train_data import Split, TrainData, load_data, retrieval_task, split_metrics
from simtune.validation import Schedule, Validator, frozen
from tests.train_helpers import project


def _drive(values: list[float], every: int, patience: int
           ) -> tuple[list[int], int, list[int], int]:
    """The train loop's protocol over scripted per-epoch values (epoch e: values[e - 1]); a
    copy is the epoch number. Returns (scheduled validations, last epoch, re-checked epochs,
    kept epoch)."""
    s = Schedule(every, patience, len(values))
    validated, last = [], len(values)
    for epoch in range(1, len(values) + 1):
        if not s.validates(epoch):
            s.hold(epoch, lambda e=epoch: e)
            continue
        validated.append(epoch)
        if s.record(epoch, values[epoch - 1], lambda e=epoch: e):
            last = epoch
            break
    rechecked = []
    for epoch, state in s.recheck():
        assert state == epoch  # the copy of that very epoch
        rechecked.append(epoch)
        s.rechecked(epoch, values[epoch - 1], state)
    assert s.best_state == s.best_epoch and s.best_value == values[s.best_epoch - 1]
    return validated, last, rechecked, s.best_epoch


def test_every_epoch_is_lightning_early_stopping() -> None:
    """N = 1: best 2 (a later equal value is not better); 2 epochs without a better value
    (3, 4) with patience 2 stop at 4; nothing to re-check."""
    assert _drive([0.1, 0.3, 0.2, 0.3, 0.9], every=1, patience=2) == ([1, 2, 3, 4], 4, [], 2)


def test_a_best_between_validations_is_found_by_the_recheck() -> None:
    """N = 3: validated 3, 6, 9, 12; the best validated epoch is 6 (0.6), 12 is the first
    validation 6 or more epochs after it: stop. Re-checked 4, 5 (before 6) and 7, 8 (after):
    epoch 7 (0.7) is kept, as validating every epoch would have kept it."""
    v = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.55, 0.5, 0.4, 0.3, 0.45, 0.2, 0.2, 0.2]
    assert _drive(v, every=3, patience=6) == ([3, 6, 9, 12], 12, [4, 5, 7, 8], 7)
    every_epoch = _drive(v, every=1, patience=6)
    assert every_epoch[3] == 7 and every_epoch[1] == 13  # same epoch kept, one epoch later stop


def test_a_best_away_from_the_best_validated_epoch_is_missed() -> None:
    """The limit of the schedule, on purpose: the kept epoch is the best within N - 1 epochs of
    the best validated one. Here epoch 5 (0.9) sits before 6 (0.4), which is beaten by 9
    (0.44): only 7, 8 and 10, 11 are re-checked and 7 (0.45) is kept."""
    v = [0.1, 0.2, 0.3, 0.35, 0.9, 0.4, 0.45, 0.3, 0.44, 0.3, 0.3, 0.42, 0.3, 0.3, 0.41]
    assert _drive(v, every=3, patience=6) == ([3, 6, 9, 12, 15], 15, [7, 8, 10, 11], 7)
    assert _drive(v, every=1, patience=6)[3] == 5


def test_ties_keep_the_earliest_epoch_and_the_last_epoch_is_validated() -> None:
    """Equal values everywhere: epoch 1 kept (as with N = 1); max_epochs 7 is not a multiple of
    3 but validated; patience larger than the run: no early stop."""
    assert _drive([0.5] * 7, every=3, patience=10) == ([3, 6, 7], 7, [1, 2, 4, 5], 1)


def test_copies_are_kept_only_while_needed() -> None:
    """At most the N - 1 epochs since the last validation plus the N - 1 on each side of the
    best: 3 (N - 1) copies, whatever the number of epochs."""
    s = Schedule(4, 1000, 400)
    for epoch in range(1, 401):
        if s.validates(epoch):
            s.record(epoch, 1.0 if epoch == 200 else 0.0, lambda: None)
        else:
            s.hold(epoch, lambda: None)
        assert len(s._recent) + len(s._before) + len(s._after) <= 3 * 3
    assert [e for e, _ in s.recheck()] == [197, 198, 199, 201, 202, 203]


def test_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="bad schedule"):
        Schedule(0, 1, 10)


# --- reused validation vectors -------------------------------------------------------------


@pytest.fixture
def data(tmp_path: Path, tiny_bert: Path) -> TrainData:
    _, params_file = project(tmp_path, tiny_bert)
    return load_data(P.load(params_file), tmp_path / "prepared", tmp_path / "cache")


def _rep(data: TrainData) -> tuple[represent.CachedVectors, list[int]]:
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
def test_reused_vectors_give_the_recomputed_metrics(data: TrainData, corpus: str | None
                                                    ) -> None:
    """The cached vectors are read once; as the head's weights change, the validator's metrics
    equal split_metrics recomputed from scratch, exactly."""
    rep, calls = _rep(data)
    head = heads.build("mlp", data.dim, 2, 0.0).eval()
    assert frozen(rep) and not frozen(head)
    validator = Validator(data, retrieval_task(data, "val", corpus), rep.embed_split, head,
                          rep_frozen=frozen(rep))
    seen = []
    for step in range(3):
        with torch.no_grad():
            for w in head.parameters():
                w.add_(0.05 * torch.randn_like(w))
            got, finite = validator()
            want, _ = split_metrics(data, "val", lambda sp, role: head(
                data.q_vectors[sp.tensors["rows"]].float()), corpus=corpus)
        assert finite and got == want, step
        seen.append(got["mrr@10"])
    assert calls[0] == (2 if corpus else 1)  # val (and train): once, not once per validation
    assert len(set(seen)) > 1  # the weights did change the metrics


def test_a_frozen_head_reuses_its_outputs_too(data: TrainData) -> None:
    """Identity head over frozen vectors: the head runs once per split, its outputs reused."""
    rep, calls = _rep(data)
    head = heads.build("identity", data.dim, 2, 0.0)
    runs = [0]
    head.register_forward_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    validator = Validator(data, retrieval_task(data, "val", "train"), rep.embed_split, head,
                          rep_frozen=True)
    first, _ = validator()
    again, _ = validator()
    want, _ = split_metrics(data, "val", lambda sp, role: data.q_vectors[sp.tensors["rows"]]
                            .float(), corpus="train")
    assert first == again == want and calls[0] == 2 and runs[0] == 2


def test_a_trainable_representation_is_recomputed(data: TrainData) -> None:
    rep, calls = _rep(data)
    head = heads.build("mlp", data.dim, 2, 0.0).eval()
    validator = Validator(data, retrieval_task(data, "val", "train"), rep.embed_split, head,
                          rep_frozen=False)
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
    data = TrainData("pairs", 8, table, table, {"val": val}, 0, {}, [], {})

    def embed(sp: Split, role: str) -> torch.Tensor:
        return table[sp.tensors["q_rows" if role == "query" else "d_rows"]]

    task = retrieval_task(data, "val")
    assert task.pairs is not None and task.q_first is not None
    assert task.q_first.tolist() == [0, 2, 3, 5] and task.pairs.tolist() == [
        [0, 0], [0, 1], [1, 2], [2, 0], [3, 4]]
    assert task.scores(data, embed) == split_metrics(data, "val", embed)
