"""When to validate what, when to stop, which epoch to keep, and validation that recomputes only
what the weights change. Lightning-free (the train stage's callback drives it,
`simtune.train.epochs`).

Every epoch is validated on the monitored metric (`train.monitor`), so early stopping and the
kept epoch are exactly those of validating everything every epoch (Lightning's
`EarlyStopping(patience)`: stop after `patience` epochs without a better value; the first epoch
with the best value is kept). That needs only each query's top 10 (P@1, MRR@10, nDCG@10 from an
exact top-k, ties by index, are the same from the top 10 as from the top R), about a third of
the cost of every metric on TREC, where MAP@R needs the top R (up to 765 of its 4,305
training texts). Every metric (the curves) is computed every `train.val_every` epochs, at the
last epoch, and for the kept epoch at the end (from its kept weights). With `monitor: map@r`
every epoch computes all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from simtune.examples import Data, Split
from simtune.retrieval import metrics
from simtune.retrieval.task import RetrievalTask, Scored, by_split, retrieval_task

KS = (1, 5, 10)  # validation's Recall@k cut-offs


def val_queries(data: Data) -> int:
    """The validation split's queries: its texts (groups) or its distinct queries (pairs),
    what `train.monitor: auto` counts (`params.resolve_monitor`)."""
    val = data.splits["val"]
    if data.kind == "groups":
        return len(val)
    return int(val.tensors["q_ids"].unique().numel()) if len(val) else 0


class Schedule:
    """Which epochs compute every metric, early stopping in epochs, the kept epoch.

    Per epoch e (0: the frozen encoder, before training; then 1-based): `full(e)`: whether
    every metric is computed (else only the monitored one); `record(e, key)` -> (better,
    stop): `better` when the key (`selection_key`: the monitored value, then the tie-breakers)
    beats every earlier one (the epoch is then the kept one; equal keys keep the earlier
    epoch; the frozen encoder yields to a better rank metric only, never to the separation
    alone), `stop` when `patience` or more epochs have passed since the later of the kept
    epoch and the best trained epoch (`trained_best`): patience counts from the first trained
    epoch, so a slow starter still below the frozen encoder trains on while it improves (a
    query-side head rose from val MRR@10 0.607 to 0.813, the frozen 0.841, when patience
    counted from epoch 0 stopped it at epoch 15). `rising`: whether the last recorded epoch
    was the best trained one and beat both the epoch before it and epoch 0 on the rank metrics
    (`gained`; a run that ends so stopped at max_epochs "still rising": a flat curve, one
    below the frozen encoder or one whose separation alone moved is not).
    `best_value`: the kept epoch's monitored value (the key's first element).
    `frozen_candidate` False (`train.frozen_candidate`): epoch 0 is recorded but never kept."""

    def __init__(self, every: int, patience: int, max_epochs: int,
                 frozen_candidate: bool = True) -> None:
        if every < 1 or patience < 0 or max_epochs < 1:
            raise ValueError(f"bad schedule: every {every}, patience {patience}, "
                             f"max_epochs {max_epochs}")
        self.every, self.patience, self.max_epochs = every, patience, max_epochs
        self.best_epoch, self.best_key = 0, (-float("inf"),)
        self.trained_best, self.trained_key = 0, (-float("inf"),)
        self.rising = False
        # epoch 0's key and the last recorded one's: `rising` needs a gain over both
        self.frozen_key: tuple[float, ...] | None = None
        self.last_key: tuple[float, ...] | None = None
        self.last_epoch = -1
        self.frozen_candidate = frozen_candidate

    @property
    def best_value(self) -> float:
        return self.best_key[0]

    def full(self, epoch: int) -> bool:
        return epoch % self.every == 0 or epoch == self.max_epochs

    def ties(self, value: float) -> bool:
        """Whether a monitored `value` equals the kept epoch's (the tie-breakers decide)."""
        return value == self.best_key[0]

    def record(self, epoch: int, key: tuple[float, ...] | float) -> tuple[bool, bool]:
        key = key if isinstance(key, tuple) else (key,)
        best_trained = epoch > 0 and key > self.trained_key
        if best_trained:
            self.trained_best, self.trained_key = epoch, key
        self.rising = (best_trained and gained(key, self.last_key)
                       and gained(key, self.frozen_key))
        self.last_epoch, self.last_key = epoch, key
        if epoch == 0:
            self.frozen_key = key
        if (key > self.best_key and (epoch > 0 or self.frozen_candidate)
                and not self._separation_over_frozen(key)):
            self.best_epoch, self.best_key = epoch, key
            return True, False
        since = epoch - max(self.best_epoch, self.trained_best)
        return False, epoch > 0 and since >= self.patience

    def completed(self, epoch: int, key: tuple[float, ...]) -> None:
        """The kept `epoch`'s key once every metric of it is computed (it had the top 10's
        only): every record of that epoch takes it."""
        self.best_key = key
        if self.trained_best == epoch:
            self.trained_key = key
        if self.last_epoch == epoch:
            self.last_key = key
        if epoch == 0:
            self.frozen_key = key

    def _separation_over_frozen(self, key: tuple[float, ...]) -> bool:
        """Whether `key` beats the kept frozen encoder (epoch 0) by the separation alone (the
        last tie-breaker), every rank metric equal. Training raises the separation by
        construction (the losses pull relevant pairs together), so it breaks ties between
        trained epochs but is no evidence against the frozen encoder: on 25 validation pairs
        that all rank alike, epoch 1 displaced it that way and lost 0.12 test P@1."""
        return (self.best_epoch == 0 and self.frozen_candidate and len(key) > 1
                and key[:-1] == self.best_key[:-1])


