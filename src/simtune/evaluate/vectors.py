"""The trained model's test vectors for evaluate: (cache rows, role) -> (n, D), by mode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from simtune import heads
from simtune.errors import UserError
from simtune.examples import Data
from simtune.params import Params

Vectors = Callable[[torch.Tensor, str], torch.Tensor]  # (cache rows, role) -> (n, D)


def cached(data: Data, head: torch.nn.Module) -> Vectors:
    """(cache rows, role) -> head(cached vectors) of those rows, 8,192 at a time."""
    def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
        table = data.d_vectors if role == "doc" else data.q_vectors
        assert table is not None
        return torch.cat([head(table[rows[i : i + 8192].to(table.device)].float())
                          for i in range(0, len(rows), 8192)]) if len(rows) else torch.empty(
                              0, data.dim)
    return vectors


def top_layers(head: heads.Head, head_dir: Path, p: Params, prepared_dir: Path,
                cache: tuple[Path, Any, Any]) -> Vectors:
    """Top-layers mode: the trained top layers (cut from the fine-tuned encoder saved with the
    head) over the cached states of the texts they rank, then the head: what validation
    computed, 2 of MiniLM's 6 layers instead of all of them. The export runs the whole encoder
    from the text: equal within the float16 states' rounding (`layers.STATES_TOLERANCE`)."""
    from simtune import layers
    from simtune.cache.modes import resolve
    from simtune.cache.views import layer_for, open_states_pair
    from simtune.encoders import resolve_device

    layer = layer_for(p.encoders, resolve(p.train, p.encoders, prepared_dir, p.cache.store))
    if layer is None:
        raise UserError(f"{head_dir}: trained in top_layers mode, but the params resolve to "
                        "another mode now; rerun train")
    cache_dir, q_table, d_table = cache
    states, doc_states = open_states_pair(cache_dir, p.encoders, p.cache, layer, q_table,
                                          d_table)
    spec = p.encoders.models[p.encoders.query]
    device = resolve_device(p.cache.device)
    top = layers.top_model(head_dir / "encoder", layer, native=True).eval().to(device)
    skips = layers.prompt_skips(head_dir / "encoder", spec)
    head = head.to(device)

    def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
        table, skip = (doc_states, skips["document"]) if role == "doc" else (
            states, skips["query"])
        if not len(rows):
            return torch.empty(0, head.config["dim"])
        return head(layers.embed_rows(top, table, rows, spec, skip, device)).cpu()

    return vectors


def trained(data: Data, head: heads.Head, head_dir: Path, p: Params,
             prepared_dir: Path, cache: tuple[Path, Any, Any]) -> Vectors:
    """(rows, role) -> the trained model's vectors: the head over the cached vectors (head
    mode), the trained top layers over the cached states (`top_layers`), or the fine-tuned
    encoder from the text (full mode), or a static student's table from the text
    (`train.mode: static`). `cache`: (cache dir, query view, document view)."""
    from simtune.static import is_static

    student = is_static(head_dir)
    if not (head_dir / "encoder").is_dir() and not student:
        return cached(data, head)
    from simtune.model import training_meta

    if not student and training_meta(head_dir).mode == "top_layers":
        return top_layers(head, head_dir, p, prepared_dir, cache)
    # top_layers and full modes: the fine-tuned encoder (saved with the head) embeds the test
    # texts (a query tower: the queries; `run` ranks them against the frozen cached corpus)
    from simtune.model import load_model
    from simtune.prepare.prepared import load as load_prepared

    enc = p.encoders
    model = load_model(head_dir, p.cache.device, encoder=enc.models[enc.query].model)
    prepared = load_prepared(prepared_dir)
    texts = prepared.text_map()

    def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
        ids = data.row_ids["doc" if role == "doc" else "query"]
        # each side with its own prompt: documents get the encoder's document prompt
        return model.encode([texts[ids[r]] for r in rows.tolist()],
                            role="document" if role == "doc" else "query", progress=True)

    return vectors
