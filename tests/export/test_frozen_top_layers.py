"""Issue 44 item 9 in top_layers mode: a run that keeps epoch 0 (the untouched encoder) saves no
copy of the encoder, records `selected: frozen`, and its export is the frozen encoder, called
so (its vectors equal the frozen encoder's)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from simtune.encoders import FrozenEncoder
from simtune.export.stage import export
from simtune.model import load_model
from tests.cache_helpers import sentences
from tests.train_helpers import project, set_schedule, train_top_layers


def test_a_top_layers_run_that_keeps_epoch_0_exports_the_frozen_encoder(
        tmp_path: Path, tiny_bert: Path) -> None:
    raw, params_file = project(tmp_path, tiny_bert, mode="top_layers")
    # learning rates too small to move a rank: every trained epoch ties epoch 0, which stays
    set_schedule(raw, "top_layers", layers=1, lr=1e-12, head_lr=1e-12, batch_size=8,
                 max_epochs=1, patience=1)
    p = train_top_layers(tmp_path, raw, params_file)
    head = tmp_path / "head"
    assert json.loads((tmp_path / "train.json").read_text())["selected"] == "frozen"
    meta = json.loads((head / "training.json").read_text())
    assert (meta["mode"], meta["selected"]) == ("top_layers", "frozen")
    assert not (head / "encoder").exists()  # no copy of the untouched encoder
    export(head, tmp_path / "export", encoder=str(tiny_bert))
    modules = json.loads((tmp_path / "export" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling",
                                                                 "Normalize"]
    card = (tmp_path / "export" / "README.md").read_text()
    assert "the frozen encoder (no trained epoch beat it on validation)" in card
    assert "its top layers and a `mlp` head (top_layers mode)" in card
    texts = sentences(12)
    spec = p.encoders.models["tiny"]
    frozen = torch.nn.functional.normalize(
        FrozenEncoder("tiny", spec, torch.device("cpu")).encode(texts, 8).float(), dim=-1)
    served = load_model(tmp_path / "export", "cpu").encode(texts)
    assert torch.allclose(served, frozen, atol=1e-6), float((served - frozen).abs().max())
