"""Prompts and last-token pooling in the export: plain `SentenceTransformer(dir)` with
`encode_query` / `encode_document` / `encode` gives `load_model(dir).encode(texts, role=...)`
and the pipeline's own role vectors (prompt tokens within max_length, `include_prompt` either
way), on a tiny random BERT; last-token pooling under right and left padding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from simtune.encoders import FrozenEncoder
from simtune.export.stage import export
from simtune.model import load_model
from simtune.params import EncoderParams
from tests.conftest import save_tiny_bert
from tests.export.test_export import TEXTS, _head_dir

st = pytest.importorskip("sentence_transformers")
E5 = {"query": "query: what is ", "document": "passage: the ", "include_prompt": True}


def _frozen(head_dir: Path, role: str, batch_size: int = 3) -> torch.Tensor:
    """The pipeline's vectors of TEXTS as `role` texts, through the (random) head."""
    spec = EncoderParams(**json.loads((head_dir / "training.json").read_text())["encoder"])
    x = FrozenEncoder("tiny", spec, torch.device("cpu"), role).encode(TEXTS, batch_size)
    from simtune import heads

    with torch.inference_mode():
        return heads.load(head_dir)(x)


def _st(directory: Path) -> Any:
    return st.SentenceTransformer(str(directory), device="cpu")  # no trust_remote_code


@pytest.mark.parametrize(("include_prompt", "pooling"), [
    (True, "mean"), (False, "mean"), (False, "cls"), (True, "lasttoken")])
def test_sentence_transformers_encode_query_and_document_equal_ours(
        tiny_bert: Path, tmp_path: Path, include_prompt: bool, pooling: str) -> None:
    prompts = {**E5, "include_prompt": include_prompt}
    # max_length 24: long texts truncated with the prompt's tokens counted in (a prompt of 8-9
    # tokens leaves the text 13-14, above the least, half the window: chunks.check_room)
    head_dir = _head_dir(tmp_path, tiny_bert, "linear", pooling=pooling, prompts=prompts,
                         max_length=24)
    assert export(head_dir, tmp_path / "export", encoder=str(tiny_bert)) is True
    plain, ours = _st(tmp_path / "export"), load_model(tmp_path / "export", "cpu")
    for role, theirs in (("query", plain.encode_query), ("document", plain.encode_document)):
        want = _frozen(head_dir, role)
        got = torch.as_tensor(theirs(TEXTS, convert_to_numpy=True))
        assert torch.allclose(got, want, atol=1e-5), (role, (got - want).abs().max())
        assert torch.allclose(ours.encode(TEXTS, role=role), want, atol=1e-5), role
    # plain encode is a query, as ours is by default
    assert torch.allclose(torch.as_tensor(plain.encode(TEXTS, convert_to_numpy=True)),
                          ours.encode(TEXTS), atol=1e-5)
    # and the prompts do change the vectors
    none = _head_dir(tmp_path / "none", tiny_bert, "linear", pooling=pooling, max_length=24)
    assert not torch.allclose(_frozen(none, "query"), _frozen(head_dir, "query"), atol=1e-3)
    config = json.loads((tmp_path / "export" / "config_sentence_transformers.json").read_text())
    assert config["prompts"] == {"query": E5["query"], "document": E5["document"]}
    assert config["default_prompt_name"] == "query"


def test_an_export_without_prompts_writes_none(tiny_bert: Path, tmp_path: Path) -> None:
    export(_head_dir(tmp_path, tiny_bert, "linear"), tmp_path / "export", encoder=str(tiny_bert))
    config = json.loads((tmp_path / "export" / "config_sentence_transformers.json").read_text())
    assert (config["prompts"], config["default_prompt_name"]) == ({}, None)
    pool = json.loads((tmp_path / "export" / "1_Pooling" / "config.json").read_text())
    assert "include_prompt" not in pool and "pooling_mode_lasttoken" not in pool


@pytest.mark.parametrize("side", ["right", "left"])
def test_lasttoken_pooling_equals_sentence_transformers_on_either_padding_side(
        tmp_path: Path, side: str) -> None:
    model = save_tiny_bert(tmp_path / "bert")
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "padding_side": side}))
    head_dir = _head_dir(tmp_path, model, "mlp", pooling="lasttoken", max_length=32,
                         prompts={"query": "what is ", "document": "", "include_prompt": True})
    export(head_dir, tmp_path / "export", encoder=str(model))
    encoder = FrozenEncoder("tiny", EncoderParams(**json.loads(
        (head_dir / "training.json").read_text())["encoder"]), torch.device("cpu"))
    mask = encoder.tokenize(TEXTS)["attention_mask"]
    assert mask[:, 0 if side == "left" else -1].tolist().count(0) >= 3  # padded on `side`
    plain = _st(tmp_path / "export")
    for role, theirs in (("query", plain.encode_query), ("document", plain.encode_document)):
        # one batch each: BERT's absolute positions move with left padding, so a text's vector
        # depends on its batch's longest (decoders' rotary positions do not)
        want = _frozen(head_dir, role, batch_size=len(TEXTS))
        got = torch.as_tensor(theirs(TEXTS, convert_to_numpy=True, batch_size=len(TEXTS)))
        assert torch.allclose(got, want, atol=1e-5), (side, role, (got - want).abs().max())
