"""LoRA (`train.lora`, through peft): off by default; the adapted model merged into plain
weights equals the adapted model, for the cut top (top_layers) and the whole encoder (full);
bad settings are one line naming the key. (GradCache and DDP with LoRA on: test_top_layers.py,
test_train.py; training and export of a merged model: test_layers.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from typer.testing import CliRunner

from simtune import layers
from simtune import params as P
from simtune.cache import stage as cache
from simtune.cache.views import layer_for
from simtune.errors import UserError
from simtune.train import lora
from stages import app
from tests.cache_helpers import sentences
from tests.conftest import repo_params
from tests.train_helpers import project, stage_args

ON = P.LoraParams(r=4, alpha=8, dropout=0.1, target_modules="all-linear")


def _trained(model: torch.nn.Module) -> None:
    """Adapters as after some training: B drawn at random (it starts at zero, a no-op)."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, q in model.named_parameters():
            if "lora_B" in name:
                q.copy_(torch.randn(q.shape, generator=gen) * 0.2)


def test_lora_is_off_by_default_and_then_changes_nothing(tiny_bert: Path) -> None:
    off = P.validate(repo_params()).train.lora
    assert off.r == 0
    model = transformers.AutoModel.from_pretrained(tiny_bert)
    assert lora.adapt(model, off) is model and lora.merged(model) is model


def test_merged_top_layers_equal_the_adapted_top(tmp_path: Path, tiny_bert: Path) -> None:
    """Top 1 of 2 layers with adapters -> merged into the full model and saved -> cut again
    from the saved model: the same last hidden states; only the top layer's adapted linear
    weights differ from the original."""
    top = lora.adapt(layers.top_model(tiny_bert, 1), ON)
    _trained(top)
    states = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    layers.merge(tiny_bert, lora.merged(top), 1).save_pretrained(tmp_path / "merged")
    assert type(top).__name__ == "PeftModel"  # merging copied: the adapted model trains on
    with torch.no_grad():
        want = top.eval()(inputs_embeds=states, attention_mask=mask).last_hidden_state
        got = layers.top_model(tmp_path / "merged", 1)(
            inputs_embeds=states, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert float((got - want)[real].abs().max()) <= 1e-5
    original = transformers.AutoModel.from_pretrained(tiny_bert).state_dict()
    saved = transformers.AutoModel.from_pretrained(tmp_path / "merged").state_dict()
    changed = {k for k in original if not torch.equal(original[k], saved[k])}
    assert changed == {f"encoder.layer.1.{m}.weight" for m in (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "intermediate.dense", "output.dense")}


def test_merged_encoder_equals_the_adapted_encoder_in_full_mode(tmp_path: Path,
                                                                tiny_bert: Path) -> None:
    encoder = lora.adapt(transformers.AutoModel.from_pretrained(tiny_bert), ON)
    _trained(encoder)
    adapted = {n for n, q in encoder.named_parameters() if q.requires_grad}
    assert adapted and all("lora_" in n and "pooler" not in n for n in adapted)
    lora.merged(encoder).save_pretrained(tmp_path / "merged")
    tokens = transformers.AutoTokenizer.from_pretrained(tiny_bert)(
        sentences(6), padding=True, return_tensors="pt")
    with torch.no_grad():
        want = encoder.eval()(**tokens).last_hidden_state
        got = transformers.AutoModel.from_pretrained(tmp_path / "merged")(**tokens
                                                                          ).last_hidden_state
    assert float((got - want).abs().max()) <= 1e-5
    assert not list((tmp_path / "merged").glob("adapter*"))  # plain weights, no adapter files


def test_bad_lora_settings_are_one_line_naming_the_key(tmp_path: Path, tiny_bert: Path
                                                       ) -> None:
    raw = repo_params()
    raw["train"]["lora"]["target_modules"] = []
    with pytest.raises(UserError, match=r"^params.yaml: train\.lora: .*target_modules"):
        P.validate(raw)
    raw, params_file = project(tmp_path, tiny_bert, mode="top_layers")
    raw["train"]["schedule"]["top_layers"].update(layers=1, max_epochs=1, batch_size=8)
    raw["train"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]}
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.validate(raw)
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    result = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert re.fullmatch(r"error: train\.lora\.target_modules: \['q_proj'\]: no such "
                        r"linear modules in the trainable layers of a BertModel \(.*q_proj.*\)",
                        result.stderr.strip().splitlines()[-1]), result.output


def test_item9_lora_rank_above_the_layer_width_is_refused(tiny_bert: Path) -> None:
    """r 33 on the tiny BERT's 32-wide layers: no more capacity than r 32, only compute (issue
    28, item 9); r 32 still adapts."""
    top = layers.top_model(tiny_bert, 1)
    wide = ON.model_copy(update={"r": 33})
    with pytest.raises(UserError) as e:
        lora.adapt(top, wide)
    assert str(e.value) == (
        "train.lora.r: 33 is more than the width of the layers it adapts (hidden_size "
        "32): a rank above it adds no capacity, only compute; use at most 32 (LoRA's point is "
        "r much smaller)")
    adapted = lora.adapt(layers.top_model(tiny_bert, 1), ON.model_copy(update={"r": 32}))
    assert {tuple(q.shape) for n, q in adapted.named_parameters() if "lora_A" in n} == {(32, 32),
                                                                                       (32, 64)}


def test_item9_lora_in_head_mode_is_said_to_be_ignored(tmp_path: Path, tiny_bert: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Head mode trains no encoder layer: LoRA set there is ignored, and a warning says so in
    one line (issue 28, item 9); r 0 says nothing."""
    from simtune.train.data import check_trainable, load_data

    raw, _ = project(tmp_path, tiny_bert, n=24)
    for r, said in ((4, True), (0, False)):
        raw["train"]["lora"]["r"] = r
        p = P.validate(raw)
        caplog.clear()
        data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared",
                         tmp_path / "cache")
        check_trainable(data, p.train, 1)
        warned = [m for m in caplog.messages if "lora" in m]
        assert warned == (["train.lora.r: 4 is ignored in head mode (no encoder layer "
                           "trains); LoRA applies in train.mode top_layers or full"]
                          if said else [])
