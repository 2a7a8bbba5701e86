"""The evaluate stage and the servable model: metrics vs an independent implementation, trained
vs baseline, export round trip, sentence-transformers load, search, bad input."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.cache import stage as cache
from simtune.errors import UserError
from simtune.evaluate import runs
from simtune.evaluate import stage as evaluate
from simtune.evaluate.report import every_metric, verdict, with_others
from simtune.evaluate.search import Hit, search, show
from simtune.examples import Data, first_positions
from simtune.export.stage import export
from simtune.model import load_model
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import kind as prepared_kind
from simtune.prepare.prepared import write as write_prepared
from simtune.retrieval import metrics
from simtune.retrieval.task import by_rows
from simtune.train.data import load_data
from stages import app
from tests.cache_helpers import sentences
from tests.conftest import write_params
from tests.train_helpers import project, stage_args, train_raw


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("evaluate")
    _, params_file = project(root, tiny_bert)
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    return root, params_file


def _evaluate_args(root: Path, params_file: Path, head: Path | None = None) -> list[str]:
    return ["evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
            "--cache", str(root / "cache"), "--head", str(head or root / "head"),
            "--out", str(root / "metrics.json"),
            "--metrics", str(root / "headline.json"), "--plot", str(root / "recall.json"),
            "--detail", str(root / "detail.json"), "--run-trained", str(root / "trained.trec"),
            "--run-baseline", str(root / "baseline.trec")]


def test_evaluate_writes_trained_baseline_lift(trained: tuple[Path, Path]) -> None:
    root, params_file = trained
    result = CliRunner().invoke(app, _evaluate_args(root, params_file))
    assert result.exit_code == 0, result.output
    m = json.loads((root / "metrics.json").read_text())  # the full report (--out)
    assert set(m) == {"trained", "baseline", "lift", "significance", "queries", "corpus",
                      "queries_without_relevant", "bm25", "lift_over_bm25",
                      "significance_over_bm25", "bm25_settings", "verdict"}  # hybrid: off
    sig = P.load(params_file).evaluate.significance
    metric = sig.verdict_metric
    assert m["verdict"] == with_others(
        verdict(m["lift"][metric], m["significance"][metric]["p_value"],
                m["significance"][metric]["ci95"], metric, sig.alpha),
        every_metric(m, sig.alpha))
    assert set(m["verdict"]["metrics"]) == set(metrics.HEADLINE)
    assert f"verdict: {m['verdict']['says']}" in result.output
    # the headline only, what `dvc exp show` makes a column of: BM25 adds no column
    headline = json.loads((root / "headline.json").read_text())
    assert headline == {part: {k: m[part][k] for k in metrics.HEADLINE}
                        for part in ("trained", "baseline", "lift")}  # trained vs frozen
    assert m["queries"] == 20 and m["corpus"] == 40
    for k, v in m["trained"].items():
        assert m["lift"][k] == pytest.approx(v - m["baseline"][k])
    plot = json.loads((root / "recall.json").read_text())
    assert [row["k"] for row in plot] == [1, 5, 10, 50]
    # the baseline is the frozen encoder: recompute it directly from the cache
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    test, train = data.splits["test"].tensors, data.splits["train"].tensors
    want, _ = metrics.group_scores(data.q_vectors[test["rows"]], test["labels"],
                                   data.q_vectors[train["rows"]], train["labels"], (1, 5, 10, 50))
    assert m["baseline"] == pytest.approx(want)
    # the detail report: each label's test queries, scored alone, against the same corpus
    detail = json.loads((root / "detail.json").read_text())
    per_label = detail["per_label"]
    assert detail["kind"] == "groups" and sorted(per_label) == ["L0", "L1", "L2", "L3"]
    for i, name in enumerate(data.label_names):
        mine = test["labels"] == i
        assert per_label[name]["queries"] == int(mine.sum())
        alone, _ = metrics.group_scores(data.q_vectors[test["rows"][mine]], test["labels"][mine],
                                        data.q_vectors[train["rows"]], train["labels"],
                                        (1, 5, 10, 50))
        assert per_label[name]["baseline"] == pytest.approx(alone)
        for k, v in per_label[name]["trained"].items():
            assert per_label[name]["lift"][k] == pytest.approx(v - per_label[name]["baseline"][k])
    for model in ("trained", "baseline"):  # the query-weighted mean of the labels: the headline
        for k, v in m[model].items():
            assert sum(d["queries"] * d[model][k] for d in per_label.values()) / 20 == (
                pytest.approx(v))


def test_the_frozen_encoder_itself_is_no_better_than_the_frozen_encoder(
        trained: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 34 item 5: an identity head (the frozen encoder's vectors) evaluates to a lift of 0
    with p = 1 on every metric: the verdict is `no better`, said in the log."""
    root, params_file = trained
    head_dir = tmp_path / "identity"
    shutil.copytree(root / "head", head_dir)
    dim = json.loads((head_dir / "config.json").read_text())["dim"]
    for f in ("config.json", "model.safetensors"):
        (head_dir / f).unlink(missing_ok=True)
    heads.save(heads.build("identity", dim, 1, 0.0), head_dir)
    result = CliRunner().invoke(app, _evaluate_args(root, params_file, head_dir))
    assert result.exit_code == 0, result.output
    v = json.loads((root / "metrics.json").read_text())["verdict"]
    assert (v["verdict"], v["lift"], v["p_value"]) == ("no better", 0.0, 1.0)
    assert "verdict: no better than the frozen encoder" in result.output


