"""The `evaluate` stage: retrieval metrics of the trained model against the frozen baseline
and BM25 (and the RRF hybrid of BM25 and the trained model when `evaluate.hybrid.enabled`).

Everything runs under `torch.inference_mode()`. Test vectors come from the cache through the
trained head; the baseline is the same computation through the identity head (the frozen
encoder). In full mode the trained vectors come from the fine-tuned encoder saved with the head.

A distillation (`train.objective: distill`) adds the teacher on the same test task, with the
same significance test, and each model's encode speed (`evaluate.distill`).

Two reports: the headline (`trained`, `baseline`, `lift`, the lift's paired `significance`,
counts; for a head trained with `matryoshka_dims`, `matryoshka`: P@1, MRR@10, nDCG@10 and MAP@R
of both models with their vectors cut to each dim and re-normalised; a DVC metrics file, one
column each in `dvc exp show`; `report.headline` cuts it from the full report, which also holds
BM25 and the hybrid, `evaluate.lexical`) and the detail (groups: the same
metrics per test label; not DVC metrics, so 50 labels do not add hundreds of columns). The
rankings of both models also go to TREC run files (`runs`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import torch

from simtune import examples, heads
from simtune import params as P
from simtune.atomic import write_json
from simtune.cache.views import open_pair
from simtune.errors import UserError
from simtune.evaluate import distill, lexical, report, runs, trained_on
from simtune.evaluate.vectors import Vectors, cached, trained
from simtune.examples import Data
from simtune.params import Params
from simtune.prepare.prepared import load as load_prepared
from simtune.prepare.prepared import read_parquet
from simtune.retrieval import metrics, significance
from simtune.retrieval.metrics import HEADLINE
from simtune.retrieval.task import RetrievalTask, by_rows, retrieval_task
from simtune.static import is_static

log = logging.getLogger(__name__)


def evaluation_task(data: Data, corpus: str, prepared_dir: Path) -> RetrievalTask:
    """The test split's task: groups against the `corpus` split's texts (`evaluate.corpus`:
    train, or test: leave-one-out); pairs against every document, the prepared corpus-only
    rows included, with graded gains (the scores, when any is not 1)."""
    if data.kind == "groups":
        return retrieval_task(data, "test", corpus)
    extra = torch.tensor(_corpus_only_rows(data, prepared_dir), dtype=torch.long)
    return retrieval_task(data, "test", "all", "graded", extra)


def _corpus_only_rows(data: Data, prepared_dir: Path) -> list[int]:
    """Cache rows of the documents that are in no example (BEIR's unjudged documents: the
    prepared `corpus` rows): they are ranked like every other document."""
    ex = read_parquet(Path(prepared_dir) / "examples.parquet", columns=["split", "doc_id"])
    ex = ex.filter(pc.equal(ex.column("split"), "corpus"))
    if ex.num_rows == 0:
        return []
    row_of = {tid: r for r, tid in enumerate(data.row_ids["doc"])}
    return [row_of[d] for d in ex.column("doc_id").to_pylist()]


@torch.inference_mode()
def run(p: Params, prepared_dir: Path, cache_dir: Path, head_dir: Path, out: Path,
        plot: Path, detail: Path, run_files: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """Evaluate trained vs baseline on the test split; write the headline metrics (`out`,
    returned), the Recall@k plot, the detail report (per test label, groups) and, given
    `run_files` (trained, baseline), both rankings as TREC run files."""
    student = is_static(head_dir)  # a static student (train.mode static): a token table
    if not student:  # its own tokenizer and table, from the text: no cached input to match
        trained_on.check(head_dir, p.encoders)
    prepared = load_prepared(prepared_dir)
    q_table, d_table = open_pair(cache_dir, p.encoders, p.cache, prepared.kind, placed=False)
    data = examples.load(prepared.kind, prepared.examples, q_table, d_table)
    if len(data.splits["test"]) == 0:
        raise UserError(f"{prepared_dir}: the test split is empty")
    head = heads.build("identity", data.dim, 1, 0.0) if student else heads.load(head_dir)
    if head.config["dim"] != data.dim:
        raise UserError(f"{head_dir}: head expects {head.config['dim']}-d vectors, the cache "
                        f"holds {data.dim}-d (encoder changed since training? rerun train)")
    ks = tuple(sorted(set(p.evaluate.ks)))
    task = evaluation_task(data, p.evaluate.corpus, prepared_dir)
    corpus_size = task.corpus_size
    if max(ks) > corpus_size:
        log.warning("Recall@k for k > %d (the corpus size) equals Recall@%d", corpus_size,
                    corpus_size)
    ids = _run_ids(data, task, prepared_dir) if run_files else None
    depth = p.evaluate.run_depth if run_files else 0
    trained_vectors = _finite(trained(data, head, head_dir, p, prepared_dir,
                                      (cache_dir, q_table, d_table)), head_dir)
    baseline_vectors = cached(data, heads.build("identity", data.dim, 1, 0.0))
    dims = _matryoshka_dims(head_dir)
    if dims or p.evaluate.hybrid.enabled:  # every prefix, the hybrid reuse the test vectors
        trained_vectors = report.remember(trained_vectors)
    if dims:
        baseline_vectors = report.remember(baseline_vectors)
    # a query-side head (train.head.side query): the corpus keeps the frozen cached vectors
    side = _head_side(head_dir)
    frozen_corpus = by_rows(baseline_vectors) if side == "query" else None
    t = task.score(by_rows(trained_vectors), ks, depth, corpus_vectors=frozen_corpus)
    b = task.score(by_rows(baseline_vectors), ks, depth)
    sig = p.evaluate.significance
    t_q, b_q = metrics.per_query(t.ranked, ks), metrics.per_query(b.ranked, ks)
    result = {"trained": t.metrics, "baseline": b.metrics, "lift": _lift(t.metrics, b.metrics),
              "significance": {m: significance.paired(t_q[m].numpy(), b_q[m].numpy(),
                                                      sig.resamples, sig.seed)
                               for m in HEADLINE},
              "queries": len(task.queries), "corpus": corpus_size,
              "queries_without_relevant": t.no_relevant}
    result["verdict"] = _verdict(result, sig)
    if side == "query":
        result["head_side"] = side
    lex, systems = lexical.scored(data, task, prepared.text_map(), t, by_rows(trained_vectors),
                                  p.evaluate, ks, frozen_corpus)
    result.update(lex)
    if P.teacher_of(p.train) is not None:
        result["distill"] = _distill(p, prepared, prepared_dir, cache_dir, head_dir, data,
                                     (t, b, t_q), ks)
    if dims:
        result["matryoshka"] = report.matryoshka(
            dims, lambda v: task.score(by_rows(v), ks).metrics, trained_vectors,
            baseline_vectors, HEADLINE)
    per_label = {str(data.label_names[lab]): {
        "queries": int((task.q_labels == lab).sum()), "trained": t.per_label[lab],
        "baseline": b.per_label[lab], "lift": _lift(t.per_label[lab], b.per_label[lab]),
        **{name: s.per_label[lab] for name, s in systems.items()}}
        for lab in t.per_label}  # class indices follow the sorted label names
    write_json(out, result)
    write_json(detail, {"kind": data.kind, "per_label": per_label})
    write_json(plot, [{"k": k, "trained": t.metrics[f"recall@{k}"],
                       "baseline": b.metrics[f"recall@{k}"]} for k in ks])
    if run_files is not None and ids is not None:
        for path, scored, tag in zip(run_files, (t, b), ("trained", "baseline"), strict=True):
            assert scored.ranked.top is not None
            runs.write_run(path, *ids, scored.ranked.top, f"simtune-{tag}")
    no_rel = t.no_relevant
    log.info("test: %d queries, corpus %d%s; trained p@1 %.4f mrr@10 %.4f; baseline p@1 %.4f "
             "mrr@10 %.4f; lift of mrr@10 %+.4f, p = %.4f", result["queries"], corpus_size,
             f", {no_rel} queries without a relevant item" if no_rel else "",
             t.metrics["p@1"], t.metrics["mrr@10"], b.metrics["p@1"], b.metrics["mrr@10"],
             result["lift"]["mrr@10"], result["significance"]["mrr@10"]["p_value"])
    _log_lexical(result)
    _log_verdict(result["verdict"])
    return result


def _verdict(result: dict[str, Any], sig: P.SignificanceParams) -> dict[str, Any]:
    """`verdict` of the report: better / no better / worse than the frozen encoder
    (`report.verdict`, on `evaluate.significance.verdict_metric` at `alpha`)."""
    m = sig.verdict_metric
    s = result["significance"][m]
    v = report.verdict(result["lift"][m], s["p_value"], s["ci95"], m, sig.alpha)
    return report.with_others(v, report.every_metric(result, sig.alpha))


def _log_verdict(v: dict[str, Any]) -> None:
    """The verdict in one line: a warning unless the trained model is better."""
    hint = "" if v["verdict"] == "better" else (
        "; the FAQ (docs/faq.md) says what to try")
    (log.info if v["verdict"] == "better" else log.warning)("verdict: %s%s", v["says"], hint)


def _distill(p: Params, prepared: Any, prepared_dir: Path, cache_dir: Path, head_dir: Path,
             data: Data, scored: tuple[Any, Any, dict[str, torch.Tensor]], ks: tuple[int, ...]
             ) -> dict[str, Any]:
    """`distill` of the report (`evaluate.distill`): the teacher scored from its cache view on
    the same test task (same queries, same order) as the trained and baseline `scored`, then
    the speed of the three models on the first `evaluate.speed_texts` test texts."""
    from simtune.cache.views import open_roles

    name = str(p.train.distill.teacher)
    t_q, t_d = open_roles(cache_dir, name, p.encoders.models[name], p.cache, prepared.kind,
                          placed=False)
    t_data = examples.load(prepared.kind, prepared.examples, t_q, t_d)
    t_task = evaluation_task(t_data, p.evaluate.corpus, prepared_dir)
    te = t_task.score(by_rows(cached(t_data, heads.build("identity", t_data.dim, 1, 0.0))), ks)
    t, b, t_q = scored
    sig = p.evaluate.significance
    out = distill.report(te.metrics, t.metrics, b.metrics, distill.per_query(te, ks), t_q,
                         sig.resamples, sig.seed)
    log.info("test: teacher p@1 %.4f mrr@10 %.4f; the distilled student recovers %s of its "
             "mrr@10 lift", te.metrics["p@1"], te.metrics["mrr@10"],
             "n/a" if out["recovered"]["mrr@10"] is None
             else f"{out['recovered']['mrr@10']:.1%}")
    if p.evaluate.speed_texts:
        out["speed"] = _speed(p, prepared, head_dir, data)
    return out


def _speed(p: Params, prepared: Any, head_dir: Path, data: Data) -> dict[str, Any]:
    """Texts/s of the frozen student, the distilled student and the teacher, each from raw
    text, on the first `evaluate.speed_texts` test texts (`evaluate.distill.speed`)."""
    from simtune.encoders import FrozenEncoder, resolve_device
    from simtune.model import load_encoder, load_model

    test = data.splits["test"].tensors  # groups: its texts; pairs: its queries
    rows = test["rows" if data.kind == "groups" else "q_rows"][: p.evaluate.speed_texts].tolist()
    texts = prepared.text_map()
    sample = [texts[data.row_ids["query"][r]] for r in rows]
    device, bs = resolve_device(p.cache.device), p.cache.batch_size
    enc = p.encoders
    student = FrozenEncoder(enc.query, enc.models[enc.query], device)
    trained = load_model(head_dir, str(device), encoder=enc.models[enc.query].model)
    name = str(p.train.distill.teacher)
    teacher = load_encoder(name, enc.models[name], device)
    out = distill.speed({"baseline": lambda x: student.encode(x, bs),
                         "trained": lambda x: trained.encode(x, bs),
                         "teacher": lambda x: teacher.encode(x, bs)}, sample, bs, str(device))
    rate = out["texts_per_s"]
    log.info("speed (%d test texts): the frozen encoder (%s) %.0f, the distilled student %.0f, "
             "the teacher (%s) %.0f texts/s (%.1fx the teacher)", len(sample), enc.query,
             rate["baseline"], rate["trained"], name, rate["teacher"], out["trained_over_teacher"])
    return out


def _log_lexical(result: dict[str, Any]) -> None:
    """The log line of trained vs BM25 (and of the hybrid vs trained, when it ran)."""
    bm, over = result["bm25"], result["lift_over_bm25"]["mrr@10"]
    log.info("test: bm25 p@1 %.4f mrr@10 %.4f; trained's lift over bm25 of mrr@10 %+.4f, "
             "p = %.4f", bm["p@1"], bm["mrr@10"], over,
             result["significance_over_bm25"]["mrr@10"]["p_value"])
    if "hybrid" in result:
        h = result["hybrid"]
        log.info("test: hybrid (rrf of bm25 and trained) p@1 %.4f mrr@10 %.4f; its lift over "
                 "trained of mrr@10 %+.4f, p = %.4f", h["p@1"], h["mrr@10"],
                 result["hybrid_lift"]["mrr@10"],
                 result["hybrid_significance"]["mrr@10"]["p_value"])


def _run_ids(data: Data, task: RetrievalTask, prepared_dir: Path
             ) -> tuple[list[str], list[str]]:
    """(query ids, corpus ids) for the run files: original ids where the data has them."""
    original = runs.source_ids(prepared_dir)
    doc_role = "doc" if data.kind == "pairs" else "query"  # groups: one table for all texts
    q_rows = task.queries.rows
    c_rows = q_rows if task.corpus is None else task.corpus.rows
    assert q_rows is not None and c_rows is not None
    q_ids = [data.row_ids["query"][r] for r in q_rows.tolist()]
    d_ids = [data.row_ids[doc_role][r] for r in c_rows.tolist()]
    q_ids, d_ids = [original.get(i, i) for i in q_ids], [original.get(i, i) for i in d_ids]
    runs.check_ids(q_ids, "query")
    runs.check_ids(d_ids, "document")
    return q_ids, d_ids


def _matryoshka_dims(head_dir: Path) -> list[int]:
    """The prefixes the head was trained at (`train.loss.matryoshka_dims`; [] for none)."""
    from simtune.model import training_meta  # checked: a damaged file is one line
    return training_meta(head_dir).matryoshka_dims if (head_dir / "training.json").exists() else []


def _head_side(head_dir: Path) -> str:
    """The side the head transforms (`train.head.side`: both | query; training.json)."""
    from simtune.model import training_meta
    return training_meta(head_dir).head_side if (head_dir / "training.json").exists() else "both"


def _lift(trained: dict[str, float], baseline: dict[str, float]) -> dict[str, float]:
    return {k: trained[k] - baseline[k] for k in trained}


def _finite(vectors: Vectors, head_dir: Path) -> Vectors:
    """`vectors`, refusing inf/NaN ones: they would be ranked into meaningless metrics."""
    def checked(rows: torch.Tensor, role: str) -> torch.Tensor:
        out = vectors(rows, role)
        if not bool(torch.isfinite(out).all()):
            raise UserError(f"{head_dir}: the trained model gives non-finite test vectors "
                            "(training diverged?); rerun train")
        return out
    return checked
