"""The export: plain `SentenceTransformer(dir)` (no remote code) gives the pipeline's vectors for
every head type, a head with no plain form falls back to `trust_remote_code`, `load_model` reads
every format version, and the model card carries the metrics of `reports/metrics.json`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.export import st_layout
from simtune.export.model_card import CardInputs
from simtune.export.stage import export
from simtune.model import load_model
from simtune.params import EncoderParams
from stages import app
from tests.cache_helpers import encoder_params, sentences
from tests.conftest import repo_params, save_tiny_bert, write_params

st = pytest.importorskip("sentence_transformers")
# long texts too: the export must truncate at max_length exactly as the pipeline does
TEXTS = [*sentences(6), " ".join(sentences(12))]
ATOL = {"float32": 1e-5, "float16": 2e-3}  # float16: the cache rounds the encoder's vectors


def _head_dir(root: Path, model: Path, kind: str, normalize_output: bool = False,
              mode: str = "head", **spec: Any) -> Path:
    """A trained-looking head directory: random weights (no head is the identity), the tiny
    encoder's training.json."""
    head = heads.build(kind, 32, 2, 0.1)
    torch.manual_seed(7)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    directory = root / f"head-{kind}"
    heads.save(head, directory)
    enc = encoder_params(model, **{"max_length": 8, "normalize": False, **spec})["models"]["tiny"]
    (directory / "training.json").write_text(json.dumps({
        "mode": mode, "kind": "groups", "query_encoder": "tiny", "document_encoder": "tiny",
        "encoder": enc, "normalize_output": normalize_output}))
    return directory


def _pipeline(head_dir: Path, encoder: Path | None = None) -> torch.Tensor:
    """What train and evaluate compute: the (cached, in its dtype) encoder vector, the head,
    L2 normalisation when `normalize_output`."""
    meta = json.loads((head_dir / "training.json").read_text())
    spec = EncoderParams(**{**meta["encoder"], "model": str(encoder or meta["encoder"]["model"])})
    cached = FrozenEncoder("tiny", spec, torch.device("cpu")).encode(TEXTS, 4)
    cached = cached.to(getattr(torch, spec.dtype)).float()
    with torch.inference_mode():
        out = heads.load(head_dir)(cached)
    return torch.nn.functional.normalize(out, dim=-1) if meta["normalize_output"] else out


def _plain(directory: Path) -> torch.Tensor:
    model = st.SentenceTransformer(str(directory), device="cpu")  # no trust_remote_code
    return torch.as_tensor(model.encode(TEXTS, convert_to_numpy=True))


def _types(directory: Path) -> list[str]:
    return [m["type"] for m in json.loads((directory / "modules.json").read_text())]


@pytest.mark.parametrize(("kind", "normalize_output", "spec"), [
    ("identity", False, {}),
    ("linear", False, {}),
    ("skip_connection", True, {"pooling": "cls"}),
    ("gated", False, {"pooling": "max"}),
    ("mlp", False, {}),
    ("mlp", True, {"normalize": True}),
    ("linear", False, {"dtype": "float16"}),
])
def test_every_head_loads_plainly_with_the_pipeline_vectors(
        tiny_bert: Path, tmp_path: Path, kind: str, normalize_output: bool,
        spec: dict[str, Any]) -> None:
    head_dir = _head_dir(tmp_path, tiny_bert, kind, normalize_output, **spec)
    assert export(head_dir, tmp_path / "export", encoder=str(tiny_bert)) is True
    want = _pipeline(head_dir)
    got = _plain(tmp_path / "export")
    atol = ATOL[spec.get("dtype", "float32")]
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    assert torch.allclose(load_model(tmp_path / "export", "cpu").encode(TEXTS), want, atol=atol)
    if kind != "identity":  # the random head really changes the vectors
        assert not torch.allclose(_pipeline(_head_dir(tmp_path / "id", tiny_bert, "identity",
                                                      normalize_output, **spec)), want,
                                  atol=1e-2)
    n_dense = {"identity": 0, "mlp": 2}.get(kind, 1)
    types = _types(tmp_path / "export")
    assert all(t.startswith("sentence_transformers.models.") for t in types)
    assert [t.rsplit(".", 1)[1] for t in types] == (
        ["Transformer", "Pooling"] + ["Normalize"] * spec.get("normalize", False)
        + ["Dense"] * n_dense + ["Normalize"] * normalize_output)
    config = json.loads((tmp_path / "export" / "simtune.json").read_text())
    assert (config["format_version"], config["sentence_transformers"]) == (3, "plain")


