"""When to validate what, when to stop, which epoch to keep, and validation that recomputes only
what the weights change. Lightning-free (the train stage's callback drives it,
`simtune.train.epochs`).

Every epoch is validated on the monitored metric (`train.monitor`), so early stopping and the
kept epoch are exactly those of validating everything every epoch (Lightning's
`EarlyStopping(patience)`: stop after `patience` epochs without a better value; the first epoch
with the best value is kept). That needs only each query's top 10 (P@1, MRR@10, nDCG@10 from an
exact top-k, ties by index, are the same from the top 10 as from the top R), about a third of
the cost of every metric on TREC, where MAP@R needs the top R (up to 765 of 4,306). Every
metric (the curves) is computed every `train.val_every` epochs, at the last epoch, and for the
kept epoch at the end (from its kept weights). With `monitor: map@r` every epoch computes all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from simtune.examples import Data, Split
from simtune.retrieval.task import RetrievalTask, by_split

KS = (1, 5, 10)  # validation's Recall@k cut-offs


class Schedule:
    """Which epochs compute every metric, early stopping in epochs, the kept epoch.

    Per epoch e (1-based): `full(e)`: whether every metric is computed (else only the
    monitored one); `record(e, value)` -> (better, stop): `better` when the value beats every
    earlier one (the epoch is then the kept one), `stop` when it does not and it comes
    `patience` or more epochs after the kept one."""

    def __init__(self, every: int, patience: int, max_epochs: int) -> None:
        if every < 1 or patience < 0 or max_epochs < 1:
            raise ValueError(f"bad schedule: every {every}, patience {patience}, "
                             f"max_epochs {max_epochs}")
        self.every, self.patience, self.max_epochs = every, patience, max_epochs
        self.best_epoch, self.best_value = 0, -float("inf")

    def full(self, epoch: int) -> bool:
        return epoch % self.every == 0 or epoch == self.max_epochs

    def record(self, epoch: int, value: float) -> tuple[bool, bool]:
        if value > self.best_value:
            self.best_epoch, self.best_value = epoch, value
            return True, False
        return False, epoch - self.best_epoch >= self.patience


def frozen(module: torch.nn.Module) -> bool:
    """Whether nothing in `module` trains (its output depends on its input only)."""
    return not any(p.requires_grad for p in module.parameters())


class Validator:
    """Metrics of a split (`task`) with vectors head(rep(split)): what does not depend on the
    weights is computed once — the task (labels, relevant pairs), the representation's vectors
    when it is frozen (head mode: the cached vectors), and the head's too when it is frozen
    (identity). Reused vectors equal recomputed ones exactly (same ops on the same input)."""

    def __init__(self, data: Data, task: RetrievalTask, rep: Callable[[Split, str], Any],
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

    def __call__(self, full: bool = True) -> tuple[dict[str, float], bool]:
        """(metrics, whether every vector was finite); `full` False: ranked down to the top
        max(ks, 10) only, every metric but MAP@R. Call it in eval mode, without grad."""
        def embed(sp: Split, role: str) -> torch.Tensor:
            vectors = self.embed(sp, role)
            if not bool(torch.isfinite(vectors).all()):
                raise _NotFinite
            return vectors

        try:
            scored = self.task.score(by_split(self.data, embed), KS, upto_r=full)
        except _NotFinite:
            # nothing to score (numpy would only warn about NaN): the caller stops the run.
            # Every process has the same weights, so all stop here together
            return {}, False
        return scored.metrics, True


class _NotFinite(Exception):
    """A vector that is not finite: scoring stops at the first."""

