"""Prompts in the cache: each role's texts are embedded with its prompt; a shared encoder whose
document prompt differs keeps documents in their own view (`<name>@document`); no prompt (or
empty ones) keeps today's fingerprints and views."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from simtune import params as P
from simtune.cache import stage as cache
from simtune.cache import vectors
from simtune.cache.views import open_pair, view_name
from simtune.encoders import FrozenEncoder, describe, fingerprint
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import text_id
from simtune.prepare.prepared import write as write_prepared
from tests.cache_helpers import cache_params, encoder_params, sentences
from tests.conftest import repo_params

E5 = {"query": "what is ", "document": "the ", "include_prompt": False}


def _pairs(root: Path, model: Path, prompts: dict[str, Any] | None, **train: Any
           ) -> P.Params:
    """12 (query, document) pairs prepared under `root`, params for the tiny encoder (mnrl,
    `train` keys updated)."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"q": q, "d": d} for q, d in zip(sentences(12), sentences(12, 100), strict=True)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = repo_params()
    raw["prepare"].update(source="file")
    raw["prepare"]["file"].update(path=str(root / "pairs.jsonl"), kind="pairs")
    raw["prepare"]["file"]["columns"].update(query="q", positive="d")
    raw["encoders"] = encoder_params(model, prompts=prompts)
    raw["cache"] = cache_params()
    raw["train"]["loss"]["name"] = "mnrl"
    # an `encoder` given in part keeps the rest of params.yaml's train.encoder (lora, ...)
    raw["train"].update({k: {**raw["train"][k], **v} if k == "encoder" else v
                         for k, v in train.items()})
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    return p


def _by_id(table: vectors.CacheTable) -> dict[str, torch.Tensor]:
    return dict(zip(table.ids.to_pylist(), table.vectors, strict=True))


def test_each_role_is_embedded_with_its_prompt_in_its_own_view(tmp_path: Path,
                                                               tiny_bert: Path) -> None:
    p = _pairs(tmp_path, tiny_bert, E5)
    results = cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache)
    assert sorted(r.needed for r in results) == [12, 12]
    assert sorted(d.name for d in (tmp_path / "cache").iterdir()) == ["tiny", "tiny@document"]
    q_table, d_table = open_pair(tmp_path / "cache", p.encoders, p.cache, "pairs", placed=False)
    assert q_table is not d_table and len(q_table) == len(d_table) == 12
    spec = p.encoders.models["tiny"]
    for table, role, texts in ((q_table, "query", sentences(12)),
                               (d_table, "document", sentences(12, 100))):
        want = FrozenEncoder("tiny", spec, torch.device("cpu"), role).encode(texts, 5)
        got = torch.stack([_by_id(table)[text_id(t)] for t in texts])
        assert torch.allclose(got, want, atol=1e-6), role
        assert table.manifest.fingerprint == fingerprint(describe("tiny", spec, role=role))
        assert table.manifest.encoder == view_name("tiny", spec, role)
    # the prompt changes the vectors: not those of the texts without it
    bare = FrozenEncoder("tiny", spec.model_copy(update={"prompts": None}),
                         torch.device("cpu")).encode(sentences(12), 5)
    assert (bare - torch.stack([_by_id(q_table)[text_id(t)] for t in sentences(12)])
            ).abs().max() > 1e-2


@pytest.mark.parametrize("prompts", [None, {"query": "", "document": "", "include_prompt": True},
                                     {"query": "x ", "document": "x ", "include_prompt": True}])
def test_one_prompt_for_both_roles_is_one_view(tmp_path: Path, tiny_bert: Path,
                                               prompts: dict[str, Any] | None) -> None:
    p = _pairs(tmp_path, tiny_bert, prompts)
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache)
    assert [d.name for d in (tmp_path / "cache").iterdir()] == ["tiny"]
    q_table, d_table = open_pair(tmp_path / "cache", p.encoders, p.cache, "pairs", placed=False)
    assert q_table is d_table and len(q_table) == 24
    unprompted = fingerprint(describe("tiny", p.encoders.models["tiny"].model_copy(
        update={"prompts": None})))
    assert (q_table.manifest.fingerprint == unprompted) == (prompts is None or
                                                            prompts["query"] == "")


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
def test_the_onnx_export_leaves_the_prompt_out_as_torch_does(tmp_path: Path, tiny_bert: Path,
                                                             pooling: str) -> None:
    """The prompt's length is a constant of the exported graph (one export per fingerprint,
    which holds the prompt): ONNX Runtime gives torch's vectors of the document role."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from simtune.cache import backends

    spec = P.EncoderParams(**{**encoder_params(tiny_bert, pooling=pooling, prompts=E5)[
        "models"]["tiny"]})
    encoder = FrozenEncoder("tiny", spec, torch.device("cpu"), "document")
    assert encoder.skip == 2  # [CLS] the
    fast = backends.select(encoder, "onnx", tmp_path, None)
    assert isinstance(fast, backends.OnnxEncoder)
    for texts in (["one"], sentences(5), sentences(9, start=40)):
        batch = encoder.tokenize(texts)
        with torch.inference_mode():
            want = encoder.embed(batch)
        assert float((fast.embed(batch) - want).abs().max()) <= 1e-6
