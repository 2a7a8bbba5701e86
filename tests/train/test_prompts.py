"""Prompts in training: top_layers reads each role's cached states (documents from their own
view) and full mode tokenises each role with its prompt; either gives the frozen encoder's role
vectors exactly (include_prompt false: the prompt left out of the pooling)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simtune.cache import stage as cache
from simtune.cache.views import layer_for
from simtune.encoders import FrozenEncoder
from simtune.prepare.prepared import text_id
from simtune.train import represent
from simtune.train.data import load_data
from tests.cache.test_prompts import E5, ENCODER_SCHEDULE, _pairs
from tests.cache_helpers import sentences


@pytest.mark.parametrize("mode", ["top_layers", "full"])
def test_each_role_gets_the_frozen_encoders_role_vectors(tmp_path: Path, tiny_bert: Path,
                                                         mode: str) -> None:
    p = _pairs(tmp_path, tiny_bert, E5, mode=mode, schedule=ENCODER_SCHEDULE)
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    if mode == "top_layers":
        assert sorted(d.name for d in (tmp_path / "cache").iterdir()) == [
            "tiny", "tiny@document", "tiny@document@layer1", "tiny@layer1"]
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    rep = represent.build(mode, p.encoders, data.tables, p.train.lora, True).eval()
    spec = p.encoders.models["tiny"]
    split = data.splits["train"]
    text_of = {text_id(t): t for t in [*sentences(12), *sentences(12, 100)]}
    for role, prompt_role, table, rows, texts in (("query", "query", "query", "q_rows", "q_texts"),
                                                  ("doc", "document", "doc", "d_rows", "d_texts")):
        with torch.no_grad():
            got = rep.embed_split(split, role)
        if mode == "full":  # the split's own texts
            wanted = split.texts[texts]
        else:  # the texts behind the split's cache rows
            ids = data.tables[table].ids.take(split.tensors[rows].numpy()).to_pylist()
            wanted = [text_of[i] for i in ids]
        want = FrozenEncoder("tiny", spec, torch.device("cpu"), prompt_role).encode(wanted, 4)
        assert len(wanted) == len(split) > 0
        assert torch.allclose(got, want, atol=2e-5), (role, float((got - want).abs().max()))


@pytest.mark.parametrize("mode", ["head", "top_layers"])
def test_item4_groups_data_with_two_prompts_trains_on_its_one_view(
        tmp_path: Path, tiny_bert: Path, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """Groups' texts are all `query` texts (their prompt is `prompts.query`; the document prompt
    is for pairs' documents): the cache fills one view, and training reads that view for both
    roles instead of asking for a `tiny@document` view no stage writes (issue 28, item 4)."""
    import json

    from simtune import params as P
    from simtune.prepare import stage as prepare
    from simtune.prepare.prepared import write as write_prepared
    from tests.train_helpers import train_raw

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": f"L{i % 4}"}) + "\n"
                            for i, t in enumerate(sentences(24))))
    raw = train_raw(tiny_bert, data, mode=mode)
    raw["encoders"]["models"]["tiny"]["prompts"] = E5
    raw["train"]["schedule"]["top_layers"]["layers"] = 1
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), tmp_path / "prepared", tmp_path / "prepare.json")
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    assert sorted(d.name for d in (tmp_path / "cache").iterdir()) == (
        ["tiny"] if mode == "head" else ["tiny", "tiny@layer1"])
    assert "encoders.models.tiny.prompts.document: not used: groups data" in caplog.text
    data_ = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    assert data_.tables["doc"] is data_.tables["query"]
    rep = represent.build(mode, p.encoders, data_.tables, p.train.lora, True).eval()
    split = data_.splits["train"]
    ids = data_.tables["query"].ids.take(split.tensors["rows"].numpy()).to_pylist()
    text_of = {text_id(t): t for t in sentences(24)}
    want = FrozenEncoder("tiny", p.encoders.models["tiny"], torch.device("cpu"),
                         "query").encode([text_of[i] for i in ids], 4)
    with torch.no_grad():
        got = rep.embed_split(split, "text")
    assert len(ids) == len(split) > 0
    assert torch.allclose(got, want, atol=2e-5), float((got - want).abs().max())
    if mode == "head":  # evaluate reads the one view too: an identity head scores the baseline
        from simtune import heads
        from simtune.evaluate import stage as evaluate

        heads.save(heads.build("gated", 32, 1, 0.0), tmp_path / "head")  # 2 sigmoid(0) x = x
        result = evaluate.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                              tmp_path / "m.json", tmp_path / "plot.json", tmp_path / "d.json")
        assert result["queries"] == 6 and result["trained"] == result["baseline"]
