"""`simtune sweep`: an Optuna study over `train.*` in one process, on the validation split only.

The cache, the split tensors and the validation task are loaded once; each trial builds its
module and trainer with the trial's params (`stage.fit`, which seeds every RNG first: a trial
trains exactly as the train stage does with the same params, so its value is the value
`reports/train.json` will show). TPE proposes the params; after each epoch the trial reports its
best validation value so far (the value the kept epoch would have) and the pruner (median or
successive halving) may stop it. The study lives in SQLite (`sweep.storage`, see `study`: its
identity, lock and storage checks): a killed sweep resumes the same study; trials it left running
are marked failed. A proposal equal to a finished trial's params is not run again; a trial that
fails (a diverging lr) is one line and the sweep goes on; the closing table counts it.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytorch_lightning as pl

from simtune import params as P
from simtune.cache.modes import resolve
from simtune.errors import UserError
from simtune.examples import Data
from simtune.negatives import mined
from simtune.params import Params, TrainParams
from simtune.retrieval.task import RetrievalTask
from simtune.train import probe, space
from simtune.train import study as study_lib
from simtune.train.data import check_compatible, check_trainable, load_data
from simtune.train.epochs import EpochLoop
from simtune.train.stage import accelerator_of, fit, quiet_lightning, validation_task
from simtune.train.sweep_report import Progress
from simtune.train.validation import val_queries

log = logging.getLogger(__name__)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
MAX_COMBINATIONS = 64  # of the other keys' choices, tried for each value (`check_values`)
MAX_REPEATS = 20  # proposals in a row that repeat finished trials before a sweep stops


class PruningLoop(EpochLoop):
    """The train stage's epoch loop that, after each epoch's validation, reports the best
    monitored value so far to `trial` (step = epoch) and stops training when the pruner says
    so (`pruned_at`: that epoch; the kept epoch's full metrics are then not computed)."""

    def __init__(self, trial: optuna.Trial, *args: Any) -> None:
        super().__init__(*args)
        self.trial, self.pruned_at = trial, 0

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Any) -> None:
        super().on_train_epoch_end(trainer, module)
        epoch = trainer.current_epoch + 1
        self.trial.report(self.schedule.best_value, epoch)
        if self.trial.should_prune():
            self.pruned_at, trainer.should_stop = epoch, True

    def on_train_end(self, trainer: pl.Trainer, module: Any) -> None:
        if not self.pruned_at:
            super().on_train_end(trainer, module)


@dataclass
class Loaded:
    """What every trial reuses: the base params (`sweep.fixed` applied, the mode resolved: what
    `space.apply` sets a trial's keys in, and the study's identity), the data (cache rows,
    splits) and the validation task."""

    params: Params
    data: Data
    task: RetrievalTask


def with_fixed(p: Params) -> Params:
    """The base params of every trial: `p` with `sweep.fixed` applied to `train`."""
    return space.apply(p, p.sweep.fixed) if p.sweep.fixed else p


def load(p: Params, prepared_dir: Path, cache_dir: Path,
         negatives_dir: Path | None = None) -> Loaded:
    """Load the data once for every trial (`load_data` with the base params, `sweep.fixed`
    applied: the swept and fixed keys never change what is loaded, see `params._NOT_SWEPT`).
    `p` is unpacked here, as the train stage unpacks it: the calls below get its sections."""
    quiet_lightning()
    p = with_fixed(p)
    t = resolve(p.train, p.encoders, prepared_dir, p.cache.store)  # as the cache stage chose
    if t.devices != 1 or t.num_nodes != 1:
        raise UserError("train.devices: a sweep runs in one process; set train.devices and "
                        "train.num_nodes to 1")
    accelerator_of(t)  # refused before loading anything (each trial checks its own params)
    data = load_data(t, p.encoders, p.cache, prepared_dir, cache_dir, check_loss=False,
                     negatives_dir=negatives_dir)
    return Loaded(p.model_copy(update={"train": t}), data,
                  validation_task(data, t.head.side, p.evaluate.corpus))


