"""`simtune search`: the nearest texts of the prepared corpus to a query, with the trained model.

The corpus vectors come from the cache through the trained head when the cache matches the
current encoder settings (instant); otherwise the model embeds the corpus itself. The hybrid
(`evaluate.hybrid`, or `hybrid`) ranks by reciprocal-rank fusion of the model's and BM25's full
rankings of the corpus (`simtune.retrieval.lexical`); its scores are the fused RRF scores.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import torch

from simtune import heads
from simtune.cache.views import open_cache
from simtune.errors import UserError
from simtune.evaluate import trained_on
from simtune.model import load_model
from simtune.params import Params
from simtune.prepare.prepared import fold
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval import lexical
from simtune.retrieval.lexical import BM25
from simtune.retrieval.metrics import cosine
from simtune.retrieval.topk import topk
from simtune.static import is_static

log = logging.getLogger(__name__)


class Hit(NamedTuple):
    """One neighbour: its score, its text and, for groups data, its label (pairs: None)."""

    score: float
    text: str
    label: str | None


MAX_LABEL_PAD = 30  # labels up to this long are padded to line the texts up; longer ones not


def show(hits: list[Hit]) -> list[str]:
    """The lines `simtune search` prints: the score (4 decimals, right-aligned: a negative
    cosine does not shift its line), then for groups data the label in brackets, padded so
    that the texts line up (a label over `MAX_LABEL_PAD` characters is not padded to and
    pushes only its own text), then the text."""
    lengths = [len(h.label) for h in hits if h.label is not None]
    width = min(max(lengths, default=0), MAX_LABEL_PAD) + 2
    score = max((len(f"{h.score:.4f}") for h in hits), default=0)
    return [f"{h.score:>{score}.4f}  "
            + (f"{f'[{h.label}]':<{width}}  " if h.label is not None else "")
            + h.text for h in hits]


@torch.inference_mode()
def search(p: Params, query: str, k: int, head_dir: Path, prepared_dir: Path,
           cache_dir: Path, hybrid: bool | None = None) -> list[Hit]:
    """The top-k hits of the corpus (groups: all texts, with their labels; pairs: all
    documents): cosine scores, or with `hybrid` (None: `evaluate.hybrid.enabled`) RRF scores
    of the model and BM25 (constant `evaluate.hybrid.rrf_k`)."""
    if k < 1:
        raise UserError("--k must be at least 1")
    if not fold(query):  # as prepare drops empty texts (zero-width characters alone too): the
        # encoder would see `[CLS][SEP]` alone, and no neighbour means anything for it
        raise UserError("the query is empty (or only whitespace): give a text to search for")
    trained_on.check(head_dir, p.encoders)  # the query cut as the corpus vectors were
    model = load_model(head_dir, p.cache.device,
                       encoder=p.encoders.models[p.encoders.query].model)
    prepared = load_prepared(prepared_dir)
    texts = prepared.text_map()
    ids = list(texts)
    if prepared.kind == "pairs":
        ids = sorted(set(prepared.examples.column("doc_id").to_pylist()))
    role = "document" if prepared.kind == "pairs" else "query"
    name = p.encoders.document if prepared.kind == "pairs" else p.encoders.query
    corpus = _corpus_vectors(p, name, ids, head_dir, cache_dir, role, model.side)
    if corpus is None:
        log.info("embedding the corpus with the model (%d texts)", len(ids))
        corpus = model.encode_corpus([texts[i] for i in ids], role=role, progress=True)
    if k > len(ids):
        log.warning("--k %d is more than the corpus (%d texts): showing all", k, len(ids))
        k = len(ids)
    q = model.encode([query], role="query")
    if p.evaluate.hybrid.enabled if hybrid is None else hybrid:
        bm25 = BM25([texts[i] for i in ids]).ranker([query])
        fused = lexical.hybrid([cosine(q, corpus), bm25], len(ids), p.evaluate.hybrid.rrf_k)
        scores, idx = fused(slice(0, 1), k, None)
    else:
        scores, idx = topk(q, corpus, k)
    labels: dict[str, str] = {}
    if prepared.kind == "groups":  # prepare keeps one label per text
        ex = prepared.examples
        labels = dict(zip(ex.column("text_id").to_pylist(), ex.column("label").to_pylist(),
                          strict=True))
    return [Hit(float(s), texts[ids[i]], labels.get(ids[i]))
            for s, i in zip(scores[0], idx[0].tolist(), strict=True) if i >= 0]


def _corpus_vectors(p: Params, name: str, ids: list[str], head_dir: Path,
                    cache_dir: Path, role: str, side: str = "both") -> torch.Tensor | None:
    if is_static(head_dir) or ((head_dir / "encoder").is_dir() and side != "query"):
        return None  # a fine-tuned encoder or a static table: the frozen cache does not
        # apply (but a query tower's corpus is the frozen encoder's: the cache's); a table
        # embeds the corpus at many times MiniLM's speed
    try:
        table = open_cache(cache_dir, name, p.encoders.models[name], p.cache, role=role)
    except UserError as e:
        log.info("not using the cache: %s", e)
        return None
    vectors = table.vectors[table.index(ids).to(table.vectors.device)].float()
    if side == "query":
        return vectors.cpu()  # a query-side head: the corpus keeps the frozen cached vectors
    return heads.load(head_dir)(vectors).cpu()
