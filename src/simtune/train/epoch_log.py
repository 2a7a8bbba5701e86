"""The train stage's per-epoch progress, numbered as its report numbers epochs: epoch k of
`train.max_epochs` (the effective one), k 1-based as the kept epoch and "trained n epochs"; a
resumed run goes on from its checkpoint's epoch (Lightning's `current_epoch` + 1).

Where stderr is a terminal: Lightning's rich bar there (with the log; stdout stays for data),
described "Epoch k/N" (Lightning's own reads "Epoch k-1/N-1") and showing the monitored validation
metric beside the training loss. Elsewhere (`dvc exp run > log 2>&1`, CI, nohup), where a bar
leaves nothing readable: no bar, and one INFO line per epoch on the `simtune.train` logger, from
the first process only (DDP), after the epoch's validation:

    epoch 2/20: train loss 1.387, val mrr@10 0.6543 (best 0.6543 at epoch 2), 0.98 s training
    + 0.25 s validation

(one line in the log). Within an epoch longer than `EVERY_S` (a top_layers or full epoch runs the
encoder's layers: minutes on CPU), a line every `EVERY_S` seconds too:

    epoch 2/4: batch 31/67, 10 s into the epoch

The seconds are the epoch's shares of the report's `seconds.train` and
`seconds.validation` (the report's validation also counts the kept epoch's recomputation at the
end). Never both bar and lines; neither where `fit` is asked for no progress (the sweep's trials).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import RichProgressBar

from simtune.train.epochs import EpochLoop

log = logging.getLogger(__name__)
EVERY_S = 10.0  # seconds between the lines within one epoch (not on a terminal: the bar there)
ESTIMATE_STEPS = 5  # steps timed (after the first) for the run's estimate


def interactive() -> bool:
    """Whether stderr, where the stage logs and the bar draws, is a terminal."""
    return sys.stderr.isatty()


def progress_callbacks(loop: EpochLoop) -> tuple[list[pl.Callback], bool]:
    """(callbacks, whether Lightning's progress bar is on: its `enable_progress_bar`) for a fit
    whose validation and history are `loop`'s; put them after `loop` in the trainer's list."""
    if interactive():
        return [EpochBar(loop), RunEstimate(loop)], True
    return [EpochLog(loop), RunEstimate(loop)], False


def estimate_line(step_s: float, steps: int, validation_s: float, epochs: int,
                  measured: int) -> str:
    """The run's length at the measured speed: `epochs` more epochs of `steps` steps of
    `step_s` seconds and `validation_s` seconds of validation each (`measured`: the steps the
    speed was timed on)."""
    train_s = step_s * steps
    epoch_s = train_s + validation_s
    return (f"run estimate from the first {measured} steps ({step_s:.2f} s a step, {steps} "
            f"steps an epoch): ~{epochs} epochs x {epoch_s:.0f} s ({train_s:.0f} s training + "
            f"{validation_s:.0f} s validation) = ~{epochs * epoch_s / 60:.1f} min at most "
            "(early stopping may end it sooner)")


class RunEstimate(pl.Callback):
    """One log line, once, after the first `batches` steps of the first epoch this process
    trains: how long the run will take at their speed (`estimate_line`; the first step is
    left out: it warms up). Validation per epoch: the frozen epoch 0's (which ranked every
    metric, the most an epoch's validation does), averaged with the trained epochs' before a
    resume."""

    def __init__(self, loop: EpochLoop, batches: int = ESTIMATE_STEPS) -> None:
        self.loop, self.batches, self.done, self._start = loop, batches, False, 0.0
        self.epoch_s = 0.0  # the estimate's epoch (0: not made yet, or already revised)
        self._validation_before = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, module: Any) -> None:
        self._validation_before = self.loop.validation_seconds

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        total = trainer.num_training_batches
        if self.done or not trainer.is_global_zero or total == float("inf") or total < 2:
            return
        if batch_idx == 0:
            self._start = time.perf_counter()
            return
        if batch_idx < min(self.batches, int(total) - 1):
            return
        self.done = True
        step_s = (time.perf_counter() - self._start) / batch_idx
        # epoch 0's validation, and each epoch's before a resume
        validation = self.loop.validation_seconds / (len(self.loop.train_seconds) + 1)
        log.info(estimate_line(step_s, int(total), validation,
                               trainer.max_epochs - trainer.current_epoch, batch_idx))
        self.epoch_s = step_s * int(total) + validation

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Any) -> None:
        """Once, after the epoch the estimate was made in: when that epoch (its training and
        validation, measured) took over 20 % more or less than estimated, the estimate again
        from it. A trained epoch's validation runs the trained layers over the validation
        texts and the corpus; epoch 0's, the estimate's figure, ranks cached vectors."""
        if not self.epoch_s or not trainer.is_global_zero:
            return
        estimated, self.epoch_s = self.epoch_s, 0.0
        validation = self.loop.validation_seconds - self._validation_before
        measured = self.loop.train_seconds[-1] + validation
        left = trainer.max_epochs - trainer.current_epoch - 1
        if left < 1 or abs(measured - estimated) <= 0.2 * estimated:
            return
        log.info("run estimate after epoch %d, measured: %.0f s an epoch (%.0f s training + "
                 "%.0f s validation), not ~%.0f s: ~%d more epochs = ~%.1f min at most",
                 trainer.current_epoch + 1, measured, self.loop.train_seconds[-1], validation,
                 estimated, left, left * measured / 60)


class EpochLog(pl.Callback):
    """One log line per epoch (the module's docstring), from `loop`'s record of the epoch."""

    def __init__(self, loop: EpochLoop, every_s: float = EVERY_S) -> None:
        self.loop, self._validation_before, self.every_s = loop, 0.0, every_s
        self._epoch_start = self._last = time.perf_counter()

    def on_train_epoch_start(self, trainer: pl.Trainer, module: Any) -> None:
        self._validation_before = self.loop.validation_seconds  # restored when resumed
        self._epoch_start = self._last = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """A line every `every_s` seconds within a long epoch: which batch of how many."""
        now, total = time.perf_counter(), trainer.num_training_batches
        if (not trainer.is_global_zero or now - self._last < self.every_s
                or batch_idx + 1 == total):  # the last batch: the epoch's own line follows
            return
        self._last = now
        log.info("epoch %d/%d: batch %d/%s, %.0f s into the epoch", trainer.current_epoch + 1,
                 trainer.max_epochs, batch_idx + 1,
                 total if total != float("inf") else "?", now - self._epoch_start)

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Any) -> None:
        if not trainer.is_global_zero:
            return
        loop, epoch = self.loop, trainer.current_epoch + 1
        loss = loop.train_loss.get(epoch, float("nan"))
        value = loop.history[epoch][f"val/{loop.monitor}"]
        log.info("epoch %d/%d: train loss %.4g, val %s %.4f (best %.4f at epoch %d), %.2f s "
                 "training + %.2f s validation", epoch, trainer.max_epochs, loss, loop.monitor,
                 value, loop.schedule.best_value, loop.best_epoch, loop.train_seconds[-1],
                 loop.validation_seconds - self._validation_before)


class EpochBar(RichProgressBar):
    """Lightning's rich bar, epochs numbered 1..N, the last validation's monitored metric
    shown (`val/<monitor>`, from the first epoch's end)."""

    def __init__(self, loop: EpochLoop) -> None:
        super().__init__(console_kwargs={"stderr": True})  # with the log, not stdout's data
        self.loop = loop

    def _get_train_description(self, current_epoch: int) -> str:
        # Lightning's hook for the epoch bar's text, padded as Lightning pads it (no flicker)
        text = f"Epoch {current_epoch + 1}/{self.trainer.max_epochs}"
        return f"{text:{len(self.validation_description)}}"

    def get_metrics(self, trainer: pl.Trainer, module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, module)
        key = f"val/{self.loop.monitor}"
        if self.loop.history:
            items[key] = self.loop.history[max(self.loop.history)][key]
        return items
