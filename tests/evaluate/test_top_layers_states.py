"""Issue 43 item 2: evaluate runs the trained top layers over the cached states of the texts it
ranks (not the whole encoder from the text); the export, which runs the whole encoder, gives
the same vectors within the states' storage rounding (`layers.STATES_TOLERANCE`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from simtune import examples, heads, layers
from simtune.cache.views import open_pair
from simtune.evaluate.vectors import trained as trained_vectors
from simtune.export.stage import export
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from tests.train_helpers import project, set_schedule, train_top_layers


@pytest.mark.parametrize("states_dtype", ["float32", "float16"])
def test_evaluate_over_cached_states_equals_the_export_from_text(
        tmp_path: Path, tiny_bert: Path, states_dtype: str) -> None:
    raw, params_file = project(tmp_path, tiny_bert, mode="top_layers")
    raw["encoders"]["models"]["tiny"]["states_dtype"] = states_dtype
    set_schedule(raw, "top_layers", layers=1, lr=0.001, head_lr=0.01, batch_size=8,
                 max_epochs=2, patience=2)
    raw["train"]["frozen_candidate"] = False  # a trained epoch is kept: the layers moved
    p = train_top_layers(tmp_path, raw, params_file)
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["mode"] == "top_layers" and report["best_epoch"] > 0
    assert report["in_force"]["train.schedule.top_layers.layers"] == 1

    prepared = load_prepared(tmp_path / "prepared")
    q_table, d_table = open_pair(tmp_path / "cache", p.encoders, p.cache, "groups",
                                 placed=False)
    data = examples.load(prepared.kind, prepared.examples, q_table, d_table)
    head_dir = tmp_path / "head"
    rows = data.splits["test"].tensors["rows"]
    with torch.inference_mode():
        got = trained_vectors(data, heads.load(head_dir).eval(), head_dir, p,
                              tmp_path / "prepared", (tmp_path / "cache", q_table, d_table)
                              )(rows, "query")
    export(head_dir, tmp_path / "export")
    texts = prepared.text_map()
    served = load_model(tmp_path / "export", "cpu").encode(
        [texts[data.row_ids["query"][r]] for r in rows.tolist()])
    got = torch.nn.functional.normalize(got.float(), dim=-1)
    diff = float((got - served).abs().max())
    tolerance = 1e-5 if states_dtype == "float32" else layers.STATES_TOLERANCE
    assert diff <= tolerance, diff
    if states_dtype == "float16":  # the rounding is there, and it is what the bound covers
        assert diff > 1e-6
