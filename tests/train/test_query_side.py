"""`train.head.side: query` (issue 37): the loss against the frozen corpus, what it refuses, and
the whole path on tiny data: train, evaluate (head(queries) against the frozen cached corpus),
search, export (a `Router`: `encode_document` is the frozen encoder's, `encode_query` is
`load_model`'s), and an index built from the frozen vectors answering the export's queries with
evaluate's metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.cache.views import open_pair
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.examples import load as load_examples
from simtune.export.model_card import CardInputs
from simtune.export.stage import export
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval.topk import topk
from simtune.train.query_side import CorpusLoss, _positives
from stages import app
from tests.conftest import repo_params, write_params
from tests.train_helpers import project, stage_args, trained_evaluated_exported

st = pytest.importorskip("sentence_transformers")


def _reference(q: torch.Tensor, corpus: torch.Tensor, pos: list[list[int]],
               own: list[int | None], t: float) -> float:
    """The multi-positive InfoNCE, one query at a time, in float64."""
    losses = []
    for i in range(len(q)):
        if not pos[i]:
            continue
        s = F.cosine_similarity(q[i].double()[None], corpus.double()) / t
        keep = [j for j in range(len(corpus)) if j != own[i]]
        lse = torch.logsumexp(s[keep], 0)
        losses.append(sum(float(lse - s[j]) for j in pos[i]) / len(pos[i]))
    return sum(losses) / len(losses)


def test_the_groups_loss_ranks_each_query_against_the_whole_frozen_corpus() -> None:
    g = torch.Generator().manual_seed(0)
    corpus, labels = torch.randn(12, 5, generator=g), torch.tensor([0, 1, 2] * 4)
    loss = CorpusLoss(corpus, 0.1, labels, None, torch.arange(12), seed=0)
    idx = torch.tensor([3, 7, 8])
    q = torch.randn(3, 5, generator=g)
    pos = [[j for j in range(12) if labels[j] == labels[i] and j != i] for i in idx.tolist()]
    want = _reference(q, corpus, pos, idx.tolist(), 0.1)
    assert float(loss(q, idx)) == pytest.approx(want, rel=1e-5)


def test_the_pairs_loss_counts_every_positive_of_the_query_and_skips_none() -> None:
    g = torch.Generator().manual_seed(1)
    corpus = torch.randn(6, 4, generator=g)
    # rows: query 0 -> docs 1, 4; query 1 -> doc 2; query 2 -> doc 5 with score 0 (no positive)
    q_ids, d_index = torch.tensor([0, 0, 1, 2]), torch.tensor([1, 4, 2, 5])
    positives = _positives(q_ids, d_index, torch.tensor([True, True, True, False]))
    assert positives.tolist() == [[1, 4], [1, 4], [2, -1], [-1, -1]]
    loss = CorpusLoss(corpus, 0.05, None, positives, None, seed=0)
    q = torch.randn(4, 4, generator=g)
    want = _reference(q, corpus, [[1, 4], [1, 4], [2], []], [None] * 4, 0.05)
    assert float(loss(q, torch.arange(4))) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(("key", "value"), [("mode", "full"), ("hard_negatives", 2)])
def test_what_a_query_side_head_cannot_train_is_refused_in_one_line(key: str, value: Any
                                                                    ) -> None:
    raw = repo_params()
    raw["train"]["head"]["side"] = "query"
    P.validate(raw)  # the default run's other settings take it
    raw["train"][key] = value
    with pytest.raises(UserError) as e:
        P.validate(raw)
    msg = str(e.value)
    assert "\n" not in msg and "train: head.side: query" in msg and f"{key}: {value}" in msg
    raw["train"][key] = repo_params()["train"][key]
    raw["train"]["mode"] = "top_layers"  # a query tower: its top layers train for queries
    assert P.validate(raw).train.head.side == "query"


def test_a_query_side_head_refuses_a_loss_it_does_not_rank_with() -> None:
    raw = repo_params()
    raw["train"]["head"]["side"] = "query"
    raw["train"]["loss"]["name"] = "triplet"
    with pytest.raises(UserError, match=r"train: head\.side: query .*loss\.name: triplet"):
        P.validate(raw)


def test_a_sweep_may_compare_the_sides() -> None:
    raw = repo_params()
    raw["sweep"]["space"]["train.head.side"] = {"choices": ["both", "query"]}
    assert P.validate(raw).sweep.space["train.head.side"].choices == ["both", "query"]


# --- the whole path on tiny data --------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("query-side")
    raw, params_file = project(root, tiny_bert, max_epochs=4, patience=4, lr=0.05)
    raw["train"]["head"]["side"] = "query"
    write_params(params_file, raw)
    return trained_evaluated_exported(root, params_file)


def _frozen(run: dict[str, Any], texts: list[str]) -> torch.Tensor:
    p = run["p"]
    return FrozenEncoder("tiny", p.encoders.models["tiny"], torch.device("cpu")).encode(texts, 8)


def test_train_records_the_side_and_evaluate_ranks_head_queries_against_frozen_texts(
        run: dict[str, Any]) -> None:
    root, data = run["root"], run["data"]
    assert json.loads((root / "head" / "training.json").read_text())["head_side"] == "query"
    report = run["report"]
    assert report["head_side"] == "query"
    # independently: head(test vectors) against the frozen cached train vectors, by brute force
    head = heads.load(root / "head")
    table = data.q_vectors
    test, train = data.splits["test"].tensors, data.splits["train"].tensors
    with torch.inference_mode():
        q = head(table[test["rows"]].float())
    sims = F.normalize(q, dim=-1) @ F.normalize(table[train["rows"]].float(), dim=-1).T
    top = sims.argmax(1)
    p1 = float((train["labels"][top] == test["labels"]).float().mean())
    assert report["trained"]["p@1"] == pytest.approx(p1, abs=1e-9)
    # and the symmetric scoring of the same head ranks otherwise (the test can tell them apart)
    with torch.inference_mode():
        both = F.normalize(q, dim=-1) @ F.normalize(head(table[train["rows"]].float()), dim=-1).T
    assert not torch.equal(both.argsort(1, descending=True), sims.argsort(1, descending=True))
    assert set(report) >= {"baseline", "lift", "bm25", "lift_over_bm25"}


def test_the_model_leaves_documents_frozen_and_search_ranks_the_frozen_corpus(
        run: dict[str, Any]) -> None:
    from simtune.evaluate.search import search

    root, texts = run["root"], run["texts"]["train"]
    model = load_model(root / "head", encoder=run["p"].encoders.models["tiny"].model)
    assert torch.equal(model.encode(texts, 8, role="document"), _frozen(run, texts))
    hits = search(run["p"], texts[0], 3, root / "head", root / "prepared", root / "cache")
    q = model.encode([texts[0]])
    corpus = load_prepared(root / "prepared").text_map()
    frozen = _frozen(run, list(corpus.values()))
    want = sorted((F.cosine_similarity(q, frozen)).tolist(), reverse=True)[:3]
    assert [h.score for h in hits] == pytest.approx(want, abs=1e-5)


def test_the_export_routes_queries_through_the_head_and_documents_past_it(
        run: dict[str, Any]) -> None:
    root, texts = run["root"], run["texts"]["test"]
    config = json.loads((root / "export" / "simtune.json").read_text())
    assert config["head_side"] == "query"
    modules = json.loads((root / "export" / "modules.json").read_text())
    assert modules[-1]["type"].endswith("Router")
    model = st.SentenceTransformer(str(root / "export"), device="cpu")  # simtune not needed
    docs = torch.as_tensor(model.encode_document(texts, convert_to_numpy=True))
    assert torch.allclose(docs, _frozen(run, texts), atol=1e-6)
    queries = torch.as_tensor(model.encode_query(texts, convert_to_numpy=True))
    ours = load_model(root / "export").encode(texts, 8)
    assert torch.allclose(queries, ours, atol=1e-6)
    assert not torch.allclose(queries, docs, atol=1e-3)  # the head did something
    assert torch.allclose(load_model(root / "export").encode(texts, 8, role="document"),
                          _frozen(run, texts), atol=0)
    card = (root / "export" / "README.md").read_text()
    assert "Existing document vectors stay valid" in card


def test_an_index_of_the_frozen_vectors_answers_the_exports_queries_with_evaluates_metrics(
        run: dict[str, Any]) -> None:
    """The ecosystem proof: the index holds only frozen vectors (here the exact top-k engine;
    faiss too where installed); the exported model's `encode_query` queries it."""
    root, data = run["root"], run["data"]
    train, test = data.splits["train"].tensors, data.splits["test"].tensors
    index = _frozen(run, run["texts"]["train"])  # what a user's index already holds
    model = st.SentenceTransformer(str(root / "export"), device="cpu")
    q = torch.as_tensor(model.encode_query(run["texts"]["test"], convert_to_numpy=True))
    _, idx = topk(q, index, 10)
    rel = train["labels"][idx] == test["labels"][:, None]
    p1 = float(rel[:, 0].float().mean())
    first = torch.where(rel.any(1), rel.float().argmax(1) + 1, 0)
    mrr = float(torch.where(first > 0, 1.0 / first.clamp_min(1), 0.0).mean())
    report = run["report"]["trained"]
    assert (p1, mrr) == (pytest.approx(report["p@1"], abs=1e-6),
                         pytest.approx(report["mrr@10"], abs=1e-6))
    try:
        import faiss
    except ImportError:
        return
    flat = faiss.IndexFlatIP(index.shape[1])
    flat.add(F.normalize(index, dim=-1).numpy())
    _, fi = flat.search(F.normalize(q, dim=-1).numpy(), 1)
    assert float((train["labels"][torch.as_tensor(fi[:, 0])] == test["labels"]).float().mean()
                 ) == pytest.approx(report["p@1"], abs=1e-6)


