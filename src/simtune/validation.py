"""When to validate, when to stop, which epoch to keep, and validation that recomputes only what
the weights change. Lightning-free (the train stage's callback drives it, `simtune.epochs`).

Schedule (`train.val_every` = N; epochs are 1-based):
- epochs N, 2N, ... and the last one (`max_epochs`) are validated;
- early stopping counts epochs: training stops at a validated epoch that is not better than the
  best validated one when it comes `patience` or more epochs after it (N = 1: Lightning's
  `EarlyStopping(patience)` exactly);
- the epochs between validations keep a copy of their weights (a head: ~2 MB) while they may
  still be needed: at the end the epochs within N - 1 of the best validated one (before and
  after it) are validated from their copies, and the best of all validated epochs is kept (ties:
  the earliest, as with N = 1). So the kept epoch is the best one within N - 1 epochs of the
  best validated one: with N = 5 on TREC (88 epochs) 25 validations instead of 88 keep the
  same epoch as validating every epoch (bench/train_speed.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from simtune.train_data import RetrievalTask, Split, TrainData

State = Any  # an opaque copy of the weights (the callback's own)


class Schedule:
    """Validation epochs, early stopping in epochs and the kept epoch (see the module doc).

    Per epoch e, in order: `validates(e)`; if False, `hold(e, copy)`; if True,
    `record(e, value, copy)` -> whether to stop. At the end: `recheck()` lists the (epoch, copy)
    to validate, each answered with `rechecked(epoch, value, copy)`; then `best_epoch`,
    `best_value` and `best_state` are the kept epoch's. `copy()` is called only for a copy
    that is kept."""

    def __init__(self, every: int, patience: int, max_epochs: int) -> None:
        if every < 1 or patience < 0 or max_epochs < 1:
            raise ValueError(f"bad schedule: every {every}, patience {patience}, "
                             f"max_epochs {max_epochs}")
        self.every, self.patience, self.max_epochs = every, patience, max_epochs
        self.best_epoch, self.best_value, self.best_state = 0, -float("inf"), None
        self._validated = 0  # the best epoch on the schedule (patience counts from it)
        self._recent: dict[int, State] = {}  # copies since the last validation
        self._before: dict[int, State] = {}  # copies of the N - 1 epochs before the best
        self._after: dict[int, State] = {}  # copies of the N - 1 epochs after it
        self.values: dict[int, float] = {}  # every validated epoch's value, re-checks included

    def validates(self, epoch: int) -> bool:
        return epoch % self.every == 0 or epoch == self.max_epochs

    def hold(self, epoch: int, copy: Callable[[], State]) -> None:
        """An epoch not validated now: keep a copy (it may be next to the best)."""
        if self.every > 1:
            self._recent[epoch] = copy()

    def record(self, epoch: int, value: float, copy: Callable[[], State]) -> bool:
        """A validated epoch's value; True when training must stop here."""
        self.values[epoch] = value
        if value > self.best_value:
            self.best_epoch = self._validated = epoch
            self.best_value, self.best_state = value, copy()
            self._before, self._after = self._recent, {}
            stop = False
        else:
            near = {e: s for e, s in self._recent.items() if e < self._validated + self.every}
            self._after.update(near)
            stop = epoch - self._validated >= self.patience
        self._recent = {}
        return stop

    def recheck(self) -> list[tuple[int, State]]:
        """The kept copies next to the best validated epoch, in epoch order."""
        both = {**self._before, **self._after}
        return sorted(both.items(), key=lambda item: item[0])

    def rechecked(self, epoch: int, value: float, state: State) -> None:
        """A re-checked epoch's value: kept when better (equal and earlier: better)."""
        self.values[epoch] = value
        if value > self.best_value or (value == self.best_value and epoch < self.best_epoch):
            self.best_epoch, self.best_value, self.best_state = epoch, value, state

    @property
    def rechecks(self) -> int:
        return len(self._before) + len(self._after)


def frozen(module: torch.nn.Module) -> bool:
    """Whether nothing in `module` trains (its output depends on its input only)."""
    return not any(p.requires_grad for p in module.parameters())


class Validator:
    """Metrics of a split (`task`) with vectors head(rep(split)): what does not depend on the
    weights is computed once — the task (labels, relevant pairs), the representation's vectors
    when it is frozen (head mode: the cached vectors), and the head's too when it is frozen
    (identity). Reused vectors equal recomputed ones exactly (same ops on the same input)."""

    def __init__(self, data: TrainData, task: RetrievalTask, rep: Callable[[Split, str], Any],
                 head: torch.nn.Module, rep_frozen: bool) -> None:
        self.data, self.task, self.rep, self.head = data, task, rep, head
        self.rep_frozen, self._cache = rep_frozen, {}  # (split, role, "rep" | "out") -> vectors
        self._head_frozen = frozen(head)

    def embed(self, sp: Split, role: str) -> torch.Tensor:
        """(n, D) head outputs of a split's examples for `role`, from the caches when valid."""
        key = (id(sp), role)  # the splits of `data` live as long as the validator
        if self.rep_frozen and self._head_frozen and (*key, "out") in self._cache:
            return self._cache[(*key, "out")]
        if self.rep_frozen:
            if (*key, "rep") not in self._cache:
                self._cache[(*key, "rep")] = self.rep(sp, role)
            x = self._cache[(*key, "rep")]
        else:
            x = self.rep(sp, role)
        out = self.head(x)
        if self.rep_frozen and self._head_frozen:
            self._cache[(*key, "out")] = out
        return out

    def __call__(self) -> tuple[dict[str, float], bool]:
        """(metrics, whether every vector was finite); call it in eval mode, without grad."""
        finite: list[bool] = []

        def embed(sp: Split, role: str) -> torch.Tensor:
            vectors = self.embed(sp, role)
            finite.append(bool(torch.isfinite(vectors).all()))
            return vectors

        scores, _ = self.task.scores(self.data, embed)
        return scores, all(finite)