def gained(key: tuple[float, ...], other: tuple[float, ...] | None) -> bool:
    """Whether the selection key `key` beats `other` (None: nothing to beat) on the rank
    metrics: the separation (the last tie-breaker) alone rises by construction and is no
    sign that more epochs gain."""
    if other is None:
        return True
    a, b = (key[:-1], other[:-1]) if len(key) > 1 else (key, other)
    # a tie-breaker one side did not compute (-inf: top-10 only) compares nothing
    n = next((i for i, pair in enumerate(zip(a, b, strict=True)) if -float("inf") in pair), len(a))
    return a[:n] > b[:n]


# after the monitored metric, in order: what breaks a tie (a small validation split saturates
# rank metrics: MRR@10 reaches 1.0 after one step while MAP@R and the separation still rise)
TIE_BREAKERS = ("map@r", "separation")


def selection_key(scores: dict[str, float], monitor: str) -> tuple[float, ...]:
    """(monitored value, then each of `TIE_BREAKERS` but the monitor) of validation `scores`
    ("val/<name>"); a tie-breaker not computed (MAP@R of a top-10 validation) is -inf: it is
    computed whenever the monitored value ties (`EpochLoop`), so only a strictly better
    monitored value ever meets a missing one."""
    names = [monitor, *(n for n in TIE_BREAKERS if n != monitor)]
    key = [scores.get(f"val/{n}", -float("inf")) for n in names]
    # the separation to 1e-6: float noise (an epoch that barely moved the weights) is a tie,
    # which keeps the earlier epoch (the frozen encoder over a head that did not train)
    key[-1] = round(key[-1], 6)
    return tuple(key)


