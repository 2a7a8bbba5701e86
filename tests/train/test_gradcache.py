"""GradCache gives the full-batch gradient (fp32, rel err <= 1e-5) for chunk sizes 1, 3 and B,
with dropout on, over a head (head mode) and over a tiny BERT encoder + head (full mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simtune import heads
from simtune.train import gradcache
from simtune.train.losses import GroupLoss

B = 12


def _loss() -> GroupLoss:
    return GroupLoss("supcon", "cosine", 0.1, 0.2, "batch_hard", 1.0)


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys() and want
    for name in want:
        err = (got[name] - want[name]).norm() / want[name].norm().clamp_min(1e-12)
        assert err <= 1e-5, (name, float(err))


def _check(model: torch.nn.Module, encode, batch, labels: torch.Tensor, chunk: int) -> None:
    loss_fn = _loss()
    chunks = [batch_slice(batch, s, s + chunk) for s in range(0, B, chunk)]
    # reference: the same chunk-wise forward passes (same dropout draws), one graph, one backward
    torch.manual_seed(123)
    model.zero_grad()
    full = loss_fn(torch.cat([encode(c) for c in chunks]), labels)
    full.backward()
    want = _grads(model)
    torch.manual_seed(123)
    model.zero_grad()
    got_loss = gradcache.step(encode, chunks, lambda reps: loss_fn(reps, labels))
    assert got_loss.item() == pytest.approx(full.item(), rel=1e-6)
    _assert_equal(_grads(model), want)


def batch_slice(batch, s: int, e: int):
    if isinstance(batch, dict):
        return {k: v[s:e] for k, v in batch.items()}
    return batch[s:e]


@pytest.mark.parametrize("chunk", [1, 3, B])
def test_head_mode_equals_full_batch(chunk: int) -> None:
    torch.manual_seed(0)
    head = heads.build("mlp", 16, 2, 0.3).train()  # dropout on
    with torch.no_grad():
        head.net[-1].weight.normal_(0, 0.1)
    x = torch.randn(B, 16)
    labels = torch.tensor([0, 1, 2] * 4)
    _check(head, head, x, labels, chunk)


def test_dropout_really_differs_between_draws() -> None:
    """Guard for the test above: without the RNG replay the gradients would not match."""
    torch.manual_seed(0)
    head = heads.build("mlp", 16, 2, 0.3).train()
    with torch.no_grad():
        head.net[-1].weight.normal_(0, 0.1)
    x = torch.randn(B, 16)
    assert not torch.equal(head(x), head(x))


@pytest.mark.parametrize("chunk", [1, 3, B])
def test_full_mode_tiny_bert_equals_full_batch(chunk: int, tiny_bert: Path) -> None:
    import transformers

    from simtune.encoders import pool

    encoder = transformers.AutoModel.from_pretrained(tiny_bert, hidden_dropout_prob=0.2,
                                                     attention_probs_dropout_prob=0.2)
    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    head = heads.build("skip_connection", 32, 2, 0.0)
    model = torch.nn.ModuleDict({"encoder": encoder, "head": head}).train()
    from tests.cache_helpers import sentences

    batch = dict(tok(sentences(B), padding=True, return_tensors="pt"))

    def encode(b: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = encoder(**b).last_hidden_state
        return head(pool(hidden, b["attention_mask"], "mean"))

    labels = torch.tensor([0, 1, 2, 3] * 3)
    _check(model, encode, batch, labels, chunk)


def test_loss_scale_is_applied_exactly_once() -> None:
    """As under fp16: the caller's backward scales the loss; the replay must not scale again."""
    torch.manual_seed(0)
    head = heads.build("linear", 8, 1, 0.0)
    x, labels = torch.randn(B, 8), torch.tensor([0, 1, 2] * 4)
    loss_fn = _loss()
    head.zero_grad()
    loss_fn(head(x), labels).backward()
    want = {k: 1024 * v for k, v in _grads(head).items()}
    head.zero_grad()
    gradcache.step(head, [x[s : s + 4] for s in range(0, B, 4)],
                   lambda reps: loss_fn(reps, labels),
                   backward=lambda loss: (loss * 1024).backward())
    _assert_equal(_grads(head), want)
