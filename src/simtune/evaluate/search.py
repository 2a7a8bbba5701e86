"""`simtune search`: the nearest texts of the prepared corpus to a query, with the trained model.

The corpus vectors come from the cache through the trained head when the cache matches the
current encoder settings (instant); otherwise the model embeds the corpus itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from simtune import heads
from simtune.cache.views import open_cache
from simtune.errors import UserError
from simtune.model import load_model
from simtune.params import Params
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval.topk import topk

log = logging.getLogger("simtune.search")


@torch.inference_mode()
def search(p: Params, query: str, k: int, head_dir: Path, prepared_dir: Path,
           cache_dir: Path) -> list[tuple[float, str]]:
    """Top-k (cosine score, text) of the corpus (groups: all texts; pairs: all documents)."""
    if k < 1:
        raise UserError("--k must be at least 1")
    if not query.strip():  # as prepare drops empty texts: no vector means anything for it
        raise UserError("the query is empty (or only whitespace): give a text to search for")
    model = load_model(head_dir, p.cache.device,
                       encoder=p.encoders.models[p.encoders.query].model)
    prepared = load_prepared(prepared_dir)
    texts = prepared.text_map()
    ids = list(texts)
    if prepared.kind == "pairs":
        ids = sorted(set(prepared.examples.column("doc_id").to_pylist()))
    role = "document" if prepared.kind == "pairs" else "query"
    name = p.encoders.document if prepared.kind == "pairs" else p.encoders.query
    corpus = _corpus_vectors(p, name, ids, head_dir, cache_dir, role)
    if corpus is None:
        log.info("embedding the corpus with the model (%d texts)", len(ids))
        corpus = model.encode([texts[i] for i in ids], role=role, progress=True)
    if k > len(ids):
        log.warning("--k %d is more than the corpus (%d texts): showing all", k, len(ids))
        k = len(ids)
    scores, idx = topk(model.encode([query], role="query"), corpus, k)
    return [(float(s), texts[ids[i]]) for s, i in zip(scores[0], idx[0].tolist(), strict=True)]


def _corpus_vectors(p: Params, name: str, ids: list[str], head_dir: Path,
                    cache_dir: Path, role: str) -> torch.Tensor | None:
    if (head_dir / "encoder").is_dir():
        return None  # a fine-tuned encoder: the frozen cache does not apply
    try:
        table = open_cache(cache_dir, name, p.encoders.models[name], p.cache, role=role)
    except UserError as e:
        log.info("not using the cache: %s", e)
        return None
    head = heads.load(head_dir)
    return head(table.vectors[table.index(ids).to(table.vectors.device)].float()).cpu()
