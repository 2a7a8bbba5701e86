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
    raw["train"]["schedule"]["head"].update(max_epochs=2, patience=2)
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
        assert d["recovered"][m] == (pytest.approx(lift / gap) if gap > 1e-12 else None)
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


def test_the_stages_end_to_end_with_an_export_teacher_and_unlabelled_texts(
        tmp_path: Path, tiny_bert: Path) -> None:
    """prepare (texts joined to a labelled set) -> cache (student and the export teacher) ->
    train (top_layers) -> evaluate (the teacher beside the student) -> export, as DVC runs
    them; the exported student gives the vectors evaluate scored."""
    import json

    from typer.testing import CliRunner

    from stages import app
    from tests.conftest import write_params
    from tests.train.test_distill import _export_teacher
    from tests.train.test_distill_texts import texts_project

    teacher = _export_teacher(tmp_path, tiny_bert)
    raw = texts_project(tmp_path, tiny_bert)
    raw["encoders"]["models"]["teacher"]["model"] = str(teacher)
    raw["train"].update(mode="top_layers")
    raw["train"]["schedule"]["top_layers"].update(max_epochs=1, layers=1, batch_size=8)
    raw["evaluate"]["speed_texts"] = 4
    params = str(write_params(tmp_path / "params.yaml", raw))
    r = {k: str(tmp_path / k) for k in ("prepared", "cache", "head", "export", "reports")}
    runner = CliRunner()
    for args in (
            ["prepare", "--params", params, "--out", r["prepared"], "--report",
             f"{r['reports']}/prepare.json"],
            ["cache", "--params", params, "--prepared", r["prepared"], "--out", r["cache"],
             "--report", f"{r['reports']}/cache.json"],
            ["train", "--params", params, "--prepared", r["prepared"], "--cache", r["cache"],
             "--out", r["head"], "--report", f"{r['reports']}/train.json", "--metrics",
             f"{r['reports']}/tm.json", "--live", f"{r['reports']}/live", "--checkpoint",
             str(tmp_path / "ck")],
            ["evaluate", "--params", params, "--prepared", r["prepared"], "--cache", r["cache"],
             "--head", r["head"], "--out", f"{r['reports']}/evaluate.json", "--metrics",
             f"{r['reports']}/metrics.json", "--plot", f"{r['reports']}/plot.json", "--detail",
             f"{r['reports']}/detail.json", "--run-trained", f"{r['reports']}/t.trec",
             "--run-baseline", f"{r['reports']}/b.trec"],
            ["export", "--head", r["head"], "--out", r["export"], "--params", params,
             "--metrics", f"{r['reports']}/evaluate.json", "--data-report",
             f"{r['reports']}/prepare.json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args[0], result.output)
    cache_report = json.loads((tmp_path / "reports" / "cache.json").read_text())
    assert cache_report["teacher"]["texts"] == 40 + 12  # the labelled texts and the new ones
    report = json.loads((tmp_path / "reports" / "evaluate.json").read_text())
    assert set(report["distill"]) >= {"teacher", "recovered", "speed"}
    assert report["distill"]["speed"]["texts"] == 4
    card = (tmp_path / "export" / "README.md").read_text()
    assert "| `train.objective` | distill |" in card
    texts = sentences_of(tmp_path / "prepared")
    exported = load_model(tmp_path / "export", "cpu").encode(texts)
    # a kept epoch 0 saves no encoder/: the head folder names the frozen one, as a head mode
    # folder does (an encoder outside the folder is read only when the caller names it)
    head = load_model(tmp_path / "head", "cpu", encoder=str(tiny_bert)).encode(texts)
    torch.testing.assert_close(exported, head, atol=1e-5, rtol=0)


def sentences_of(prepared: Path) -> list[str]:
    return list(load_prepared(prepared).text_map().values())[:6]


def test_speed_takes_turns_and_keeps_each_models_fastest_pass(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A fake clock: each pass of 100 texts takes 100 / rate seconds; the teacher's first
    timed pass is slowed 4x (other work on the machine): its fastest pass counts."""
    from simtune.evaluate import distill

    clock = {"now": 0.0}
    monkeypatch.setattr(distill.time, "perf_counter", lambda: clock["now"])
    calls: list[tuple[str, int]] = []

    def model(name: str, rate: float):
        def encode(texts: list[str]) -> torch.Tensor:
            calls.append((name, len(texts)))
            slowed = 4 if (name, len(texts)) == ("teacher", 100) and calls.count(
                ("teacher", 100)) == 1 else 1
            clock["now"] += slowed * len(texts) / rate
            return torch.zeros(len(texts), 2)
        return encode

    out = distill.speed({"baseline": model("baseline", 400.0),
                         "trained": model("trained", 500.0),
                         "teacher": model("teacher", 125.0)}, ["x"] * 100, 8, "cpu")
    assert out["texts_per_s"] == pytest.approx({"baseline": 400, "trained": 500,
                                                "teacher": 125})
    assert out["trained_over_teacher"] == pytest.approx(4.0)
    # warm-up batches first, then the models in turn, 3 rounds
    assert calls[:3] == [("baseline", 8), ("trained", 8), ("teacher", 8)]
    assert [n for n, _ in calls[3:]] == ["baseline", "trained", "teacher"] * 3


def test_probe_no_share_of_a_lift_is_recovered_from_a_teacher_below_the_student() -> None:
    """A teacher scoring below the frozen student has no lift to recover: a student that fell
    half as far (0.6 -> 0.55, teacher 0.5) read as 'recovers 50.0% of its lift'. null, as for
    no gap; a teacher above still gives the share."""
    from simtune.evaluate.distill import report

    q = {m: torch.tensor([1.0, 0.0]) for m in ("p@1", "mrr@10", "ndcg@10", "map@r")}
    out = report({"p@1": 0.5, "mrr@10": 0.8}, {"p@1": 0.55, "mrr@10": 0.7},
                 {"p@1": 0.6, "mrr@10": 0.6}, q, q, 10, 0)
    assert out["recovered"] == {"p@1": None, "mrr@10": pytest.approx(0.5)}
