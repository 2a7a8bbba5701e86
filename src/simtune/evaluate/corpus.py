"""The corpus's vectors under the trained model, for `simtune search`: computed once per model
and corpus, kept in the shared store (`cache.computed`), so a later search embeds the query alone.

Where they come from, by the model folder:

- a head over the frozen encoder (head mode, or any query-side head: the corpus keeps the frozen
  vectors): the workspace's cache view through the head. Nothing is embedded and nothing stored
  (the view is already the store's rows; the head costs milliseconds).
- the trained top layers (a `models/head` of top_layers mode): the cached layer states of the
  corpus through the trained layers and the head, as evaluate computes them
  (`evaluate.vectors.top_layers`), stored under the fingerprint of the head folder's files and
  of the states' settings.
- anything else (full mode, a static student, an export folder, or a cache that does not match
  the current settings): the model from the text, stored under the fingerprint of the model
  folder's files (and of the frozen encoder a head folder is served with).

Rows are keyed by the content hash of each text, so a changed corpus fills its new texts only,
and a retrained model (other files: another fingerprint) fills a new entry.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from simtune import heads
from simtune.cache import computed, reference, store, vectors
from simtune.cache.views import open_cache, open_pair, view_name
from simtune.encoders import describe, fingerprint, sha256_of, window_level
from simtune.errors import UserError
from simtune.model import Model, training_meta
from simtune.params import Params
from simtune.prepare.prepared import text_id
from simtune.static import is_static

log = logging.getLogger(__name__)
FORMAT_VERSION = 1  # of the stored corpus vectors' description: a bump refills every entry


def corpus_vectors(p: Params, model: Model, head_dir: Path, prepared_dir: Path,
                   cache_dir: Path, kind: str, ids: list[str], texts: dict[str, str]
                   ) -> torch.Tensor:
    """(N, D) vectors of the corpus `ids` (workspace text ids; `texts`: id -> text) of data of
    `kind` (groups: query texts; pairs: documents) under the trained `model` loaded from
    `head_dir`: see the module docstring for where they come from. Logs what it cost."""
    role = "document" if kind == "pairs" else "query"
    name = p.encoders.document if kind == "pairs" else p.encoders.query
    frozen = _through_head(p, name, ids, head_dir, cache_dir, role, model.side)
    if frozen is not None:
        log.info("corpus: %s cached vectors through the head, nothing embedded", f"{len(ids):,}")
        return frozen
    states = _states(p, head_dir, prepared_dir, cache_dir, name, role, model.side)
    if states is None:
        description = _text_description(p, name, head_dir, role)

        def compute(pos: list[int]) -> torch.Tensor:
            return model.encode_corpus([texts[ids[j]] for j in pos], role=role, progress=True)
    else:
        description = {"kind": "search corpus", "format_version": FORMAT_VERSION,
                       "source": "layer states", "role": role,
                       "model": folder_files(head_dir), "states": states}

        def compute(pos: list[int]) -> torch.Tensor:
            return _through_layers(p, head_dir, prepared_dir, cache_dir, kind,
                                   [ids[j] for j in pos])
    got = computed.stored(store.root(p.cache.store), f"search corpus ({description['source']})",
                          description, [text_id(texts[i]) for i in ids], compute,
                          int(p.cache.store_max_gb * 1e9), p.cache.shard_rows)
    if got.computed:
        log.info("corpus: %s texts embedded (%s) in %.0f s, stored for the next search "
                 "(store hit %d/%d)", f"{got.computed:,}", description["source"], got.seconds,
                 got.hits, got.hits + got.computed)
    else:
        log.info("corpus vectors: store hit %d/%d, 0 embedded (this search embeds 1 text: "
                 "the query)", got.hits, got.hits)
    return got.vectors


def _through_head(p: Params, name: str, ids: list[str], head_dir: Path, cache_dir: Path,
                  role: str, side: str) -> torch.Tensor | None:
    """The frozen cached vectors of `ids` through the head (a query-side head: as they are), or
    None where they are not the model's (a fine-tuned encoder, a static table) or the cache view
    does not hold them under the current settings (said in the log)."""
    if is_static(head_dir) or ((head_dir / "encoder").is_dir() and side != "query"):
        return None
    try:
        table = open_cache(cache_dir, name, p.encoders.models[name], p.cache, role=role)
        rows = table.index(ids)
    except UserError as e:
        log.info("not using the cache: %s", e)
        return None
    found = table.vectors[rows.to(table.vectors.device)].float()
    if side == "query":
        return found.cpu()  # a query-side head: the corpus keeps the frozen cached vectors
    return heads.load(head_dir)(found).cpu()


def _states(p: Params, head_dir: Path, prepared_dir: Path, cache_dir: Path, name: str,
            role: str, side: str) -> dict[str, Any] | None:
    """The settings (`encoders.describe`: layer k, model files, chunks) of the cached states
    the trained top layers of `head_dir` run on, or None when the corpus is embedded from the
    text: not a top_layers head folder, or no layer view in `cache_dir` under the current
    settings (said in the log; evaluate would refuse it)."""
    if side == "query" or is_static(head_dir) or not (head_dir / "encoder").is_dir() or not (
            head_dir / "training.json").is_file() or training_meta(head_dir).mode != "top_layers":
        return None
    from simtune.cache.modes import resolve
    from simtune.cache.views import layer_for

    # the store's speed, as evaluate's vectors resolve it (the same mode, said there once)
    layer = layer_for(p.encoders, resolve(p.train, p.encoders, prepared_dir, p.cache.store,
                                          say=False))
    if layer is None:
        log.info("the corpus is embedded from the text: the params resolve another mode than "
                 "the head's top_layers")
        return None
    spec = p.encoders.models[name]
    view = cache_dir / view_name(name, spec, role, layer)
    states = describe(name, spec, layer, role)
    if _view_fingerprint(view) != fingerprint(window_level(states)):
        log.info("the corpus is embedded from the text: %s holds no layer states of the "
                 "current settings (run the cache stage)", view)
        return None
    return states


def _view_fingerprint(view: Path) -> str | None:
    """The store fingerprint a layer view's states are under (None: no readable view)."""
    try:
        ref = reference.read(view)
        if ref is not None:
            return ref.fingerprint
        manifest = vectors.read_manifest(view)  # a view from before views were references
    except UserError:
        return None
    return manifest.fingerprint if manifest is not None else None


