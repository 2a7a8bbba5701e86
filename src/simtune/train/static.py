"""A static student (`train.mode: static`): a token table, mean-pooled, taught by a teacher.

The student is a table E (V, d) over a tokenizer's tokens and a linear map W (d, D); a text's
vector is mean(E[tokens]) @ W, L2-normalised. Its targets are a teacher's vectors of the same
texts (any encoder entry, typically an earlier simtune export; the cache stage fills them like
any encoder's); its examples are the training texts plus unlabelled ones (`prepare.file.kind:
texts`), which cost nothing to label. The loss is 1 - cos(student, teacher), plus
`label_weight` x SupCon on the labelled rows (groups) or MNRL on the pairs (pairs data).

The mean is linear, so mean(E[t]) @ W = mean((E @ W)[t]) exactly: at the end W is folded into
the table (`fold`: E @ W, (V, D)) and what is served is a plain sentence-transformers
`StaticEmbedding` + `Normalize` (`simtune.static`). The map gives the fit a low-rank start and a
cheap global rotation the per-token rows alone learn slowly.

The table starts from the teacher's own vector of each of its tokens (`init: teacher`, the map
at identity) or model2vec's distill of the query encoder (`init: distill`, the map from the
least-squares fit of the teacher's training vectors on the table's means: `least_squares_map`),
cached in the store (`simtune.train.static_init`), so epoch 0 (nothing trained by gradient) is
already a candidate the validation split can keep. Validation uses
`simtune.train.validation` (`Schedule`, `Validator`, `selection_key`): early stopping and the
kept epoch as in every mode.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from simtune.static import StaticEncoder
from simtune.train.losses import GroupLoss, PairLoss
from simtune.train.validation import Schedule, selection_key

log = logging.getLogger(__name__)


@dataclass
class Tokens:
    """Token ids of N texts: `flat` (T,) ids, `starts` (N,) and `lengths` (N,) into it: what
    the static mode caches instead of encoder states (a few bytes per token)."""

    flat: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of(cls, table: StaticEncoder, texts: list[str]) -> Tokens:
        ids, offsets = table.token_ids(texts)
        lengths = torch.diff(offsets, append=torch.tensor([len(ids)]))
        return cls(ids, offsets, lengths)

    def __len__(self) -> int:
        return len(self.starts)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, offsets) of the texts `index`, in that order, for `embedding_bag`."""
        lengths = self.lengths[index]
        offsets = torch.cumsum(lengths, 0) - lengths
        pos = torch.repeat_interleave(self.starts[index] - offsets, lengths)
        return self.flat[pos + torch.arange(len(pos))], offsets


# k a's bound: weights within e^+-20 of 1 (a ratio of e^40 ~ 2e17), so the folded rows, scaled
# to a largest weight of 1, keep squares float32 can sum (a served vector's norm stays finite)
LOG_WEIGHT_BOUND = 20.0