def _checked(loaded: Loaded, values: dict[str, Any]) -> TrainParams:
    """The train params of a trial with `values` (`train.<key>` -> value), the mode's schedule
    in force and the loss resolved, refused (`UserError`) as the train stage would refuse them
    on this data."""
    p = space.apply(loaded.params, values)  # validated as params.yaml is: the whole tree
    t = P.resolve_loss(P.effective(p.train), loaded.data.kind)  # as the train stage does
    t = P.resolve_monitor(t, val_queries(loaded.data))
    check_compatible(loaded.data.kind, t)
    data = loaded.data  # a texts file's unlabelled rows: distillation alone takes them
    P.check_unlabelled(t, len(data.training) - len(data.splits["train"]))
    if t.hard_negatives:
        mined.check(loaded.data.kind, t)
    check_trainable(loaded.data, t, 1)
    return t


def check_values(loaded: Loaded) -> None:
    """Refuse, before any trial, a value of the space that no trial can train with on this data
    (`mnrl` among the loss choices on groups data): with every combination of the other keys'
    choices (the first `MAX_COMBINATIONS`), the train stage would refuse it. When no value of a
    key can train, the fault is elsewhere (a fixed key, train's own): the sweep is refused."""
    entries = loaded.params.sweep.space
    choices = {k: e.choices for k, e in entries.items() if e.choices is not None}
    for key, entry in entries.items():
        others = {k: c for k, c in choices.items() if k != key}
        errors: dict[str, str] = {}
        for value in entry.values():
            first = None
            for combo in itertools.islice(itertools.product(*others.values()),
                                          MAX_COMBINATIONS):
                try:
                    _checked(loaded, {**dict(zip(others, combo, strict=True)), key: value})
                    break
                except UserError as e:
                    first = first or str(e)
            else:
                errors[space.literal(value)] = first or ""
        if not errors:
            continue
        value, why = next(iter(errors.items()))
        if len(errors) == len(entry.values()):
            raise UserError(f"sweep: no trial can train on this data: {why}")
        raise UserError(f"sweep.space.{key}: no trial can train with {value} on this data "
                        f"({why}); remove it from the space")


def train_trial(loaded: Loaded, values: dict[str, Any], trial: Any = None
                ) -> tuple[float, int, int]:
    """Train with the base params and `values` (`train.<key>` -> value) on the loaded data ->
    (the kept epoch's validation value of `train.monitor`, epochs run, the epoch the pruner
    stopped it at or 0). `trial` None: no pruning (a plain run, as the train stage)."""
    t, base = _checked(loaded, values), loaded.params
    loop_type: Any = functools.partial(PruningLoop, trial) if trial is not None else EpochLoop
    accelerator = accelerator_of(t)
    # `lr: auto` (an encoder mode): the probe picks the trial's rate, as the train stage does
    t = probe.run(t, loaded.data, fit, enc=base.encoders, cache=base.cache,
                  accelerator=accelerator)
    module, loop, trainer, _ = fit(t, base.encoders, base.cache, loaded.data, loaded.task,
                                   accelerator, None, loop_type, progress=False)
    value = loop.schedule.best_value if getattr(loop, "pruned_at", 0) else \
        loop.history[loop.best_epoch][f"val/{t.monitor}"]
    result = (float(value), len(loop.train_seconds), getattr(loop, "pruned_at", 0))
    del module, loop, trainer  # nothing of a trial outlives it (memory stays flat)
    gc.collect()
    return result


