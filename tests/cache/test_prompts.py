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
from simtune.errors import UserError
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import text_id
from simtune.prepare.prepared import write as write_prepared
from tests.cache_helpers import cache_params, encoder_params, sentences
from tests.conftest import WORDS, repo_params

E5 = {"query": "what is ", "document": "the ", "include_prompt": False}


# a short schedule for both encoder modes (`_pairs(..., schedule=ENCODER_SCHEDULE)`): one epoch
# of batch 4, the top 1 layer in top_layers mode
_ENCODER = {"lr": 0.001, "head_lr": 0.01, "batch_size": 4, "max_epochs": 1, "patience": 1,
            "val_every": 1}
ENCODER_SCHEDULE = {"top_layers": {**_ENCODER, "layers": 1}, "full": _ENCODER}


def _pairs(root: Path, model: Path, prompts: dict[str, Any] | None,
           enc: dict[str, Any] | None = None, **train: Any) -> P.Params:
    """12 (query, document) pairs prepared under `root`, params for the tiny encoder (`enc`
    keys updated; mnrl, `train` keys updated)."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"q": q, "d": d} for q, d in zip(sentences(12), sentences(12, 100), strict=True)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = repo_params()
    raw["prepare"].update(source="file")
    raw["prepare"]["file"].update(path=str(root / "pairs.jsonl"), kind="pairs")
    raw["prepare"]["file"]["columns"].update(query="q", positive="d")
    raw["encoders"] = encoder_params(model, prompts=prompts, **(enc or {}))
    raw["cache"] = cache_params()
    raw["train"]["loss"]["name"] = "mnrl"
    # a section given in part (`schedule={"full": {"lr": ...}}`) keeps the rest of params.yaml's
    raw["train"] = _merged(raw["train"], train)
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    return p


def _merged(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`base` with `new`'s keys set, a mapping in both merged key by key."""
    return {**base, **{k: _merged(base[k], v) if isinstance(v, dict)
                       and isinstance(base.get(k), dict) else v for k, v in new.items()}}


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


LONG_PROMPT = " ".join(WORDS[i % len(WORDS)] for i in range(200))  # 200 words, 200 tokens


@pytest.mark.parametrize(("role", "include"), [("query", True), ("query", False),
                                               ("document", True)])
def test_item2_prompt_leaving_too_few_tokens_refused(tmp_path: Path, tiny_bert: Path,
                                                     _own_store: Path, role: str,
                                                     include: bool) -> None:
    """A 200-word prompt in a 64-token window left no token for the text: every vector was the
    prompt's (all equal, exit 0), with or without `include_prompt` (issue 28, item 2). It is
    refused naming the key and both token counts, before any view or store entry is written
    (a document prompt: before the query view is filled)."""
    import yaml
    from typer.testing import CliRunner

    from stages import app

    prompts = {"query": "", "document": "", "include_prompt": include, role: LONG_PROMPT}
    p = _pairs(tmp_path, tiny_bert, prompts, enc={"max_length": 64})
    want = (f"encoders.models.tiny.prompts.{role}: the prompt is 200 tokens, leaving 0 of "
            "max_length 64 for the text (2 special tokens); at least 16 are needed: shorten the "
            "prompt or raise max_length")
    with pytest.raises(UserError) as e:
        cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache)
    assert str(e.value) == want
    params_file = tmp_path / "params.yaml"  # the stage: exit 1, the one line, no traceback
    params_file.write_text(yaml.safe_dump(p.model_dump(), sort_keys=False))
    result = CliRunner().invoke(app, ["cache", "--params", str(params_file), "--prepared",
                                      str(tmp_path / "prepared"), "--out",
                                      str(tmp_path / "cache")])
    assert result.exit_code == 1 and result.stderr.strip().splitlines() == [f"error: {want}"]
    assert not (tmp_path / "cache").exists()
    assert not _own_store.exists() or not any(_own_store.rglob("*.arrow"))


def test_item2_a_prompt_may_leave_exactly_the_least(tiny_bert: Path) -> None:
    """64 tokens less 2 special: a 46-token prompt leaves 16 (accepted), 47 leave 15; a window
    shorter than 2 x 16 needs half of itself (16 tokens, prompt 2: 12 of 14 left, accepted)."""
    import transformers

    from simtune.chunks import Chunker

    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    spec = P.EncoderParams(**encoder_params(tiny_bert, max_length=64)["models"]["tiny"])
    words = LONG_PROMPT.split()
    assert Chunker(tok, spec, " ".join(words[:46]) + " ", "tiny").body == 16
    with pytest.raises(UserError, match=r"^encoders.models.tiny.prompts.query: the prompt is "
                       r"47 tokens, leaving 15 of max_length 64 "):
        Chunker(tok, spec, " ".join(words[:47]) + " ", "tiny")
    short = spec.model_copy(update={"max_length": 16})
    assert Chunker(tok, short, "what is ", "tiny").body == 12
    with pytest.raises(UserError, match=r"leaving 6 of max_length 16 .* at least 7 are "
                       r"needed \(half the window\)"):
        Chunker(tok, short, " ".join(words[:8]) + " ", "tiny")


def test_probe_a_window_with_no_room_for_the_text_is_refused(tiny_bert: Path) -> None:
    """A `max_length` at or under the special tokens left no text token, prompt or not: every
    text became `[CLS] [SEP]`, one vector for all (exit 0). A 3-token window with a 1-token
    prompt passed the room check (half of 1 is 0 tokens needed) with the same result. Both
    refused; a tiny window with no prompt (8: 6 text tokens) still works."""
    import transformers

    from simtune.chunks import Chunker

    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    spec = P.EncoderParams(**encoder_params(tiny_bert, max_length=8)["models"]["tiny"])
    assert Chunker(tok, spec, "", "tiny").body == 6
    for n, prompt in [(2, ""), (1, ""), (2, "what ")]:
        with pytest.raises(UserError) as e:
            Chunker(tok, spec.model_copy(update={"max_length": n}), prompt, "tiny")
        assert str(e.value) == (f"encoders.models.tiny.max_length: {n} leaves no token for the "
                                "text (2 special tokens): raise max_length")
    with pytest.raises(UserError) as e:
        Chunker(tok, spec.model_copy(update={"max_length": 3}), "what ", "tiny")
    assert str(e.value).startswith("encoders.models.tiny.prompts.query: the prompt is 1 tokens, "
                                   "leaving 0 of max_length 3 for the text (2 special tokens); "
                                   "at least 1 are needed")
    chunked = spec.model_copy(update={"max_length": 3, "chunks": P.ChunkParams(
        max=4, overlap=1, pool="mean")})
    with pytest.raises(UserError, match=r"chunks.overlap: 1 leaves 0 new tokens per window of 1 "
                       r"text tokens .* at least 1 are needed"):
        Chunker(tok, chunked, "", "tiny")