def test_leave_one_out_per_label_metrics(trained: tuple[Path, Path], tmp_path: Path) -> None:
    """evaluate.corpus test: each test text against the other test texts, per label too."""
    root, params_file = trained
    p = P.load(params_file)
    p = p.model_copy(update={"evaluate": p.evaluate.model_copy(update={"corpus": "test"})})
    m = evaluate.run(p, root / "prepared", root / "cache", root / "head", tmp_path / "m.json",
                     tmp_path / "plot.json", tmp_path / "detail.json")
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    test = data.splits["test"].tensors
    want, _ = metrics.group_scores(data.q_vectors[test["rows"]], test["labels"], None, None,
                                   (1, 5, 10, 50))
    assert m["baseline"] == pytest.approx(want) and m["corpus"] == 19
    per_label = json.loads((tmp_path / "detail.json").read_text())["per_label"]
    assert sum(d["queries"] for d in per_label.values()) == 20
    for k, v in m["trained"].items():
        assert sum(d["queries"] * d["trained"][k] for d in per_label.values()) / 20 == (
            pytest.approx(v))


def _reference(scores: torch.Tensor, relevant: list[set[int]], k: int) -> dict[str, float]:
    """An independent, per-query loop implementation (sorting with explicit tie order)."""
    import math

    out = {"p@1": 0.0, f"recall@{k}": 0.0, "mrr@10": 0.0, "ndcg@10": 0.0, "map@r": 0.0}
    for qi, rel in enumerate(relevant):
        ranking = sorted(range(scores.shape[1]), key=lambda j: (-float(scores[qi, j]), j))
        hits = [j in rel for j in ranking]
        r = len(rel)
        out["p@1"] += hits[0]
        out[f"recall@{k}"] += sum(hits[:k]) / r if r else 0
        first = next((i for i, h in enumerate(hits[:10]) if h), None)
        out["mrr@10"] += 1 / (first + 1) if first is not None else 0
        dcg = sum(h / math.log2(i + 2) for i, h in enumerate(hits[:10]))
        idcg = sum(1 / math.log2(i + 2) for i in range(min(r, 10)))
        out["ndcg@10"] += dcg / idcg if idcg else 0
        out["map@r"] += (sum(sum(hits[: i + 1]) / (i + 1) for i in range(r) if hits[i]) / r
                         if r else 0)
    return {key: v / len(relevant) for key, v in out.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_an_independent_implementation(seed: int) -> None:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    q, c = torch.randn(30, 6), torch.randn(80, 6)
    c[10] = c[3]  # exact ties
    relevant = [set(rng.sample(range(80), rng.randint(0, 12))) for _ in range(30)]
    pairs = torch.tensor([(qi, d) for qi, rel in enumerate(relevant) for d in sorted(rel)])
    got, no_rel = metrics.pair_scores(q, c, pairs, ks=(5,))
    scores = torch.nn.functional.normalize(q) @ torch.nn.functional.normalize(c).T
    want = _reference(scores, relevant, 5)
    assert no_rel == sum(1 for r in relevant if not r)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-6), key


def _pipeline_vectors(root: Path, params_file: Path, texts: list[str],
                      head_dir: Path | None = None) -> torch.Tensor:
    """cache + head (what train and evaluate compute) for corpus texts, unnormalised."""
    from simtune.prepare.prepared import text_id

    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    rows = torch.tensor([data.row_ids["query"].index(text_id(t)) for t in texts])
    with torch.inference_mode():
        return heads.load(head_dir or root / "head")(data.q_vectors[rows].float())


