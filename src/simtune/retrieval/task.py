"""The retrieval task of a split: which queries rank which corpus, and what is relevant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from simtune.examples import Data, Split, first_positions
from simtune.retrieval import metrics

Embed = Callable[[Split, str], torch.Tensor]  # (split, role: text | query | doc) -> (n, D)



def split_metrics(data: Data, split: str, embed: Embed, ks: tuple[int, ...] = (1, 5, 10),
                  corpus: str | None = None) -> tuple[dict[str, float], int]:
    """Retrieval metrics of `split` with vectors from `embed` (any head, any encoder).

    Groups: each text queries the texts of the `corpus` split, or with None the other texts of
    its own split (leave-one-out); relevant = same label. Pairs: each distinct query against the
    split's distinct documents, relevant = its documents with score > 0.
    Returns (metrics, queries without a relevant item)."""
    return retrieval_task(data, split, corpus, ks).scores(data, embed)



@dataclass
class RetrievalTask:
    """What `split_metrics` needs besides the vectors, computed once per split: the splits'
    names and, for pairs, each distinct query's and document's first row and the relevant
    (query, document) pairs."""

    split: str
    corpus: str | None
    ks: tuple[int, ...]
    q_first: torch.Tensor | None = None
    d_first: torch.Tensor | None = None
    pairs: torch.Tensor | None = None

    def scores(self, data: Data, embed: Embed, upto_r: bool = True
               ) -> tuple[dict[str, float], int]:
        """(metrics, queries without a relevant item) with vectors from `embed`; `upto_r`
        False: ranked down to max(ks, 10) only, without MAP@R (`metrics.group_scores`)."""
        sp = data.splits[self.split]
        if self.pairs is None:
            c = data.splits[self.corpus] if self.corpus else None
            return metrics.group_scores(embed(sp, "text"), sp.tensors["labels"],
                                        embed(c, "text") if c else None,
                                        c.tensors["labels"] if c else None, self.ks,
                                        upto_r=upto_r)
        assert self.q_first is not None and self.d_first is not None
        return metrics.pair_scores(embed(sp, "query")[self.q_first],
                                   embed(sp, "doc")[self.d_first], self.pairs, self.ks,
                                   upto_r=upto_r)



def retrieval_task(data: Data, split: str, corpus: str | None = None,
                   ks: tuple[int, ...] = (1, 5, 10)) -> RetrievalTask:
    """The retrieval task of `split` (see `split_metrics`); `corpus` matters for groups only."""
    if data.kind == "groups":
        return RetrievalTask(split, corpus, ks)
    sp = data.splits[split]
    q_u, q_inv = torch.unique(sp.tensors["q_ids"], return_inverse=True)
    d_u, d_inv = torch.unique(sp.tensors["d_ids"], return_inverse=True)
    positive = sp.tensors["scores"] > 0
    pairs = torch.stack([q_inv[positive], d_inv[positive]], 1)
    return RetrievalTask(split, None, ks, first_positions(q_inv, len(q_u)),
                         first_positions(d_inv, len(d_u)), pairs)
