"""`train.mode: static` on pairs data (issue 45): the cache stage fills the teacher's query
view of the queries and its document view of the documents (its two prompts differ here),
the fit's texts are the train split's queries then documents, each taught its own role's
teacher vector, the MNRL term pairs them, and the kept epoch's validation metrics are what the
saved table scores on the same task (the val queries against every known document)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from simtune import examples
from simtune import params as P
from simtune.cache import stage as cache
from simtune.cache.views import open_pair, open_roles
from simtune.model import load_model
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import load as load_prepared
from simtune.prepare.prepared import write as write_prepared
from simtune.retrieval.task import by_rows, retrieval_task
from simtune.train import static_run
from simtune.train.stage import in_force
from simtune.train.validation import KS
from tests.cache_helpers import cache_params, encoder_params, sentences
from tests.conftest import repo_params, save_tiny_bert

PROMPTS = {"query": "what is ", "document": "the ", "include_prompt": False}
N = 40


def _raw(root: Path, bert: Path) -> dict[str, Any]:
    """N (query, document) pairs; the student encoder `tiny`, the teacher a 48-d tiny BERT
    with a prompt per role; train.mode static."""
    rows = [{"q": q, "d": d} for q, d in zip(sentences(N), sentences(N, 100), strict=True)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = repo_params()
    raw["prepare"].update(source="file")
    raw["prepare"]["file"].update(path=str(root / "pairs.jsonl"), kind="pairs")
    raw["prepare"]["file"]["columns"].update(query="q", positive="d")
    raw["prepare"]["split"]["fractions"] = {"train": 0.5, "val": 0.25, "test": 0.25}
    raw["encoders"] = encoder_params(bert)
    teacher = save_tiny_bert(root / "teacher-bert", seed=3, hidden=48)
    raw["encoders"]["models"]["teacher"] = {**raw["encoders"]["models"]["tiny"],
                                            "model": str(teacher), "prompts": PROMPTS}
    raw["cache"] = cache_params()
    raw["train"].update(mode="static")
    raw["train"]["distill"]["teacher"] = "teacher"
    raw["train"]["schedule"]["static"].update({"lr": 0.05, "batch_size": 8, "max_epochs": 3,
                                               "patience": 3, "label_weight": 0.5})
    return raw


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, P.Params]:
    root = tmp_path_factory.mktemp("static-pairs")
    p = P.validate(_raw(root, save_tiny_bert(root / "bert")))
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    results = cache.fill(root / "prepared", root / "cache", p.encoders, p.cache,
                         teacher=P.teacher_of(p.train))
    views = {r.view for r in results}
    assert len(views) == 3 and "tiny" in views  # the student's one view, the teacher's two
    return root, p


def test_the_fit_texts_are_the_train_queries_then_documents_each_taught_its_role(
        project: tuple[Path, P.Params]) -> None:
    root, p = project
    prepared = load_prepared(root / "prepared")
    t_q, t_d = open_roles(root / "cache", "teacher", p.encoders.models["teacher"], p.cache,
                          "pairs", placed=False)
    assert t_q is not t_d  # two prompts: two views
    rows = static_run.fit_rows("pairs", prepared.examples, t_q, t_d)
    ex = prepared.examples.filter(pc.equal(prepared.examples.column("split"), "train"))
    queries, docs = ex.column("query_id").to_pylist(), ex.column("doc_id").to_pylist()
    assert rows.ids == queries + docs  # one pair per query here: all distinct
    assert (rows.labelled, rows.unlabelled, rows.labels) == (2 * len(queries), 0, None)
    n = len(queries)
    assert torch.equal(rows.pairs, torch.stack([torch.arange(n), torch.arange(n) + n], 1))
    assert torch.equal(rows.target[:n], t_q.vectors[t_q.index(queries)].float())
    assert torch.equal(rows.target[n:], t_d.vectors[t_d.index(docs)].float())
    # the documents' targets are the document view's: the query view's differ (its prompt)
    shared = [d for d in docs if d in set(t_q.ids.to_pylist())]
    assert not shared or not torch.equal(rows.target[n:][:1], t_q.vectors[t_q.index(shared[:1])])


def test_corpus_only_documents_are_unlabelled_fit_texts(project: tuple[Path, P.Params]) -> None:
    """A BEIR corpus's documents no pair names (split `corpus`) come after the train ones,
    with the teacher's document vectors and no pair; validation's documents never enter."""
    root, p = project
    ex = load_prepared(root / "prepared").examples
    t_q, t_d = open_roles(root / "cache", "teacher", p.encoders.models["teacher"], p.cache,
                          "pairs", placed=False)
    val = ex.filter(pc.equal(ex.column("split"), "val"))
    corpus = val.set_column(val.schema.get_field_index("split"), "split",
                            pa.array(["corpus"] * val.num_rows))
    test = ex.filter(pc.equal(ex.column("split"), "test"))
    train = ex.filter(pc.equal(ex.column("split"), "train"))
    rows = static_run.fit_rows("pairs", pa.concat_tables([train, corpus, test]), t_q, t_d)
    extra = val.column("doc_id").to_pylist()
    assert rows.unlabelled == len(extra) and rows.ids[-len(extra):] == extra
    assert torch.equal(rows.target[-len(extra):], t_d.vectors[t_d.index(extra)].float())
    assert int(rows.pairs.max()) < rows.labelled
    base = static_run.fit_rows("pairs", pa.concat_tables([train, test]), t_q, t_d)
    assert rows.ids[: rows.labelled] == base.ids and torch.equal(rows.pairs, base.pairs)


def test_train_on_pairs_keeps_what_the_saved_table_scores(project: tuple[Path, P.Params]
                                                          ) -> None:
    root, p = project
    t = in_force(p.train, p.encoders, root / "prepared")
    report = static_run.run(t, p.encoders, p.cache, p.evaluate.corpus, root / "prepared",
                            root / "cache", root / "head", root / "train.json")
    assert report["texts"] == {"train": N, "unlabelled": 0, "pairs": N // 2}
    # the kept epoch's metrics are the saved table's on the validation task (the val queries
    # against the train and val documents), each side embedded from its text by the served model
    q_table, d_table = open_pair(root / "cache", p.encoders, p.cache, "pairs", placed=False)
    prepared = load_prepared(root / "prepared")
    data = examples.load("pairs", prepared.examples, q_table, d_table)
    texts = prepared.text_map()
    model = load_model(root / "head", "cpu")

    def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
        ids = data.row_ids["doc" if role == "doc" else "query"]
        return model.encode([texts[ids[r]] for r in rows.tolist()])
    task = retrieval_task(data, "val", "known")
    got = task.score(by_rows(vectors), KS).metrics
    assert got["mrr@10"] == pytest.approx(report["best_val"]["val/mrr@10"], abs=1e-6)
    # the teacher's validation metrics are its two cached views' on the same task
    t_q, t_d = open_roles(root / "cache", "teacher", p.encoders.models["teacher"], p.cache,
                          "pairs", placed=False)
    t_data = examples.load("pairs", prepared.examples, t_q, t_d)
    teacher = retrieval_task(t_data, "val", "known").score(
        by_rows(lambda rows, role: (t_d if role == "doc" else t_q).vectors[rows].float()), KS)
    assert report["teacher_val"]["val/mrr@10"] == pytest.approx(teacher.metrics["mrr@10"])


def test_evaluate_scores_the_teacher_from_its_two_views(project: tuple[Path, P.Params]) -> None:
    """Evaluate's `distill` part on pairs: the teacher ranks every document from its document
    view and queries from its query view, on the test task the student's rows use; the speed
    sample is the test queries."""
    from simtune.evaluate import stage as evaluate
    from simtune.evaluate.stage import evaluation_task

    root, p = project
    if not (root / "head").is_dir():
        test_train_on_pairs_keeps_what_the_saved_table_scores(project)
    p = P.validate({**p.model_dump(), "evaluate": {**p.evaluate.model_dump(), "speed_texts": 4}})
    out = evaluate.run(p, root / "prepared", root / "cache", root / "head",
                       root / "evaluate.json", root / "recall.json", root / "detail.json")
    prepared = load_prepared(root / "prepared")
    t_q, t_d = open_roles(root / "cache", "teacher", p.encoders.models["teacher"], p.cache,
                          "pairs", placed=False)
    t_data = examples.load("pairs", prepared.examples, t_q, t_d)
    want = evaluation_task(t_data, p.evaluate.corpus, root / "prepared").score(
        by_rows(lambda rows, role: (t_d if role == "doc" else t_q).vectors[rows].float()),
        (1, 10))
    assert out["distill"]["teacher"]["mrr@10"] == pytest.approx(want.metrics["mrr@10"])
    assert out["distill"]["speed"]["texts"] == 4
