"""What a sweep tells: one line per trial as it ends (`Progress`), the trials that failed
(`Failures`, for the exit status), and the closing text (`summary`): the study's counts, the best
trials, the importances, a tie at the best value (`tied`: validation cannot tell those trials
apart) and the `dvc exp run --temp -S` line that reproduces the best one (`best_values`), and
whether the params file still holds what the sweep ran under (`check_unchanged`, before
`--apply` writes into it). Reads a study; runs nothing.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from simtune.errors import UserError
from simtune.train import space
from simtune.train import study as study_lib

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """One log line per trial (number, value or where it was pruned or why it failed, seconds)."""

    lines: list[str] = field(default_factory=list)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        sec = trial.duration.total_seconds() if trial.duration else 0.0
        state, attrs = trial.state, trial.user_attrs
        if state == optuna.trial.TrialState.COMPLETE:
            what = f"{trial.value:.4f} ({attrs.get('epochs')} epochs)"
        elif state == optuna.trial.TrialState.PRUNED:
            what = f"pruned at epoch {attrs.get('pruned_at')} (best {trial.value:.4f})" \
                if trial.value is not None else "pruned"
        elif "duplicate_of" in attrs:
            what = f"skipped: the params of trial {attrs['duplicate_of']} (not run again)"
        else:
            what = f"failed: {attrs.get('error', 'see the log')}"
        line = f"trial {trial.number}: {what}, {sec:.1f} s"
        self.lines.append(line)
        log.info("%s", line)


@dataclass
class Failures:
    """A callback that collects the numbers of the trials that failed (not skipped repeats)."""

    numbers: list[int] = field(default_factory=list)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == optuna.trial.TrialState.FAIL and "duplicate_of" not in trial.user_attrs:
            self.numbers.append(trial.number)


def _leaves(raw: Any) -> dict[str, Any]:
    """A parsed params file as dotted key -> leaf value."""
    if not isinstance(raw, dict):
        return {"(the file)": raw}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        out.update(study_lib.flat(str(key), value))
    return out


def check_unchanged(path: Path, ran_from: bytes, now: bytes) -> None:
    """Refuse, in one line naming the keys whose values differ (at most 3), when the params
    file `path` holds `now`, not the bytes `ran_from` the sweep started from: it was edited
    while the sweep ran (or while `--apply` was writing), so its values are not those the
    trials ran under, and writing the best values into it would mix the two or undo the
    user's edit. A comment or layout edit is refused too (the file is left as the user left
    it, their comment intact); the line then says no value changed."""
    from simtune import params as P

    if now == ran_from:
        return
    try:
        old, new = (_leaves(P.parse_yaml(b.decode("utf-8"), str(path))) for b in (ran_from, now))
        changed = study_lib.changes(old, new, "(none)") or "its comments or layout, no value"
    except (UserError, UnicodeDecodeError):  # half-saved by an editor: still the user's
        changed = "it no longer parses"
    raise UserError(f"{path} changed while the sweep ran ({changed}): nothing applied (the "
                    "trials ran under its earlier values); apply the line above with dvc exp "
                    "run, or sweep again")


def best_values(study: optuna.Study) -> dict[str, Any]:
    """What reproduces the best complete trial: the study's fixed values and the trial's
    params (`train.<key>` -> value); `UserError` when there is no complete trial."""
    try:
        return {**study.user_attrs.get("fixed", {}), **study.best_trial.params}
    except ValueError:
        raise UserError(f"sweep: study '{study.study_name}' has no complete trial yet") from None


def tied(study: optuna.Study) -> list[int]:
    """The numbers of the complete trials whose value equals the best one, in trial order: a
    tie when there are two or more (a small validation split often scores several settings
    alike, e.g. all 1.0): validation cannot tell them apart, the "best" is merely the first."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        return []
    best = max(float(t.value) for t in complete)  # type: ignore[arg-type]
    return sorted(t.number for t in complete if float(t.value) == best)  # type: ignore[arg-type]


def tie_lines(study: optuna.Study) -> list[str]:
    """What the closing text says of a tie at the best value (nothing when there is none):
    which trials tie, that the pick among them is arbitrary, and why importances are missing
    when every trial has one value."""
    numbers = tied(study)
    if len(numbers) < 2:
        return []
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    shown = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
    lines = [f"tie: {len(numbers)} of {len(complete)} complete trials score the best "
             f"validation value {study.best_value:.4f} (trials {shown}); validation cannot tell "
             f"them apart, so trial {numbers[0]} is merely the first of them (a larger "
             "validation split, or a metric that does not saturate (train.monitor: map@r), "
             "can)"]
    if len(numbers) == len(complete):
        lines.append("no importances: every complete trial has the same value, so no "
                     "parameter can be said to matter")
    return lines


def importances(study: optuna.Study) -> dict[str, float]:
    """Each param's importance to the value over the complete trials (Optuna's default
    evaluator, PED-ANOVA); {} while there are too few trials to tell, or when the evaluator
    cannot tell them apart (every value the same: it warned and called one param 1.00)."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2 or len({t.value for t in complete}) < 2:
        return {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            found = dict(optuna.importance.get_param_importances(study))
        except (RuntimeError, ValueError):  # e.g. every complete trial has the same params
            return {}
    return {} if any(issubclass(w.category, UserWarning) for w in caught) else found


def summary(study: optuna.Study, top: int, trials: int) -> str:
    """The closing text: how many of the `trials` asked for are finished (and how many failed,
    were pruned, were skipped as repeats), the best `top` complete trials (validation value,
    epochs, seconds, params), the importances, a tie at the best value, and the
    `dvc exp run --temp -S` line of the best."""
    everything = study.get_trials(deepcopy=False)
    complete = sorted((t for t in everything if t.state == optuna.trial.TrialState.COMPLETE),
                      key=lambda t: -float(t.value))  # type: ignore[arg-type]
    fail = [t for t in everything if t.state == optuna.trial.TrialState.FAIL]
    repeats = sum("duplicate_of" in t.user_attrs for t in fail)
    counts = {"complete": len(complete), "pruned": sum(t.state == optuna.trial.TrialState.PRUNED
                                                       for t in everything),
              "failed": len(fail) - repeats, "skipped as repeats": repeats}
    parts = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    finished = counts["complete"] + counts["pruned"]
    lines = [f"study '{study.study_name}': {finished} of {trials} finished"
             + (f" ({parts})" if parts else ""), ""]
    if not complete:
        return "\n".join(lines)
    keys = list(complete[0].params)
    lines += ["| trial | val | epochs | s | " + " | ".join(keys) + " |",
              "|---" * (4 + len(keys)) + "|"]
    for t in complete[:top]:
        sec = t.duration.total_seconds() if t.duration else 0.0
        cells = [f"{v:.4g}" if isinstance(v, float) else space.literal(v)
                 for v in (t.params.get(k) for k in keys)]
        lines.append(f"| {t.number} | {t.value:.4f} | {t.user_attrs.get('epochs')} | "
                     f"{sec:.1f} | " + " | ".join(cells) + " |")
    imp = importances(study)
    if imp:
        lines += ["", "importance: " + ", ".join(f"{k} {v:.2f}" for k, v in imp.items())]
    ties = tie_lines(study)
    if ties:
        lines += ["", *ties]
    lines += ["", "best trial through the pipeline (train, evaluate on test):",
              space.overrides(best_values(study), temp=True)]
    return "\n".join(lines)