def test_a_fine_tuned_encoder_loads_plainly(tiny_bert: Path, tmp_path: Path) -> None:
    """top_layers and full modes save an ordinary transformers model next to the head: the
    export serves it, not the encoder named in params."""
    head_dir = _head_dir(tmp_path, tiny_bert, "mlp", True, mode="full")
    save_tiny_bert(head_dir / "encoder", seed=1)
    export(head_dir, tmp_path / "export")
    want = _pipeline(head_dir, head_dir / "encoder")
    assert torch.allclose(_plain(tmp_path / "export"), want, atol=1e-5)
    assert torch.allclose(load_model(tmp_path / "export", "cpu").encode(TEXTS), want, atol=1e-5)
    assert not torch.allclose(_pipeline(head_dir), want, atol=1e-2)  # not the original encoder


def test_a_head_without_a_plain_form_needs_remote_code_and_says_so(
        tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A head type with no Dense rule (none today; simulated) is served by HeadModule."""
    monkeypatch.delitem(st_layout.RULES, "gated")
    head_dir = _head_dir(tmp_path, tiny_bert, "gated", True)
    with caplog.at_level(logging.INFO, logger="simtune.model"):
        assert export(head_dir, tmp_path / "export", encoder=str(tiny_bert)) is False
    assert "head 'gated' has no plain sentence-transformers form" in caplog.text
    assert "trust_remote_code=True" in caplog.text
    assert "simtune.st_module.HeadModule" in _types(tmp_path / "export")
    config = json.loads((tmp_path / "export" / "simtune.json").read_text())
    assert config["sentence_transformers"] == "trust_remote_code"
    with pytest.raises(ValueError, match="trust_remote_code"):
        st.SentenceTransformer(str(tmp_path / "export"), device="cpu")
    model = st.SentenceTransformer(str(tmp_path / "export"), device="cpu", trust_remote_code=True)
    got = torch.as_tensor(model.encode(TEXTS, convert_to_numpy=True))
    assert torch.allclose(got, _pipeline(head_dir), atol=1e-5)
    card = (tmp_path / "export" / "README.md").read_text()
    assert 'trust_remote_code=True' in card


def test_older_export_formats_still_load(tiny_bert: Path, tmp_path: Path) -> None:
    """Version 2 (no `sentence_transformers` key) and 1 (no name, never normalised)."""
    head_dir = _head_dir(tmp_path, tiny_bert, "linear", True)
    export(head_dir, tmp_path / "export", encoder=str(tiny_bert))
    path = tmp_path / "export" / "simtune.json"
    config = json.loads(path.read_text())
    want = _pipeline(head_dir)
    del config["sentence_transformers"]
    path.write_text(json.dumps({**config, "format_version": 2}))
    assert torch.allclose(load_model(tmp_path / "export", "cpu").encode(TEXTS), want, atol=1e-5)
    del config["encoder_name"], config["normalize_output"]
    path.write_text(json.dumps({**config, "format_version": 1}))
    raw = load_model(tmp_path / "export", "cpu").encode(TEXTS)
    assert torch.allclose(torch.nn.functional.normalize(raw, dim=-1), want, atol=1e-5)
    assert not torch.allclose(raw.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-3)


METRICS = {  # the shape evaluate writes to reports/metrics.json
    "trained": {"p@1": 0.8125, "recall@1": 0.8125, "recall@5": 0.9375, "mrr@10": 0.86,
                "ndcg@10": 0.71, "map@r": 0.55},
    "baseline": {"p@1": 0.5, "recall@1": 0.5, "recall@5": 0.75, "mrr@10": 0.6, "ndcg@10": 0.5,
                 "map@r": 0.3},
    "lift": {"p@1": 0.3125, "recall@1": 0.3125, "recall@5": 0.1875, "mrr@10": 0.26,
             "ndcg@10": 0.21, "map@r": 0.25},
    "significance": {m: {"p_value": 0.0123, "ci95": [0.1, 0.4]}
                     for m in ("p@1", "mrr@10", "ndcg@10", "map@r")},
    "queries": 16, "corpus": 40, "queries_without_relevant": 0}
DATA_REPORT = {"rows": 90, "texts": 80, "examples": {"train": 40, "val": 20, "test": 20}}


def _front_matter(card: str) -> dict[str, Any]:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_the_stage_writes_a_model_card_with_the_evaluated_metrics(tiny_bert: Path,
                                                                  tmp_path: Path) -> None:
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    raw["train"]["head"]["type"] = "skip_connection"
    params_file = write_params(tmp_path / "params.yaml", raw)
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    (tmp_path / "prepare.json").write_text(json.dumps(DATA_REPORT))
    head_dir = _head_dir(tmp_path, tiny_bert, "skip_connection", True)
    result = CliRunner().invoke(app, [
        "export", "--head", str(head_dir), "--out", str(tmp_path / "export"), "--params",
        str(params_file), "--metrics", str(tmp_path / "metrics.json"), "--data-report",
        str(tmp_path / "prepare.json")])
    assert result.exit_code == 0, result.output
    assert "loads with plain SentenceTransformer" in result.stderr
    card = (tmp_path / "export" / "README.md").read_text()
    front = _front_matter(card)
    assert (front["library_name"], front["pipeline_tag"]) == ("sentence-transformers",
                                                              "sentence-similarity")
    assert {"sentence-transformers", "sentence-similarity", "skip_connection-head"} <= set(
        front["tags"])
    assert "base_model" not in front  # a local encoder has no Hub id
    assert front["metrics"] == list(METRICS["trained"])
    reported = front["model-index"][0]["results"][0]["metrics"]
    assert {m["type"]: m["value"] for m in reported} == METRICS["trained"]
    assert "| p@1 | 0.8125 | 0.5000 | +0.3125 | 0.0123 |" in card
    assert "| mrr@10 | 0.8600 | 0.6000 | +0.2600 | 0.0123 |" in card
    assert "Test split: 16 queries against a corpus of 40." in card
    assert "80 distinct texts; examples: train 40, val 20, test 20." in card
    # issue 36 item 10: the data sentence names the kind once, and the batch in force is
    # listed, not params.yaml's 1024: 40 training examples, train.min_steps 4 -> 10, raised to
    # train.min_batch 32 (the train stage's `examples.batch_for`: steps of 32 and 8)
    assert ("## Data\n\nTREC question classification (fine labels, 50 classes); groups: texts "
            "with the same label are similar. 80 distinct texts;") in card
    assert ("| `train.schedule.head.batch_size` | 32 (params.yaml 1024: 2 steps an epoch over "
            "40 training examples; train.min_steps 4, min_batch 32) |") in card
    assert "-S train.schedule.head.batch_size=1024" in card  # the reproduction repeats params.yaml
    assert "| `train.head.type` | skip_connection |" in card
    # params.yaml's `auto` on the head's groups data: the card names the loss that ran
    assert P.load(params_file).train.loss.name == "auto"
    assert "| `train.loss.name` | supcon |" in card and "-S train.loss.name=supcon" in card
    assert "| `train.loss.temperature` | 0.05 |" in card  # supcon's own key
    assert "\n  -S train.mode=head \\\n  -S train.head.type=skip_connection \\\n" in card
    assert 'SentenceTransformer("path/to/export")\n' in card
    st_config = json.loads((tmp_path / "export" / "config_sentence_transformers.json").read_text())
    assert st_config["similarity_fn_name"] == "cosine"
    # sentence-transformers reads the card without complaint and keeps its text
    model = st.SentenceTransformer(str(tmp_path / "export"), device="cpu")
    assert "0.8125" in model._model_card_text


def test_the_card_of_a_pairs_head_names_mnrl_and_refuses_a_groups_loss(tiny_bert: Path,
                                                                         tmp_path: Path) -> None:
    """A head trained on pairs, exported with params.yaml's `auto`: the card's loss is mnrl
    (with mnrl's own keys); with a loss pairs cannot take the export is one line, no folder."""
    head_dir = _head_dir(tmp_path, tiny_bert, "linear")
    meta = json.loads((head_dir / "training.json").read_text())
    (head_dir / "training.json").write_text(json.dumps({**meta, "kind": "pairs"}))
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    export(head_dir, tmp_path / "export", CardInputs(params=P.validate(raw)))
    card = (tmp_path / "export" / "README.md").read_text()
    assert "| `train.loss.name` | mnrl |" in card and "| `train.loss.scale` | 20.0 |" in card
    assert "train.loss.temperature" not in card  # supcon's key is not this model's
    raw["train"]["loss"]["name"] = "supcon"
    with pytest.raises(UserError) as e:
        export(head_dir, tmp_path / "export2", CardInputs(params=P.validate(raw)))
    assert str(e.value) == (f"train.loss.name: 'supcon' needs groups data, the data {head_dir} "
                            "was trained on is pairs (use auto or one of mnrl, contrastive)")
    assert not (tmp_path / "export2").exists()


def test_a_card_without_reports_says_so(tiny_bert: Path, tmp_path: Path) -> None:
    export(_head_dir(tmp_path, tiny_bert, "linear"), tmp_path / "export", CardInputs(),
           encoder=str(tiny_bert))
    card = (tmp_path / "export" / "README.md").read_text()
    front = _front_matter(card)
    assert "metrics" not in front and "model-index" not in front
    assert "No evaluation report was available" in card
    assert "dvc exp run" not in card  # no params: no settings to repeat


def test_a_card_of_a_bad_metrics_file_is_one_line(tiny_bert: Path, tmp_path: Path) -> None:
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    params_file = write_params(tmp_path / "params.yaml", raw)
    (tmp_path / "metrics.json").write_text("{not json")
    result = CliRunner().invoke(app, [
        "export", "--head", str(_head_dir(tmp_path, tiny_bert, "linear")), "--out",
        str(tmp_path / "export"), "--params", str(params_file), "--metrics",
        str(tmp_path / "metrics.json")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.strip().startswith(f"error: {tmp_path / 'metrics.json'}: not valid JSON")
    assert not (tmp_path / "export").exists()


@pytest.mark.integration  # the real MiniLM (installed by `make install`: never skipped)
def test_the_default_configuration_loads_plainly(tmp_path: Path) -> None:
    """params.yaml as shipped: bundled MiniLM (copied into the export), mlp head, cosine."""
    p = P.validate(repo_params())
    enc = p.encoders.models[p.encoders.query]
    head = heads.build(p.train.head.type, 384, p.train.head.expansion, p.train.head.dropout)
    torch.manual_seed(3)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(torch.randn_like(param) * 0.05)
    heads.save(head, tmp_path / "head")
    (tmp_path / "head" / "training.json").write_text(json.dumps({
        "mode": p.train.mode, "kind": "groups", "query_encoder": p.encoders.query,
        "document_encoder": p.encoders.document, "encoder": enc.model_dump(),
        "normalize_output": p.train.loss.distance == "cosine"}))
    export(tmp_path / "head", tmp_path / "export", CardInputs(params=p))
    assert (tmp_path / "export" / "encoder" / "model.safetensors").is_file()
    assert not (tmp_path / "export" / "encoder" / "modules.json").exists()  # its own layout only
    with torch.inference_mode():
        x = FrozenEncoder("minilm", enc, torch.device("cpu")).encode(TEXTS, 4)
        want = torch.nn.functional.normalize(heads.load(tmp_path / "head")(x), dim=-1)
    assert torch.allclose(_plain(tmp_path / "export"), want, atol=1e-5)
    front = _front_matter((tmp_path / "export" / "README.md").read_text())
    assert front["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_the_card_shows_the_batch_each_size_of_data_trained_with() -> None:
    """batch_size 1024, min_steps 2, min_batch 32: 20 examples -> 32 > 20, one batch of all
    20; 300 -> 150 (two steps); 4,306 -> 1024 as set; min_steps 0: 300 -> one batch of all."""
    from simtune.export.model_card import in_force

    def shown(n: int, steps: int = 2) -> str:
        keys = [("train.schedule.head.batch_size", 1024), ("train.min_steps", steps),
                ("train.min_batch", 32)]
        return dict(in_force(keys, {"examples": {"train": n}}))["train.schedule.head.batch_size"]

    assert shown(20) == "20 (params.yaml 1024: one batch of all 20 training examples)"
    assert shown(300) == ("150 (params.yaml 1024: 2 steps an epoch over 300 training "
                          "examples; train.min_steps 2, min_batch 32)")
    assert shown(4306) == "1024"
    assert shown(300, steps=0) == "300 (params.yaml 1024: one batch of all 300 training examples)"


FROZEN = "the frozen encoder (no trained epoch beat it on validation)"


def test_a_kept_frozen_encoder_is_exported_and_described_as_the_frozen_encoder(
        tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 44 item 9: no trained epoch beat epoch 0, so train saved the mlp head at identity
    (reports/train.json `selected: frozen`). The export called it a trained mlp head and chained
    Normalize twice (the encoder's, then the output's over a head that is no module): now its
    modules are the frozen encoder's, its card, tags and log line say so, and its vectors are
    the frozen encoder's."""
    head = heads.build("mlp", 32, 2, 0.1)
    head.load_state_dict(head.identity_state())
    directory = tmp_path / "head-frozen"
    heads.save(head, directory)
    enc = encoder_params(tiny_bert, max_length=8, normalize=True)["models"]["tiny"]
    (directory / "training.json").write_text(json.dumps({
        "mode": "head", "kind": "groups", "query_encoder": "tiny", "document_encoder": "tiny",
        "encoder": enc, "normalize_output": True}))
    out = tmp_path / "export"
    with caplog.at_level(logging.INFO, logger="simtune.export.stage"):
        assert export(directory, out, CardInputs(), encoder=str(tiny_bert)) is True
    assert [t.rsplit(".", 1)[1] for t in _types(out)] == ["Transformer", "Pooling", "Normalize"]
    frozen = FrozenEncoder("tiny", EncoderParams(**enc), torch.device("cpu")).encode(TEXTS, 4)
    assert torch.allclose(frozen.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-6)
    for got in (_plain(out), load_model(out, "cpu").encode(TEXTS), _pipeline(directory)):
        assert torch.allclose(got, frozen, atol=1e-6), (got - frozen).abs().max()
    assert f"({FROZEN}: Transformer -> Pooling -> Normalize)" in caplog.text
    assert "head 'mlp'" not in caplog.text
    card = (out / "README.md").read_text()
    tags = _front_matter(card)["tags"]
    assert "frozen-encoder" in tags and "mlp-head" not in tags
    assert f"# simtune tiny: {FROZEN}\n" in card
    assert f"| head | none: {FROZEN}; no epoch of the trained `mlp` head was kept |" in card
    assert f"This is {FROZEN}, exported with simtune" in card
    assert "mlp head\n" not in card and "the head trained on cached embeddings" not in card
    assert "| modules | Transformer -> Pooling -> Normalize |" in card