def separation(task: RetrievalTask, q: torch.Tensor, c: torch.Tensor | None,
               loo_corpus: torch.Tensor | None = None) -> float:
    """The mean over queries of (mean cosine to its relevant items - mean cosine to every
    item it ranks): a continuous score that never saturates, the last tie-breaker
    (`TIE_BREAKERS`). `q` (Q, D) the queries' vectors, `c` (C, D) the corpus' (None: the
    queries leave themselves out; the corpus is then `loo_corpus` (Q, D), the queries' own
    vectors on the corpus side (a query-side head: frozen), or `q` itself). O((Q + C) D):
    per-label sums of unit vectors (groups), or one dot product per relevant pair (pairs).
    Queries without a relevant item count 0."""
    q = torch.nn.functional.normalize(q.float(), dim=1)
    loo = c is None
    if loo:
        c = q if loo_corpus is None else torch.nn.functional.normalize(loo_corpus.float(), dim=1)
    else:
        c = torch.nn.functional.normalize(c.float(), dim=1)
    own = (q * c).sum(1) if loo else None  # each query's cosine to its own corpus item
    dev = q.device  # the task's labels and pairs live on the CPU, the vectors maybe not
    total = q @ c.sum(0)  # (Q,)
    n_all = torch.full((len(q),), float(len(c) - loo), device=dev)
    if task.pairs is None:
        assert task.q_labels is not None
        q_labels = task.q_labels.to(dev)
        c_labels = q_labels if task.c_labels is None else task.c_labels.to(dev)
        n_labels = int(max(q_labels.max(), c_labels.max())) + 1
        sums = torch.zeros(n_labels, c.shape[1], device=dev).index_add_(0, c_labels, c)
        rel = (q * sums[q_labels]).sum(1)
        n_rel = torch.bincount(c_labels, minlength=n_labels)[q_labels].float()
        if own is not None:  # each query is in the corpus sums once: take itself out
            rel, total, n_rel = rel - own, total - own, n_rel - 1
    else:
        qi, ci = task.pairs[:, 0].to(dev), task.pairs[:, 1].to(dev)
        rel = torch.zeros(len(q), device=dev).index_add_(0, qi, (q[qi] * c[ci]).sum(1))
        n_rel = torch.bincount(qi, minlength=len(q)).float()
    has = n_rel > 0
    gap = torch.where(has, rel / n_rel.clamp_min(1) - total / n_all.clamp_min(1), 0.0)
    return float(gap.mean()) if len(gap) else 0.0


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
        self.last: Scored | None = None

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
        max(ks, 10) only, every metric but MAP@R and the separation (`full`: both). `last`:
        the ranking's `Scored` (per-query metrics). Call it in eval mode, without grad."""
        def embed(sp: Split, role: str) -> torch.Tensor:
            vectors = self.embed(sp, role)
            if not bool(torch.isfinite(vectors).all()):
                raise _NotFinite
            return vectors

        vectors, task = by_split(self.data, embed), self.task
        try:
            q = vectors(task.queries)
            c = None if task.corpus is None else vectors(task.corpus)
        except _NotFinite:
            # nothing to score (numpy would only warn about NaN): the caller stops the run.
            # Every process has the same weights, so all stop here together
            return {}, False
        self.last = task.score_by(metrics.cosine(q, q if c is None else c), KS, upto_r=full)
        # the separation with MAP@R only: both break ties, and a tie computes every metric
        extra = {"separation": separation(task, q, c)} if full else {}
        return {**self.last.metrics, **extra}, True

    @contextlib.contextmanager
    def representing(self, rep: Callable[[Split, str], Any] | None) -> Iterator[None]:
        """Within the block, `rep` embeds the splits (None: the validator's own)."""
        own = self.rep
        self.rep = rep or own
        try:
            yield
        finally:
            self.rep = own


def cached_encoder(data: Data, rep: Any) -> Callable[[Split, str], torch.Tensor] | None:
    """Epoch 0's representation in top_layers mode: the frozen encoder's vectors, read from
    the cached vector tables (its `q_vectors`, `d_vectors`: the encoder's own float32 output,
    what the untouched top layers give from the float16 states up to their rounding, and what
    evaluate's baseline scores) instead of a forward pass of every validation text through
    the top layers (one validation of the run's epochs + 1). None in the other modes (head:
    its representation is the cache already; full: no cache)."""
    from simtune.train.represent import CachedStates

    if not isinstance(rep, CachedStates) or data.q_vectors is None or data.d_vectors is None:
        return None
    return _CachedEncoder(data, rep.device).embed_split


