"""Evaluate in full mode embeds each side with its own prompt: the fine-tuned encoder gives the
test queries the query prompt and the documents the document prompt, as `load_model` and the
export do."""

from __future__ import annotations

from pathlib import Path

import torch

from simtune import examples, heads
from simtune.cache import stage as cache
from simtune.cache.views import open_pair
from simtune.evaluate.vectors import trained as trained_vectors
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from simtune.train import stage as train
from tests.cache.test_prompts import E5, ENCODER_SCHEDULE, _pairs


def test_full_mode_test_vectors_carry_each_roles_prompt(tmp_path: Path, tiny_bert: Path) -> None:
    # the trained epoch kept: the fine-tuned encoder (saved with the head) embeds the texts
    p = _pairs(tmp_path, tiny_bert, E5, mode="full", schedule=ENCODER_SCHEDULE,
               frozen_candidate=False)
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache)
    head_dir = tmp_path / "head"
    train.run(p, tmp_path / "prepared", tmp_path / "cache", head_dir, tmp_path / "train.json",
              tmp_path / "live")
    prepared = load_prepared(tmp_path / "prepared")
    q_table, d_table = open_pair(tmp_path / "cache", p.encoders, p.cache, "pairs", placed=False)
    data = examples.load(prepared.kind, prepared.examples, q_table, d_table)
    vectors = trained_vectors(data, heads.load(head_dir), head_dir, p, tmp_path / "prepared",
                              (tmp_path / "cache", q_table, d_table))
    model, texts = load_model(head_dir, "cpu"), prepared.text_map()
    test = data.splits["test"].tensors
    for role, rows, ids, prompt_role in (("query", test["q_rows"], data.row_ids["query"], "query"),
                                         ("doc", test["d_rows"], data.row_ids["doc"], "document")):
        want = model.encode([texts[ids[r]] for r in rows.tolist()], role=prompt_role)
        other = model.encode([texts[ids[r]] for r in rows.tolist()],
                             role="query" if prompt_role == "document" else "document")
        got = vectors(rows, role)
        assert len(rows) > 0 and torch.equal(got, want)
        assert not torch.allclose(got, other, atol=1e-4)  # the prompts do differ