def test_pairs_train_and_evaluate_queries_against_every_frozen_document(
        tmp_path: Path, tiny_bert: Path) -> None:
    """Pairs: head(test queries) rank every document's frozen cached vector (MRR@10 by brute
    force), and the document vectors of the model are the frozen encoder's."""
    import pyarrow.parquet as pq

    from simtune.cache.views import open_cache
    from simtune.evaluate import stage as evaluate
    from tests.negatives.test_negatives import _pairs_project

    head = {**repo_params()["train"]["head"], "side": "query", "dropout": 0.0}
    params_file = _pairs_project(tmp_path, tiny_bert, hard_negatives=0, head=head,
                                 max_epochs=3, lr=0.05)
    out = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert out.exit_code == 0, out.output
    p = P.load(params_file)
    report = evaluate.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                          tmp_path / "m.json", tmp_path / "r.json", tmp_path / "d.json")
    assert report["head_side"] == "query"
    ex = pq.read_table(tmp_path / "prepared" / "examples.parquet").to_pylist()
    docs = list(dict.fromkeys(r["doc_id"] for r in ex))
    test = [r for r in ex if r["split"] == "test"]
    queries = list(dict.fromkeys(r["query_id"] for r in test))
    table = open_cache(tmp_path / "cache", "tiny", p.encoders.models["tiny"], p.cache)
    with torch.inference_mode():
        q = heads.load(tmp_path / "head")(table.vectors[table.index(queries)].float())
    d = table.vectors[table.index(docs)].float()
    sims = F.normalize(q, dim=-1) @ F.normalize(d, dim=-1).T
    rr = []
    for i, qid in enumerate(queries):
        relevant = {docs.index(r["doc_id"]) for r in test if r["query_id"] == qid}
        ranked = sims[i].argsort(descending=True)[:10].tolist()
        rr.append(next((1 / (k + 1) for k, j in enumerate(ranked) if j in relevant), 0.0))
    assert report["trained"]["mrr@10"] == pytest.approx(sum(rr) / len(rr), abs=1e-6)  # fp32 mean
    model = load_model(tmp_path / "head", encoder=p.encoders.models["tiny"].model)
    texts = ["the river of the king", "a song of the war"]
    frozen = FrozenEncoder("tiny", p.encoders.models["tiny"], torch.device("cpu"))
    assert torch.equal(model.encode(texts, role="document"),
                       frozen.as_role("document").encode(texts, 64))


