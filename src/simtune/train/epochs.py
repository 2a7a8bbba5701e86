"""The train stage's epoch loop around Lightning's: validation, early stopping, the kept
weights, the training curves and the time split (imported by `simtune.train` only).

Lightning runs no validation loop of its own: after each training epoch this callback checks
the weights, validates (in eval mode, without gradients, in the precision plugin's validation
context: as Lightning's loop would; the monitored metric every epoch, every metric when
`validation.Schedule.full`) and stops training early; at the end it computes every metric of
the kept epoch from its kept weights when that epoch computed only the monitored one.

Epoch 0 is the frozen encoder (the head at `heads.Head.identity_state`, the representation
untouched), validated with every metric before the first training epoch: a candidate like any
epoch, so a run whose training never beats it keeps epoch 0 and saves the frozen behaviour.
The kept epoch is the best `validation.selection_key`: the monitored metric, a tie broken by
MAP@R (computed, for this epoch and the kept one, whenever the monitored value ties), then by
the separation (`validation.separation`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from simtune.atomic import write_json
from simtune.retrieval import metrics
from simtune.train.validation import KS, Schedule, Validator, cached_encoder, selection_key

log = logging.getLogger(__name__)
KEPT = "kept_epoch.json"  # in the curves' directory: the kept epoch, for the plots


class EpochLoop(pl.Callback):
    """Validation on `schedule` with `validator`, early stopping on `monitor`, the kept
    weights (head and representation state dicts, `state`), the per-epoch training seconds and
    the validation seconds, and (on rank 0, when `live_dir` is given) the curves with dvclive:
    one point per epoch at step = epoch number (1, 2, ...; the metrics other than the monitored
    one at the epochs that compute them), so x only increases, and at the end the kept epoch,
    `live_dir/kept_epoch.json` ([{"step": e, "kept_epoch": e}]: dvc.yaml's plots draw it as a
    rule across each curve, `.dvc/plots/curves.json`). `frozen_only`: stop after epoch 0 (the
    frozen encoder, kept: no training epoch runs). `history`: epoch -> its
    validation metrics ("val/<name>"; without MAP@R where only the top 10 was ranked); the
    kept epoch's has every metric."""

    def __init__(self, schedule: Schedule, validator: Validator, monitor: str,
                 live_dir: Path | None, frozen_only: bool = False) -> None:
        self.schedule, self.validator, self.monitor = schedule, validator, monitor
        # nothing to gain (`headroom`): epoch 0 is validated and kept, no epoch trains
        self.frozen_only = frozen_only
        self.history: dict[int, dict[str, float]] = {}
        self.state: Any = None
        self.train_seconds: list[float] = []
        # CPU seconds of this process (all threads) in the training epochs: on a machine other
        # jobs share, what the work cost, where wall seconds also count the waits
        self.train_cpu_seconds = 0.0
        self.validation_seconds = 0.0
        self.full_validations = 0  # validations that computed every metric
        self.steps = 0  # training batches (optimizer steps), every process this run took
        # epoch -> each validation query's monitored metric (Q,): epoch 0 and the kept epoch
        # (the lift's interval on validation, `val_lift`)
        self.per_query: dict[int, torch.Tensor] = {}
        self.train_loss: dict[int, float] = {}  # epoch -> its mean training loss (the curves)
        self._start = 0.0
        # a resumed run (`checkpoint`): the epoch it resumed after and the seconds the
        # interrupted processes had trained, so the report gives the whole run's time
        self.resumed_after, self.seconds_before = 0, 0.0
        self._fit_start = time.perf_counter()
        self.live_dir, self.live = live_dir, None  # a dvclive.Live on rank 0 while training

    @property
    def best_epoch(self) -> int:
        return self.schedule.best_epoch

    def on_fit_start(self, trainer: pl.Trainer, module: Any) -> None:
        self._fit_start = time.perf_counter()

    def on_train_start(self, trainer: pl.Trainer, module: Any) -> None:
        if self.live_dir is not None and trainer.is_global_zero:
            from dvclive import Live

            self.live = Live(str(self.live_dir), save_dvc_exp=False, dvcyaml=False)
            if self.history:  # resumed (`checkpoint`): the curves so far, as first logged
                for epoch, scores in sorted(self.history.items()):
                    self._log(epoch, scores)
                self.live.sync()
        if 0 not in self.history:  # resumed: epoch 0 is in the checkpoint's history
            self._frozen_epoch(trainer, module)
        if self.frozen_only:  # Lightning checks `should_stop` before the first epoch starts
            trainer.should_stop = True

    def _frozen_epoch(self, trainer: pl.Trainer, module: Any) -> None:
        """Epoch 0: validate the head at its identity state (the rep is untouched before
        training) with every metric, and record it as the first candidate."""
        start, trained = time.perf_counter(), copy.deepcopy(module.head.state_dict())
        identity = module.head.identity_state()
        module.head.load_state_dict(identity)
        try:  # top_layers: the frozen encoder's cached vectors (`validation.cached_encoder`)
            with self.validator.representing(cached_encoder(module.data, module.rep)):
                scores, finite = self._validate(trainer, module, True)
        finally:
            module.head.load_state_dict(trained)  # the init the optimizer starts from
        module._stop_if(not finite, "the frozen encoder's validation vectors are not finite")
        self.full_validations += 1
        self.history[0] = scores
        if self.schedule.record(0, selection_key(scores, self.monitor))[0]:
            self.state = {"head": identity, "rep": copy.deepcopy(module.rep.state_dict())}
        self.per_query[0] = self._per_query()
        self.validation_seconds += time.perf_counter() - start
        if self.live is not None:
            self._log(0, scores)
            self.live.sync()
        if trainer.is_global_zero:
            log.info("epoch 0 (the frozen encoder, a candidate): val %s %.4f", self.monitor,
                     scores[f"val/{self.monitor}"])

    def _per_query(self) -> torch.Tensor:
        """The last validation's monitored metric per query (Q,)."""
        assert self.validator.last is not None
        return metrics.per_query(self.validator.last.ranked, KS)[self.monitor].clone()

    def on_train_epoch_start(self, trainer: pl.Trainer, module: Any) -> None:
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.steps += 1

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Any) -> None:
        self.train_seconds.append(time.perf_counter() - self._start)
        self.train_cpu_seconds += time.process_time() - self._cpu_start
        start, epoch = time.perf_counter(), trainer.current_epoch + 1
        # weights (and the vectors they give) are checked before they can be kept as the best
        module._stop_if(not all(bool(torch.isfinite(w).all()) for w in module.parameters()),
                        "the weights are no longer finite")
        # MAP@R needs each query's top R: monitored, it is computed every epoch
        full = self.schedule.full(epoch) or self.monitor == "map@r"
        scores, finite = self._validate(trainer, module, full)
        self.full_validations += full
        module._stop_if(not finite, "the validation vectors are no longer finite")
        if self.schedule.ties(scores[f"val/{self.monitor}"]) and "val/map@r" not in scores:
            # a tie (a saturated metric): MAP@R of both epochs decides (`selection_key`)
            self._complete_kept(trainer, module)  # first: `validator.last` is this epoch's
            scores, _ = self._validate(trainer, module, True)
            self.full_validations += 1
        self.history[epoch] = scores
        better, stop = self.schedule.record(epoch, selection_key(scores, self.monitor))
        if better:
            self.state = {k: copy.deepcopy(m.state_dict()) for k, m in (
                ("head", module.head), ("rep", module.rep))}
            self.per_query = {0: self.per_query[0], epoch: self._per_query()}
        if trainer.strategy.reduce_boolean_decision(stop, all=False):
            trainer.should_stop = True
        self.validation_seconds += time.perf_counter() - start
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            self.train_loss[epoch] = float(loss)
        if self.live is not None:
            self._log(epoch, scores)
            self.live.sync()

    def _log(self, epoch: int, scores: dict[str, float]) -> None:
        assert self.live is not None
        self.live.step = epoch
        loss = {"train/loss": self.train_loss[epoch]} if epoch in self.train_loss else {}
        for name, value in sorted({**scores, **loss}.items()):
            self.live.log_metric(name, float(value))

    def _complete_kept(self, trainer: pl.Trainer, module: Any, restore: bool = True) -> None:
        """Every metric of the kept epoch from its kept weights, when it computed only the
        monitored one; `restore`: the module's current weights are put back after."""
        best = self.best_epoch
        if "val/map@r" in self.history[best]:
            return
        current = ({k: copy.deepcopy(m.state_dict()) for k, m in (
            ("head", module.head), ("rep", module.rep))} if restore else None)
        module.head.load_state_dict(self.state["head"])
        module.rep.load_state_dict(self.state["rep"])
        self.history[best], _ = self._validate(trainer, module, True)
        self.schedule.completed(best, selection_key(self.history[best], self.monitor))
        self.full_validations += 1
        if current is not None:
            module.head.load_state_dict(current["head"])
            module.rep.load_state_dict(current["rep"])

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        best = self.best_epoch
        start = time.perf_counter()  # the kept epoch may have computed the top-10 metrics only
        self._complete_kept(trainer, module, restore=False)
        self.validation_seconds += time.perf_counter() - start
        if self.live is not None:
            assert self.live_dir is not None
            write_json(self.live_dir / KEPT, [{"step": best, "kept_epoch": best}])
            self.live.end()

    def on_exception(self, trainer: pl.Trainer, module: Any, exception: BaseException) -> None:
        """A diverged run leaves no curves: only the files dvclive wrote are removed (and the
        folders it made, when empty), never anything else in `live_dir`."""
        from simtune.train.module import is_divergence

        if self.live is None or not is_divergence(exception):
            return
        live, self.live = self.live, None
        Path(live.metrics_file).unlink(missing_ok=True)
        shutil.rmtree(Path(live.plots_dir) / "metrics", ignore_errors=True)  # `log_metric`'s
        for folder in (Path(live.plots_dir), Path(live.dir)):
            with contextlib.suppress(OSError):  # not empty (the user's own files), or gone
                folder.rmdir()

    def state_dict(self) -> dict[str, Any]:
        """Everything the rest of the run reads (a resumable checkpoint, `checkpoint`):
        history, kept weights, kept epoch and value (early stopping counts from it), training
        losses, seconds and the count of full validations."""
        return {"history": self.history, "state": self.state, "train_loss": self.train_loss,
                "best": (self.schedule.best_epoch, list(self.schedule.best_key)),
                "trained_best": (self.schedule.trained_best, list(self.schedule.trained_key),
                                 self.schedule.rising),
                "keys": [None if k is None else list(k)  # epoch 0's and the last's (`rising`)
                         for k in (self.schedule.frozen_key, self.schedule.last_key)],
                "per_query": self.per_query,
                "train_seconds": self.train_seconds, "train_cpu_seconds": self.train_cpu_seconds,
                "validation_seconds": self.validation_seconds,
                "full_validations": self.full_validations, "steps": self.steps,
                # the whole run's seconds so far (every process this run took), at this epoch
                "fit_seconds": self.seconds_before + time.perf_counter() - self._fit_start,
                "epoch": len(self.train_seconds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history, self.state = state["history"], state["state"]
        self.train_loss = state["train_loss"]
        self.schedule.best_epoch, key = state["best"]
        self.schedule.best_key = tuple(key)
        epoch, key, rising = state.get("trained_best", (0, [-float("inf")], False))
        s = self.schedule
        s.trained_best, s.trained_key, s.rising = epoch, tuple(key), rising
        s.frozen_key, s.last_key = (None if k is None else tuple(k)
                                    for k in state.get("keys", (None, None)))
        s.last_epoch = int(state.get("epoch", len(self.train_seconds)))
        self.per_query = dict(state["per_query"])
        self.train_seconds = list(state["train_seconds"])
        self.train_cpu_seconds = state["train_cpu_seconds"]
        self.validation_seconds = state["validation_seconds"]
        self.full_validations = state["full_validations"]
        self.steps = int(state.get("steps", 0))
        self.seconds_before = float(state.get("fit_seconds", 0.0))
        self.resumed_after = int(state.get("epoch", len(self.train_seconds)))

    def _validate(self, trainer: pl.Trainer, module: Any, full: bool
                  ) -> tuple[dict[str, float], bool]:
        training = module.training
        module.eval()
        try:
            with torch.inference_mode(), trainer.precision_plugin.val_step_context():
                scores, finite = self.validator(full)
        finally:
            module.train(training)
        return {f"val/{k}": v for k, v in scores.items()}, finite
