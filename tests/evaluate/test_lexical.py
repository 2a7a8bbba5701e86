"""BM25 and the RRF hybrid in evaluate's report and in `simtune search`: every number against an
independent computation (bm25s's own retrieval, rankings and metrics by per-query loops, fusion
by hand); the headline metrics file gains no column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.evaluate import lexical, report
from simtune.evaluate import stage as evaluate
from simtune.evaluate.search import search
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval import metrics, significance
from simtune.retrieval.metrics import HEADLINE
from simtune.retrieval.task import by_rows
from simtune.train.data import load_data
from stages import app
from tests.cache_helpers import sentences
from tests.conftest import write_params
from tests.evaluate.test_evaluate import beir_trained, trained  # noqa: F401 (fixtures)
from tests.lexical_helpers import fuse, library_scores, mean_metrics, query_metrics, ranking

KS = (1, 5, 10, 50)


def _params(params_file: Path, tmp_path: Path, corpus: str | None = None,
            hybrid: bool = True) -> tuple[P.Params, Path]:
    raw = yaml.safe_load(params_file.read_text())
    raw["evaluate"]["hybrid"]["enabled"] = hybrid
    if corpus is not None:
        raw["evaluate"]["corpus"] = corpus
    path = write_params(tmp_path / "params.yaml", raw)
    return P.load(path), path


def _run(p: P.Params, root: Path, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    m = evaluate.run(p, root / "prepared", root / "cache", root / "head", tmp_path / "r.json",
                     tmp_path / "plot.json", tmp_path / "detail.json")
    assert json.loads((tmp_path / "r.json").read_text()) == m
    return m, json.loads((tmp_path / "detail.json").read_text())


def _dense(q: torch.Tensor, c: torch.Tensor, exclude: int) -> list[int]:
    """Every corpus index but `exclude`, by cosine, ties by index (a loop, not `topk`)."""
    cos = (torch.nn.functional.normalize(q, dim=0) @ torch.nn.functional.normalize(c, dim=1).T)
    return sorted((j for j in range(len(c)) if j != exclude), key=lambda j: (-float(cos[j]), j))


def _per_query(rankings: list[list[int]], gains: list[dict[int, float]]) -> list[dict[str, float]]:
    return [query_metrics(r, g, KS) for r, g in zip(rankings, gains, strict=True)]


def _significance(m: dict[str, Any], p: P.Params, root: Path, corpus: str,
                  ref: dict[str, list[dict[str, float]]]) -> None:
    """The reported paired tests are `significance.paired` of the per-query values of the
    systems, and those values are the reference loops' (`ref`: trained, bm25, hybrid). The test
    runs on evaluate's own float32 per-query values: it counts sign flips whose mean ties the
    observed one, so an ulp of summation order would move the p-value."""
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    task = evaluate.evaluation_task(data, corpus, root / "prepared")
    text_map = load_prepared(root / "prepared").text_map()
    trained_vectors = by_rows(evaluate.cached(data, heads.load(root / "head")))
    with torch.inference_mode():
        t = task.score(trained_vectors, KS)
        _, systems = lexical.scored(data, task, text_map, t, trained_vectors, p.evaluate, KS)
    per_query = {"trained": metrics.per_query(t.ranked, KS), **{
        name: metrics.per_query(s.ranked, KS) for name, s in systems.items()}}
    assert set(per_query) == set(ref)
    for name, rows in ref.items():
        for k in rows[0]:
            assert per_query[name][k].tolist() == pytest.approx([r[k] for r in rows], abs=1e-6)
    sig = p.evaluate.significance

    def paired(a: str, b: str) -> dict[str, Any]:
        return {k: significance.paired(per_query[a][k].numpy(), per_query[b][k].numpy(),
                                       sig.resamples, sig.seed) for k in HEADLINE}

    assert m["significance_over_bm25"] == paired("trained", "bm25")
    assert m["hybrid_significance"] == paired("hybrid", "trained")
    assert m["significance_over_bm25"] != m["significance"]  # not the baseline's test


@pytest.mark.parametrize("corpus", ["train", "test"])
def test_groups_report_bm25_and_hybrid_equal_independent_computations(
        corpus: str, trained: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    """Test texts query the train texts (or each other, leave-one-out): BM25 by bm25s, the
    hybrid by fusing the trained vectors' and bm25s's rankings by hand, metrics by loops; the
    lifts, the paired significance and the per-label detail follow from them."""
    root, params_file = trained
    p, _ = _params(params_file, tmp_path, corpus)
    m, detail = _run(p, root, tmp_path)
    ex = pq.read_table(root / "prepared" / "examples.parquet").to_pydict()
    text = dict(zip(*pq.read_table(root / "prepared" / "texts.parquet",
                                   columns=["text_id", "text"]).to_pydict().values(), strict=True))
    rows = {s: [i for i, sp in enumerate(ex["split"]) if sp == s] for s in ("train", "test")}
    q_ids, c_ids = [ex["text_id"][i] for i in rows["test"]], [ex["text_id"][i] for i in
                                                              rows[corpus]]
    q_lab, c_lab = [ex["label"][i] for i in rows["test"]], [ex["label"][i] for i in rows[corpus]]
    loo = corpus == "test"
    lex = library_scores([text[t] for t in c_ids], [text[t] for t in q_ids])
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    head = heads.load(root / "head")
    with torch.inference_mode():
        tv = {t: head(data.q_vectors[r : r + 1].float())[0] for t, r in zip(
            data.row_ids["query"], range(len(data.row_ids["query"])), strict=True)}
    cv = torch.stack([tv[t] for t in c_ids])
    gains = [{j: 1.0 for j, lab in enumerate(c_lab) if lab == q_lab[q] and not (loo and j == q)}
             for q in range(len(q_ids))]
    own = [q if loo else -1 for q in range(len(q_ids))]
    bm = _per_query([ranking(lex[q], own[q]) for q in range(len(q_ids))], gains)
    dense = [_dense(tv[t], cv, own[q]) for q, t in enumerate(q_ids)]
    tr = _per_query(dense, gains)
    hy = _per_query([[j for _, j in fuse([dense[q], ranking(lex[q], own[q])],
                                         p.evaluate.hybrid.rrf_k)] for q in range(len(q_ids))],
                    gains)
    assert m["trained"] == pytest.approx(mean_metrics(tr), abs=1e-6)  # the dense loop is right
    assert m["bm25"] == pytest.approx(mean_metrics(bm), abs=1e-6)
    assert m["hybrid"] == pytest.approx(mean_metrics(hy), abs=1e-6)
    assert m["bm25"]["p@1"] > 0 and m["bm25"] != pytest.approx(m["trained"])  # can fail
    assert m["hybrid"] != pytest.approx(m["bm25"]) and m["hybrid"] != pytest.approx(m["trained"])
    for k, v in m["trained"].items():
        assert m["lift_over_bm25"][k] == pytest.approx(v - m["bm25"][k], abs=1e-12)
        assert m["hybrid_lift"][k] == pytest.approx(m["hybrid"][k] - v, abs=1e-12)
    _significance(m, p, root, corpus, {"trained": tr, "bm25": bm, "hybrid": hy})
    assert m["bm25_settings"]["library"] == "bm25s 0.3.16"
    for lab, d in detail["per_label"].items():
        mine = [q for q in range(len(q_ids)) if q_lab[q] == lab]
        assert d["bm25"] == pytest.approx(mean_metrics([bm[q] for q in mine]), abs=1e-6)
        assert d["hybrid"] == pytest.approx(mean_metrics([hy[q] for q in mine]), abs=1e-6)
    assert report.headline(m) == {part: {k: m[part][k] for k in HEADLINE}
                                  for part in ("trained", "baseline", "lift")}


def test_hybrid_off_reports_no_hybrid(trained: tuple[Path, Path],  # noqa: F811
                                      tmp_path: Path) -> None:
    root, params_file = trained
    off, _ = _run(_params(params_file, tmp_path, hybrid=False)[0], root, tmp_path / "off")
    on, _ = _run(_params(params_file, tmp_path, hybrid=True)[0], root, tmp_path / "on")
    assert not {"hybrid", "hybrid_lift", "hybrid_significance"} & set(off)
    assert {k: v for k, v in on.items() if not k.startswith("hybrid")} == off


def test_beir_report_bm25_ranks_every_document_with_graded_gains(
        beir_trained: tuple[Path, Path, dict[str, dict[str, int]]],  # noqa: F811
        tmp_path: Path) -> None:
    """Pairs: BM25 ranks all 60 documents (the 20 unjudged ones included) for the test
    queries, with the folder's graded qrels as gains."""
    root, params_file, qrels = beir_trained
    p, _ = _params(params_file, tmp_path)
    m, _ = _run(p, root, tmp_path)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    task = evaluate.evaluation_task(data, "all", root / "prepared")
    q_orig, d_orig = evaluate._run_ids(data, task, root / "prepared")  # the task's order
    assert sorted(q_orig) == sorted(qrels) and sorted(d_orig) == sorted(
        f"doc-{i}" for i in range(60))
    t = pq.read_table(root / "prepared" / "texts.parquet").to_pydict()
    text = dict(zip(t["source_id"], t["text"], strict=True))
    lex = library_scores([text[d] for d in d_orig], [text[q] for q in q_orig])
    gains = [{d_orig.index(d): float(g) for d, g in qrels[q].items()} for q in q_orig]
    bm = _per_query([ranking(row) for row in lex], gains)
    assert m["bm25"] == pytest.approx(mean_metrics(bm), abs=1e-6)
    assert m["bm25"]["ndcg@10"] > 0 and m["corpus"] == 60
    assert m["hybrid"]["ndcg@10"] > 0 and set(m["hybrid_significance"]) == set(HEADLINE)