def test_a_new_export_replaces_an_earlier_query_side_export(run: dict[str, Any],
                                                           tmp_path: Path) -> None:
    """Its `Router` folder is an export's own: the folder is replaced, not refused."""
    import shutil

    out = tmp_path / "export"
    shutil.copytree(run["root"] / "export", out)
    assert any(p.name.endswith("_Router") for p in out.iterdir())
    export(run["root"] / "head", out, CardInputs(params=run["p"]))
    assert torch.equal(load_model(out).encode(["a song"]),
                       load_model(run["root"] / "export").encode(["a song"]))


def test_a_query_side_heads_pairs_validate_against_the_train_and_val_documents(
        tmp_path: Path, tiny_bert: Path) -> None:
    """The val queries rank the frozen vectors of every train and val document (no test one):
    the frozen encoder's MRR@10 by brute force over them is the task's; a symmetric head's
    still ranks the val documents alone."""
    from simtune.cache.views import open_cache
    from simtune.train import headroom
    from simtune.train.stage import validation_task
    from tests.negatives.test_negatives import _pairs_project

    head = {**repo_params()["train"]["head"], "side": "query"}
    p = P.load(_pairs_project(tmp_path, tiny_bert, hard_negatives=0, head=head))
    prepared = load_prepared(tmp_path / "prepared")
    q_table, d_table = open_pair(tmp_path / "cache", p.encoders, p.cache, prepared.kind,
                                 placed=False)
    data = load_examples(prepared.kind, prepared.examples, q_table, d_table)
    task = validation_task(data, p.train.head.side, p.evaluate.corpus)
    ex = prepared.examples.to_pylist()
    docs = list(dict.fromkeys(r["doc_id"] for r in ex if r["split"] in ("train", "val")))
    assert task.corpus_size == len(docs) < len({r["doc_id"] for r in ex})
    val = [r for r in ex if r["split"] == "val"]
    queries = list(dict.fromkeys(r["query_id"] for r in val))
    table = open_cache(tmp_path / "cache", "tiny", p.encoders.models["tiny"], p.cache)
    q = F.normalize(table.vectors[table.index(queries)].float(), dim=-1)
    d = F.normalize(table.vectors[table.index(docs)].float(), dim=-1)
    rr = []
    for i, ranked in enumerate((q @ d.T).argsort(1, descending=True)[:, :10].tolist()):
        relevant = {docs.index(r["doc_id"]) for r in val if r["query_id"] == queries[i]}
        rr.append(next((1 / (k + 1) for k, j in enumerate(ranked) if j in relevant), 0.0))
    got = headroom.frozen_metrics(data, task)
    assert got is not None and got["mrr@10"] == pytest.approx(sum(rr) / len(rr), abs=1e-6)
    # the symmetric head: the val documents alone
    assert validation_task(data, "both", p.evaluate.corpus).corpus_size == len(
        {r["doc_id"] for r in val})


def test_switching_to_the_query_side_embeds_no_document_again(tmp_path: Path,
                                                               tiny_bert: Path) -> None:
    """The target "nothing re-embedded": a fill for `side: query` after one for `both` embeds
    0 texts, and `train.head.side` is no param of the cache stage (DVC does not rerun it)."""
    import yaml

    from simtune.cache import stage as cache
    from tests.conftest import ROOT
    from tests.negatives.test_negatives import _pairs_project

    params_file = _pairs_project(tmp_path, tiny_bert, hard_negatives=0)  # filled, side both
    raw = P.read_yaml(params_file)
    raw["train"]["head"]["side"] = "query"
    p = P.validate(raw)
    results = cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache)
    assert results and all(r.embedded == 0 and r.cached == r.needed > 0 for r in results)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert not [k for k in stages["cache"]["params"] if str(k).startswith("train.head")]
