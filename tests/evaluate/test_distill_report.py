"""Evaluate after distillation: the teacher beside the distilled and the frozen student on the
same test queries (P@1 and its paired significance against the student recomputed here from
the models themselves), the recovered share of the lift, and each model's encode speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from simtune import params as P
from simtune.encoders import FrozenEncoder
from simtune.evaluate import stage as evaluate
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval import significance
from simtune.train import stage as train
from tests.train.distill_helpers import distill_raw, fill


def _distilled(root: Path, bert: Path, **evaluate_params: Any) -> P.Params:
    raw = distill_raw(root, bert, n=48)
    raw["train"].update(max_epochs=2, patience=2)
    raw["evaluate"].update(evaluate_params)
    fill(root, raw)
    p = P.load(root / "params.yaml")
    train.run(p, root / "prepared", root / "cache", root / "head", root / "train.json", None)
    return p


def _run(p: P.Params, root: Path) -> dict[str, Any]:
    return evaluate.run(p, root / "prepared", root / "cache", root / "head", root / "m.json",
                        root / "plot.json", root / "detail.json")


def _hits(vectors: torch.Tensor, test: list[int], corpus: list[int], labels: list[str]
          ) -> torch.Tensor:
    """P@1 of each test text: is its nearest corpus text (cosine) of its label?"""
    v = torch.nn.functional.normalize(vectors, dim=-1)
    best = (v[test] @ v[corpus].T).argmax(1)
    return torch.tensor([float(labels[q] == labels[corpus[int(j)]])
                         for q, j in zip(test, best, strict=True)])


def test_the_teacher_is_scored_on_the_same_queries_with_the_same_test(tmp_path: Path,
                                                                      tiny_bert: Path) -> None:
    p = _distilled(tmp_path, tiny_bert, speed_texts=8)
    result = _run(p, tmp_path)
    d = result["distill"]
    ex = load_prepared(tmp_path / "prepared")
    texts = ex.text_map()
    rows = ex.examples.to_pydict()
    order = list(range(len(rows["split"])))
    all_texts = [texts[t] for t in rows["text_id"]]
    test = [i for i in order if rows["split"][i] == "test"]
    corpus = [i for i in order if rows["split"][i] == "train"]
    teacher_spec = p.encoders.models["teacher"]
    teacher = FrozenEncoder("teacher", teacher_spec, torch.device("cpu")).encode(all_texts, 8)
    student = load_model(tmp_path / "head", "cpu", encoder=str(tiny_bert)).encode(all_texts)
    t_hits = _hits(teacher, test, corpus, rows["label"])
    s_hits = _hits(student, test, corpus, rows["label"])
    assert d["teacher"]["p@1"] == pytest.approx(float(t_hits.mean()))
    assert result["trained"]["p@1"] == pytest.approx(float(s_hits.mean()))
    sig = p.evaluate.significance
    want = significance.paired(t_hits.numpy(), s_hits.numpy(), sig.resamples, sig.seed)
    assert not torch.equal(t_hits, s_hits)  # the pairing matters: the queries differ
    assert d["significance_teacher_over_trained"]["p@1"] == want
    for m in ("p@1", "mrr@10", "ndcg@10", "map@r"):
        gap = d["teacher"][m] - result["baseline"][m]
        lift = result["trained"][m] - result["baseline"][m]
        assert d["recovered"][m] == (pytest.approx(lift / gap) if abs(gap) > 1e-12 else None)
        assert d["teacher_minus_trained"][m] == pytest.approx(
            d["teacher"][m] - result["trained"][m])
    speed = d["speed"]
    assert (speed["texts"], speed["batch_size"], speed["device"]) == (8, 8, "cpu")
    rates = speed["texts_per_s"]
    assert set(rates) == {"baseline", "trained", "teacher"} and min(rates.values()) > 0
    assert speed["trained_over_teacher"] == pytest.approx(rates["trained"] / rates["teacher"])


def test_no_speed_when_off_and_no_distill_part_without_distillation(tmp_path: Path,
                                                                     tiny_bert: Path) -> None:
    p = _distilled(tmp_path, tiny_bert, speed_texts=0)
    result = _run(p, tmp_path)
    assert "speed" not in result["distill"] and "teacher" in result["distill"]
    similarity = p.model_copy(update={"train": p.train.model_copy(
        update={"objective": "similarity"})})
    assert "distill" not in _run(similarity, tmp_path)