def _lines(output: str) -> list[tuple[float, str]]:
    """(score, text) of each line `search` prints for groups data: `score  [label]  text`."""
    rows = [x.split("  ", 2) for x in output.splitlines() if x[:1].isdigit()]
    assert all(r[1].startswith("[") and r[1].endswith("]") for r in rows), output
    return [(float(s), t.lstrip()) for s, _, t in rows]


def test_search_hybrid_is_the_fusion_by_hand(trained: tuple[Path, Path],  # noqa: F811
                                             tmp_path: Path) -> None:
    """`search --hybrid` prints the RRF of the model's and bm25s's full rankings of the corpus
    (every prepared text); `--no-hybrid` the cosine; no flag: `evaluate.hybrid.enabled`."""
    root, params_file = trained
    p, on_file = _params(params_file, tmp_path, hybrid=True)
    query = sentences(80)[7] + " river"
    texts = pq.read_table(root / "prepared" / "texts.parquet").column("text").to_pylist()
    dense = search(p, query, len(texts), root / "head", root / "prepared", root / "cache",
                   hybrid=False)
    assert sorted(h.text for h in dense) == sorted(texts)
    by_text = {t: i for i, t in enumerate(texts)}
    lex = library_scores(texts, [query])[0]
    want = fuse([[by_text[h.text] for h in dense], ranking(lex)], p.evaluate.hybrid.rrf_k)[:6]
    args = ["search", query, "--k", "6", "--params", str(on_file), "--head", str(root / "head"),
            "--prepared", str(root / "prepared"), "--cache", str(root / "cache")]
    for flags in ([], ["--hybrid"]):
        result = CliRunner().invoke(app, args + flags)
        assert result.exit_code == 0, result.output
        got = _lines(result.output)
        assert [t for _, t in got] == [texts[j] for _, j in want]
        assert [s for s, _ in got] == pytest.approx([s for s, _ in want], abs=5e-5)
    assert [texts[j] for _, j in want] != [h.text for h in dense[:6]]  # fusion moved something
    assert max(s for s, _ in want) <= 2 / 61  # an RRF score, not a cosine
    result = CliRunner().invoke(app, [*args, "--no-hybrid"])
    assert result.exit_code == 0, result.output
    assert _lines(result.output) == [(pytest.approx(h.score, abs=5e-5), h.text)
                                     for h in dense[:6]]
