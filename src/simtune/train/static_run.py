"""The train stage's `train.mode: static` branch: a static student (`simtune.train.static`) fit
to the teacher's cached vectors of the prepared texts, written where every mode writes.

What it reads: the prepared data (`fit_rows`: groups, its train split and its unlabelled texts,
`prepare.file.kind: texts`; pairs, its train split's queries and documents and a BEIR corpus's
other documents), the teacher's cache views (`train.distill.teacher`: the cache stage fills
them as for a distillation, `params.teacher_of`; pairs: one per role) and the query and
document encoders' views (the frozen encoder's validation metrics, `frozen_val`, as every mode
reports them). What it writes: the folded
student as a static model folder in the head folder (`models/head`, `simtune.static`: what
`load_model`, evaluate, search and export read) and `reports/train.json` with the keys the other
modes write (epochs, best_epoch, selected, best_val, frozen_val, seconds, mode, mode_reason,
in_force), plus `teacher_val` and the fit's per-epoch `history`.

Epoch 0 is the initial student (`start_table`: the teacher's token vectors, or the distilled
table and the least-squares map: nothing trained by gradient), a candidate like the frozen
encoder in the other modes: `selected` is `initial` when it is kept. The validation task is the
other modes' (`evaluate.corpus`), computed from the student's own vectors of the texts (their
tokens: a few bytes each, no encoder states).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from simtune import examples, static
from simtune import params as P
from simtune.atomic import write_json
from simtune.cache import store
from simtune.cache.views import open_pair, open_roles
from simtune.encoders import check_teacher, model_dir
from simtune.errors import UserError
from simtune.examples import Data
from simtune.model import load_encoder
from simtune.params import CacheParams, EncodersParams, TrainParams
from simtune.prepare.prepared import CORPUS, UNLABELLED
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval.task import RetrievalTask, by_rows, retrieval_task
from simtune.train import static as st
from simtune.train import static_init, static_ngrams
from simtune.train.validation import KS, separation, val_queries, validation_task

log = logging.getLogger(__name__)


def run(t: TrainParams, enc: EncodersParams, cache: CacheParams, corpus: str,
        prepared_dir: Path, cache_dir: Path, out: Path, report: Path,
        live_dir: Path | None = None) -> dict[str, Any]:
    """Fit the static student of the resolved train params `t` (`train.mode: static`; `enc`,
    `cache`: the sections that name the teacher's and the query encoder's views; `corpus`:
    `evaluate.corpus`), save it to `out` and its report to `report` (both atomically), the
    curves to `live_dir` (dvclive, as the other modes: one .tsv per metric, step = epoch, and
    the kept epoch); returns the report."""
    start = time.perf_counter()
    s = t.run
    teacher = t.distill.teacher
    assert teacher is not None  # params refuses train.mode static without one
    prepared = load_prepared(prepared_dir)
    check_teacher(enc, teacher)
    q_table, d_table = open_pair(cache_dir, enc, cache, prepared.kind, placed=False)
    t_views = open_roles(cache_dir, teacher, enc.models[teacher], cache, prepared.kind,
                         placed=False)
    data = examples.load(prepared.kind, prepared.examples, q_table, d_table)
    for name in ("train", "val"):
        if len(data.splits[name]) == 0:
            raise UserError(f"{prepared_dir}: the {name} split is empty")
    t = P.resolve_monitor(t, val_queries(data))
    if t.run.monitor_reason:
        log.info("%s", t.run.monitor_reason)
    texts = prepared.text_map()
    rows = fit_rows(prepared.kind, prepared.examples, *t_views,
                    train_labels=data.splits["train"].tensors.get("labels"))
    init = start_table(s.init, s.pca_dims, enc, teacher, store.root(cache.store),
                       [texts[i] for i in rows.ids], s.ngrams, s.ngram_words)
    tokens = st.Tokens.of(init, [texts[i] for i in rows.ids])
    task = _validation_task(data, corpus)
    # MAP@R monitored: every epoch ranks whole (the other metrics need the top 10 only)
    validate, frozen_val, teacher_val = _validation(task, init, data, texts, (q_table, d_table),
                                                    t_views,
                                                    1 if t.monitor == "map@r" else s.val_every)
    # epoch 0: the teacher's token vectors (the map at identity), or the distilled table and
    # the map (pca_dims, the teacher's width) at the least-squares fit
    student = st.StaticStudent(init.weight, None if s.init == "teacher" else
                               st.least_squares_map(st.StaticStudent(init.weight), tokens,
                                                    rows.target), weight_rate=s.token_weights)
    log.info("static student: %d training texts + %d unlabelled, table %d x %d -> %d dims "
             "(teacher %s)", rows.labelled, rows.unlabelled, *init.weight.shape,
             rows.target.shape[1], teacher)
    settings = st.FitSettings(lr=s.lr, batch_size=s.batch_size, max_epochs=s.max_epochs,
                              patience=s.patience, label_weight=s.label_weight,
                              temperature=t.loss.temperature, seed=t.seed, monitor=t.monitor)
    use = s.label_weight > 0
    result = st.fit(student, tokens, rows.target, validate, settings,
                    labels=rows.labels if use else None, pairs=rows.pairs if use else None)
    static.write(out, init.tokenizer, result.table, teacher)
    history = {int(h["epoch"]): h for h in result.history}
    epochs = len(result.history) - 1
    total = time.perf_counter() - start
    out_report = {
        "epochs": epochs, "best_epoch": result.best_epoch,
        "selected": "initial" if result.best_epoch == 0 else "trained",
        "best_val": _val(history[result.best_epoch]), "frozen_val": frozen_val,
        "initial_val": _val(history[0]), "teacher_val": teacher_val,
        "still_rising": bool(epochs >= s.max_epochs and result.best_epoch == epochs),
        "seconds": {"total": total, "fit": result.seconds,
                    "per_epoch": result.seconds / max(epochs, 1)},
        "texts": {"train": rows.labelled, "unlabelled": rows.unlabelled,
                  **({} if rows.pairs is None else {"pairs": len(rows.pairs)})},
        "teacher": teacher,  # epoch 0 trained nothing: no loss (NaN is no JSON)
        "monitor": t.monitor,
        "history": [{k: v for k, v in h.items() if k != "loss" or v == v}
                    for h in result.history],
        "mode": t.mode, "mode_reason": s.reason, "in_force": s.shown()}
    if live_dir is not None:
        _curves(Path(live_dir), result.history, result.best_epoch)
    write_json(report, out_report)
    log.info("static student: kept epoch %d of %d (val %s %.4f; initial %.4f, frozen encoder "
             "%.4f, teacher %.4f), fit %.1f s", result.best_epoch, epochs, t.monitor,
             out_report["best_val"].get(f"val/{t.monitor}", float("nan")),
             out_report["initial_val"].get(f"val/{t.monitor}", float("nan")),
             frozen_val.get(f"val/{t.monitor}", float("nan")),
             teacher_val.get(f"val/{t.monitor}", float("nan")), result.seconds)
    return out_report


@dataclass
class FitRows:
    """The texts the student fits on, in order: `ids` (N,) text ids, `target` (N, D) the
    teacher's vectors of them (each in its role's view), `labels` (N,) class indices, -1 for
    an unlabelled text (groups; None for pairs), `pairs` (P, 2) rows of (query, document) of
    the train split's positive pairs (pairs; None for groups); the first `labelled` rows are
    the train split's texts, the `unlabelled` after them the teacher alone teaches."""

    ids: list[str]
    target: torch.Tensor
    labels: torch.Tensor | None
    pairs: torch.Tensor | None
    labelled: int
    unlabelled: int


