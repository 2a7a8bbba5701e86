"""Similarity losses over embeddings, computed in row chunks so B x B never has to be whole.

Every loss is a sum over *anchors* divided by a count; anchors are this process's rows, columns
are every process's rows (all-gathered with gradients under DDP). The count is all-reduced, so
2 processes x batch B give exactly the gradient of 1 process x batch 2B.

Groups (embeddings (B, D) + integer labels (B,)): `supcon`, `triplet`, `contrastive`, `arcface`,
`cosine_mse`.
Pairs (queries (B, D), documents (B, D) + ids): `mnrl`, `contrastive` (score-weighted).
Distances: `cosine` (1 - cos), `dot` (-a.b), `euclidean` (||a - b||); similarity is -distance
(cosine similarity for `cosine`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from simtune.params import TrainParams, resolve_loss
from simtune.train import matryoshka

CHUNK_ROWS = 512  # anchors per chunk: memory O(CHUNK_ROWS x B), recomputed in backward
# a batch whose anchors x (elements per anchor) fit is one piece, not recomputed in backward:
# 2-D losses (B x B) up to B = 1448; at B = 1024 a TREC head training epoch takes 0.35 instead
# of 0.42 core-s (one thread) for ~30 MB more
WHOLE_ELEMENTS = 2**21

# the `train.loss` keys each loss reads (the others change nothing; a sweep over one warns)
USED_BY = {
    "distance": {"supcon", "triplet", "contrastive", "mnrl"},  # arcface: cosine to centres
    "temperature": {"supcon"},
    "margin": {"triplet", "contrastive", "arcface"},
    "mining": {"triplet"},
    "scale": {"mnrl", "arcface"},
    "symmetric": {"mnrl"},
}


def similarity(a: torch.Tensor, b: torch.Tensor, distance: str) -> torch.Tensor:
    """(n, D), (m, D) -> (n, m) similarity."""
    if distance == "cosine":
        return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
    if distance == "dot":
        return a @ b.T
    return -pairwise_distance(a, b, distance)


def pairwise_distance(a: torch.Tensor, b: torch.Tensor, distance: str) -> torch.Tensor:
    """(n, D), (m, D) -> (n, m) distance."""
    if distance == "cosine":
        return 1 - F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
    if distance == "dot":
        return -(a @ b.T)
    sq = (a * a).sum(1, keepdim=True) + (b * b).sum(1) - 2 * a @ b.T
    return sq.clamp_min(1e-12).sqrt()  # clamp: sqrt has no gradient at 0


class Gather:
    """Columns from every process (with gradients) and global counts; identity when alone.

    World size and rank are read at each call: the loss is built before DDP starts."""

    @property
    def world(self) -> int:
        dist = torch.distributed
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @property
    def rank(self) -> int:
        return torch.distributed.get_rank() if self.world > 1 else 0

    def columns(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """All processes' rows of `x` concatenated, and the offset of this process's rows."""
        if self.world == 1:
            return x, 0
        from torch.distributed.nn.functional import all_gather

        parts = all_gather(x) if x.is_floating_point() else _gather_nograd(x, self.world)
        return torch.cat(parts), self.rank * x.shape[0]

    def mean(self, total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """`total` / (global count / world): DDP's gradient average then equals the global mean."""
        if self.world > 1:
            count = count.detach().clone()
            torch.distributed.all_reduce(count)
            count = count / self.world
        return total / count.clamp_min(1)


def _gather_nograd(x: torch.Tensor, world: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(world)]
    torch.distributed.all_gather(parts, x.contiguous())
    return parts


