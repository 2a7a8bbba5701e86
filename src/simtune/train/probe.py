"""The learning-rate probe (`train.schedule.<top_layers|full>.lr: auto`): the encoder's rate
chosen from the data, not fixed from one data set.

Each of the schedule's `probe_rates` trains `probe_steps` optimizer steps from the same start
(the untouched layers, the head at its initialisation, the same seed and batch order), then the
monitored metric (`train.monitor`; from each query's top 10, MAP@R from its whole ranking) is
computed on a cheap validation task: each validation text ranks the other validation texts
(groups; pairs: the validation documents), so the corpus is not re-embedded through the layers
per rate. The run then trains with the rate
whose probe scored best (a tie: the lower rate, which moves the encoder less). A rate that
overshoots on data the frozen encoder already serves well scores below the frozen encoder here
(TREC's weak frozen encoder rewards 2e-4; short chat topics, already good frozen, lost on every
epoch at 2e-4 and gained at 5e-5); when no rate beats the frozen encoder, the lowest one trains,
and validation can still keep epoch 0. A number the user wrote is never probed.

The cost: len(probe_rates) x probe_steps training steps plus one cheap validation per rate and
one of the frozen encoder; the log says it.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytorch_lightning as pl
import torch

from simtune import params as P
from simtune.examples import Data
from simtune.params import TrainParams
from simtune.retrieval.task import RetrievalTask, retrieval_task
from simtune.train.validation import Schedule, Validator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probe:
    """One probed rate: `rate`, its validation `value` (the monitored metric) after `steps`."""

    rate: float
    value: float
    steps: int


def wanted(t: TrainParams) -> bool:
    """Whether the run's encoder rate is `auto` (resolved `t`: the mode's schedule in force)."""
    return t.run.encoder_lr == "auto"


def probe_task(data: Data) -> RetrievalTask:
    """The probe's validation task: the validation split against itself (groups: leave-one-out;
    pairs: its queries against its own documents): nothing outside the split is embedded."""
    return retrieval_task(data, "val", "split")


def choose(probes: list[Probe], frozen_value: float) -> tuple[float, str]:
    """(rate, why) from the probed rates: the best validation value, a tie going to the lower
    rate; when none beats `frozen_value`, the lowest rate (it moves the encoder least)."""
    if not probes:
        raise ValueError("no rate was probed")
    best = max(probes, key=lambda p: (p.value, -p.rate))
    shown = ", ".join(f"{p.rate:g} {p.value:.4f}" for p in sorted(probes, key=lambda p: p.rate))
    if best.value <= frozen_value:
        low = min(probes, key=lambda p: p.rate)
        return low.rate, (f"no probed rate beat the frozen encoder ({frozen_value:.4f}; "
                          f"{shown}): the lowest")
    return best.rate, f"best of the probe ({shown}; frozen {frozen_value:.4f})"


class _ProbeEnd(pl.Callback):
    """Validates once, when the probe's steps are done (`value`), and the frozen encoder before
    the first step when `frozen` is asked (`frozen_value`)."""

    def __init__(self, validator: Validator, monitor: str, frozen: bool) -> None:
        self.validator, self.monitor = validator, monitor
        self.want_frozen, self.frozen_value, self.value = frozen, math.nan, math.nan

    def _score(self, trainer: pl.Trainer, module: Any) -> float:
        training = module.training
        module.eval()
        try:
            with torch.inference_mode(), trainer.precision_plugin.val_step_context():
                # MAP@R needs each query's whole ranking; the other metrics the top 10
                scores, finite = self.validator(self.monitor == "map@r")
        finally:
            module.train(training)
        return scores[self.monitor] if finite else -math.inf  # a diverged rate never wins

    def on_train_start(self, trainer: pl.Trainer, module: Any) -> None:
        if not self.want_frozen:
            return
        trained = copy.deepcopy(module.head.state_dict())
        module.head.load_state_dict(module.head.identity_state())
        try:
            self.frozen_value = self._score(trainer, module)
        finally:
            module.head.load_state_dict(trained)

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        self.value = self._score(trainer, module)


Fit = Callable[..., Any]  # `stage.fit`, passed in (the stage imports this module)


def run(t: TrainParams, data: Data, fit: Fit, skip: bool = False,
        **fit_args: Any) -> TrainParams:
    """`t` with its encoder rate (and an `auto` head rate) chosen by the probe, and why
    (`t.run.lr_reason`); `t` itself when its rate is a number. `fit`: the stage's `fit`,
    called per rate with `fit_args` (encoders, cache, accelerator...) and a callback that
    validates at the end; a rate that diverges scores -inf. `skip`: no epoch will train (the
    frozen encoder leaves nothing to gain): the lowest rate, unprobed."""
    from simtune.train.module import Diverged

    if not wanted(t):
        return t
    s = getattr(t.schedule, t.mode)
    head_auto = getattr(s, "head_lr", "auto") == "auto"
    if skip:
        low = min(s.probe_rates)
        return P.with_run(t, encoder_lr=low, lr=low if head_auto else t.run.lr,
                          lr_reason=f"lr auto: {low:g}, not probed (nothing to gain: no "
                          "epoch trains)")
    task, start = probe_task(data), time.perf_counter()
    probes, frozen_value = [], math.nan
    for rate in sorted(s.probe_rates):
        # each epoch has a step at least: max_steps ends the probe, whatever the epochs
        tr = P.with_run(t, encoder_lr=rate, lr=rate if head_auto else t.run.lr,
                        max_epochs=s.probe_steps, patience=s.probe_steps, val_every=1)
        ends: list[_ProbeEnd] = []

        def loop(schedule: Schedule, validator: Validator, monitor: str, live: Any,
                 first: bool = not probes, ends: list[_ProbeEnd] = ends) -> _ProbeEnd:
            ends.append(_ProbeEnd(validator, monitor, first))
            return ends[-1]

        try:
            fit(tr, data=data, task=task, loop_type=loop, live_dir=None, progress=False,
                max_steps=s.probe_steps, **fit_args)
            value = ends[-1].value
        except Diverged:
            value = -math.inf
        if not probes and ends:
            frozen_value = ends[-1].frozen_value
        probes.append(Probe(rate, value, s.probe_steps))
    rate, why = choose(probes, frozen_value)
    seconds = time.perf_counter() - start
    reason = (f"lr auto: {rate:g} ({why}; {len(probes)} rates x {s.probe_steps} steps, "
              f"val {t.monitor} on the validation texts alone, {seconds:.0f} s)")
    log.info("%s", reason)
    return P.with_run(t, encoder_lr=rate, lr=rate if head_auto else t.run.lr,
                      lr_reason=reason)
