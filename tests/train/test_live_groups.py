"""Full mode runs a batch's texts as groups of similar length, each padded to its own longest
(`layers.length_groups`, as the top layers' states do): the vectors and their gradients equal the
one padded forward of the whole batch, and a split's vectors equal the frozen encoder's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simtune import layers
from simtune import params as P
from simtune.encoders import FrozenEncoder
from simtune.train import represent
from simtune.train.data import load_data
from tests.train_helpers import dropout_free, project

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu"]


def _rows() -> list[tuple[str, str]]:
    """40 texts of 1 to 8 words in 4 labels: a batch padded to its longest wastes most tokens."""
    return [(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(1 + (i * 3) % 8)), f"L{i % 4}")
            for i in range(40)]


@pytest.fixture
def live(tmp_path: Path, tiny_bert: Path) -> tuple[represent.LiveEncoder, object, P.Params]:
    model = dropout_free(tiny_bert, tmp_path / "bert")
    raw, _ = project(tmp_path, model, rows=_rows(), mode="full")
    p = P.validate(raw)
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    live = represent.LiveEncoder(model, p.encoders.models["tiny"], None, True)
    return live, data.splits["train"], p


def _forwards(monkeypatch: pytest.MonkeyPatch, enc: represent.LiveEncoder
              ) -> list[tuple[int, int]]:
    """Records each encoder call's (rows, padded width)."""
    calls: list[tuple[int, int]] = []
    forward = enc.encoder.forward

    def spy(*args: object, **kw: torch.Tensor) -> object:
        calls.append(tuple(kw["input_ids"].shape))
        return forward(*args, **kw)

    monkeypatch.setattr(enc.encoder, "forward", spy)
    return calls


def test_grouped_batch_equals_one_padded_forward_with_its_gradients(
        live: tuple[represent.LiveEncoder, object, P.Params],
        monkeypatch: pytest.MonkeyPatch) -> None:
    enc, split, _ = live
    idx = list(range(len(split)))
    part = enc.collate(split, idx)
    calls = _forwards(monkeypatch, enc)
    results = []
    for overhead in (10**9, 0):  # one group (the long way); a group per distinct length
        monkeypatch.setattr(layers, "GROUP_OVERHEAD", {"cpu": overhead, "other": overhead})
        enc.zero_grad()
        vectors = enc(split, part, "text")
        (vectors * torch.linspace(-1, 1, vectors.numel()).view_as(vectors)).sum().backward()
        results.append((vectors.detach(), {n: p.grad.clone() for n, p in enc.named_parameters()
                                           if p.grad is not None}))
    (rows, one_width), grouped = calls[0], calls[1:]
    assert rows == len(idx) and len(grouped) > 4 and sum(r for r, _ in grouped) == rows
    assert max(w for _, w in grouped) == one_width and min(w for _, w in grouped) < one_width / 3
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert want_grads.keys() == got_grads.keys() and len(want_grads) > 10
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_splits_vectors_in_bounded_groups_equal_the_frozen_encoders(
        live: tuple[represent.LiveEncoder, object, P.Params],
        monkeypatch: pytest.MonkeyPatch) -> None:
    enc, split, p = live
    monkeypatch.setattr(layers, "TOKENS_PER_CHUNK", 64)  # a few rows a forward
    calls = _forwards(monkeypatch, enc)
    with torch.no_grad():
        got = enc.eval().embed_split(split, "text")
    want = FrozenEncoder("tiny", p.encoders.models["tiny"], torch.device("cpu")).encode(
        split.texts["texts"], 5)
    assert len(calls) > 1 and sum(r for r, _ in calls) == len(split)
    assert all(r * w <= 64 or r == 1 for r, w in calls)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_capped_groups_bound_each_forward_and_partition_the_rows() -> None:
    lengths = torch.tensor([30, 3, 30, 5, 4, 29, 3, 100])
    groups = layers.capped_groups(lengths, 10, 60)  # the 30s group as one (90 tokens), then cut
    assert sorted(torch.cat(groups).tolist()) == list(range(len(lengths)))
    for g in groups:  # a row longer than the bound runs alone
        assert int(lengths[g].max()) * len(g) <= 60 or len(g) == 1
    assert [lengths[g].tolist() for g in groups] == [[100], [30, 30], [29], [5, 4, 3, 3]]
