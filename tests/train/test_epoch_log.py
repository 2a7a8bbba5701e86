"""Issue 36 item 6: a long epoch (top_layers: the encoder's layers run in the loop) says how far
it is within the epoch, a line every ~10 s where no bar draws."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from simtune.train import epoch_log


def _trainer(epoch: int = 1) -> SimpleNamespace:
    return SimpleNamespace(is_global_zero=True, current_epoch=epoch, max_epochs=4,
                           num_training_batches=67)


def test_a_long_epoch_logs_its_batches_every_interval(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.0, 4.0, 10.5, 15.0, 21.0, 29.0, 32.0])  # perf_counter at each call
    monkeypatch.setattr(epoch_log.time, "perf_counter", lambda: next(clock))
    log = epoch_log.EpochLog(SimpleNamespace(validation_seconds=0.0))  # t 0
    trainer = _trainer()
    with caplog.at_level(logging.INFO, logger="simtune.train.epoch_log"):
        log.on_train_epoch_start(trainer, None)  # t 0
        for batch in range(6):  # at t 4, 10.5, 15, 21, 29, 32
            log.on_train_batch_end(trainer, None, None, None, batch)
    assert caplog.messages == ["epoch 2/4: batch 2/67, 10 s into the epoch",
                               "epoch 2/4: batch 4/67, 21 s into the epoch",
                               "epoch 2/4: batch 6/67, 32 s into the epoch"]


def test_a_short_epoch_or_another_rank_logs_nothing_within(
        caplog: pytest.LogCaptureFixture) -> None:
    log = epoch_log.EpochLog(SimpleNamespace(validation_seconds=0.0))
    with caplog.at_level(logging.INFO, logger="simtune.train.epoch_log"):
        log.on_train_epoch_start(_trainer(), None)
        for batch in range(50):  # a head epoch: well under 10 s
            log.on_train_batch_end(_trainer(), None, None, None, batch)
        other = epoch_log.EpochLog(SimpleNamespace(validation_seconds=0.0), every_s=0.0)
        rank1 = SimpleNamespace(**{**vars(_trainer()), "is_global_zero": False})
        other.on_train_batch_end(rank1, None, None, None, 0)
        other.on_train_batch_end(_trainer(), None, None, None, 66)  # the last: its line follows
    assert caplog.messages == []
    assert epoch_log.EVERY_S == 10.0


def _estimated_then_measured(monkeypatch: pytest.MonkeyPatch, train_s: float,
                             validation_s: float) -> None:
    """The estimate from 5 steps of 1 s (52 steps an epoch, epoch 0's validation 1 s), then
    the first epoch's end measured at `train_s` + `validation_s` (its end called twice)."""
    clock = iter([100.0, 105.0])  # the first step's end, then the sixth's: 1 s a step
    monkeypatch.setattr(epoch_log.time, "perf_counter", lambda: next(clock))
    loop = SimpleNamespace(validation_seconds=1.0, train_seconds=[])
    est = epoch_log.RunEstimate(loop)
    trainer = _trainer(epoch=0)
    trainer.num_training_batches = 52
    est.on_train_epoch_start(trainer, None)
    for batch in range(6):
        est.on_train_batch_end(trainer, None, None, None, batch)
    loop.train_seconds.append(train_s)
    loop.validation_seconds += validation_s
    est.on_train_epoch_end(trainer, None)
    est.on_train_epoch_end(trainer, None)  # once only


ESTIMATE = ("run estimate from the first 5 steps (1.00 s a step, 52 steps an epoch): ~4 epochs "
            "x 53 s (52 s training + 1 s validation) = ~3.5 min at most (early stopping may end "
            "it sooner)")


def test_the_estimate_is_made_again_when_the_first_epoch_measured_otherwise(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate takes epoch 0's validation (cached vectors: 1 s); the trained epoch's ran
    the layers (19 s): after that epoch, one line from its measured 52 + 19 s."""
    with caplog.at_level(logging.INFO, logger="simtune.train.epoch_log"):
        _estimated_then_measured(monkeypatch, 52.0, 19.0)
    assert caplog.messages == [
        ESTIMATE, "run estimate after epoch 1, measured: 71 s an epoch (52 s training + 19 s "
        "validation), not ~53 s: ~3 more epochs = ~3.5 min at most"]


def test_an_epoch_as_estimated_says_nothing_more(caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with caplog.at_level(logging.INFO, logger="simtune.train.epoch_log"):
        _estimated_then_measured(monkeypatch, 55.0, 2.0)  # 57 s against 53: within 20 %
    assert caplog.messages == [ESTIMATE]
