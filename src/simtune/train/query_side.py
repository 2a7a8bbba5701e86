"""`train.head.side: query`: a head on the query side only, over a frozen corpus.

Documents keep the frozen encoder's vectors exactly (a user's index of them stays valid); the
head transforms queries (groups: each text as a query) and the loss ranks each query of a batch
against the frozen vectors of the whole training corpus (groups: every training text, the query
itself left out; pairs: every distinct training document), not the batch alone: with every
document vector fixed, a step can afford the whole corpus, and each step then sees every
negative (`CANDIDATES` "batch" ranks against the batch's own frozen documents, what a symmetric
head sees: bench/query_adapter.py measures both). Above `CORPUS_SAMPLE` corpus items a step
ranks a fresh uniform sample of them plus the batch's own positives.

The loss is multi-positive InfoNCE (SupCon's "out" form): for query i with positives P(i) among
the candidates, -1/|P(i)| sum_{p in P(i)} log softmax_p(cos(head(q_i), c) / T), T the supcon
`temperature` (groups) or 1 / the mnrl `scale` (pairs); queries with no positive are left out.
Validation ranks the same way (`QuerySideValidator`): head(queries) against frozen vectors
(pairs: of the train and val documents, `train.validation.validation_task`). In top_layers mode the
queries run through the trainable top layers first (a query tower); the corpus stays the cached
frozen vectors. With `train.objective: distill` the loss is the distillation `kl` of the head's
rows against the batch's frozen vectors (`simtune.train.distill`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from simtune.examples import Data, Split
from simtune.params import CacheParams, EncodersParams, TrainParams
from simtune.retrieval.task import by_split
from simtune.train.module import SimilarityModule
from simtune.train.represent import ROWS
from simtune.train.validation import KS, Validator, separation

CANDIDATES = "corpus"  # "corpus" (the default, measured better) | "batch" (bench/query_adapter)
CORPUS_SAMPLE = 65536  # corpus items a step ranks at most (a uniform sample above it)


class CorpusLoss(torch.nn.Module):
    """Multi-positive InfoNCE of head(queries) (c, D) against frozen corpus vectors.

    `corpus` (M, D): the frozen vectors; `keys` (M,): groups, each item's label; pairs, unused.
    `positives` (R, P) for pairs: per training row, the corpus indices of its query's positive
    documents (-1 pads); `self_of` (R,) groups: each training row's own corpus index."""

    def __init__(self, corpus: torch.Tensor, temperature: float, keys: torch.Tensor | None,
                 positives: torch.Tensor | None, self_of: torch.Tensor | None,
                 seed: int) -> None:
        super().__init__()
        self.register_buffer("corpus", F.normalize(corpus.float(), dim=-1), persistent=False)
        self.temperature, self.keys, self.positives, self.self_of = (
            temperature, keys, positives, self_of)
        self.generator = torch.Generator().manual_seed(seed)

    def candidates(self, idx: torch.Tensor) -> torch.Tensor:
        """(K,) corpus indices this step ranks (the training rows `idx` (c,) of the batch)."""
        m = len(self.corpus)
        own = (self.self_of[idx] if self.self_of is not None
               else self.positives[idx].reshape(-1))  # type: ignore[index]
        own = own[own >= 0]
        if CANDIDATES == "batch":
            return torch.unique(own)
        if m <= CORPUS_SAMPLE:
            return torch.arange(m)
        sample = torch.randint(m, (CORPUS_SAMPLE,), generator=self.generator)
        return torch.unique(torch.cat([sample, own]))

    def forward(self, queries: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """queries (c, D) head outputs of training rows `idx` (c,) -> the mean loss (scalar)."""
        cand = self.candidates(idx)
        dev = queries.device
        logits = F.normalize(queries, dim=-1) @ self.corpus[cand.to(dev)].T / self.temperature
        if self.keys is not None:  # groups: same label, not itself
            assert self.self_of is not None
            keys = self.keys[idx]
            pos = keys[:, None] == self.keys[cand][None]
            own = self.self_of[idx][:, None] == cand[None]
            pos &= ~own
        else:  # pairs: the query's positive documents that are candidates
            col = torch.full((len(self.corpus),), -1, dtype=torch.long)
            col[cand] = torch.arange(len(cand))
            p = self.positives[idx]  # type: ignore[index]
            cols = torch.where(p >= 0, col[p.clamp_min(0)], -1)
            pos = torch.zeros(len(idx), len(cand) + 1, dtype=torch.bool)
            pos.scatter_(1, cols.masked_fill(cols < 0, len(cand)), True)
            pos, own = pos[:, :-1], torch.zeros_like(pos[:, :-1])
        pos, own = pos.to(dev), own.to(dev)
        logits = logits.masked_fill(own, float("-inf"))
        log_prob = logits - torch.logsumexp(logits, 1, keepdim=True)
        n_pos = pos.sum(1)
        keep = n_pos > 0
        if not bool(keep.any()):
            return (queries * 0).sum()  # no positive in the batch: no gradient, no NaN
        per = -(log_prob.masked_fill(~pos, 0).sum(1)[keep] / n_pos[keep])
        return per.mean()


def corpus_loss(data: Data, t: TrainParams) -> CorpusLoss:
    """The loss over `data`'s training split: its frozen corpus, keys and positives (`t`: the
    train params; its loss's temperature or scale, and its seed)."""
    tr = data.training.tensors
    if data.kind == "groups":
        corpus = data.tables["query"].vectors[tr["rows"]]
        return CorpusLoss(corpus, t.loss.temperature, tr["labels"], None,
                          torch.arange(len(tr["rows"])), t.seed)
    d_u, d_inv = torch.unique(tr["d_ids"], return_inverse=True)
    first = torch.full((len(d_u),), len(d_inv), dtype=torch.long).scatter_reduce(
        0, d_inv, torch.arange(len(d_inv)), "amin")
    corpus = data.tables["doc"].vectors[tr["d_rows"][first]]
    return CorpusLoss(corpus, 1.0 / t.loss.scale, None,
                      _positives(tr["q_ids"], d_inv, tr["scores"] > 0), None, t.seed)


def _positives(q_ids: torch.Tensor, d_index: torch.Tensor, positive: torch.Tensor
               ) -> torch.Tensor:
    """(R, P) per row, the corpus indices of its query's positive documents (-1 pads)."""
    by_query: dict[int, list[int]] = {}
    for q, d, ok in zip(q_ids.tolist(), d_index.tolist(), positive.tolist(), strict=True):
        if ok and d not in by_query.setdefault(q, []):
            by_query[q].append(d)
    width = max((len(v) for v in by_query.values()), default=1)
    out = torch.full((len(q_ids), width), -1, dtype=torch.long)
    for r, q in enumerate(q_ids.tolist()):
        docs = by_query.get(q, [])
        out[r, : len(docs)] = torch.tensor(docs, dtype=torch.long)
    return out


class QuerySideModule(SimilarityModule):
    """`SimilarityModule` whose head sees the queries only and whose loss ranks them against
    the frozen training corpus (`CorpusLoss`)."""

    def __init__(self, data: Data, t: TrainParams, enc: EncodersParams,
                 cache: CacheParams) -> None:
        super().__init__(data, t, enc, cache)
        self.distilling = t.objective == "distill"
        if not self.distilling:  # distillation: `kl` against the rows' frozen vectors
            self.loss_fn = corpus_loss(data, t)

    def encode(self, part: dict[str, Any]) -> torch.Tensor:
        """Training batch part -> (c, D) head outputs of its queries (groups: its texts)."""
        role = "text" if self.data.kind == "groups" else "query"
        return self.encode_role(part, role)

    def roles(self) -> list[str]:
        return ["text"] if self.data.kind == "groups" else ["query"]

    def loss_of(self, reps: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if not self.distilling:
            return self.loss_fn(reps, idx)
        tr, dev = self.data.training.tensors, self.device
        teacher = self.data.tables["teacher"].vectors[tr["t_rows"][idx]].to(dev).float()
        frozen = self.data.tables["query"].vectors[tr["rows"][idx]].to(dev).float()
        return self.loss_fn(reps, teacher, None, frozen)


class QuerySideValidator(Validator):
    """`Validator` that ranks head(queries) against the frozen vectors of the corpus, read
    once: head mode, the representation's (the cached vectors); top_layers mode, the rows of
    the cached vector tables, what the loss ranks against and evaluate scores with (the
    trained query tower never embeds the corpus)."""

    def frozen(self, sp: Split, role: str) -> torch.Tensor:
        """(n, D) frozen vectors of a split's examples for `role`, on the model's device."""
        key = (id(sp), role, "frozen")
        if key not in self._cache:
            if self.rep_frozen:
                self._cache[key] = self.rep(sp, role)
            else:
                table = self.data.d_vectors if role == "doc" else self.data.q_vectors
                assert table is not None  # top_layers mode holds the vector tables
                device = getattr(getattr(self.rep, "__self__", None), "device", table.device)
                rows = sp.tensors[ROWS[role]]
                self._cache[key] = table[rows.to(table.device)].float().to(device)
        return self._cache[key]

    def __call__(self, full: bool = True) -> tuple[dict[str, float], bool]:
        """As `Validator.__call__`: (metrics, whether every query vector was finite)."""
        frozen = self.frozen

        finite = [True]

        def embed(sp: Split, role: str) -> torch.Tensor:
            vectors = self.embed(sp, role)
            finite[0] = finite[0] and bool(torch.isfinite(vectors).all())
            return vectors

        q, c = by_split(self.data, embed), by_split(self.data, frozen)
        scored = self.task.score(q, KS, upto_r=full, corpus_vectors=c)
        if not finite[0]:
            return {}, False
        self.last = scored  # the per-query metrics (`EpochLoop`: the lift over epoch 0)
        if not full:
            return scored.metrics, True
        task = self.task  # the separation breaks ties (`selection_key`), as `Validator`'s
        qv = q(task.queries)
        sep = (separation(task, qv, c(task.corpus)) if task.corpus is not None
               else separation(task, qv, None, loo_corpus=c(task.queries)))
        return {**scored.metrics, "separation": sep}, True
