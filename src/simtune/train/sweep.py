"""`simtune sweep`: an Optuna study over `train.*` in one process, on the validation split only.

The cache, the split tensors and the validation task are loaded once; each trial builds its
module and trainer with the trial's params (`stage.fit`, which seeds every RNG first: a trial
trains exactly as the train stage does with the same params, so its value is the value
`reports/train.json` will show). TPE proposes the params; after each epoch the trial reports its
best validation value so far (the value the kept epoch would have) and the pruner (median or
successive halving) may stop it. The study lives in SQLite (`sweep.storage`): a killed sweep
resumes the same study; trials it left running are marked failed and run again.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytorch_lightning as pl

from simtune import params as P
from simtune.errors import UserError
from simtune.examples import Data
from simtune.negatives import mined
from simtune.params import Params
from simtune.retrieval.task import RetrievalTask
from simtune.train import space
from simtune.train.data import check_compatible, check_trainable, load_data
from simtune.train.epochs import EpochLoop
from simtune.train.stage import accelerator_of, fit, quiet_lightning, validation_task

log = logging.getLogger(__name__)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


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
    """What every trial reuses: the base params, the data (cache rows, splits) and the
    validation task."""

    params: Params
    data: Data
    task: RetrievalTask


def with_fixed(p: Params) -> Params:
    """The base params of every trial: `p` with `sweep.fixed` applied to `train`."""
    return space.apply(p, p.sweep.fixed) if p.sweep.fixed else p


def load(p: Params, prepared_dir: Path, cache_dir: Path,
         negatives_dir: Path | None = None) -> Loaded:
    """Load the data once for every trial (`load_data` with the base params, `sweep.fixed`
    applied: the swept and fixed keys never change what is loaded, see `params._NOT_SWEPT`)."""
    quiet_lightning()
    p = with_fixed(p)
    t = P.effective(p.train)
    if t.devices != 1 or t.num_nodes != 1:
        raise UserError("train.devices: a sweep runs in one process; set train.devices and "
                        "train.num_nodes to 1")
    accelerator_of(t)  # refused before loading anything (each trial checks its own params)
    data = load_data(p, prepared_dir, cache_dir, check_loss=False, negatives_dir=negatives_dir)
    return Loaded(p, data, validation_task(data, p))


def train_trial(loaded: Loaded, values: dict[str, Any], trial: Any = None
                ) -> tuple[float, int, int]:
    """Train with the base params and `values` (`train.<key>` -> value) on the loaded data ->
    (the kept epoch's validation value of `train.monitor`, epochs run, the epoch the pruner
    stopped it at or 0). `trial` None: no pruning (a plain run, as the train stage)."""
    p = space.apply(loaded.params, values)
    t = P.resolve_loss(P.effective(p.train), loaded.data.kind)  # as the train stage does
    p = p.model_copy(update={"train": t})
    check_compatible(loaded.data.kind, t)
    if t.hard_negatives:
        mined.check(loaded.data.kind, t)
    check_trainable(loaded.data, t, 1)
    loop_type: Any = functools.partial(PruningLoop, trial) if trial is not None else EpochLoop
    module, loop, trainer, _ = fit(p, loaded.data, loaded.task, accelerator_of(t), None,
                                   loop_type, progress=False)
    value = loop.schedule.best_value if getattr(loop, "pruned_at", 0) else \
        loop.history[loop.best_epoch][f"val/{t.monitor}"]
    result = (float(value), len(loop.train_seconds), getattr(loop, "pruned_at", 0))
    del module, loop, trainer  # nothing of a trial outlives it (memory stays flat)
    gc.collect()
    return result


def _fingerprint(p: Params) -> str:
    """The study's identity beyond its name: the space and every train key it does not vary,
    the fixed ones as fixed (a resumed study must search the same thing)."""
    raw = with_fixed(p).train.model_dump()
    for key in p.sweep.space:
        *parents, leaf = key.removeprefix("train.").split(".")
        section = raw
        for part in parents:
            section = section[part]
        section.pop(leaf)
    return json.dumps({"space": {k: e.model_dump() for k, e in p.sweep.space.items()},
                       "train": raw}, sort_keys=True)


def open_study(p: Params) -> optuna.Study:
    """Create or resume the study `sweep.study` in the SQLite file `sweep.storage`; a study of
    that name over another space or other fixed train keys is refused; trials a killed run left
    running are marked failed (they run again)."""
    sw = p.sweep
    path = Path(sw.storage).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is ours
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=sw.min_epochs)
        if sw.pruner == "median" else
        optuna.pruners.SuccessiveHalvingPruner(min_resource=sw.min_epochs))
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    study = optuna.create_study(
        storage=storage, study_name=sw.study, direction="maximize", load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=sw.seed), pruner=pruner)
    mark = _fingerprint(p)
    known = study.user_attrs.get("fingerprint")
    if known is None:
        study.set_user_attr("fingerprint", mark)
        study.set_user_attr("fixed", dict(sw.fixed))  # the best trial's line carries them
    elif known != mark:
        raise UserError(f"sweep.study: study '{sw.study}' in {sw.storage} searched another space "
                        "or other fixed train keys; use a new study name")
    for trial in study.get_trials(deepcopy=False,
                                  states=(optuna.trial.TrialState.RUNNING,)):
        storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    return study


@dataclass
class Progress:
    """One log line per finished trial (number, value or where it was pruned, seconds)."""

    lines: list[str] = field(default_factory=list)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        sec = trial.duration.total_seconds() if trial.duration else 0.0
        state, attrs = trial.state, trial.user_attrs
        if state == optuna.trial.TrialState.COMPLETE:
            what = f"{trial.value:.4f} ({attrs.get('epochs')} epochs)"
        elif state == optuna.trial.TrialState.PRUNED:
            what = f"pruned at epoch {attrs.get('pruned_at')} (best {trial.value:.4f})" \
                if trial.value is not None else "pruned"
        else:
            what = f"failed: {attrs.get('error', 'see the log')}"
        line = f"trial {trial.number}: {what}, {sec:.1f} s"
        self.lines.append(line)
        log.info("%s", line)


def run(p: Params, prepared_dir: Path, cache_dir: Path, negatives_dir: Path | None = None,
        callbacks: list[Any] | None = None) -> optuna.Study:
    """Run the missing trials of the study (`sweep.trials` finished ones in all, or until
    `sweep.timeout`) and return it; `callbacks`: more of Optuna's per-trial callbacks."""
    space.check_mode(p)
    # a new study's file is written only once the data loaded (bad paths leave nothing); an
    # existing study that is complete needs no data
    loaded = None if Path(p.sweep.storage).exists() else load(p, prepared_dir, cache_dir,
                                                              negatives_dir)
    study = open_study(p)
    done = len(study.get_trials(deepcopy=False, states=FINISHED))
    missing = p.sweep.trials - done
    if missing <= 0:
        log.info("study '%s' already holds %d finished trials", p.sweep.study, done)
        return study
    loaded = loaded or load(p, prepared_dir, cache_dir, negatives_dir)
    log.info("study '%s': %d finished trials, running %d more", p.sweep.study, done, missing)

    def objective(trial: optuna.Trial) -> float:
        values = space.suggest(trial, p.sweep.space)
        try:
            value, epochs, pruned_at = train_trial(loaded, values, trial)
        except UserError as e:  # a diverging lr, a loss the data cannot use: a failed trial
            trial.set_user_attr("error", str(e))
            raise
        trial.set_user_attr("epochs", epochs)
        if pruned_at:
            trial.set_user_attr("pruned_at", pruned_at)
            raise optuna.TrialPruned()
        return value

    start = time.perf_counter()
    study.optimize(objective, n_trials=missing, timeout=p.sweep.timeout or None,
                   catch=(UserError,), callbacks=[Progress(), *(callbacks or [])])
    log.info("%d trials in %.1f s", missing, time.perf_counter() - start)
    return study


