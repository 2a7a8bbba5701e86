"""Full mode over long texts cut into windows (`simtune.chunks`): the live encoder's pooled
vectors equal the frozen encoder's (what evaluate, search and the export serve), GradCache
(chunks splitting a batch between windows of different texts) equals the plain step, and DDP on
2 processes equals 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from simtune import params as P
from simtune.cache import stage as cache
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.prepare.prepared import load as load_prepared
from simtune.train import represent
from simtune.train.data import load_data
from tests.train_helpers import (
    dropout_free,
    project,
    relative_errors,
    step_gradients,
    trained_by_one_and_two_processes,
)

CHUNKS = {"max_length": 10, "chunks": {"max": 3, "overlap": 2, "pool": "mean"}}


def _chunked_project(root: Path, model: Path, mode: str = "full") -> tuple[Path, P.Params]:
    """The small groups project with 10-token windows (most texts span 2-3 windows), full or
    top_layers (the top 1 of 2 layers) mode, one epoch of batch 8."""
    from simtune.cache.views import layer_for

    raw, params_file = project(root, model, n=48)  # 24 training texts: 3 steps of 8
    raw["encoders"]["models"]["tiny"].update(CHUNKS)
    raw["train"]["mode"] = mode
    raw["train"]["schedule"][mode].update(max_epochs=1, batch_size=8)
    raw["train"]["schedule"]["top_layers"]["layers"] = 1
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.validate(raw)
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    return params_file, p


def test_live_windows_pool_to_the_frozen_encoders_vectors(tmp_path: Path, tiny_bert: Path
                                                          ) -> None:
    model = dropout_free(tiny_bert, tmp_path / "bert")
    _, p = _chunked_project(tmp_path, model)
    spec = p.encoders.models["tiny"]
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    live = represent.LiveEncoder(model, spec, None, True).eval()
    split = data.splits["train"]
    with torch.no_grad():
        got = live.embed_split(split, "text")
    windows = [len(ws) for ws in live.chunkers["query"].windows(split.texts["texts"])]
    assert max(windows) == 3 and min(windows) == 1  # long and short texts both
    want = FrozenEncoder("tiny", spec, torch.device("cpu")).encode(split.texts["texts"], 5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_top_layers_pool_each_windows_top_to_the_frozen_encoders_vectors(
        tmp_path: Path, tiny_bert: Path) -> None:
    """top_layers: each window's cached states (a layer view listing each text's windows)
    through the top layers, pooled, then the windows pooled = the whole encoder's chunked
    vectors (what evaluate serves from the saved model)."""
    from simtune.cache.views import layer_for, open_states

    model = dropout_free(tiny_bert, tmp_path / "bert")
    raw, _ = project(tmp_path, model, mode="top_layers")
    raw["encoders"]["models"]["tiny"].update(CHUNKS)
    raw["train"]["schedule"]["top_layers"]["layers"] = 1
    p = P.validate(raw)
    layer = layer_for(p.encoders, p.train)
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache, layer=layer)
    spec = p.encoders.models["tiny"]
    table = open_states(tmp_path / "cache", "tiny", spec, layer, p.cache)
    assert table.windows is not None and len(table.length_np) > len(table)
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    rep = represent.CachedStates(table, model, layer, spec).eval()
    split = data.splits["train"]
    with torch.no_grad():
        got = rep.embed_split(split, "text")
    texts = load_prepared(tmp_path / "prepared").text_map()
    order = [texts[table.ids[int(r)].as_py()] for r in split.tensors["rows"]]
    want = FrozenEncoder("tiny", spec, torch.device("cpu")).encode(order, 5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # a layer view cut with other chunk settings is refused, not pooled wrongly
    other = spec.model_copy(update={"chunks": spec.chunks.model_copy(update={"overlap": 1})})
    with pytest.raises(UserError, match=r"windows cut with chunks .* run the cache stage"):
        open_states(tmp_path / "cache", "tiny", other, layer, p.cache)


@pytest.mark.parametrize("mode", ["full", "top_layers"])
def test_gradcache_over_windows_equals_plain(tmp_path: Path, tiny_bert: Path,
                                             monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    params_file, _ = _chunked_project(tmp_path, dropout_free(tiny_bert, tmp_path / "bert"),
                                      mode)
    steps = step_gradients(tmp_path, params_file, monkeypatch)
    assert len(steps["plain"]) == len(steps["gc"]) == 3
    for got, want in zip(steps["gc"], steps["plain"], strict=True):
        worst = relative_errors(got, want)
        assert any(n.startswith(("rep.encoder", "rep.top")) for n, _ in worst)
        assert worst[0][1] <= 1e-4, worst[:3]


@pytest.mark.integration
def test_ddp_two_processes_over_windows_equal_one(tmp_path: Path, tiny_bert: Path) -> None:
    """Full mode, batch 8 x 2 processes with GradCache (chunks of 3 texts, whose windows a chunk
    keeps together; one all-reduce per step) == 1 process, batch 16, no GradCache."""
    params_file, _ = _chunked_project(tmp_path, dropout_free(tiny_bert, tmp_path / "bert"))
    raw = yaml.safe_load(params_file.read_text())
    raw["train"]["schedule"]["full"]["batch_size"] = 16
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    trained_by_one_and_two_processes(tmp_path, params_file)
    one = load_file(str(tmp_path / "headone" / "model.safetensors"))
    two = load_file(str(tmp_path / "headtwo" / "model.safetensors"))
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-5), (k, (one[k] - two[k]).abs().max())
    enc_one = load_file(str(tmp_path / "headone" / "encoder" / "model.safetensors"))
    enc_two = load_file(str(tmp_path / "headtwo" / "encoder" / "model.safetensors"))
    for k in enc_one:
        assert torch.allclose(enc_one[k], enc_two[k], atol=1e-5), k
    base = load_file(str(tmp_path / "bert" / "model.safetensors"))
    moved = sum(not torch.equal(enc_one[k], base[k]) for k in base if k in enc_one)
    assert moved > 10  # the encoder trained
    assert json.loads((tmp_path / "trainone.json").read_text())["epochs"] == 1


def test_probe_full_modes_prompt_refusal_names_the_encoder(tiny_bert: Path) -> None:
    """Full mode's live encoder refused a prompt that leaves too little room under the key
    `encoders.models.<name>.prompts.document`: a placeholder, not the encoder's name."""
    from tests.cache_helpers import encoder_params
    from tests.conftest import repo_params

    prompts = {"query": "", "document": " ".join(["the"] * 25) + " ", "include_prompt": True}
    spec = P.EncoderParams(**encoder_params(tiny_bert, max_length=32, prompts=prompts)[
        "models"]["tiny"])
    p = P.validate({**repo_params(), "encoders": encoder_params(tiny_bert, max_length=32,
                                                                prompts=prompts)})
    assert p.encoders.models["tiny"] == spec
    with pytest.raises(UserError) as e:
        represent.build("full", p.encoders, {}, p.train.lora, True)
    assert str(e.value) == (
        "encoders.models.tiny.prompts.document: the prompt is 25 tokens, leaving 5 of "
        "max_length 32 for the text (2 special tokens); at least 15 are needed (half the "
        "window): shorten the prompt or raise max_length")
