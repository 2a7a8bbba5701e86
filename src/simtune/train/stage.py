"""The `train` stage, wired with PyTorch Lightning (imported here only, lazily by the stage).

A batch is a tensor of example indices; a `simtune.train.represent.Representation` turns them into
vectors (head mode: rows of the resident cache table; top_layers: cached layer states through the
trainable top layers; full: the DataLoader tokenises in workers and the whole encoder learns),
then the head. GradCache switches to manual optimisation.
A non-finite loss, weights or validation vectors stop the run with one line (`UserError`,
raised through Lightning, which re-raises it) before anything is saved.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from simtune import heads, threads
from simtune import params as P
from simtune.atomic import atomic_dir, write_json
from simtune.cache.modes import resolve
from simtune.encoders import describe
from simtune.errors import UserError
from simtune.examples import Data, batch_for
from simtune.params import CacheParams, EncodersParams, Params, TrainParams
from simtune.prepare.prepared import kind as prepared_kind
from simtune.retrieval.task import RetrievalTask
from simtune.train import headroom, probe, run_steps
from simtune.train.checkpoint import Resume, fingerprint
from simtune.train.data import check_trainable, load_data
from simtune.train.epoch_log import progress_callbacks
from simtune.train.epochs import EpochLoop
from simtune.train.module import Diverged, SimilarityModule, diverged, is_divergence
from simtune.train.validation import (
    TIE_BREAKERS,
    Schedule,
    Validator,
    disagreement,
    disagreement_line,
    frozen,
    val_queries,
    validation_task,
)

log = logging.getLogger(__name__)


def accelerator_of(t: TrainParams) -> str:
    gpu = t.accelerator == "gpu" or (t.accelerator == "auto" and torch.cuda.is_available())
    if gpu and not torch.cuda.is_available():
        raise UserError("train.accelerator: 'gpu' requested but CUDA is not available")
    if not gpu and t.precision == "16-mixed":
        raise UserError("train.precision: '16-mixed' needs a GPU (on CPU Lightning would switch "
                        "to bf16, ~7x slower here); use 32-true")
    available = torch.cuda.device_count() if gpu else (os.cpu_count() or 1)
    if t.devices > available:
        raise UserError(f"train.devices: {t.devices} requested, {available} "
                        f"{'GPUs' if gpu else 'CPU cores'} available")
    if not gpu and t.precision == "bf16-mixed":
        log.warning("bf16-mixed on CPU is much slower than 32-true here")
    return "gpu" if gpu else "cpu"


def quiet_lightning() -> None:
    """Lightning's tips and deprecation notes are not the user's business."""
    import warnings

    logging.getLogger("pytorch_lightning.utilities.rank_zero").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def run(p: Params, prepared_dir: Path, cache_dir: Path, out: Path, report: Path,
        live_dir: Path, negatives_dir: Path | None = None,
        checkpoint_dir: Path | None = None) -> dict[str, Any]:
    """Train, early-stop on the validation metric, save the best head (and report) atomically;
    `negatives_dir`: the negatives stage's output (read when `train.hard_negatives` > 0);
    `checkpoint_dir`: where a checkpoint is kept after each epoch, and a matching one resumed
    (`simtune.train.checkpoint`; removed on success); None: none.

    `p` is resolved and unpacked here, once: each call below gets the sections it reads (the
    resolved `train`, `encoders`, `cache`, `evaluate.corpus`), never `p`."""
    quiet_lightning()
    auto = p.train.loss.name == "auto"
    t = in_force(p.train, p.encoders, prepared_dir, p.cache.store)
    enc, cache, corpus = p.encoders, p.cache, p.evaluate.corpus
    if t.mode == "static":  # a token table taught by the teacher's cached vectors
        from simtune.train import static_run
        return static_run.run(t, enc, cache, corpus, prepared_dir, cache_dir, out, report,
                              live_dir)
    accelerator = accelerator_of(t)
    if accelerator == "cpu":  # DDP ranks on CPU share this process's cores
        threads.divide(t.devices)
    pl.seed_everything(t.seed, workers=True, verbose=False)
    data = load_data(t, enc, cache, prepared_dir, cache_dir, negatives_dir=negatives_dir)
    check_trainable(data, t, t.devices * t.num_nodes)
    t = P.resolve_monitor(t, val_queries(data))
    if t.run.monitor_reason:
        log.info("%s", t.run.monitor_reason)
    threads.announce()
    if t.objective == "distill":  # the distillation loss trains (train.loss: on labels only)
        d = t.distill
        log.info("loss: distill %s (%s)", d.loss,
                 f"+ {d.label_weight:g} x {t.loss.name} on the labels" if d.label_weight
                 else "labels unused: train.distill.label_weight 0")
    elif auto:  # once every check passed: a refused set-up stays one line
        log.info("loss auto: %s (%s data)", t.loss.name, data.kind)
    resumes: list[Resume] = []

    def resume(loop: EpochLoop) -> list[pl.Callback]:
        """After the loop: the checkpoint saves what the loop recorded."""
        if checkpoint_dir is None:
            return []
        resumes.append(Resume(checkpoint_dir, fingerprint(t, enc, cache, corpus, prepared_dir,
                                                          data.tables, negatives_dir), loop))
        return resumes[-1:]

    task = validation_task(data, t.head.side, corpus)
    # the frozen encoder at 1.0 on validation: said, and (frozen_candidate) kept untrained
    gain = headroom.check(data, task, t.frozen_candidate)
    # `lr: auto`: the probe picks the rate (not when nothing can gain: no epoch trains)
    t = probe.run(t, data, fit, skip=gain["nothing_to_gain"] and t.frozen_candidate, enc=enc,
                  cache=cache, accelerator=accelerator)
    if gain["nothing_to_gain"] and t.frozen_candidate:
        loop_type: Callable[..., EpochLoop] = functools.partial(EpochLoop, frozen_only=True)
    else:  # epochs train: at least the mode's step floor of them
        loop_type, t = EpochLoop, run_steps.floor(t, len(data.training))
        if t.run.steps_reason:
            log.info("%s", t.run.steps_reason)
    module, loop, trainer, seconds = fit(t, enc, cache, data, task, accelerator, live_dir,
                                         loop_type, extra=resume)
    if trainer.global_rank != 0:
        return {}
    # epoch 0 (`frozen_val`) is the frozen encoder's validation; `gain` said whether it had room
    result = {**report_of(loop, seconds, len(data.training), t.monitor,
                          p.evaluate.significance.resamples, p.evaluate.significance.seed),
              "nothing_to_gain": gain["nothing_to_gain"], "mode": t.mode,
              "mode_reason": t.run.reason, "in_force": t.run.shown(), "monitor": t.monitor,
              **({"monitor_reason": t.run.monitor_reason} if t.run.monitor_reason else {}),
              **({"lr_reason": t.run.lr_reason} if t.run.lr_reason else {}),
              **({"steps_reason": t.run.steps_reason} if t.run.steps_reason else {})}
    save(module, loop, t, enc, out)
    write_json(report, result)
    for done in resumes:
        done.finish()
    log_selection(result, t.monitor)
    sec = result["seconds"]
    log.info("trained %d epochs (best %d: val %s = %.4f), %.2f s/epoch training + %.2f "
             "s/epoch validation (%d of every metric)", result["epochs"], loop.best_epoch,
             t.monitor, loop.schedule.best_value, sec["per_epoch_train"],
             sec["per_epoch_validation"], result["full_validations"])
    return result


def in_force(train: TrainParams, enc: EncodersParams, prepared_dir: Path,
             store: str | None = None) -> TrainParams:
    """The train params as a run trains them, resolved once: the mode (`train.mode: auto`
    chosen from the prepared data and the encoders `enc`, `cache.modes`) with its own
    schedule section in force (`t.run`, `params.effective`), and the loss that runs on the
    prepared data's kind (`params.resolve_loss`: `auto` resolved), so the checkpoint's
    fingerprint and the saved head record what ran, not `auto`. `store`: `cache.store`
    (auto's time bound: `cache.modes.resolve`)."""
    kind = prepared_kind(prepared_dir)
    return P.resolve_loss(resolve(train, enc, prepared_dir, store, note_auto=True), kind,
                          f"the prepared data ({prepared_dir})")


def fit(t: TrainParams, enc: EncodersParams, cache: CacheParams, data: Data,
        task: RetrievalTask, accelerator: str, live_dir: Path | None,
        loop_type: Callable[..., EpochLoop] = EpochLoop, progress: bool = True,
        extra: Callable[[EpochLoop], list[pl.Callback]] | None = None, max_steps: int = -1
        ) -> tuple[SimilarityModule, EpochLoop, pl.Trainer, float]:
    """Build the module and trainer for the train params `t` (resolved: the mode's schedule in
    force, `in_force`), the encoders `enc` (the query encoder's, top_layers and full modes) and
    `cache` (where the tables are placed) over loaded `data` and fit them, validating on `task`
    each epoch (a `loop_type` callback). Seeds every RNG first, so a fit depends on these
    settings and the data only (the sweep's trials reuse the data).
    Returns the module (the last epoch's weights), the loop (the kept weights, the history),
    the trainer and the seconds `trainer.fit` took; `progress`: each epoch's progress, numbered
    as the report numbers epochs (`epoch_log`: a bar on a terminal, else a log line per epoch);
    `extra`: callbacks to run after the loop's, given the loop (the resumable checkpoint);
    `max_steps`: stop after this many optimizer steps (-1: the epochs decide; the probe)."""
    t = fit_schedule(t, len(data.training), announce=progress)
    t = P.resolve_monitor(t, val_queries(data))  # a caller's `auto` (the run resolved it already)
    pl.seed_everything(t.seed, workers=True, verbose=False)
    module_type, validator_type = _query_side_or(SimilarityModule, Validator, t)
    module = module_type(data, t, enc, cache)
    validator = validator_type(data, task, module.rep.embed_split, module.head,
                               frozen(module.rep))
    loop = loop_type(Schedule(t.run.val_every, t.run.patience, t.run.max_epochs,
                              t.frozen_candidate),
                     validator, t.monitor, live_dir)
    shown, bar = progress_callbacks(loop) if progress else ([], False)
    trainer = pl.Trainer(
        accelerator=accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=t.precision, max_epochs=t.run.max_epochs, max_steps=max_steps,
        num_sanity_val_steps=0,
        callbacks=[loop, *(extra(loop) if extra else []), *shown], logger=False,
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=bar,
        use_distributed_sampler=False, deterministic="warn" if accelerator == "gpu" else True)
    start = time.perf_counter()
    try:
        trainer.fit(module)
    except RuntimeError as e:
        if not is_divergence(e):
            raise
        raise Diverged(diverged(t, trainer.current_epoch + 1, module._step,
                                "the update overflows float32")) from None
    return module, loop, trainer, time.perf_counter() - start


def _query_side_or(module: type, validator: type, t: TrainParams) -> tuple[type, type]:
    """The module and validator classes of `train.head.side` (`simtune.train.query_side`)."""
    if t.head.side == "both":
        return module, validator
    from simtune.train import query_side
    return query_side.QuerySideModule, query_side.QuerySideValidator


def fit_schedule(t: TrainParams, n: int, announce: bool = True) -> TrainParams:
    """`t` (resolved train params) with the batch size an epoch of `n` training examples trains
    with (`examples.batch_for`: `train.min_steps` steps or more), logged when it changes and
    `announce`."""
    batch, why = batch_for(n, t.run.batch_size, t.min_steps, t.min_batch)
    if batch == t.run.batch_size:
        return t
    if announce:
        log.info("train.schedule.%s.batch_size %d -> %d: %s, so %d steps per epoch", t.mode,
                 t.run.batch_size, batch, why, -(-n // batch))
    return P.with_run(t, batch_size=batch)


def report_of(loop: EpochLoop, total: float, n_train: int, monitor: str = "mrr@10",
              resamples: int = 10000, seed: int = 13) -> dict[str, Any]:
    """`reports/train.json`: epochs, the kept epoch and its validation metrics, `selected`
    ("frozen" when epoch 0, the frozen encoder, is kept: nothing trained beat it on
    validation; else "trained"), `frozen_val` (epoch 0's validation metrics), `val_lift` (the
    kept epoch's monitored metric minus the frozen encoder's on the validation queries, its
    paired bootstrap 95 % interval (`resamples`, `seed`) and `resolved`: whether the interval
    excludes 0, i.e. the split can tell a lift of that size from none), the validations that
    computed every metric, and seconds: `total` (trainer.fit, every process of a resumed run:
    `resumed` then says after which epoch and the seconds before), `train` (the training epochs),
    `validation` (every epoch's, epoch 0's and the kept epoch's at the end), `per_epoch_*`
    (each / epochs), `train_cpu` (the training epochs' CPU seconds, all threads of this
    process); train + validation <= total (the rest: set-up, curves, Lightning between
    epochs)."""
    epochs = len(loop.train_seconds)
    train_s, val_s = sum(loop.train_seconds), loop.validation_seconds
    total += loop.seconds_before  # a resumed run: the interrupted processes' seconds too
    resumed = ({"resumed": {"after_epoch": loop.resumed_after,
                            "seconds_before": loop.seconds_before}}
               if loop.resumed_after else {})
    return {**resumed,
        "epochs": epochs, "best_epoch": loop.best_epoch,
        "selected": "frozen" if loop.best_epoch == 0 else "trained",
        "best_val": loop.history[loop.best_epoch], "frozen_val": loop.history.get(0, {}),
        "val_lift": val_lift(loop, monitor, resamples, seed),
        # epoch 0 kept, yet a trained epoch beat it on another metric: which, by how much
        "other_metric": disagreement(loop.history, loop.best_epoch, monitor),
        "full_validations": loop.full_validations, "steps": loop.steps,
        # the last epoch was the best trained one when max_epochs ended the run: more may gain
        "still_rising": bool(epochs >= loop.schedule.max_epochs and loop.schedule.rising),
        "rising_on": _rose_on(loop.history, epochs, monitor),
        "seconds": {"total": total, "train": train_s, "validation": val_s,
                    "per_epoch_train": train_s / max(epochs, 1),
                    "per_epoch_validation": val_s / max(epochs, 1),
                    "train_cpu": loop.train_cpu_seconds},
        "samples_per_s": epochs * n_train / max(train_s, 1e-9),
    }


def _rose_on(history: dict[int, dict[str, float]], epoch: int, monitor: str) -> str:
    """The metric on which `epoch` beat the epoch before it: the monitored one, else the
    first tie-breaker that rose (MAP@R under a saturated MRR@10); the monitor when neither
    epoch is in `history`."""
    now, before = history.get(epoch, {}), history.get(epoch - 1, {})
    for name in (monitor, *(n for n in TIE_BREAKERS if n != monitor)):
        a, b = now.get(f"val/{name}"), before.get(f"val/{name}")
        if a is not None and b is not None and a > b:
            return name
    return monitor


def val_lift(loop: EpochLoop, monitor: str, resamples: int, seed: int) -> dict[str, Any]:
    """{metric, queries, lift, ci95, resolved} of the kept epoch over epoch 0 on the validation
    queries (`report_of`); the kept epoch 0 has lift 0, interval [0, 0], resolved false."""
    from simtune.retrieval.significance import bootstrap_ci

    frozen_q = loop.per_query.get(0)
    kept_q = loop.per_query.get(loop.best_epoch, frozen_q)
    if frozen_q is None or kept_q is None:  # a loop that never validated epoch 0
        return {}
    diff = (kept_q.double() - frozen_q.double()).numpy()
    lo, hi = bootstrap_ci(diff, resamples, seed)
    return {"metric": monitor, "queries": len(diff), "lift": float(diff.mean()),
            "ci95": [lo, hi], "resolved": bool(lo > 0 or hi < 0)}


def log_selection(result: dict[str, Any], monitor: str) -> None:
    """One line when the frozen encoder is kept; one when the validation split is too small
    to tell the kept epoch's lift from none."""
    lift, frozen_value = result["val_lift"], result["frozen_val"].get(f"val/{monitor}")
    if result.get("still_rising"):
        rose = result.get("rising_on", monitor)
        log.warning("still rising: epoch %d, the last (the mode's max_epochs), was the best "
                    "trained epoch on val %s%s; more epochs may gain", result["epochs"], rose,
                    "" if rose == monitor else f" (val {monitor} tied)")
    if result["selected"] == "frozen" and result["epochs"] == 0:
        return  # nothing to gain: `headroom` said so, and no epoch trained
    if result["selected"] == "frozen":
        log.warning("no trained epoch beat the frozen encoder on validation (val %s %.4f at "
                    "epoch 0): kept epoch 0, the head saved at identity (the frozen encoder's "
                    "vectors)", monitor, frozen_value)
        if result.get("other_metric"):  # what training found that the monitor did not keep
            log.warning("%s", disagreement_line(result["other_metric"]))
    elif lift and not lift["resolved"]:
        lo, hi = lift["ci95"]
        log.warning("the validation split (%d queries) cannot tell the kept epoch %d from the "
                    "frozen encoder: val %s lift %+.4f, 95%% interval [%+.4f, %+.4f] holds 0",
                    lift["queries"], result["best_epoch"], monitor, lift["lift"], lo, hi)


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The DVC metrics of a training report: the mode that trained (`train.mode: auto`
    resolved, so `simtune compare` and `dvc exp show` show it), the kept epoch and the seconds
    of `trainer.fit` (the validation detail, the time split and the throughput stay in the full
    report)."""
    return {"mode": result["mode"], "kept_epoch": result["best_epoch"],
            "train_s": result["seconds"]["total"]}


def save(module: SimilarityModule, loop: EpochLoop, t: TrainParams, enc: EncodersParams,
         out: Path) -> None:
    """The best head (safetensors + config.json) and, in full mode, the fine-tuned encoder;
    `training.json` records `t` (the resolved train params that ran) and the query encoder of
    `enc`."""
    best = loop.state
    assert best is not None
    module.head.load_state_dict(best["head"])
    with atomic_dir(out) as tmp:
        heads.save(module.head, tmp)
        # the fine-tuned encoder, an ordinary transformers model; none when epoch 0 (the
        # untouched encoder) was kept: the frozen encoder serves it (no 90 MB copy of it)
        if t.mode != "head" and loop.best_epoch > 0:
            module.rep.load_state_dict(best["rep"])
            module.rep.save(tmp / "encoder")
        loss = t.loss
        # trained on angles (cosine, or arcface or cosine_mse, cosine whatever the distance): the
        # servable model normalises its output (unit vectors, the same cosine ranking)
        # (distillation compares normalised vectors or their cosines: angles too)
        angular = (loss.distance == "cosine" or loss.name in P.ANGULAR_LOSSES
                   or t.objective == "distill")
        meta = {"mode": t.mode, "kind": module.data.kind, "query_encoder": enc.query,
                "document_encoder": enc.document,
                "encoder": enc.models[enc.query].model_dump(), "normalize_output": angular,
                "matryoshka_dims": loss.matryoshka_dims,  # evaluate scores each prefix too
                # what evaluate and search check the cache against (`evaluate.trained_on`)
                "encoder_description": describe(enc.query, enc.models[enc.query], role="query")}
        meta["mode_reason"] = t.run.reason
        if t.run.lr_reason:  # lr auto: the rate the probe chose, and why
            meta["lr_reason"] = t.run.lr_reason
        if t.run.steps_reason:  # the step floor added passes
            meta["steps_reason"] = t.run.steps_reason
        meta["selected"] = "frozen" if loop.best_epoch == 0 else "trained"
        if t.head.side != "both":  # the key only when set: `both` writes what it did
            meta["head_side"] = t.head.side
        write_json(tmp / "training.json", meta)