def _chunked(fn: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]], rows: int,
             per_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum fn(start, end) -> (loss sum, count) over row chunks; checkpointed when chunked.
    `per_row`: elements of the largest intermediate per anchor (B, or B^2 for the triplet
    mining that compares every positive with every negative); one piece when
    rows x per_row <= WHOLE_ELEMENTS."""
    if rows * per_row <= WHOLE_ELEMENTS:
        return fn(0, rows)
    total, count = [], []
    for s in range(0, rows, CHUNK_ROWS):
        e = min(s + CHUNK_ROWS, rows)
        if rows > CHUNK_ROWS and torch.is_grad_enabled():
            t, c = checkpoint(fn, s, e, use_reentrant=False)
        else:
            t, c = fn(s, e)
        total.append(t)
        count.append(c)
    return torch.stack(total).sum(), torch.stack(count).sum()


class GroupLoss(nn.Module):
    """Loss over (B, D) embeddings with (B,) integer labels; same label = similar."""

    def __init__(self, name: str, distance: str, temperature: float, margin: float,
                 mining: str, scale: float, num_classes: int = 0, dim: int = 0) -> None:
        super().__init__()
        self.name, self.distance, self.temperature = name, distance, temperature
        self.margin, self.mining, self.scale = margin, mining, scale
        self.gather = Gather()
        if name == "arcface":
            self.centers = nn.Parameter(F.normalize(torch.randn(num_classes, dim), dim=-1))

    def forward(self, emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.name == "arcface":
            return self.gather.mean(*self._arcface(emb, labels))
        cols, offset = self.gather.columns(emb)
        col_labels, _ = self.gather.columns(labels)
        row_fn = {"supcon": self._supcon, "triplet": self._triplet,
                  "contrastive": self._contrastive, "cosine_mse": self._cosine_mse}[self.name]

        def fn(s: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
            same = labels[s:e, None] == col_labels[None, :]
            self_mask = torch.zeros_like(same)
            self_mask[torch.arange(e - s), torch.arange(offset + s, offset + e)] = True
            return row_fn(emb[s:e], cols, same & ~self_mask, ~same)

        cubic = self.name == "triplet" and self.mining != "batch_hard"  # (C, P, N)
        return self.gather.mean(*_chunked(fn, emb.shape[0], len(cols) ** (2 if cubic else 1)))

    def _supcon(self, a: torch.Tensor, cols: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = similarity(a, cols, self.distance) / self.temperature
        others = pos | neg  # every column but the anchor itself
        log_prob = logits - torch.logsumexp(logits.masked_fill(~others, -math.inf), 1,
                                            keepdim=True)
        n_pos = pos.sum(1)
        has = n_pos > 0
        per_anchor = -(log_prob * pos).sum(1)[has] / n_pos[has]
        return per_anchor.sum(), has.sum()

    def _triplet(self, a: torch.Tensor, cols: torch.Tensor, pos: torch.Tensor,
                 neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = pairwise_distance(a, cols, self.distance)
        if self.mining == "batch_hard":
            valid = pos.any(1) & neg.any(1)
            hardest_pos = d.masked_fill(~pos, -math.inf).amax(1)
            hardest_neg = d.masked_fill(~neg, math.inf).amin(1)
            loss = F.relu(hardest_pos - hardest_neg + self.margin)[valid]
            return loss.sum(), valid.sum()
        ap, an = d[:, :, None], d[:, None, :]  # (C, P, 1), (C, 1, N)
        if self.mining == "batch_all":
            valid = pos[:, :, None] & neg[:, None, :]
            loss = F.relu(ap - an + self.margin) * valid
            return loss.sum(), (loss > 1e-16).sum()  # mean over triplets that still contribute
        # semi_hard (FaceNet): per (anchor, positive), the closest negative farther than the
        # positive; if there is none, the farthest negative
        farther = neg[:, None, :] & (an > ap)
        semi = an.masked_fill(~farther, math.inf).amin(2)
        fallback = d.masked_fill(~neg, -math.inf).amax(1, keepdim=True).expand_as(semi)
        chosen = torch.where(farther.any(2), semi, fallback)
        valid = pos & neg.any(1, keepdim=True)
        loss = F.relu(d - chosen + self.margin) * valid
        return loss.sum(), valid.sum()

    def _contrastive(self, a: torch.Tensor, cols: torch.Tensor, pos: torch.Tensor,
                     neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = pairwise_distance(a, cols, self.distance)
        loss = 0.5 * (pos * d.pow(2) + neg * F.relu(self.margin - d).pow(2))
        return loss.sum(), (pos | neg).sum()

    def _cosine_mse(self, a: torch.Tensor, cols: torch.Tensor, pos: torch.Tensor,
                    neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SetFit's CosineSimilarityLoss over the batch's pairs: each anchor's mean (cos - 1)^2
        over its positives and mean cos^2 over its negatives, averaged (SetFit balances the
        two by oversampling pairs; here each side counts half whatever the label mix). An
        anchor without a positive or a negative in the batch is not averaged. Unlike supcon,
        no softmax: a negative already at cos 0 adds no push, so few-shot classes stop
        moving once apart (TREC coarse at 16 per label, bench.small_data: see docs/modes.md)."""
        cos = similarity(a, cols, "cosine")
        n_pos, n_neg = pos.sum(1), neg.sum(1)
        has = (n_pos > 0) & (n_neg > 0)
        on_pos = ((cos - 1).pow(2) * pos).sum(1)[has] / n_pos[has]
        on_neg = (cos.pow(2) * neg).sum(1)[has] / n_neg[has]
        return (0.5 * (on_pos + on_neg)).sum(), has.sum()

    def _arcface(self, emb: torch.Tensor, labels: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        centers = self.centers[:, : emb.shape[1]]  # Matryoshka: a prefix of each centre
        cos = (F.normalize(emb, dim=-1) @ F.normalize(centers, dim=-1).T).clamp(-1, 1)
        target = cos.gather(1, labels[:, None])
        sin = (1 - target.pow(2)).clamp_min(1e-12).sqrt()
        m = self.margin
        with_margin = target * math.cos(m) - sin * math.sin(m)  # cos(theta + m)
        # past theta = pi - m, cos(theta + m) stops decreasing: use a linear penalty instead
        with_margin = torch.where(target > math.cos(math.pi - m), with_margin,
                                  target - math.sin(math.pi - m) * m)
        logits = self.scale * cos.scatter(1, labels[:, None], with_margin)
        loss = F.cross_entropy(logits, labels, reduction="sum")
        return loss, torch.tensor(emb.shape[0], device=emb.device)


class PairLoss(nn.Module):
    """Loss over queries (B, D) and their documents (B, D); row i of each is a listed pair.

    Other rows' documents are in-batch negatives, except documents that are the same text or
    belong to the same query (they would be false negatives).
    """

    def __init__(self, name: str, distance: str, scale: float, symmetric: bool,
                 margin: float) -> None:
        super().__init__()
        self.name, self.distance, self.scale = name, distance, scale
        self.symmetric, self.margin = symmetric, margin
        self.gather = Gather()

    def forward(self, q: torch.Tensor, d: torch.Tensor, q_ids: torch.Tensor,
                d_ids: torch.Tensor, scores: torch.Tensor, negs: torch.Tensor | None = None,
                neg_ids: torch.Tensor | None = None) -> torch.Tensor:
        """q, d (B, D); ids, scores (B,). mnrl: `negs` (B, n, D) mined negatives of each row and
        `neg_ids` (B, n) their document ids (-1: none): every row's negatives are candidates for
        every query (as sentence-transformers' MNRL does), masked where -1 or where the document
        is listed with that query in the batch."""
        all_q, offset = self.gather.columns(q)
        all_d, _ = self.gather.columns(d)
        all_qid, _ = self.gather.columns(q_ids)
        all_did, _ = self.gather.columns(d_ids)
        neg_cols = neg_col_ids = pair_keys = None
        size = 0
        if negs is not None and neg_ids is not None:
            all_n, _ = self.gather.columns(negs)
            all_nid, _ = self.gather.columns(neg_ids)
            neg_cols, neg_col_ids = all_n.reshape(-1, all_n.shape[-1]), all_nid.reshape(-1)
            size = int(torch.cat([all_qid, all_did, neg_col_ids]).max()) + 1
            pair_keys = all_qid * size + all_did  # the batch's (query, document) pairs

        def fn(s: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
            rows = torch.arange(e - s, device=q.device)
            target = rows + offset + s
            same = (d_ids[s:e, None] == all_did[None]) | (q_ids[s:e, None] == all_qid[None])
            false_neg = same.clone()
            false_neg[rows, target] = False
            if self.name == "mnrl":
                extra = None
                if neg_cols is not None:
                    listed = torch.isin(q_ids[s:e, None] * size + neg_col_ids[None], pair_keys)
                    extra = (neg_cols, listed | (neg_col_ids[None] < 0))
                return self._mnrl(q[s:e], d[s:e], all_q, all_d, target, false_neg, extra)
            return self._contrastive(q[s:e], all_d, target, false_neg, scores[s:e])

        return self.gather.mean(*_chunked(fn, q.shape[0], len(all_d)))

    def _mnrl(self, q: torch.Tensor, d: torch.Tensor, all_q: torch.Tensor, all_d: torch.Tensor,
              target: torch.Tensor, false_neg: torch.Tensor,
              extra: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """`extra`: (M, D) more candidate documents after the batch's and their (c, M) mask."""
        logits = (self.scale * similarity(q, all_d, self.distance)).masked_fill(false_neg,
                                                                               -math.inf)
        if extra is not None:
            more = (self.scale * similarity(q, extra[0], self.distance)).masked_fill(extra[1],
                                                                                    -math.inf)
            logits = torch.cat([logits, more], 1)
        loss = F.cross_entropy(logits, target, reduction="none")
        if self.symmetric:  # documents -> queries as well
            back = (self.scale * similarity(d, all_q, self.distance)).masked_fill(false_neg,
                                                                                 -math.inf)
            loss = 0.5 * (loss + F.cross_entropy(back, target, reduction="none"))
        return loss.sum(), torch.tensor(q.shape[0], device=q.device)

    def _contrastive(self, q: torch.Tensor, all_d: torch.Tensor, target: torch.Tensor,
                     false_neg: torch.Tensor, scores: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        dist = pairwise_distance(q, all_d, self.distance)
        y = torch.zeros_like(dist)
        y[torch.arange(q.shape[0]), target] = scores.to(dist.dtype)
        keep = ~false_neg
        loss = 0.5 * (y * dist.pow(2) + (1 - y) * F.relu(self.margin - dist).pow(2)) * keep
        return loss.sum(), keep.sum()


def build_loss(kind: str, t: TrainParams, num_classes: int, dim: int) -> torch.nn.Module:
    """The loss of `t.loss` for the data kind (summed over `matryoshka_dims` when listed);
    `auto` resolved as everywhere else (`params.resolve_loss`)."""
    lp = resolve_loss(t, kind).loss
    loss: torch.nn.Module
    if kind == "groups":
        loss = GroupLoss(lp.name, lp.distance, lp.temperature, lp.margin, lp.mining, lp.scale,
                         num_classes, dim)
    else:
        loss = PairLoss(lp.name, lp.distance, lp.scale, lp.symmetric, lp.margin)
    return matryoshka.wrap(loss, lp.matryoshka_dims, lp.matryoshka_weights)