class _CachedEncoder:
    """`cached_encoder`'s vectors, a bound method like the representation's `embed_split`
    (whose `__self__.device` the query-side validator reads)."""

    def __init__(self, data: Data, device: torch.device) -> None:
        self.data, self.device = data, device

    def embed_split(self, sp: Split, role: str) -> torch.Tensor:
        from simtune.train.represent import ROWS

        table = self.data.d_vectors if role in ("doc", "neg") else self.data.q_vectors
        assert table is not None
        rows = sp.tensors[ROWS[role]]
        return table[rows.to(table.device)].float().to(self.device)


RANK_METRICS = ("p@1", "mrr@10", "ndcg@10", "map@r")  # what `train.monitor` can name


def disagreement(history: dict[int, dict[str, float]], kept: int, monitor: str
                 ) -> dict[str, Any] | None:
    """What training found that the monitored metric did not keep: when epoch 0 (the frozen
    encoder) is `kept` but a trained epoch beat it on validation on another rank metric, the
    epoch and metric of the largest such lift -> {epoch, metric, lifts: every rank metric
    that epoch computed, minus epoch 0's}; else None. `history`: epoch -> "val/<name>" scores
    (an epoch that computed only the top 10 has no MAP@R: it competes on what it has)."""
    if kept != 0 or 0 not in history:
        return None
    frozen = history[0]
    best: tuple[float, int, str] | None = None
    for epoch, scores in sorted(history.items()):
        for name in RANK_METRICS:
            key = f"val/{name}"
            if epoch == 0 or name == monitor or key not in scores or key not in frozen:
                continue
            lift = scores[key] - frozen[key]
            if lift > 0 and (best is None or lift > best[0]):
                best = (lift, epoch, name)
    if best is None:
        return None
    _, epoch, name = best
    lifts = {m: history[epoch][f"val/{m}"] - frozen[f"val/{m}"] for m in RANK_METRICS
             if f"val/{m}" in history[epoch] and f"val/{m}" in frozen}
    return {"epoch": epoch, "metric": name, "lifts": lifts}


def disagreement_line(d: dict[str, Any]) -> str:
    """`disagreement`'s finding in one line: "epoch 2: map@r +0.3100, mrr@10 -0.0100 on
    validation; `train.monitor: map@r` keeps it"."""
    lifts = ", ".join(f"{m} {v:+.4f}" for m, v in sorted(
        d["lifts"].items(), key=lambda kv: (kv[0] != d["metric"], RANK_METRICS.index(kv[0]))))
    return (f"epoch {d['epoch']}: {lifts} on validation against the frozen encoder; "
            f"`train.monitor: {d['metric']}` keeps it")


class _NotFinite(Exception):
    """A vector that is not finite: scoring stops at the first."""


def validation_task(data: Data, side: str, corpus: str) -> RetrievalTask:
    """The validation split's retrieval task. Groups: the test evaluation's corpus (the train
    texts, or leave-one-out); pairs, with binary gains (the test ranks every document with
    graded gains): the val documents; a query-side head's, the train and val documents, the
    frozen corpus its loss ranks against (the val documents alone were too easy to choose an
    epoch by: on 1,500 news title -> body pairs, frozen val MRR@10 0.95 against 0.84 on the
    test, and the query-side head kept epoch 13, which lost 0.056 MRR@10 on test; against the
    train and val documents it keeps the frozen encoder). The symmetric head keeps the val
    documents: against the train and val ones too, its news pairs at 1,500 kept the frozen
    encoder (instead of losing 0.019) but at 200 one seed in 3 kept an epoch that lost 0.2 P@1
    (bench.small_data), where the val documents alone left nothing to gain. The top 2 layers
    on those 1,500 pairs (4 epochs) validated against `known` kept the frozen encoder too (val
    MRR@10 0.881, then 0.850, 0.866, 0.880, 0.876): there, neither task hides a gain. `side`:
    `train.head.side`; `corpus`: `evaluate.corpus`."""
    if data.kind == "pairs" and side == "query":
        return retrieval_task(data, "val", "known")
    against_train = data.kind == "groups" and corpus == "train"
    return retrieval_task(data, "val", "train" if against_train else "split")