def fit_rows(kind: str, ex: pa.Table, t_query: Any, t_doc: Any,
             train_labels: torch.Tensor | None = None) -> FitRows:
    """The fit's texts of the prepared examples `ex` (`FitRows`). Groups: the train split's
    texts, then every unlabelled one (`prepare.file.kind: texts`). Pairs: the train split's
    distinct queries, then its distinct documents, then the corpus-only documents (a BEIR
    corpus: what search will rank, unlabelled); the validation and test texts never. The
    targets come from the teacher's query view `t_query` (queries, groups' texts) and
    document view `t_doc` (documents); `train_labels` (groups): the train split's class
    indices, in `ex`'s order (`examples.load`'s)."""
    col = ex.to_pydict()
    split = col["split"]
    if kind == "groups":
        train = [i for i, sp in zip(col["text_id"], split, strict=True) if sp == "train"]
        extra = [i for i, sp in zip(col["text_id"], split, strict=True) if sp == UNLABELLED]
        assert train_labels is not None and len(train_labels) == len(train)
        labels = torch.cat([train_labels, torch.full((len(extra),), -1, dtype=torch.long)])
        ids = train + extra
        return FitRows(ids, t_query.vectors[t_query.index(ids)].float(), labels, None,
                       len(train), len(extra))
    train = [n for n, sp in enumerate(split) if sp == "train"]
    queries = list(dict.fromkeys(col["query_id"][n] for n in train))
    docs = list(dict.fromkeys(col["doc_id"][n] for n in train))
    seen = set(docs)
    extra = list(dict.fromkeys(d for d, sp in zip(col["doc_id"], split, strict=True)
                               if sp == CORPUS and d not in seen))
    q_at = {q: n for n, q in enumerate(queries)}
    d_at = {d: len(queries) + n for n, d in enumerate(docs)}
    pairs = torch.tensor([[q_at[col["query_id"][n]], d_at[col["doc_id"][n]]] for n in train
                          if col["score"][n] > 0], dtype=torch.long).reshape(-1, 2)
    target = torch.cat([t_query.vectors[t_query.index(queries)].float(),
                        t_doc.vectors[t_doc.index(docs + extra)].float()])
    return FitRows(queries + docs + extra, target, None, pairs, len(queries) + len(docs),
                   len(extra))