def best_values(study: optuna.Study) -> dict[str, Any]:
    """What reproduces the best complete trial: the study's fixed values and the trial's
    params (`train.<key>` -> value); `UserError` when there is no complete trial."""
    try:
        return {**study.user_attrs.get("fixed", {}), **study.best_trial.params}
    except ValueError:
        raise UserError(f"sweep: study '{study.study_name}' has no complete trial yet") from None


def importances(study: optuna.Study) -> dict[str, float]:
    """Each param's importance to the value over the complete trials (Optuna's default
    evaluator, PED-ANOVA); {} while there are too few trials to tell."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}
    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError):  # e.g. every complete trial has the same params
        return {}


def summary(study: optuna.Study, top: int) -> str:
    """The closing text: the best `top` complete trials (validation value, epochs, seconds,
    params), the importances, and the `dvc exp run -S` line of the best trial."""
    trials = sorted(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)),
                    key=lambda t: -float(t.value))  # type: ignore[arg-type]
    states = [t.state for t in study.get_trials(deepcopy=False)]
    counts = ", ".join(f"{states.count(s)} {s.name.lower()}" for s in
                       optuna.trial.TrialState if states.count(s))
    lines = [f"study '{study.study_name}': {counts or 'no trials'}", ""]
    if not trials:
        return "\n".join(lines)
    keys = list(trials[0].params)
    lines += ["| trial | val | epochs | s | " + " | ".join(keys) + " |",
              "|---" * (4 + len(keys)) + "|"]
    for t in trials[:top]:
        sec = t.duration.total_seconds() if t.duration else 0.0
        cells = [f"{v:.4g}" if isinstance(v, float) else space.literal(v)
                 for v in (t.params.get(k) for k in keys)]
        lines.append(f"| {t.number} | {t.value:.4f} | {t.user_attrs.get('epochs')} | "
                     f"{sec:.1f} | " + " | ".join(cells) + " |")
    imp = importances(study)
    if imp:
        lines += ["", "importance: " + ", ".join(f"{k} {v:.2f}" for k, v in imp.items())]
    lines += ["", "best trial through the pipeline (train, evaluate on test):",
              space.overrides(best_values(study))]
    return "\n".join(lines)