class StaticStudent(nn.Module):
    """E (V, d) and W (d, D) (module docstring); `forward` -> (B, D) unnormalised vectors.

    `weight_rate` k > 0: a learned weight per row too, w = exp(k a) (a (V,) at 0: the start
    unchanged), and a text's vector is the weighted mean sum(w_t E[t]) / sum(w_t) @ W; k
    scales a's effective rate against the table's (Adam's steps are ~lr in a, k lr in log w).
    The start's fixed SIF weights (`static_init`) are folded in the rows; these learn on top,
    so a frequent word the labels need ("what", "how") can regain what SIF took from it. The
    fold serves (w_t / max w) E[t] @ W: StaticEmbedding's plain mean of those rows is the
    weighted sum over the token count, the same direction (the output is L2-normalised)."""

    def __init__(self, table: torch.Tensor, mapping: torch.Tensor | None = None,
                 weight_rate: float = 0.0) -> None:
        super().__init__()
        self.table = nn.Parameter(table.float().clone())
        width = table.shape[1]
        self.map = nn.Parameter(torch.eye(width) if mapping is None else mapping.float().clone())
        self.weight_rate = float(weight_rate)
        self.log_weight = nn.Parameter(torch.zeros(len(table))) if weight_rate > 0 else None

    def weights(self, ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """The learned weight exp(k a) of the rows `ids` (None: every row, (V,)), or None
        without them; k a is held in [-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND] (past float32's
        exp range a weight is inf, then a text's vector NaN)."""
        if self.log_weight is None:
            return None
        a = self.log_weight if ids is None else self.log_weight[ids]
        return torch.exp((self.weight_rate * a).clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        tw = self.weights(ids)  # a batch's tokens only, not the whole vocabulary
        if tw is None:
            return F.embedding_bag(ids, self.table, offsets, mode="mean") @ self.map
        lengths = torch.diff(offsets, append=torch.tensor([len(ids)]))
        bag = torch.repeat_interleave(torch.arange(len(offsets)), lengths)
        total = F.embedding_bag(ids, self.table, offsets, mode="sum", per_sample_weights=tw)
        norm = torch.zeros(len(offsets)).index_add_(0, bag, tw).clamp_min(1e-12)
        return (total / norm[:, None]) @ self.map

    @torch.no_grad()
    def fold(self) -> torch.Tensor:
        """The served table (V, D) = (w E) @ W: its means give `forward`'s directions to float
        rounding (equal vectors without learned weights)."""
        w = self.weights()
        if w is not None:
            w = w.double() / w.max().double()  # one scale for every row: the same directions
        table = self.table.double() if w is None else w[:, None] * self.table.double()
        return (table @ self.map.double()).float()

    @torch.no_grad()
    def encode(self, tokens: Tokens, batch: int = 8192) -> torch.Tensor:
        """(N, D) unnormalised vectors of every text of `tokens`, in order."""
        out = [self(*tokens.batch(torch.arange(i, min(i + batch, len(tokens)))))
               for i in range(0, len(tokens), batch)]
        return torch.cat(out) if out else torch.empty(0, self.map.shape[1])


def least_squares_map(student: StaticStudent, tokens: Tokens, teacher: torch.Tensor,
                      ridge: float = 1e-3) -> torch.Tensor:
    """(d, D) W minimising ||M W - T||^2 + ridge ||W||^2 over the rows: M the table's means of
    the texts (unit rows), T the teacher's unit vectors: the map epoch 0 starts from."""
    with torch.no_grad():
        ids, offsets = tokens.batch(torch.arange(len(tokens)))
        means = F.normalize(F.embedding_bag(ids, student.table, offsets, mode="mean").double(),
                            dim=1)
        target = F.normalize(teacher.double(), dim=1)
        gram = means.T @ means + ridge * len(means) * torch.eye(means.shape[1],
                                                                 dtype=torch.float64)
        return torch.linalg.solve(gram, means.T @ target).float()


@dataclass(frozen=True)
class FitSettings:
    """The static schedule (`train.schedule.static`, resolved: no defaults here): `lr` (Adam),
    `batch_size`, `max_epochs`, `patience` (epochs without a better validation key),
    `label_weight` (0: the labels unused), `temperature` (SupCon's, `train.loss`), `seed`,
    `monitor` (the validation metric that keeps an epoch)."""

    lr: float
    batch_size: int
    max_epochs: int
    patience: int
    label_weight: float
    temperature: float
    seed: int
    monitor: str


@dataclass
class FitResult:
    """The kept epoch's folded table (V, D), its epoch (0: the initial table), the
    per-epoch validation metrics and loss, the fit's seconds."""

    table: torch.Tensor
    best_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


Validate = Callable[[Callable[[Tokens], torch.Tensor]], dict[str, float]]


class _Mixed:
    """Batches of labelled and unlabelled texts in equal numbers. An epoch runs once over the
    larger of the two sets, shuffled, `batch_size` at a time; each batch is joined by as many
    rows of the other (at most all of them), taken in turn from a shuffle of it that is drawn
    again when it runs out. Why: in one shuffle, 57,927 unlabelled tweets beside 1,776
    labelled ones left ~8 labelled rows in a batch of 256, the label term had next to no
    positives, and the student fell from 0.453 to 0.344 test P@1 (0.434 with no label term
    at all); an epoch over the labelled rows alone kept the label term but showed the
    student a fraction of the texts (bbc with 16,000 news texts: 0.937 against 0.963).
    Measured: bench/static_probe.txt."""

    def __init__(self, labelled: torch.Tensor, unlabelled: torch.Tensor,
                 gen: torch.Generator) -> None:
        self.labelled_major = len(labelled) >= len(unlabelled)
        self.major, self.minor = ((labelled, unlabelled) if self.labelled_major
                                  else (unlabelled, labelled))
        self.gen, self.left = gen, self.minor[:0]

    @classmethod
    def of(cls, labels: torch.Tensor | None, gen: torch.Generator) -> _Mixed | None:
        """None unless `labels` holds both labelled (>= 0) and unlabelled (-1) rows."""
        if labels is None:
            return None
        have = labels >= 0
        if bool(have.all()) or not bool(have.any()):
            return None
        return cls(torch.nonzero(have).flatten(), torch.nonzero(~have).flatten(), gen)

    def take(self, n: int) -> torch.Tensor:
        """The next min(n, all) rows of the smaller set from its running shuffle."""
        parts, need = [], min(n, len(self.minor))
        while need > 0:
            if not len(self.left):
                self.left = self.minor[torch.randperm(len(self.minor), generator=self.gen)]
            parts.append(self.left[:need])
            self.left, need = self.left[need:], need - len(parts[-1])
        return torch.cat(parts)

    def batches(self, batch_size: int) -> list[torch.Tensor]:
        """One epoch's batches: row indices, the labelled first."""
        order = self.major[torch.randperm(len(self.major), generator=self.gen)]
        return [torch.cat([b, self.take(len(b))] if self.labelled_major
                          else [self.take(len(b)), b]) for b in order.split(batch_size)]


def fit(student: StaticStudent, tokens: Tokens, teacher: torch.Tensor, validate: Validate,
        s: FitSettings, labels: torch.Tensor | None = None,
        pairs: torch.Tensor | None = None) -> FitResult:
    """Fit `student` to `teacher` (N, D) vectors of the texts `tokens` (N rows); `labels` (N,)
    class indices, -1 for an unlabelled text (SupCon on the labelled rows of each batch; with
    both kinds and the label term on, each batch holds as many of each, `_Mixed`);
    `pairs` (P, 2) rows (query, document) of related texts (MNRL): the label term, weighted by
    `s.label_weight`. `validate(embed)` -> the validation metrics ("val/<name>") of the
    vectors `embed(tokens)` gives. Epoch 0 (the student as given) is a candidate; the kept
    epoch is the best by `selection_key`, with early stopping after `s.patience` epochs."""
    t0 = time.perf_counter()
    torch.manual_seed(s.seed)
    target = F.normalize(teacher.float(), dim=1)
    schedule = Schedule(1, s.patience, s.max_epochs)
    opt = torch.optim.Adam(student.parameters(), lr=s.lr)
    supcon = GroupLoss("supcon", "cosine", s.temperature, 0.0, "batch_hard", 1.0)
    mnrl = PairLoss("mnrl", "cosine", 20.0, False, 0.0)

    def embed(tok: Tokens) -> torch.Tensor:
        return student.encode(tok)

    def check(epoch: int, loss: float) -> bool:
        student.eval()
        scores = validate(embed)
        schedule_better, stop = schedule.record(epoch, selection_key(scores, s.monitor))
        history.append({"epoch": epoch, "loss": loss, **scores})
        if schedule_better:
            best[0] = student.fold()
        # epoch 0 is the start, trained by no step: it has no training loss to print
        # (its history keeps NaN there; the curves leave it out)
        done = "the start, no training loss" if epoch == 0 else f"loss {loss:.4f}"
        log.info("static epoch %d: %s, val %s %.4f (best epoch %d)", epoch, done, s.monitor,
                 scores.get(f"val/{s.monitor}", float("nan")), schedule.best_epoch)
        return stop

    history: list[dict[str, float]] = []
    best = [student.fold()]
    check(0, float("nan"))
    gen = torch.Generator().manual_seed(s.seed)
    mixed = _Mixed.of(labels, gen) if s.label_weight > 0 else None
    for epoch in range(1, s.max_epochs + 1):
        student.train()
        total, steps = 0.0, 0
        for index in (mixed.batches(s.batch_size) if mixed else
                      torch.randperm(len(tokens), generator=gen).split(s.batch_size)):
            out = student(*tokens.batch(index))
            loss = (1 - F.cosine_similarity(out, target[index], dim=1)).mean()
            if s.label_weight > 0 and labels is not None:
                lab = labels[index]
                keep = lab >= 0
                if int(keep.sum()) > 1:
                    loss = loss + s.label_weight * supcon(out[keep], lab[keep])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total, steps = total + float(loss.detach()), steps + 1
        if s.label_weight > 0 and pairs is not None and len(pairs):
            for chunk in pairs[torch.randperm(len(pairs), generator=gen)].split(s.batch_size):
                q = student(*tokens.batch(chunk[:, 0]))
                d = student(*tokens.batch(chunk[:, 1]))
                loss = s.label_weight * mnrl(q, d, chunk[:, 0], chunk[:, 1],
                                                torch.ones(len(chunk)))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        if check(epoch, total / max(steps, 1)):
            break
    return FitResult(best[0], schedule.best_epoch, history, time.perf_counter() - t0)


def describe(result: FitResult) -> str:
    """One line for logs: the kept epoch and its validation metric."""
    kept = next((h for h in result.history if h["epoch"] == result.best_epoch), {})
    return json.dumps({"best_epoch": result.best_epoch, "seconds": round(result.seconds, 1),
                       **{k: round(v, 4) for k, v in kept.items() if k.startswith("val/")}})
