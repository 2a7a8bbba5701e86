"""The train stage's epoch loop around Lightning's: validation on a schedule, early stopping,
the kept weights, the training curves and the time split (imported by `simtune.train` only).

Lightning runs no validation loop of its own: after each training epoch this callback checks
the weights, validates when `validation.Schedule` says so (in eval mode, without gradients, in
the precision plugin's validation context: as Lightning's loop would) and stops training early;
at the end it re-checks the kept copies next to the best validated epoch.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from simtune.validation import Schedule, Validator


class EpochLoop(pl.Callback):
    """Validation on `schedule` with `validator`, early stopping, the best weights (head and
    representation state dicts, `state`), the per-epoch training seconds and the validation
    seconds, and (on rank 0, when `live_dir` is given) the curves with dvclive: one point per
    epoch at step = epoch number (1, 2, ...; val metrics at validated epochs), so x only
    increases. `history`: epoch -> its validation metrics ("val/<name>")."""

    def __init__(self, schedule: Schedule, validator: Validator, monitor: str,
                 live_dir: Path | None) -> None:
        self.schedule, self.validator, self.monitor = schedule, validator, monitor
        self.history: dict[int, dict[str, float]] = {}
        self.train_seconds: list[float] = []
        self.validation_seconds = 0.0
        self._start = 0.0
        self.live_dir, self.live = live_dir, None  # a dvclive.Live on rank 0 while training

    @property
    def state(self) -> Any:
        return self.schedule.best_state

    @property
    def best_epoch(self) -> int:
        return self.schedule.best_epoch

    def on_train_start(self, trainer: pl.Trainer, module: Any) -> None:
        if self.live_dir is not None and trainer.is_global_zero:
            from dvclive import Live

            self.live = Live(str(self.live_dir), save_dvc_exp=False, dvcyaml=False)

    def on_train_epoch_start(self, trainer: pl.Trainer, module: Any) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Any) -> None:
        self.train_seconds.append(time.perf_counter() - self._start)
        epoch = trainer.current_epoch + 1
        # every epoch, cheap: divergence is caught where it happens, not at the next validation
        module._stop_if(not all(bool(torch.isfinite(w).all()) for w in module.parameters()),
                        "the weights are no longer finite")
        scores = {}
        if self.schedule.validates(epoch):
            start = time.perf_counter()
            scores, finite = self._validate(trainer, module)
            module._stop_if(not finite, "the validation vectors are no longer finite")
            self.history[epoch] = scores
            stop = self.schedule.record(epoch, scores[f"val/{self.monitor}"],
                                        lambda: _copy(module))
            if trainer.strategy.reduce_boolean_decision(stop, all=False):
                trainer.should_stop = True
            self.validation_seconds += time.perf_counter() - start
        else:
            self.schedule.hold(epoch, lambda: _copy(module))
        if self.live is not None:
            self.live.step = epoch
            loss = trainer.callback_metrics.get("train/loss")
            for name, value in sorted({**scores, **({"train/loss": loss} if loss is not None
                                                    else {})}.items()):
                self.live.log_metric(name, float(value))
            self.live.sync()

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        start = time.perf_counter()
        for epoch, state in self.schedule.recheck():
            _load(module, state)
            scores, finite = self._validate(trainer, module)
            if finite:  # vectors of an unvalidated epoch that overflow: never kept
                self.history[epoch] = scores
                self.schedule.rechecked(epoch, scores[f"val/{self.monitor}"], state)
        self.validation_seconds += time.perf_counter() - start
        if self.live is not None:
            self.live.end()

    def _validate(self, trainer: pl.Trainer, module: Any) -> tuple[dict[str, float], bool]:
        training = module.training
        module.eval()
        try:
            with torch.inference_mode(), trainer.precision_plugin.val_step_context():
                scores, finite = self.validator()
        finally:
            module.train(training)
        return {f"val/{k}": v for k, v in scores.items()}, finite


def _copy(module: Any) -> dict[str, Any]:
    """The weights that make the validation vectors: head and representation."""
    return {k: copy.deepcopy(m.state_dict()) for k, m in (("head", module.head),
                                                          ("rep", module.rep))}


def _load(module: Any, state: dict[str, Any]) -> None:
    module.head.load_state_dict(state["head"])
    module.rep.load_state_dict(state["rep"])