def test_export_round_trip_equals_normalised_cache_plus_head(
        trained: tuple[Path, Path], tiny_bert: Path, tmp_path: Path) -> None:
    """Trained with cosine: the export's vectors are the pipeline's, L2-normalised."""
    root, params_file = trained
    export(root / "head", tmp_path / "export", encoder=str(tiny_bert))
    config = json.loads((tmp_path / "export" / "simtune.json").read_text())
    assert (config["format_version"], config["encoder_name"], config["normalize_output"]) == (
        3, "tiny", True)
    texts = sentences(10)
    want = _pipeline_vectors(root, params_file, texts)
    assert not torch.allclose(want.norm(dim=1), torch.ones(10), atol=1e-3)  # the head's own
    for directory in (tmp_path / "export", root / "head"):  # export, or the head directory
        got = load_model(directory, "cpu", encoder=str(tiny_bert)).encode(texts)
        assert torch.allclose(got.norm(dim=1), torch.ones(10), atol=1e-6)
        assert torch.allclose(got, torch.nn.functional.normalize(want, dim=-1), atol=1e-6)


def test_exported_vectors_give_the_evaluated_metrics(
        trained: tuple[Path, Path], tiny_bert: Path, tmp_path: Path) -> None:
    """Normalising changes no cosine ranking: the exported model's vectors of the test and train
    texts give exactly evaluate's `trained` metrics (computed from unnormalised head outputs)."""
    root, params_file = trained
    p = P.load(params_file)
    m = evaluate.run(p, root / "prepared", root / "cache", root / "head", tmp_path / "m.json",
                     tmp_path / "plot.json", tmp_path / "detail.json")
    export(root / "head", tmp_path / "export", encoder=str(tiny_bert))
    model = load_model(tmp_path / "export", "cpu")
    from simtune.prepare.prepared import load as load_prepared

    prepared = load_prepared(root / "prepared")
    text_of = dict(zip(prepared.texts.column("text_id").to_pylist(),
                       prepared.texts.column("text").to_pylist(), strict=True))
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    ids = data.row_ids["query"]
    test, train = data.splits["test"].tensors, data.splits["train"].tensors
    q = model.encode([text_of[ids[r]] for r in test["rows"].tolist()])
    c = model.encode([text_of[ids[r]] for r in train["rows"].tolist()])
    got, _ = metrics.group_scores(q, test["labels"], c, train["labels"], (1, 5, 10, 50))
    assert got == pytest.approx(m["trained"], abs=1e-6)
    assert m["trained"] != m["baseline"]


def test_export_of_a_dot_product_head_is_not_normalised(
        trained: tuple[Path, Path], tiny_bert: Path, tmp_path: Path) -> None:
    """Distance `dot`: vector lengths carry meaning; the export returns cache + head as is."""
    root, params_file = trained
    raw = yaml.safe_load(params_file.read_text())
    raw["train"]["loss"]["distance"] = "dot"
    raw["train"]["schedule"]["head"]["max_epochs"] = 1
    raw["train"]["frozen_candidate"] = False  # the trained head exported, not the identity
    dot_params = write_params(tmp_path / "params.yaml", raw)
    args = stage_args(root, dot_params, "_dot")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    head_dir = root / "head_dot"
    assert json.loads((head_dir / "training.json").read_text())["normalize_output"] is False
    export(head_dir, tmp_path / "export", encoder=str(tiny_bert))
    config = json.loads((tmp_path / "export" / "simtune.json").read_text())
    assert config["normalize_output"] is False
    modules = json.loads((tmp_path / "export" / "modules.json").read_text())
    assert [mod["path"] for mod in modules] == ["encoder", "1_Pooling", "2_Normalize", "3_Dense",
                                                "4_Dense"]  # the mlp head, no last Normalize
    texts = sentences(10)
    want = _pipeline_vectors(root, params_file, texts, head_dir)
    assert torch.allclose(load_model(tmp_path / "export", "cpu").encode(texts), want, atol=1e-6)


