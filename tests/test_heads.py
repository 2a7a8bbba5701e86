"""Heads: identity at initialisation where promised, and a saved head reloads exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simtune import heads
from simtune.errors import UserError


@pytest.mark.parametrize("kind", ["identity", "linear", "gated", "mlp"])
def test_starts_as_identity(kind: str) -> None:
    x = torch.randn(5, 16)
    assert torch.allclose(heads.build(kind, 16, 2, 0.0)(x), x, atol=1e-6)


def test_skip_connection_starts_close_to_identity() -> None:
    torch.manual_seed(0)
    head = heads.build("skip_connection", 16, 2, 0.0)
    x = torch.randn(5, 16)
    y = head(x)
    gate = torch.sigmoid(torch.tensor(-4.0))
    assert torch.allclose(y, x + gate * head.fc(x))
    assert (y - x).abs().max() < 0.1 * x.abs().max()


@pytest.mark.parametrize("kind", heads.TYPES)
def test_save_and_load_give_identical_outputs(tmp_path: Path, kind: str) -> None:
    torch.manual_seed(1)
    head = heads.build(kind, 12, 3, 0.1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p))  # trained-looking weights
    head.eval()
    heads.save(head, tmp_path / "head")
    loaded = heads.load(tmp_path / "head")
    x = torch.randn(7, 12)
    assert torch.equal(loaded(x), head(x))
    assert loaded.config == head.config


def test_load_without_a_head(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no trained head here"):
        heads.load(tmp_path)
