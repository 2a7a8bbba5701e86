"""The retrieval task of a split: which queries rank which corpus, and what is relevant.

One task serves training's validation, the evaluate stage and the benchmarks. Two policies say
what is ranked and how relevance counts (pairs data; groups rank texts by label):
- corpus "split": the split's own distinct documents (groups: its other texts, leave-one-out);
  "all": the distinct documents of every split, then the caller's `extra` rows (documents in no
  split: BEIR's corpus-only rows); groups may name another split instead (its texts).
- gains "binary": relevant = score > 0, gain 1; "graded": the pair's score is its gain (nDCG).
Validation uses ("split", "binary"), evaluate ("all", "graded"): the val metrics are of the val
documents only, the test metrics of the whole corpus.

Each side of the task (`Items`) names its rows as positions in splits, so vectors may come
per split (`by_split`: validation's representation of a whole split) or per cache row
(`by_rows`: evaluate's heads over the cache; `Items.rows`, fixed once, lets callers memoise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from simtune.examples import Data, Split, first_positions
from simtune.retrieval import metrics

ROWS = {"text": "rows", "query": "q_rows", "doc": "d_rows"}  # role -> cache rows column


@dataclass(eq=False)
class Items:
    """One side of a task: the `role` (text | query | doc) vectors of the rows `parts`, in order:
    (split name, positions in it, None: every row) concatenated, then `extra` caller-given cache
    rows. `rows` (n,): their cache rows, when the splits hold rows (head and top_layers data)."""

    role: str
    parts: tuple[tuple[str, torch.Tensor | None], ...]
    rows: torch.Tensor | None
    size: int
    extra: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.size


Vectors = Callable[[Items], torch.Tensor]  # items -> (len(items), D)
Embed = Callable[[Split, str], torch.Tensor]  # (split, role) -> (len(split), D)
RowVectors = Callable[[torch.Tensor, str], torch.Tensor]  # (cache rows (n,), role) -> (n, D)


def by_split(data: Data, embed: Embed) -> Vectors:
    """Vectors of items from `embed` of their whole splits (no `extra` rows: they are in none)."""
    def vectors(items: Items) -> torch.Tensor:
        if items.extra is not None and len(items.extra):
            raise ValueError("rows outside the splits need vectors by cache row (by_rows)")
        out = [embed(data.splits[name], items.role) if pos is None else
               embed(data.splits[name], items.role)[pos] for name, pos in items.parts]
        return out[0] if len(out) == 1 else torch.cat(out)
    return vectors


def by_rows(vectors: RowVectors) -> Vectors:
    """Vectors of items from `vectors` of their cache rows (`Items.rows`, the same tensor at
    every call, so `vectors` may memoise by it)."""
    def of(items: Items) -> torch.Tensor:
        if items.rows is None:
            raise ValueError("these items have no cache rows (full-mode data)")
        return vectors(items.rows, items.role)
    return of


@dataclass
class Scored:
    """One model on a task: mean `metrics`, `no_relevant` queries without a relevant item, and
    the ranking (`metrics.Ranked`: per-query metrics, top lists for run files); groups:
    `per_label`, class index -> the metrics of that label's queries (computed when asked)."""

    metrics: dict[str, float]
    no_relevant: int
    ranked: metrics.Ranked
    labels: torch.Tensor | None = None
    ks: tuple[int, ...] = ()
    upto_r: bool = True

    @cached_property
    def per_label(self) -> dict[int, dict[str, float]]:
        if self.labels is None:
            return {}
        return {lab: metrics.without_r(m, self.upto_r)
                for lab, m in metrics.by_label(self.ranked, self.labels, self.ks).items()}


@dataclass(eq=False)
class RetrievalTask:
    """`queries` rank `corpus` (None: the queries themselves, each leaving itself out).
    Groups: relevant = same label (`q_labels`, `c_labels`). Pairs: `pairs` (P, 2) (query index,
    corpus index) of the relevant items, `gains` (P,) their graded gains (None: binary)."""

    queries: Items
    corpus: Items | None
    q_labels: torch.Tensor | None = None
    c_labels: torch.Tensor | None = None
    pairs: torch.Tensor | None = None
    gains: torch.Tensor | None = None

    @property
    def corpus_size(self) -> int:
        """Items each query is ranked against."""
        return len(self.queries) - 1 if self.corpus is None else len(self.corpus)

    @property
    def corpus_items(self) -> Items:
        """What each query ranks: `corpus`, or the queries themselves (leave-one-out)."""
        return self.queries if self.corpus is None else self.corpus

    def cosine(self, vectors: Vectors, corpus_vectors: Vectors | None = None
               ) -> metrics.Ranker:
        """The exact cosine `metrics.Ranker` of the task's queries over its corpus items;
        `corpus_vectors` (None: `vectors`) gives the corpus side's vectors (a query-side head:
        head(queries) against frozen documents; leave-one-out still leaves each query out)."""
        q = vectors(self.queries)
        if corpus_vectors is None:
            return metrics.cosine(q, q if self.corpus is None else vectors(self.corpus))
        return metrics.cosine(q, corpus_vectors(self.corpus_items))

    def score(self, vectors: Vectors, ks: tuple[int, ...], depth: int = 0,
              upto_r: bool = True, corpus_vectors: Vectors | None = None) -> Scored:
        """The metrics of the vectors `vectors` gives (`metrics` module): `depth` > 0 keeps
        each query's top `depth` too (run files); `upto_r` False ranks down to max(ks, 10) only
        and leaves MAP@R out (the other metrics are the same: the top-k is exact);
        `corpus_vectors`: the corpus side's own vectors (`cosine`)."""
        return self.score_by(self.cosine(vectors, corpus_vectors), ks, depth, upto_r)

    def score_by(self, ranker: metrics.Ranker, ks: tuple[int, ...], depth: int = 0,
                 upto_r: bool = True) -> Scored:
        """`score` of any ranker of the queries over `corpus_items` (BM25, a fusion): the same
        relevance, gains, leave-one-out and metrics as the vectors get."""
        if self.pairs is None:
            assert self.q_labels is not None
            c_labels = self.q_labels if self.c_labels is None else self.c_labels
            ranked = metrics.group_ranking(ranker, self.q_labels, c_labels, self.corpus is None,
                                           ks, depth=depth, upto_r=upto_r)
        else:
            ranked = metrics.pair_ranking(ranker, len(self.queries), len(self.corpus_items),
                                          self.pairs, ks, gains=self.gains, depth=depth,
                                          upto_r=upto_r)
        return Scored(metrics.without_r(metrics.scores(ranked, ks), upto_r),
                      int((ranked.n_relevant == 0).sum()), ranked, self.q_labels, ks, upto_r)


