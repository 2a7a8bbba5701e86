"""The `negatives` stage: hard negatives mined from the cached vectors, and their use in training.

The frozen encoder's vectors of every training query and document are already in the cache, so
mining is one exact streamed top-k (`retrieval.topk`, memory O(tile), never queries x documents):
for each distinct training query, its top-ranked training documents (cosine) that are not listed
with it, skipping likely false negatives: documents scoring above a threshold set by the query's
lowest positive score p (score > 0 pairs), `p - margin` (absolute) or `p - |p| * margin`
(relative; NV-Retriever's TopK-PercPos, sentence-transformers' `relative_margin`). A query with
no positive gets none. If the first k ranked hold fewer than `count` kept documents, the query is
ranked again at 4k (up to the whole corpus), so the result is exactly the brute-force one.

Output `negatives/`: `negatives.parquet` (`query_id`, `doc_ids`: list, `scores`: list, best
first) and `meta.json` (settings and the fingerprints of the vectors mined). DVC reruns the stage
only when the prepared data, the cache or the `negatives` params change.

Training (`train.hard_negatives: n`, mnrl, head mode): each training row gets its query's first n
negatives as `neg_ids` (distinct-text ids, -1 where a query has fewer) and `neg_rows` (rows of the
document cache) in its split's tensors; their vectors are cache rows through the head.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from simtune.atomic import atomic_dir, write_json
from simtune.cache.views import open_pair
from simtune.negatives.mined import FORMAT_VERSION
from simtune.params import Params
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval.topk import topk

log = logging.getLogger(__name__)


@dataclass
class Mined:
    """`index` (Q, count) corpus indices, best first, -1 where fewer were found; `score`
    (Q, count) their cosines (NaN there); `skipped` (Q,) documents passed over as likely false
    negatives (scoring above the threshold, not listed); `threshold` (Q,)."""

    index: torch.Tensor
    score: torch.Tensor
    skipped: torch.Tensor
    threshold: torch.Tensor


def thresholds(queries: torch.Tensor, corpus: torch.Tensor, listed: torch.Tensor,
               positive: torch.Tensor, margin: float, relative: bool) -> torch.Tensor:
    """(Q,) the highest score a negative may have: from each query's lowest positive cosine p,
    p - margin or p - |p| * margin; -inf for a query without a positive."""
    pos = listed[positive]
    cos = (F.normalize(queries[pos[:, 0]].float(), dim=-1)
           * F.normalize(corpus[pos[:, 1]].float(), dim=-1)).sum(1)
    low = torch.full((len(queries),), torch.inf).scatter_reduce(0, pos[:, 0], cos, "amin")
    thr = low - (low.abs() * margin if relative else margin)
    return torch.where(torch.isinf(low), -torch.inf, thr)


def mine(queries: torch.Tensor, corpus: torch.Tensor, listed: torch.Tensor,
         positive: torch.Tensor, count: int, margin: float, relative: bool,
         chunk: int = 1024) -> Mined:
    """Hard negatives of (Q, D) `queries` among (N, D) `corpus` (cosine).

    `listed` (P, 2): (query, corpus index) of every known pair, never a negative; `positive`
    (P,) bool: which of them set the threshold (`thresholds`). Exact: each query's first `count`
    documents by descending cosine (ties: lower index) among the unlisted ones scoring <= its
    threshold."""
    n_q, n = len(queries), len(corpus)
    index = torch.full((n_q, count), -1, dtype=torch.long)
    score = torch.full((n_q, count), torch.nan)
    skipped = torch.zeros(n_q, dtype=torch.long)
    thr = thresholds(queries, corpus, listed, positive, margin, relative)
    keys = torch.unique(listed[:, 0] * n + listed[:, 1])
    most_listed = int(torch.bincount(listed[:, 0], minlength=1).max()) if len(listed) else 0
    todo = torch.arange(n_q)[thr > -torch.inf]  # a query without a positive gets none
    k = min(n, 2 * count + most_listed)
    while count and len(todo):
        s, i = topk(queries[todo], corpus, k, chunk)
        key = todo[:, None] * n + i
        at = torch.searchsorted(keys, key).clamp_max(len(keys) - 1)
        own = (keys[at] == key) | (i < 0)  # listed with the query (or no document)
        above = s > thr[todo, None]
        keep = ~own & ~above
        done = (keep.sum(1) >= count) | (k >= n)
        rank = keep.cumsum(1)
        rows, cols = torch.nonzero(keep & (rank <= count) & done[:, None], as_tuple=True)
        index[todo[rows], rank[rows, cols] - 1] = i[rows, cols]
        score[todo[rows], rank[rows, cols] - 1] = s[rows, cols]
        skipped[todo[done]] = (~own & above)[done].sum(1)
        todo, k = todo[~done], min(n, 4 * k)
    return Mined(index, score, skipped, thr)


def run(p: Params, prepared_dir: Path, cache_dir: Path, out: Path, report: Path
        ) -> dict[str, Any]:
    """The stage: mine `negatives.count` negatives per training query (pairs data; groups data
    or count 0: an empty table), write `out/` atomically and the counts to `report`."""
    start = time.perf_counter()
    prepared, n = load_prepared(prepared_dir), p.negatives
    meta: dict[str, Any] = {"format_version": FORMAT_VERSION, "kind": prepared.kind,
                            **n.model_dump()}
    q_ids: list[str] = []
    docs: list[list[str]] = []
    scores: list[list[float]] = []
    result: dict[str, Any] = {"queries": 0, "corpus": 0, "negatives": 0, "short_queries": 0,
                              "skipped_false_negatives": 0}
    if prepared.kind == "pairs" and n.count:
        enc = p.encoders
        q_table, d_table = open_pair(cache_dir, enc, p.cache, prepared.kind, placed=False)
        ex = prepared.examples.filter(pc.equal(prepared.examples["split"], "train"))
        qs, ds = ex.column("query_id").to_pylist(), ex.column("doc_id").to_pylist()
        q_ids, d_ids = list(dict.fromkeys(qs)), list(dict.fromkeys(ds))
        q_at, d_at = {q: i for i, q in enumerate(q_ids)}, {d: i for i, d in enumerate(d_ids)}
        listed = torch.tensor([[q_at[q], d_at[d]] for q, d in zip(qs, ds, strict=True)],
                              dtype=torch.long).view(-1, 2)
        positive = torch.tensor(ex.column("score").to_pylist()) > 0
        t0 = time.perf_counter()
        mined = mine(q_table.vectors[q_table.index(q_ids)].float(),
                     d_table.vectors[d_table.index(d_ids)].float(), listed, positive, n.count,
                     n.margin, n.margin_type == "relative")
        result["mine_seconds"] = time.perf_counter() - t0
        found = mined.index >= 0
        docs = [[d_ids[j] for j in row if j >= 0] for row in mined.index.tolist()]
        scores = [s[: len(d)] for s, d in zip(mined.score.tolist(), docs, strict=True)]
        meta["fingerprints"] = {"query": q_table.manifest.fingerprint,
                                "document": d_table.manifest.fingerprint}
        result.update(queries=len(q_ids), corpus=len(d_ids), negatives=int(found.sum()),
                      short_queries=int((found.sum(1) < n.count).sum()),
                      skipped_false_negatives=int(mined.skipped.sum()))
    table = pa.table({"query_id": pa.array(q_ids, pa.string()),
                      "doc_ids": pa.array(docs, pa.list_(pa.string())),
                      "scores": pa.array(scores, pa.list_(pa.float32()))})
    with atomic_dir(out) as tmp:
        pq.write_table(table, tmp / "negatives.parquet")
        write_json(tmp / "meta.json", meta)
    result["seconds"] = time.perf_counter() - start
    write_json(report, result)
    if prepared.kind != "pairs" or not n.count:  # say why the table is empty
        log.info("%s: nothing mined (%s)", out, "negatives.count is 0" if not n.count else
                 f"the data is {prepared.kind}: hard negatives are mined for pairs")
        return result
    log.info("%s: %d negatives for %d training queries among %d documents (%d with fewer than "
             "%d, %d likely false negatives skipped), %.2f s", out, result["negatives"],
             result["queries"], result["corpus"], result["short_queries"], n.count,
             result["skipped_false_negatives"], result["seconds"])
    return result


# --- training ------------------------------------------------------------------------------------