def _through_layers(p: Params, head_dir: Path, prepared_dir: Path, cache_dir: Path, kind: str,
                    ids: list[str]) -> torch.Tensor:
    """(n, D) head(trained top layers(cached states)) of `ids`: evaluate's computation."""
    from simtune.evaluate.vectors import top_layers

    q_table, d_table = open_pair(cache_dir, p.encoders, p.cache, kind, placed=False)
    table, role = (d_table, "doc") if kind == "pairs" else (q_table, "query")
    vectors_of = top_layers(heads.load(head_dir).eval(), head_dir, p, prepared_dir,
                            (cache_dir, q_table, d_table))
    return vectors_of(table.index(ids), role).float().cpu()


def folder_files(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file in the model `folder` (subfolders included) but
    dotfiles and the Markdown model card: what decides the vectors it computes."""
    return {f.relative_to(folder).as_posix(): sha256_of(f) for f in sorted(folder.rglob("*"))
            if f.is_file() and f.suffix != ".md"
            and not any(part.startswith(".") for part in f.relative_to(folder).parts)}


def _text_description(p: Params, name: str, head_dir: Path, role: str) -> dict[str, Any]:
    """What decides the model's vectors of the corpus from the text: its folder's files, and
    for a trained head folder the frozen encoder's settings and files it is served with (its
    own `encoder/` aside, training.json names it: evaluate's check holds it to the params)."""
    out: dict[str, Any] = {"kind": "search corpus", "format_version": FORMAT_VERSION,
                           "source": "text", "role": role, "model": folder_files(head_dir)}
    if (head_dir / "training.json").is_file():
        out["encoder"] = describe(name, p.encoders.models[name], role=role)
    return out
