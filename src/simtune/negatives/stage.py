"""The `negatives` stage: hard negatives mined from the cached vectors, and their use in training.

The frozen encoder's vectors of every training query and document are already in the cache, so
mining is one exact streamed top-k (`retrieval.topk`, memory O(tile), never queries x documents):
for each distinct training query, its top-ranked training documents (cosine) that are not listed
with it, skipping likely false negatives: documents scoring above a threshold set by the query's
lowest positive score p (score > 0 pairs), `p - margin` (absolute) or `p - |p| * margin`
(relative; NV-Retriever's TopK-PercPos, sentence-transformers' `relative_margin`). A query with
no positive gets none. If the first k ranked hold fewer than `count` kept documents, the query is
ranked again at 4k (up to the whole corpus), so the result is exactly the brute-force one
(`negatives.mining`, imported for pairs data only: on groups data the stage starts without torch).

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
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from simtune.atomic import atomic_dir, write_json
from simtune.negatives.mined import FORMAT_VERSION
from simtune.params import Params
from simtune.prepare.prepared import load as load_prepared

log = logging.getLogger(__name__)


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
    if prepared.kind == "pairs" and n.count:  # torch and the cache only here: groups start fast
        import torch

        from simtune.cache.views import open_pair
        from simtune.negatives.mining import mine

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