def retrieval_task(data: Data, split: str, corpus: str = "split", gains: str = "binary",
                   extra: torch.Tensor | None = None) -> RetrievalTask:
    """The task of `split`'s queries (see the module docstring for the policies).

    Groups: every text queries, `corpus` "split" (or the split's own name): leave-one-out, else
    the name of the split whose texts are ranked; `gains` is ignored (binary by label).
    Pairs: each distinct query (first row) against the distinct documents of `corpus` "split"
    (ordered by text id), "all" (every split's, in order of first appearance, then `extra`
    (E,) cache rows) or "known" (as "all", of the train and val splits only); relevant = its
    documents with score > 0, with gains "graded" their scores as gains (binary when all are
    1). Ties rank by corpus index, so each order is the
    one validation and evaluate always had: it is part of their numbers."""
    if gains not in ("binary", "graded"):
        raise ValueError(f"gains must be binary or graded, not {gains!r}")
    sp = data.splits[split]
    if data.kind == "groups":
        if corpus == "all" or extra is not None:
            raise ValueError("groups rank the texts of one split: corpus 'split' or a name")
        q = Items("text", ((split, None),), sp.tensors.get("rows"), len(sp))
        if corpus in ("split", split):
            return RetrievalTask(q, None, sp.tensors["labels"])
        c = data.splits[corpus]
        return RetrievalTask(q, Items("text", ((corpus, None),), c.tensors.get("rows"), len(c)),
                             sp.tensors["labels"], c.tensors["labels"])
    if corpus not in ("split", "all", "known"):
        raise ValueError(f"pairs rank documents of corpus 'split', 'all' or 'known', not "
                         f"{corpus!r}")
    t = sp.tensors
    q_u, q_inv = torch.unique(t["q_ids"], return_inverse=True)
    q_first = first_positions(q_inv, len(q_u))
    queries = Items("query", ((split, q_first),), _rows(t, "query", q_first), len(q_u))
    positive = t["scores"] > 0
    if corpus == "split":
        d_u, d_inv = torch.unique(t["d_ids"], return_inverse=True)
        d_first = first_positions(d_inv, len(d_u))
        docs = Items("doc", ((split, d_first),), _rows(t, "doc", d_first), len(d_u))
        relevant = d_inv[positive]
    else:
        docs, index = _every_document(data, extra, ("train", "val") if corpus == "known"
                                      else None)
        relevant = torch.tensor([index[d] for d in t["d_ids"][positive].tolist()],
                                dtype=torch.long)
    g = t["scores"][positive]
    return RetrievalTask(queries, docs, pairs=torch.stack([q_inv[positive], relevant], 1),
                         gains=g if gains == "graded" and bool((g != 1).any()) else None)


def _rows(tensors: dict[str, torch.Tensor], role: str, pos: torch.Tensor
          ) -> torch.Tensor | None:
    rows = tensors.get(ROWS[role])
    return None if rows is None else rows[pos]


def _every_document(data: Data, extra: torch.Tensor | None,
                    only: tuple[str, ...] | None = None) -> tuple[Items, dict[int, int]]:
    """The distinct documents of every split (`only`: of those splits; first appearance, splits
    in order), then `extra` cache rows; and each split document's corpus index by its text id
    (`d_ids`)."""
    index: dict[int, int] = {}
    parts = []
    splits = {n: s for n, s in data.splits.items() if only is None or n in only}
    for name, s in splits.items():
        fresh = []
        for pos, d in enumerate(s.tensors["d_ids"].tolist()):
            if d not in index:
                index[d] = len(index)
                fresh.append(pos)
        parts.append((name, torch.tensor(fresh, dtype=torch.long)))
    have_rows = all(ROWS["doc"] in s.tensors for s in splits.values())
    rows = [s.tensors[ROWS["doc"]][pos] for (name, pos), s in
            zip(parts, splits.values(), strict=True)] if have_rows else None
    if extra is not None:
        if rows is None:
            raise ValueError("extra documents are cache rows: the splits need rows too")
        rows.append(extra.long())
    n_extra = 0 if extra is None else len(extra)
    return Items("doc", tuple(parts), None if rows is None else torch.cat(rows),
                 len(index) + n_extra, extra), index