def test_sentence_transformers_loads_the_export(
        trained: tuple[Path, Path], tiny_bert: Path, tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    root, _ = trained
    export(root / "head", tmp_path / "export", encoder=str(tiny_bert))
    texts = sentences(6)
    st_model = st.SentenceTransformer(str(tmp_path / "export"), device="cpu")  # no remote code
    got = torch.as_tensor(st_model.encode(texts, convert_to_numpy=True))
    want = load_model(tmp_path / "export", "cpu").encode(texts)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(got.norm(dim=1), torch.ones(6), atol=1e-5)  # its last module normalises
    modules = json.loads((tmp_path / "export" / "modules.json").read_text())
    assert [mod["path"] for mod in modules] == ["encoder", "1_Pooling", "2_Normalize", "3_Dense",
                                                "4_Dense", "5_Normalize"]


def test_auto_loss_trains_pairs_with_mnrl(beir_trained: tuple[Path, Path, Any]) -> None:
    """The BEIR pairs trained with params.yaml's `auto`: the train log names mnrl, and the
    loss that runs is mnrl, as the sweep and the export resolve it."""
    root, params_file, _ = beir_trained
    p = P.load(params_file)
    assert p.train.loss.name == "auto"
    assert "loss auto: mnrl (pairs data)" in (root / "train.log").read_text()
    assert P.resolve_loss(p.train, prepared_kind(root / "prepared")).loss.name == "mnrl"


def _search_lines(root: Path, params_file: Path, query: str, k: int) -> list[str]:
    result = CliRunner().invoke(app, [*_search_args(root, params_file, query), "--k", str(k)])
    assert result.exit_code == 0, result.output
    assert "loaded encoder 'tiny' from" in result.output  # its name in params, not 'model'
    return [x for x in result.output.splitlines() if x[:1].isdigit()]


def test_search_prints_neighbours_with_scores_and_labels(trained: tuple[Path, Path]) -> None:
    """Groups: each hit's label (the data file's, not the model's) in brackets between its
    score and its text; the query, a corpus text, comes first with score 1."""
    root, params_file = trained
    query = sentences(80)[7]
    hits = search(P.load(params_file), query, 3, root / "head", root / "prepared",
                  root / "cache")
    label_of = {t: f"L{i % 4}" for i, t in enumerate(sentences(80))}  # project()'s data file
    assert _search_lines(root, params_file, query, 3) == [
        f"{h.score:.4f}  [{label_of[h.text]}]  {h.text}" for h in hits]
    assert (hits[0].text, hits[0].label) == (query, "L3")
    assert hits[0].score == pytest.approx(1.0, abs=1e-4)


def test_search_on_pairs_prints_no_label(beir_trained: tuple[Path, Path, Any]) -> None:
    """Pairs have no labels: score and text only, as before."""
    root, params_file, _ = beir_trained
    query = sentences(60)[4]  # document doc-4 (no title): it comes first
    hits = search(P.load(params_file), query, 3, root / "head", root / "prepared",
                  root / "cache")
    assert [h.label for h in hits] == [None, None, None] and hits[0].text == query
    assert _search_lines(root, params_file, query, 3) == [
        f"{h.score:.4f}  {h.text}" for h in hits]


def test_search_lines_pad_labels_so_the_texts_line_up() -> None:
    assert show([Hit(0.91234, "how far is the moon ?", "NUM:dist"),
                 Hit(0.5, "who wrote hamlet ?", "HUM:ind"), Hit(-0.25, "a b", "LOC")]) == [
        " 0.9123  [NUM:dist]  how far is the moon ?",
        " 0.5000  [HUM:ind]   who wrote hamlet ?",
        "-0.2500  [LOC]       a b"]
    assert show([Hit(0.5, "a text", None)]) == ["0.5000  a text"]


def test_probe_search_lines_align_negative_scores_and_long_labels() -> None:
    """A negative score is right-aligned (its line's text used to start one column later); a
    label over MAX_LABEL_PAD characters no longer pads every other line to its length."""
    long = "x" * 200
    assert show([Hit(0.91234, "how far", "NUM"), Hit(-0.25, "a b", "LOC"),
                 Hit(0.1, "c", long)]) == [
        " 0.9123  [NUM]" + " " * 29 + "how far",
        "-0.2500  [LOC]" + " " * 29 + "a b",
        f" 0.1000  [{long}]  c"]
    assert show([Hit(-0.5, "t", None), Hit(0.25, "u", None)]) == ["-0.5000  t", " 0.2500  u"]


def test_no_trained_head_and_dimension_mismatch(trained: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    root, params_file = trained
    result = CliRunner().invoke(app, _evaluate_args(root, params_file, tmp_path / "none"))
    assert result.exit_code == 1
    assert "no trained head here (run the train stage)" in result.output
    heads.save(heads.build("mlp", 7, 2, 0.0), tmp_path / "wrong")
    result = CliRunner().invoke(app, _evaluate_args(root, params_file, tmp_path / "wrong"))
    assert result.exit_code == 1
    assert "head expects 7-d vectors, the cache holds 32-d" in result.output


def test_metric_counts_queries_without_relevant_items() -> None:
    v = torch.eye(4)
    got, no_rel = metrics.group_scores(v[:2], torch.tensor([0, 5]), v, torch.tensor([0, 1, 2, 3]),
                                       ks=(1,))
    assert no_rel == 1 and got["p@1"] == pytest.approx(0.5)  # the label-5 query scores 0


def test_evaluate_run_is_deterministic(trained: tuple[Path, Path], tmp_path: Path) -> None:
    root, params_file = trained
    p = P.load(params_file)
    a = evaluate.run(p, root / "prepared", root / "cache", root / "head", tmp_path / "a.json",
                     tmp_path / "a_plot.json", tmp_path / "a_detail.json")
    b = evaluate.run(p, root / "prepared", root / "cache", root / "head", tmp_path / "b.json",
                     tmp_path / "b_plot.json", tmp_path / "b_detail.json")
    assert a == b
    for name in ("", "_detail"):
        assert (tmp_path / f"a{name}.json").read_bytes() == (tmp_path / f"b{name}.json"
                                                              ).read_bytes()


@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_match_trec_eval(seed: int) -> None:
    """P@1, Recall@5, MRR@10, nDCG@10 against trec_eval (pytrec_eval); no score ties here."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    q, c = torch.randn(25, 6), torch.randn(60, 6)
    relevant = [set(rng.sample(range(60), rng.randint(0, 9))) for _ in range(25)]
    pairs = torch.tensor([(qi, d) for qi, rel in enumerate(relevant) for d in sorted(rel)])
    got, _ = metrics.pair_scores(q, c, pairs, ks=(5,))
    scores = torch.nn.functional.normalize(q) @ torch.nn.functional.normalize(c).T
    # queries without a relevant document are judged (all 0) so trec_eval counts them too
    qrels = {f"q{i}": {f"d{d}": int(d in rel) for d in (rel or {0})}
             for i, rel in enumerate(relevant)}
    run = {f"q{i}": {f"d{d}": float(scores[i, d]) for d in range(60)} for i in range(25)}
    top10 = {qid: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:10])
             for qid, docs in run.items()}
    full = pytrec_eval.RelevanceEvaluator(qrels, {"P_1", "recall_5", "ndcg_cut_10"}).evaluate(run)
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    mean = lambda res, key: sum(v[key] for v in res.values()) / len(res)  # noqa: E731
    assert got["p@1"] == pytest.approx(mean(full, "P_1"), abs=1e-6)
    assert got["recall@5"] == pytest.approx(mean(full, "recall_5"), abs=1e-6)
    assert got["ndcg@10"] == pytest.approx(mean(full, "ndcg_cut_10"), abs=1e-6)
    assert got["mrr@10"] == pytest.approx(mean(mrr, "recip_rank"), abs=1e-6)


# --- TREC run files, the lift's significance, a BEIR folder end to end --------------------------


def _read_run(path: Path) -> dict[str, list[tuple[str, int, float]]]:
    """qid -> [(docid, rank, score)] in file order; checks every line's six fields."""
    out: dict[str, list[tuple[str, int, float]]] = {}
    for line in path.read_text().splitlines():
        qid, q0, docid, rank, score, tag = line.split(" ")
        assert q0 == "Q0" and tag in ("simtune-trained", "simtune-baseline")
        out.setdefault(qid, []).append((docid, int(rank), float(score)))
    return out


def _trec_eval(qrels: dict[str, dict[str, int]], run: dict[str, list[tuple[str, int, float]]]
               ) -> dict[str, dict[str, float]]:
    """Per-query P@1, Recall@5, nDCG@10 and MRR@10 of a run file's lists, by trec_eval."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    full = {q: {d: s for d, _, s in docs} for q, docs in run.items()}
    top10 = {q: {d: s for d, _, s in docs[:10]} for q, docs in run.items()}
    res = pytrec_eval.RelevanceEvaluator(qrels, {"P_1", "recall_5", "ndcg_cut_10"}).evaluate(full)
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    return {q: {"p@1": v["P_1"], "recall@5": v["recall_5"], "ndcg@10": v["ndcg_cut_10"],
                "mrr@10": mrr[q]["recip_rank"]} for q, v in res.items()}


def _means(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    keys = next(iter(per_query.values()))
    return {k: sum(v[k] for v in per_query.values()) / len(per_query) for k in keys}


def test_run_files_rescore_to_the_same_metrics(trained: tuple[Path, Path]) -> None:
    """Groups: trec_eval on the run files, with qrels 'same label', gives evaluate's metrics;
    the lift's p-value of P@1 recomputed from trec_eval's per-query P@1 is the one reported."""
    from simtune.retrieval import significance

    root, params_file = trained
    assert CliRunner().invoke(app, _evaluate_args(root, params_file)).exit_code == 0
    m = json.loads((root / "metrics.json").read_text())
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    ids = data.row_ids["query"]
    test, train = data.splits["test"].tensors, data.splits["train"].tensors
    train_ids = [ids[r] for r in train["rows"].tolist()]
    qrels = {ids[r]: {d: int(lab == dl) for d, dl in zip(train_ids, train["labels"].tolist(),
                                                          strict=True)}
             for r, lab in zip(test["rows"].tolist(), test["labels"].tolist(), strict=True)}
    per_query = {}
    for model in ("trained", "baseline"):
        run = _read_run(root / f"{model}.trec")
        assert list(run) == [ids[r] for r in test["rows"].tolist()]  # the test split's order
        assert all([r for _, r, _ in docs] == list(range(1, 41)) for docs in run.values())
        assert all(len({d for d, _, _ in docs}) == 40 for docs in run.values())  # all 40
        per_query[model] = _trec_eval(qrels, run)
        assert _means(per_query[model]) == pytest.approx(
            {k: m[model][k] for k in ("p@1", "recall@5", "ndcg@10", "mrr@10")}, abs=1e-6)
    assert set(m["significance"]) == {"p@1", "mrr@10", "ndcg@10", "map@r"}
    order = list(per_query["trained"])
    want = significance.paired(np.array([per_query["trained"][q]["p@1"] for q in order]),
                               np.array([per_query["baseline"][q]["p@1"] for q in order]),
                               p.evaluate.significance.resamples, p.evaluate.significance.seed)
    assert m["significance"]["p@1"] == want
    for sig in m["significance"].values():
        assert 0 < sig["p_value"] <= 1 and sig["ci95"][0] <= sig["ci95"][1]


def test_run_file_format_by_hand() -> None:
    top = (torch.tensor([[0.5, 0.25], [0.123456789, -1.0]]), torch.tensor([[1, 0], [0, 1]]))
    got = runs.render(["q1", "q2"], ["a", "b"], top, "tag").decode()
    assert got == ("q1 Q0 b 1 0.5 tag\nq1 Q0 a 2 0.25 tag\n"
                   "q2 Q0 a 1 0.123456791 tag\nq2 Q0 b 2 -1 tag\n")  # float32: 9 digits
    with pytest.raises(UserError, match="document id 'a b' is empty or holds whitespace"):
        runs.check_ids(["a", "a b"], "document")


@pytest.fixture(scope="module")
def beir_trained(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path
                 ) -> tuple[Path, Path, dict[str, dict[str, int]]]:
    """A BEIR folder (train/dev/test qrels, graded test qrels, 20 unjudged documents),
    prepared, cached, trained with the default loss (`auto`: MNRL on pairs; the train stage's
    output in train.log); returns (root, params file, the test qrels)."""
    root = tmp_path_factory.mktemp("beir")
    folder = root / "scifact-like"
    (folder / "qrels").mkdir(parents=True)
    docs, queries = sentences(60), sentences(35, start=200)
    (folder / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": f"doc-{i}", "title": "" if i % 3 else "the title", "text": t}) + "\n"
        for i, t in enumerate(docs)))
    (folder / "queries.jsonl").write_text("".join(
        json.dumps({"_id": f"Q{i}", "text": t}) + "\n" for i, t in enumerate(queries)))
    qrels: dict[str, list[tuple[str, str, int]]] = {
        "train": [(f"Q{i}", f"doc-{i}", 1) for i in range(20)],
        "dev": [(f"Q{i}", f"doc-{i}", 1) for i in range(20, 25)],
        "test": [(f"Q{i}", f"doc-{d}", g) for i in range(25, 35)
                 for d, g in ((i, 2), (i - 25, 1), (i + 5, 0), ((i * 7) % 40, 1))]}
    for name, lines in qrels.items():
        (folder / "qrels" / f"{name}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in lines))
    raw = train_raw(tiny_bert, folder)
    raw["prepare"]["file"].update(format="beir", kind="pairs")
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache)
    params_file = write_params(root / "params.yaml", raw)
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    (root / "train.log").write_text(result.output)
    test_qrels: dict[str, dict[str, int]] = {}
    for q, d, s in qrels["test"]:
        test_qrels.setdefault(q, {})[d] = max(s, test_qrels.get(q, {}).get(d, 0))
    return root, params_file, test_qrels


def test_beir_end_to_end_ranks_the_whole_corpus_with_graded_gains(
        beir_trained: tuple[Path, Path, dict[str, dict[str, int]]]) -> None:
    """Every corpus document (20 never judged) is ranked; the run files carry the BEIR ids;
    trec_eval on them with the folder's own graded test qrels gives evaluate's metrics."""
    root, params_file, test_qrels = beir_trained
    result = CliRunner().invoke(app, _evaluate_args(root, params_file))
    assert result.exit_code == 0, result.output
    m = json.loads((root / "metrics.json").read_text())
    assert (m["queries"], m["corpus"], m["queries_without_relevant"]) == (10, 60, 0)
    ranked_docs = set()
    for model in ("trained", "baseline"):
        run = _read_run(root / f"{model}.trec")
        assert sorted(run) == sorted(test_qrels)  # the original query ids
        assert all(len(docs) == 60 for docs in run.values())  # run_depth 100 > the corpus
        ranked_docs |= {d for docs in run.values() for d, _, _ in docs}
        got = _means(_trec_eval(test_qrels, run))
        assert got == pytest.approx({k: m[model][k] for k in got}, abs=1e-6)
    assert ranked_docs == {f"doc-{i}" for i in range(60)}
    # graded: the grades change nDCG@10 (with binary gains trec_eval gives another value)
    binary = {q: {d: int(g > 0) for d, g in docs.items()} for q, docs in test_qrels.items()}
    assert _means(_trec_eval(binary, _read_run(root / "trained.trec")))["ndcg@10"] != (
        pytest.approx(m["trained"]["ndcg@10"], abs=1e-4))


def _before(data: Data, corpus: str, extra: list[int], vectors: Any, ks: tuple[int, ...],
            depth: int) -> tuple[dict[str, float], int, dict[int, dict[str, float]],
                                 metrics.Ranked]:
    """The evaluate stage's task and scoring as they were before the one retrieval task (its
    `_task` and `score`, copied): (metrics, no relevant, per label, ranking)."""
    test = data.splits["test"].tensors
    if data.kind == "pairs":
        docs: dict[int, int] = {}
        for sp in data.splits.values():
            for did, row in zip(sp.tensors["d_ids"].tolist(), sp.tensors["d_rows"].tolist(),
                                strict=True):
                docs.setdefault(did, row)
        doc_index = {did: i for i, did in enumerate(docs)}
        q_u, q_inv = torch.unique(test["q_ids"], return_inverse=True)
        first = first_positions(q_inv, len(q_u))
        positive = test["scores"] > 0
        pairs = torch.stack([q_inv[positive], torch.tensor(
            [doc_index[d] for d in test["d_ids"][positive].tolist()], dtype=torch.long)], 1)
        gains = test["scores"][positive]
        ranked = metrics.pair_ranked(
            vectors(test["q_rows"][first], "query"),
            vectors(torch.tensor(list(docs.values()) + extra, dtype=torch.long), "doc"), pairs,
            ks, gains=gains if bool((gains != 1).any()) else None, depth=depth)
        return metrics.scores(ranked, ks), int((ranked.n_relevant == 0).sum()), {}, ranked
    q_labels, leave_one_out = test["labels"], corpus == "test"
    q = vectors(test["rows"], "text")
    c = q if leave_one_out else vectors(data.splits[corpus].tensors["rows"], "text")
    c_labels = q_labels if leave_one_out else data.splits[corpus].tensors["labels"]
    counts = torch.bincount(c_labels, minlength=int(max(q_labels.max(), c_labels.max())) + 1)
    n_rel = counts[q_labels] - (1 if leave_one_out else 0)
    ranked = metrics.rank(q, c, lambda qi, idx: c_labels[idx] == q_labels[qi][:, None], n_rel,
                          max(*ks, 10, int(n_rel.max())),
                          torch.arange(len(q)) if leave_one_out else None, depth=depth)
    per_label = {lab: metrics.scores(metrics.Ranked(ranked.rel[q_labels == lab],
                                                    n_rel[q_labels == lab]), ks)
                 for lab in torch.unique(q_labels).tolist()}
    return metrics.scores(ranked, ks), int((n_rel == 0).sum()), per_label, ranked


@pytest.mark.parametrize("case", ["groups/train", "groups/test", "beir/all"])
def test_the_task_scores_as_evaluate_did_before(case: str, trained: tuple[Path, Path],
                                                beir_trained: tuple[Path, Path, Any]) -> None:
    """The one retrieval task, as evaluate builds it, gives exactly the numbers (metrics, per
    label, top lists) of evaluate's own task and ranking before it (`_before`), for the trained
    head and the baseline: groups against the train texts and leave-one-out; BEIR pairs against
    every document (corpus-only ones included) with graded gains."""
    kind, corpus = case.split("/")
    root, params_file = trained if kind == "groups" else beir_trained[:2]
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    task = evaluate.evaluation_task(data, corpus, root / "prepared")
    extra = evaluate._corpus_only_rows(data, root / "prepared") if kind == "beir" else []
    assert len(extra) == (20 if kind == "beir" else 0)
    ks = (1, 5, 10, 50)
    with torch.inference_mode():
        for head in (heads.load(root / "head"), heads.build("identity", data.dim, 1, 0.0)):
            vectors = evaluate.cached(data, head)
            got = task.score(by_rows(vectors), ks, depth=30)
            want, no_rel, per_label, ranked = _before(data, corpus, extra, vectors, ks, 30)
            assert got.metrics == want and got.no_relevant == no_rel
            assert got.per_label == per_label and len(per_label) == (4 if kind == "groups" else 0)
            assert torch.equal(got.ranked.rel, ranked.rel) and got.ranked.top is not None
            assert ranked.top is not None and all(
                torch.equal(a, b) for a, b in zip(got.ranked.top, ranked.top, strict=True))


def _search_args(root: Path, params_file: Path, query: str, head: Path | None = None
                 ) -> list[str]:
    return ["search", query, "--params", str(params_file), "--head", str(head or root / "head"),
            "--prepared", str(root / "prepared"), "--cache", str(root / "cache")]


@pytest.mark.parametrize("query", ["", "  \t\n "])
def test_item13_empty_search_query_refused(trained: tuple[Path, Path], query: str) -> None:
    """As prepare drops empty texts, search refuses an empty (or blank) query: no neighbours."""
    root, params_file = trained
    result = CliRunner().invoke(app, _search_args(root, params_file, query))
    assert result.exit_code == 1
    assert result.stderr.strip() == ("error: the query is empty (or only whitespace): give a "
                                     "text to search for")
    assert not [x for x in result.output.splitlines() if x[:1].isdigit()]


def test_item7_damaged_head_files_are_one_line_in_every_command(
        trained: tuple[Path, Path], tmp_path: Path) -> None:
    """A damaged config.json or training.json of the head: evaluate, search and export each
    exit 1 with the same one line (no KeyError, no size-mismatch traceback), writing nothing."""
    import shutil

    root, params_file = trained
    head = tmp_path / "head"
    shutil.copytree(root / "head", head)
    config, meta = head / "config.json", head / "training.json"
    good_config, good_meta = config.read_text(), meta.read_text()
    cases = {
        "type bogus": (config, {**json.loads(good_config), "type": "bogus"},
                       f"{config}: type: Input should be 'identity', 'linear', "
                       "'skip_connection', 'gated' or 'mlp', got 'bogus'"),
        "expansion string": (config, {**json.loads(good_config), "expansion": "2"},
                             f"{config}: expansion: Input should be a valid integer, got '2'"),
        "config a list": (config, [1, 2], f"{config}: expected a JSON object, got list"),
        "meta not json": (meta, None, f"{meta}: not JSON: Expecting value (line 1, column 1)"),
    }
    for target, content, line in cases.values():
        config.write_text(good_config)
        meta.write_text(good_meta)
        target.write_text("nonsense" if content is None else json.dumps(content))
        out = tmp_path / "export"
        for args in (_evaluate_args(root, params_file, head),
                     _search_args(root, params_file, "a question", head),
                     ["export", "--head", str(head), "--out", str(out), "--params",
                      str(params_file)]):
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 1, (args[0], result.output)
            # the error is the last line (log lines before it are the usual warnings)
            assert result.stderr.strip().splitlines()[-1] == f"error: {line}", (
                args[0], result.stderr)
            assert "Traceback" not in result.output
        assert not out.exists()