def start_table(init: str, pca_dims: int, enc: EncodersParams, teacher: str,
                store_root: Path, fit_texts: list[str], ngrams: int,
                ngram_words: int) -> static.StaticEncoder:
    """The student's starting table and tokenizer (`train.schedule.static.init`,
    `simtune.train.static_init`): the teacher's vector of each of its tokens, or model2vec's
    distill of the query encoder cut to `pca_dims`; cached under `store_root`. `ngrams` > 0
    (init teacher): the tokenizer gains that many word n-grams of `fit_texts` (up to
    `ngram_words` words), each row the teacher's vector of it (`simtune.train.static_ngrams`:
    they depend on the data, so they are not cached; ~100 short texts through the teacher)."""
    if init == "distill":
        spec = enc.models[enc.query]
        return static_init.distilled_init(model_dir(enc.query, spec), pca_dims, store_root)
    spec = enc.models[teacher]
    key = f"encoders.models.{teacher}"
    encoder = load_encoder(teacher, spec, torch.device("cpu"), key=key)
    start = static_init.teacher_init(encoder, model_dir(teacher, spec, key), store_root)
    if not ngrams:
        return start
    grams = static_ngrams.choose(start.tokenizer, fit_texts, ngrams, ngram_words)
    log.info("static: %d word n-grams join the tokenizer (asked %d; most frequent: %s)",
             len(grams), ngrams, ", ".join(repr(g) for g in grams[:5]))
    with torch.inference_mode():
        return static_ngrams.extend(start, grams, lambda t: encoder.encode(t, 256).float().cpu(),
                                    static_init.sif_weights(len(start.weight)))