def _finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def _run_trial(study: optuna.Study, loaded: Loaded) -> optuna.trial.FrozenTrial:
    """Ask for a trial and run it: the same params as a finished trial are not run again (the
    trial is told failed, marked `duplicate_of`); a `UserError` (a diverging lr) fails it with
    the error's line as its `error`; anything else fails it and propagates."""
    trial = study.ask()
    values = space.suggest(trial, loaded.params.sweep.space)
    for done in study.get_trials(deepcopy=False, states=FINISHED):
        if done.params == trial.params:
            trial.set_user_attr("duplicate_of", done.number)
            return study.tell(trial, state=optuna.trial.TrialState.FAIL)
    try:
        value, epochs, pruned_at = train_trial(loaded, values, trial)
    except UserError as e:
        trial.set_user_attr("error", str(e))
        return study.tell(trial, state=optuna.trial.TrialState.FAIL)
    except BaseException:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)  # never left running
        raise
    trial.set_user_attr("epochs", epochs)
    if pruned_at:
        trial.set_user_attr("pruned_at", pruned_at)
        return study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return study.tell(trial, value)


def _optimize(study: optuna.Study, loaded: Loaded, missing: int,
              callbacks: list[Any]) -> None:
    """Run `missing` trials (failed ones count, skipped repeats do not), starting none after
    `sweep.timeout` seconds and stopping after `MAX_REPEATS` repeats in a row."""
    sw, start = loaded.params.sweep, time.perf_counter()
    runs = repeats = 0
    while runs < missing:
        if sw.timeout and time.perf_counter() - start >= sw.timeout:
            log.info("sweep.timeout: %g s passed, no new trial", sw.timeout)
            return
        frozen = _run_trial(study, loaded)
        repeat = "duplicate_of" in frozen.user_attrs
        runs, repeats = runs + (not repeat), repeats + 1 if repeat else 0
        for callback in callbacks:
            callback(study, frozen)
        if repeats >= MAX_REPEATS:
            log.warning("study '%s': %d proposals in a row repeated finished trials; the space "
                        "seems exhausted, stopping", sw.study, repeats)
            return


def run(p: Params, prepared_dir: Path, cache_dir: Path, negatives_dir: Path | None = None,
        callbacks: list[Any] | None = None) -> optuna.Study:
    """Run the missing trials of the study (`sweep.trials` finished ones in all, or until
    `sweep.timeout`) and return it; `callbacks`: more per-trial callbacks (study, FrozenTrial).

    Refused before anything is written: keys the mode or loss ignores, more trials than the
    space holds, an unusable `sweep.storage`, a value no trial can train with on this data, a
    study made for other data or params (`study`), a study another sweep is running."""
    sw = p.sweep
    if (base := with_fixed(p)).train.mode != "auto":  # refused before anything is read or written
        space.check_mode(base)
    size = space.combinations(sw.space)
    if size is not None and size < sw.trials:
        raise UserError(f"sweep.trials: {sw.trials} trials asked of a space that holds "
                        f"{size} distinct ones; lower sweep.trials (or --trials)")
    path = study_lib.storage_path(sw.storage)
    study_lib.check_storage(path)
    loaded = load(p, prepared_dir, cache_dir, negatives_dir)
    space.check_mode(loaded.params)  # the mode that runs (auto resolved on the data)
    space.check_ignored(p, loaded.data.kind)  # `auto` is the loss of the data's kind
    check_values(loaded)
    ident = study_lib.identity(loaded.params, prepared_dir, negatives_dir, loaded.data.tables)
    with study_lib.lock(path, sw.study):
        study = study_lib.open_study(sw, path, ident)
        done = _finished(study)
        missing = sw.trials - done
        if missing <= 0:
            log.info("study '%s' already holds %d finished trials", sw.study, done)
            return study
        log.info("study '%s': %d finished trials, running %d more", sw.study, done, missing)
        start = time.perf_counter()
        with study_lib.database_errors(path, "write the study"):
            _optimize(study, loaded, missing, [Progress(), *(callbacks or [])])
        log.info("%d trials in %.1f s", missing, time.perf_counter() - start)
    return study
