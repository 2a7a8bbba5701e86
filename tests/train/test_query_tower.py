"""A query tower (issue 37): `train.head.side: query` in top_layers mode. The encoder's top
layers train for the queries alone, the documents keep the frozen encoder's vectors (the cached
ones: nothing re-embedded), and the export is one sentence-transformers `Router` over both
encoders: `encode_document` is the frozen encoder's, `encode_query` is `load_model`'s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from simtune import params as P
from simtune import st_files
from simtune.cache import stage as cache
from simtune.cache.views import layer_for
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.export.model_card import CardInputs
from simtune.export.stage import export
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from simtune.train import headroom
from simtune.train.stage import validation_task
from tests.conftest import write_params
from tests.train_helpers import project, trained_evaluated_exported

st = pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def tower(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("query-tower")
    raw, params_file = project(root, tiny_bert, mode="top_layers")
    t = raw["train"]
    t["head"].update(side="query", dropout=0.0)
    t["frozen_candidate"] = False  # a trained epoch is kept: the tower differs from frozen
    t["schedule"]["top_layers"].update({"layers": 1, "lr": 0.01, "head_lr": 0.05,
                                        "batch_size": 16, "max_epochs": 3, "patience": 3})
    write_params(params_file, raw)
    p = P.validate(raw)
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    return {**trained_evaluated_exported(root, params_file), "model": str(tiny_bert),
            "train": json.loads((root / "train.json").read_text())}


def _frozen(tower: dict[str, Any], texts: list[str]) -> torch.Tensor:
    p = tower["p"]
    return FrozenEncoder("tiny", p.encoders.models["tiny"], torch.device("cpu")).encode(texts, 8)


def test_the_tower_trains_its_top_layer_and_its_epoch_zero_is_the_frozen_encoder(
        tower: dict[str, Any]) -> None:
    root, data, p = tower["root"], tower["data"], tower["p"]
    meta = json.loads((root / "head" / "training.json").read_text())
    assert (meta["mode"], meta["head_side"]) == ("top_layers", "query")
    assert tower["train"]["best_epoch"] >= 1
    # epoch 0: the cached states through the untrained top layer are the frozen vectors, so
    # its validation is the frozen encoder's (the cached vectors scored the same way)
    want = headroom.frozen_metrics(data, validation_task(data, p.train.head.side,
                                                         p.evaluate.corpus))
    assert want is not None
    got = tower["train"]["frozen_val"]
    for metric in ("p@1", "mrr@10", "map@r"):
        assert got[f"val/{metric}"] == pytest.approx(want[metric], abs=1e-6), metric
    # the tower's top layer trained; the frozen encoder (documents) did not
    tuned = load_file(str(root / "head" / "encoder" / "model.safetensors"))
    frozen = load_file(str(Path(tower["model"]) / "model.safetensors"))
    moved = [k for k in frozen if not torch.equal(frozen[k], tuned[k])]
    assert moved and all(".layer.1." in k for k in moved)  # the top layer of 2, only


def test_evaluate_ranks_the_towers_queries_against_the_frozen_cached_corpus(
        tower: dict[str, Any]) -> None:
    root, data, report = tower["root"], tower["data"], tower["report"]
    assert report["head_side"] == "query"
    model = load_model(root / "head", encoder=tower["model"])
    q = model.encode(tower["texts"]["test"], 8)
    train, test = data.splits["train"].tensors, data.splits["test"].tensors
    corpus = data.q_vectors[train["rows"]].float()
    top = (F.normalize(q, dim=-1) @ F.normalize(corpus, dim=-1).T).argmax(1)
    p1 = float((train["labels"][top] == test["labels"]).float().mean())
    assert report["trained"]["p@1"] == pytest.approx(p1, abs=1e-9)
    frozen_q = data.q_vectors[test["rows"]].float()
    assert not torch.allclose(model.encoder.encode(tower["texts"]["test"], 8), frozen_q,
                              atol=1e-3)  # the queries' tower is not the frozen encoder


def test_the_model_embeds_documents_with_the_frozen_encoder_and_search_reads_the_cache(
        tower: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    from simtune.evaluate.search import search

    root, texts = tower["root"], tower["texts"]["train"]
    model = load_model(root / "head", encoder=tower["model"])
    assert torch.equal(model.encode(texts, 8, role="document"), _frozen(tower, texts))
    with caplog.at_level("INFO"):
        hits = search(tower["p"], texts[0], 3, root / "head", root / "prepared", root / "cache")
    assert "embedding the corpus" not in caplog.text  # the cached frozen vectors, not again
    corpus = load_prepared(root / "prepared").text_map()
    frozen = _frozen(tower, list(corpus.values()))
    want = sorted(F.cosine_similarity(model.encode([texts[0]]), frozen).tolist(),
                  reverse=True)[:3]
    assert [h.score for h in hits] == pytest.approx(want, abs=1e-5)


def test_a_head_folder_names_the_frozen_encoder_it_cannot_find(tower: dict[str, Any]) -> None:
    with pytest.raises(UserError, match=r"training\.json: encoder\.model .* outside the head"):
        load_model(tower["root"] / "head")


def test_the_export_is_one_router_over_the_tower_and_the_frozen_encoder(
        tower: dict[str, Any]) -> None:
    root, texts = tower["root"], tower["texts"]["test"]
    out = root / "export"
    config = json.loads((out / "simtune.json").read_text())
    assert (config["head_side"], config["document_encoder"]) == ("query", "document_encoder")
    assert json.loads((out / "modules.json").read_text()) == [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}]
    model = st.SentenceTransformer(str(out), device="cpu")  # simtune not needed
    docs = torch.as_tensor(model.encode_document(texts, convert_to_numpy=True))
    assert torch.allclose(docs, _frozen(tower, texts), atol=1e-6)
    queries = torch.as_tensor(model.encode_query(texts, convert_to_numpy=True))
    ours = load_model(out)
    assert torch.allclose(queries, ours.encode(texts, 8), atol=1e-6)
    assert torch.allclose(queries, load_model(root / "head", encoder=tower["model"]).encode(
        texts, 8), atol=1e-6)
    assert not torch.allclose(queries, docs, atol=1e-3)
    assert torch.equal(ours.encode(texts, 8, role="document"), _frozen(tower, texts))
    card = (out / "README.md").read_text()
    assert "Existing document vectors stay valid" in card and "query tower" in card
    # the hashed copies are the head's (its Dense modules and the router's config), no encoder
    copies = st_files.head_copies(out)
    assert "router_config.json" in copies and any(c.endswith("_Dense/model.safetensors")
                                                  for c in copies)
    assert not any(c.startswith(("encoder/", "document_encoder/")) for c in copies)


def test_the_tower_export_refuses_an_edited_router_and_is_replaced_by_a_new_export(
        tower: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "export"
    shutil.copytree(tower["root"] / "export", out)
    export(tower["root"] / "head", out, CardInputs(params=tower["p"]))  # an earlier export
    config = json.loads((out / "router_config.json").read_text())
    dense = [m for m in config["structure"]["query"] if m.endswith("_Dense")]
    config["structure"]["document"] += dense  # documents through the head
    (out / "router_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"router_config\.json: changed since the export"):
        load_model(out)
    config["types"]["../x"] = "sentence_transformers.models.Dense"
    (out / "router_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"router_config\.json: \.\./x: .* inside"):
        load_model(out)
    simtune = json.loads((out / "simtune.json").read_text())
    simtune["head_side"] = "both"  # contradicts its document_encoder
    (out / "simtune.json").write_text(json.dumps(simtune))
    with pytest.raises(UserError, match=r"document_encoder is only for head_side query"):
        load_model(out)


def test_the_tower_export_as_a_teacher_embeds_documents_frozen_and_queries_through_it(
        tower: dict[str, Any]) -> None:
    """A distillation teacher (`load_encoder` of an export folder): documents get the frozen
    encoder's vectors, queries the tower's and head's, at the export's window or the params'."""
    from simtune.model import load_encoder

    out, texts = tower["root"] / "export", tower["texts"]["test"]
    saved = load_model(out).encoder.spec
    ours = load_model(out)
    for max_length in (saved.max_length, 16):
        spec = saved.model_copy(update={"model": str(out), "max_length": max_length})
        doc = load_encoder("teacher", spec, torch.device("cpu"), "document")
        query = load_encoder("teacher", spec, torch.device("cpu"), "query")
        if max_length == saved.max_length:
            assert torch.equal(doc.encode(texts, 8), _frozen(tower, texts))
            assert torch.allclose(query.encode(texts, 8), ours.encode(texts, 8), atol=1e-6)
        else:  # the params' window: both towers cut at 16 tokens
            cut = saved.model_copy(update={"model": str(out / "document_encoder"),
                                           "max_length": 16})
            want = FrozenEncoder("t", cut, torch.device("cpu")).encode(texts, 8)
            assert torch.equal(doc.encode(texts, 8), want)
            assert not torch.allclose(query.encode(texts, 8), ours.encode(texts, 8), atol=1e-4)


def test_a_tower_head_folder_without_its_encoder_is_refused_not_served_frozen(
        tower: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    head = tmp_path / "head"
    shutil.copytree(tower["root"] / "head", head, ignore=shutil.ignore_patterns("encoder"))
    with pytest.raises(UserError, match=r"train\.mode top_layers, but the fine-tuned encoder/"):
        load_model(head, encoder=tower["model"])
    with pytest.raises(UserError, match=r"encoder/ beside it is missing"):
        export(head, tmp_path / "export", CardInputs(params=tower["p"]))