def _curves(live_dir: Path, history: list[dict[str, float]], best: int) -> None:
    """The per-epoch curves as the other modes write them (`train.epochs.EpochLoop`)."""
    from dvclive import Live

    live = Live(str(live_dir), save_dvc_exp=False, dvcyaml=False)
    for h in history:
        live.step = int(h["epoch"])
        loss = {} if h["epoch"] == 0 else {"train/loss": h["loss"]}
        for name, value in sorted({**_val(h), **loss}.items()):
            live.log_metric(name, float(value))
    live.sync()
    write_json(live_dir / "kept_epoch.json", [{"step": best, "kept_epoch": best}])  # epochs.KEPT
    live.end()


def _val(h: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in h.items() if k.startswith("val/")}


def _validation(task: RetrievalTask, init: static.StaticEncoder, data: Data,
                texts: dict[str, str], frozen: tuple[Any, Any], teacher: tuple[Any, Any],
                every: int) -> tuple[st.Validate, dict[str, float], dict[str, float]]:
    """(validate: the student's validation metrics, the frozen encoder's, the teacher's), all
    on `task` ("val/<metric>" and the separation, as `train.validation` names them); `frozen`
    and `teacher`: (query view, document view) of each. Only the rows the task ranks are
    tokenised and embedded; every metric (MAP@R too) on epochs that are multiples of `every`
    (epoch 0 included), the top 10 on the others."""
    sides = {"query": data.row_ids["query"], "doc": data.row_ids["doc"]}
    parts = [task.queries] + ([task.corpus] if task.corpus is not None else [])
    by_side: dict[str, list[torch.Tensor]] = {}
    for items in parts:
        assert items.rows is not None
        by_side.setdefault(_side(items.role), []).append(items.rows)
    needed = {side: torch.unique(torch.cat(rows)) for side, rows in by_side.items()}
    tokens = {side: st.Tokens.of(init, [texts[sides[side][r]] for r in rows.tolist()])
              for side, rows in needed.items()}

    def score(tables: dict[str, torch.Tensor], upto_r: bool = True) -> dict[str, float]:
        got = task.score(by_rows(lambda rows, role: tables[_side(role)][rows]), KS,
                         upto_r=upto_r)
        q = tables[_side(task.queries.role)][task.queries.rows]
        c = None if task.corpus is None else tables[_side(task.corpus.role)][task.corpus.rows]
        return {f"val/{k}": v for k, v in {**got.metrics,
                                            "separation": separation(task, q, c)}.items()}

    epoch = [0]

    def validate(embed: Any) -> dict[str, float]:
        tables = {}
        for side, rows in needed.items():
            vectors = embed(tokens[side])
            tables[side] = torch.zeros(len(sides[side]), vectors.shape[1])
            tables[side][rows] = vectors
        full = epoch[0] % every == 0
        epoch[0] += 1
        return score(tables, upto_r=full)

    frozen_scores = score({"query": frozen[0].vectors.float(), "doc": frozen[1].vectors.float()})
    # the teacher's view of each role holds that role's texts (the frozen views may hold both)
    t_tables = {}
    for side, view in zip(("query", "doc"), teacher, strict=True):
        rows = needed.get(side, torch.empty(0, dtype=torch.long))
        t_tables[side] = torch.zeros(len(sides[side]), view.dim)
        t_tables[side][rows] = view.vectors[view.index([sides[side][r]
                                                        for r in rows.tolist()])].float()
    return validate, frozen_scores, score(t_tables)


def _validation_task(data: Data, corpus: str) -> RetrievalTask:
    """The student's validation task: the other modes' for groups (`validation_task`); for
    pairs, the val queries against the train and val documents (`known`, as a query-side
    head's), not the val documents alone: on news title -> article pairs (bench.static,
    1,500 pairs) the val documents alone kept epochs worth 0.612 test P@1 without the label
    term and 0.598 with it, against 0.670 and 0.630 kept against every known document."""
    if data.kind == "pairs":
        return retrieval_task(data, "val", "known")
    return validation_task(data, "both", corpus)


def _side(role: str) -> str:
    """The cache side of an `Items.role`: documents' rows are the document view's."""
    return "doc" if role == "doc" else "query"
