"""The train stage's `train.mode: static` branch: a static student (`simtune.train.static`) fit
to the teacher's cached vectors of the prepared texts, written where every mode writes.

What it reads: the prepared groups data (its train split, its unlabelled texts, `prepare.file.
kind: texts`), the teacher's cache view (`train.distill.teacher`: the cache stage fills it as
for a distillation, `params.teacher_of`) and the query encoder's view (the frozen encoder's
validation metrics, `frozen_val`, as every mode reports them). What it writes: the folded
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
from pathlib import Path
from typing import Any

import torch

from simtune import examples, static
from simtune.atomic import write_json
from simtune.cache import store
from simtune.cache.views import open_cache
from simtune.encoders import check_teacher, model_dir
from simtune.errors import UserError
from simtune.model import load_encoder
from simtune.params import CacheParams, EncodersParams, TrainParams
from simtune.prepare.prepared import UNLABELLED
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval.task import RetrievalTask, by_rows, retrieval_task
from simtune.train import static as st
from simtune.train import static_init
from simtune.train.validation import KS, separation

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
    if prepared.kind != "groups":
        raise UserError(f"train.mode: static trains on groups data (texts with labels) for now; "
                        f"the prepared data ({prepared_dir}) is {prepared.kind}")
    check_teacher(enc, teacher)
    spec = enc.models[enc.query]
    q_table = open_cache(cache_dir, enc.query, spec, cache, placed=False)
    t_table = open_cache(cache_dir, teacher, enc.models[teacher], cache, placed=False)
    data = examples.load("groups", prepared.examples, q_table, q_table)
    for name in ("train", "val"):
        if len(data.splits[name]) == 0:
            raise UserError(f"{prepared_dir}: the {name} split is empty")
    texts = prepared.text_map()
    row_text = [texts[i] for i in data.row_ids["query"]]
    init = start_table(s.init, s.pca_dims, enc, teacher, store.root(cache.store))
    # the fit's texts: the train split's, then every unlabelled one (label -1: the teacher alone)
    ex = prepared.examples
    split_of, ids = ex.column("split").to_pylist(), ex.column("text_id").to_pylist()
    unlabelled = [i for i, sp in zip(ids, split_of, strict=True) if sp == UNLABELLED]
    train_ids = [i for i, sp in zip(ids, split_of, strict=True) if sp == "train"]
    fit_ids = train_ids + unlabelled
    tokens = st.Tokens.of(init, [texts[i] for i in fit_ids])
    target = t_table.vectors[t_table.index(fit_ids)].float()
    labels = torch.cat([data.splits["train"].tensors["labels"],
                        torch.full((len(unlabelled),), -1, dtype=torch.long)])
    task = retrieval_task(data, "val", "train" if corpus == "train" else "split")
    validate, frozen_val, teacher_val = _validation(task, init, row_text, q_table, t_table,
                                                    data.row_ids["query"], s.val_every)
    # epoch 0: the teacher's token vectors (the map at identity), or the distilled table and
    # the map (pca_dims, the teacher's width) at the least-squares fit
    student = st.StaticStudent(init.weight, None if s.init == "teacher" else
                               st.least_squares_map(st.StaticStudent(init.weight), tokens,
                                                    target))
    log.info("static student: %d training texts + %d unlabelled, table %d x %d -> %d dims "
             "(teacher %s)", len(train_ids), len(unlabelled), *init.weight.shape,
             target.shape[1], teacher)
    settings = st.FitSettings(lr=s.lr, batch_size=s.batch_size, max_epochs=s.max_epochs,
                              patience=s.patience, label_weight=s.label_weight,
                              temperature=t.loss.temperature, seed=t.seed, monitor=t.monitor)
    result = st.fit(student, tokens, target, validate, settings,
                    labels=labels if s.label_weight > 0 else None)
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
        "texts": {"train": len(train_ids), "unlabelled": len(unlabelled)},
        "teacher": teacher,  # epoch 0 trained nothing: no loss (NaN is no JSON)
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


def start_table(init: str, pca_dims: int, enc: EncodersParams, teacher: str,
                store_root: Path) -> static.StaticEncoder:
    """The student's starting table and tokenizer (`train.schedule.static.init`,
    `simtune.train.static_init`): the teacher's vector of each of its tokens, or model2vec's
    distill of the query encoder cut to `pca_dims`; cached under `store_root`."""
    if init == "distill":
        spec = enc.models[enc.query]
        return static_init.distilled_init(model_dir(enc.query, spec), pca_dims, store_root)
    spec = enc.models[teacher]
    key = f"encoders.models.{teacher}"
    return static_init.teacher_init(load_encoder(teacher, spec, torch.device("cpu"), key=key),
                                    model_dir(teacher, spec, key), store_root)


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


def _validation(task: RetrievalTask, init: static.StaticEncoder, row_text: list[str],
                q_table: Any, t_table: Any, row_ids: list[str], every: int
                ) -> tuple[st.Validate, dict[str, float], dict[str, float]]:
    """(validate: the student's validation metrics, the frozen encoder's, the teacher's), all
    on `task` ("val/<metric>" and the separation, as `train.validation` names them). Only the
    rows the task ranks are tokenised and embedded; every metric (MAP@R too) on epochs that
    are multiples of `every` (epoch 0 included), the top 10 on the others."""
    parts = [task.queries.rows] + ([task.corpus.rows] if task.corpus is not None else [])
    assert all(r is not None for r in parts)
    needed = torch.unique(torch.cat(parts))  # type: ignore[arg-type]
    tokens = st.Tokens.of(init, [row_text[r] for r in needed.tolist()])

    def score(table: torch.Tensor, upto_r: bool = True) -> dict[str, float]:
        got = task.score(by_rows(lambda rows, role: table[rows]), KS, upto_r=upto_r)
        q = table[task.queries.rows]
        c = None if task.corpus is None else table[task.corpus.rows]
        return {f"val/{k}": v for k, v in {**got.metrics,
                                            "separation": separation(task, q, c)}.items()}

    epoch = [0]

    def validate(embed: Any) -> dict[str, float]:
        vectors = embed(tokens)
        table = torch.zeros(len(row_text), vectors.shape[1])
        table[needed] = vectors
        full = epoch[0] % every == 0
        epoch[0] += 1
        return score(table, upto_r=full)

    frozen = score(q_table.vectors.float())
    t_rows = t_table.index(row_ids)  # the teacher's view holds the same texts
    teacher = score(t_table.vectors[t_rows].float())
    return validate, frozen, teacher
