"""Views: the workspace side of the cache (`cache/<encoder>[@layer<k>]/`), written from and
feeding the shared store; and what a fill says before it starts (what changed, how big).

A view holds exactly the rows one workspace's data needs, keyed by its text ids, sorted, in
`part-NNNNN.arrow` shards: the same inputs give the same bytes on any machine (stable DVC hashes).
"""

from __future__ import annotations

import logging
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune.atomic import atomic_dir
from simtune.cache import formats, policy, reference, states, store, vectors
from simtune.cache.formats import Format
from simtune.cache.states import StatesTable
from simtune.chunks import pool_windows
from simtune.encoders import (
    changes,
    describe,
    fingerprint,
    model_config,
    model_dir,
    prompt_of,
)
from simtune.errors import UserError
from simtune.params import CacheParams, EncoderParams, EncodersParams, TrainParams
from simtune.pretrained import load_tokenizer

log = logging.getLogger(__name__)
VECTORS = Format()


def view_name(name: str, spec: EncoderParams, role: str, layer: int | None = None) -> str:
    """The view directory (under the cache output) of encoder `name`'s `role` texts: `<name>`,
    or `<name>@document` for documents when its document prompt differs from its query prompt
    (the same text then has another vector); `@layer<k>` after either for layer states."""
    apart = role == "document" and prompt_of(spec, "document") != prompt_of(spec, "query")
    return f"{name}{'@document' if apart else ''}{Format(layer).suffix()}"


def say_what_changed(view: Path, root: Path, name: str, description: dict, fp: str) -> None:
    """Log why the vectors are about to change encoder settings, against the settings of this
    workspace's view (DVC keeps it: a `persist` output). No view here (a fresh workspace):
    nothing changed here, whatever another workspace's store entries say. Nothing is dropped:
    earlier settings' vectors stay in the store."""
    try:
        old = reference.read(view) or vectors.read_manifest(view)
    except UserError:
        old = None
    if old is not None and old.fingerprint != fp:
        log.warning("cache %s: encoder changed (%s); vectors under the previous settings stay "
                    "in the store", name, changes(old.description, description))


VIEW_FILES = re.compile(r"manifest\.json|part-\d{5}\.arrow|reference\.json|rows\.arrow")


def remove_stale(out: Path, produced: set[str], store_root: Path) -> list[str]:
    """Remove the views under `out` that the current settings did not produce (`produced`:
    their names), with their store refs: a view of earlier settings (another layer, another
    encoder, head mode after top_layers) would otherwise stay, be read as current by nothing
    but pin its store entry forever. Only a folder holding a view's files and nothing else is
    removed (what simtune wrote); anything else is left alone. Returns the names removed."""
    removed = []
    for d in sorted(Path(out).iterdir()) if Path(out).is_dir() else []:
        if d.name in produced or d.name.startswith(".") or d.is_symlink() or not d.is_dir():
            continue
        files = list(d.iterdir())
        if not (reference.is_reference(d) or (d / vectors.MANIFEST).is_file()) or not all(
                f.is_file() and not f.is_symlink() and VIEW_FILES.fullmatch(f.name)
                for f in files):
            continue
        reference.unregister(store_root, d)
        shutil.rmtree(d)
        removed.append(d.name)
        log.info("cache: removed %s: a view of earlier settings (the current ones do not "
                 "produce it; its vectors stay in the store)", d)
    return removed


def import_view(view: Path, directory: Path, manifest: vectors.Manifest,
                 by_hash: dict[str, str], fmt: Format) -> None:
    """Rows of an existing view with the same fingerprint that the store lacks (a teammate's
    `dvc pull`, a cache from before the store existed) go into the store: no re-embedding.
    Only intact shards are taken (checksum, schema, dtype and dim as the store entry's)."""
    try:
        old = vectors.read_manifest(view)
    except UserError:
        return
    if old is None or (old.fingerprint, old.dtype) != (manifest.fingerprint, manifest.dtype) or (
            manifest.dim not in (None, old.dim)):
        return
    have = vectors.cached_hashes(directory, manifest)
    for s in old.shards:
        try:
            if vectors.sha256_of(view / s.file) != s.sha256:
                continue
            hashes = vectors.open_shard(view, s, old).column("text_hash").to_pylist()
            take = [i for i, h in enumerate(hashes) if h not in have and h in by_hash]
            if not take:
                continue
            rows = formats.take(fmt.shard_rows(view, s, old), take)
        except (UserError, OSError):
            continue
        picked = [hashes[i] for i in take]
        manifest.shards.append(fmt.write(directory, 0, picked, picked, rows, manifest))
        vectors.write_manifest(directory, manifest)
        have.update(dict.fromkeys(picked, ""))
        log.info("cache %s: took %d vectors from %s into the store", manifest.encoder,
                 len(take), view / s.file)


def write_view(view: Path, directory: Path, manifest: vectors.Manifest,
               ids: dict[str, list[str]], shard_rows: int, fmt: Format = VECTORS,
               description: dict | None = None) -> None:
    """Write `view` (atomically replaced): the rows `ids` (workspace id -> content hashes of
    its windows, `simtune.chunks`; one for a text that fits) taken from the store entry
    `directory`, sorted by id, in `part-NNNNN.arrow` shards of `shard_rows`; a text of several
    windows gets their pooled vector (its `text_hash`: the windows' hashes joined by `+`).
    `description`: the view's settings (the store entry's plus the chunk settings). Same inputs
    give the same bytes on any machine (stable DVC hashes)."""
    table = fmt.load(directory)
    keys = sorted(ids)
    hashes = ["+".join(ids[k]) for k in keys]
    if any(len(ids[k]) > 1 for k in keys):
        if fmt.layer is not None:
            raise ValueError("layer states are cached one window per text")
        rows = _pooled_rows(table, [ids[k] for k in keys], description or manifest.description)
    else:
        rows = fmt.gather(table, table.index(hashes)) if keys else []
    description = description or manifest.description
    out = vectors.Manifest(manifest.encoder, fingerprint(description), description,
                           manifest.dtype, manifest.dim)
    with atomic_dir(view) as tmp:
        for n, i in enumerate(range(0, len(keys), shard_rows)):
            j = i + shard_rows
            out.shards.append(fmt.write(tmp, 0, keys[i:j], hashes[i:j], rows[i:j], out,
                                        name=f"part-{n:05d}.arrow"))
        vectors.write_manifest(tmp, out)


def _pooled_rows(table: vectors.CacheTable, windows: list[list[str]], description: dict
                 ) -> np.ndarray:
    """(n, D) in the stored dtype: each text's window vectors pooled by the description's
    `chunks.pool` (a text of one window: its stored vector as it is)."""
    flat = [h for ws in windows for h in ws]
    stored = table.vectors[table.index(flat)]
    counts = torch.tensor([len(ws) for ws in windows], dtype=torch.long)
    pooled = pool_windows(stored.float(), counts, description["chunks"]["pool"],
                          bool(description["normalize"]))
    return pooled.to(stored.dtype).numpy()


def layer_for(encoders: EncodersParams, train: TrainParams) -> int | None:
    """The layer whose token states top-layers training reads: k = L - K of the query
    encoder's L layers, K = `train.schedule.top_layers.layers` (None in the other modes;
    `train.mode: auto` is resolved first, `simtune.cache.modes.resolve`)."""
    if train.mode == "auto":
        raise ValueError("layer_for: train.mode auto not resolved (cache.modes.resolve)")
    if train.mode != "top_layers":
        return None
    name = encoders.query
    if encoders.document != name:
        raise UserError("train.mode top_layers: needs one shared encoder (encoders.query == "
                        "encoders.document)")
    total = int(model_config(name, encoders.models[name]).num_hidden_layers)
    top = train.schedule.top_layers.layers
    if top > total:
        raise UserError(f"train.schedule.top_layers.layers: {top}, but encoder '{name}' has "
                        f"{total} layers")
    return total - top


def check_layer_size(name: str, spec: EncoderParams, texts: dict[str, str], fmt: Format,
                     cp: CacheParams, role: str) -> None:
    """Estimate the layer cache of `role` texts (texts x mean tokens, prompt included, x hidden
    x bytes of `states_dtype`; tokens counted on a sample), log it, and refuse it, before
    embedding anything, above `cache.max_layer_gb` (when set) or above what the store's disk
    has free (plus what the store entry already holds)."""
    config = model_config(name, spec)
    tokenizer = load_tokenizer(model_dir(name, spec), f"encoders.models.{name}.model")
    sample = random.Random(0).sample(sorted(texts.values()), min(2000, len(texts)))
    sample = [prompt_of(spec, role) + t for t in sample]
    lengths = tokenizer(sample, truncation=True, max_length=spec.max_length)["input_ids"]
    mean = sum(map(len, lengths)) / max(len(lengths), 1)
    width = 2 if spec.states_dtype == "float16" else 4
    size = len(texts) * mean * int(config.hidden_size) * width
    label = view_name(name, spec, role, fmt.layer)
    log.info("cache %s: ~%.2f GB (%d texts x %.1f tokens x %d x %s)", label, size / 1e9,
             len(texts), mean, config.hidden_size, spec.states_dtype)
    advice = "use states_dtype float16, a lower max_length, or train.mode head"
    if cp.max_layer_gb is not None and size > cp.max_layer_gb * 1e9:
        raise UserError(f"cache.max_layer_gb: the layer cache of '{name}' would take "
                        f"~{size / 1e9:.1f} GB, over the limit of {cp.max_layer_gb:g} GB (raise "
                        f"it, {advice})")
    root = store.root(cp.store)
    entry = store.fingerprint_dir(root, fingerprint(describe(name, spec, fmt.layer, role,
                                                             chunks=False)))
    held = policy.entry_bytes(entry) if entry.is_dir() else 0
    free = _free_bytes(root)
    if size > free + held:
        raise UserError(f"cache {label}: the layer cache would take ~{size / 1e9:.1f} GB, the "
                        f"store {root} has {(free + held) / 1e9:.1f} GB free for it (free disk "
                        f"there, set cache.store or $SIMTUNE_STORE elsewhere, or {advice})")


def _free_bytes(path: Path) -> int:
    """Free bytes on the file system of `path` (or of its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def open_cache(out: Path, name: str, spec: EncoderParams, cp: CacheParams,
               placed: bool = True, role: str = "query") -> vectors.CacheTable:
    """Load the view of encoder `name`'s `role` texts (`view_name`) for training or evaluation:
    fingerprint must match the current encoder settings, every shard's checksum must match,
    then (with `placed`) the table is placed per `cache_type` (or its `mapping` entry).
    Hashing the model files here loads no weights."""
    fp = fingerprint(describe(name, spec, role=role))
    table = vectors.load(Path(out) / view_name(name, spec, role), fingerprint=fp,
                         checksums=True)
    return vectors.place(table, cp.mapping.get(name, cp.cache_type)) if placed else table


def open_pair(out: Path, encoders: EncodersParams, cp: CacheParams, kind: str,
              placed: bool = True) -> tuple[vectors.CacheTable, vectors.CacheTable]:
    """(query table, document table) of `encoders` for data of `kind` (groups | pairs): one
    table when both roles read one view. Groups' texts are all query texts (the query encoder
    and prompt: what the cache stage fills, `texts_per_encoder`), so groups get the query table
    twice; one head reads both, so they must give one dim."""
    q_spec, d_spec = encoders.models[encoders.query], encoders.models[encoders.document]
    q = open_cache(out, encoders.query, q_spec, cp, placed)
    same = kind == "groups" or (
        encoders.document == encoders.query
        and view_name(encoders.query, q_spec, "document") == view_name(encoders.query, q_spec,
                                                                       "query"))
    d = q if same else open_cache(out, encoders.document, d_spec, cp, placed, "document")
    if q.dim != d.dim:
        raise UserError(f"encoders: '{encoders.query}' gives {q.dim}-d and "
                        f"'{encoders.document}' {d.dim}-d vectors; one head needs one dim")
    return q, d


def open_roles(out: Path, name: str, spec: EncoderParams, cp: CacheParams, kind: str,
               placed: bool = True) -> tuple[vectors.CacheTable, vectors.CacheTable]:
    """(query table, document table) of the one encoder `name` (a teacher: `texts_per_encoder`
    fills its views of the same texts as the student's) for data of `kind`: its query view
    twice for groups, or when one prompt makes both roles one view."""
    q = open_cache(out, name, spec, cp, placed)
    if kind == "groups" or view_name(name, spec, "document") == view_name(name, spec, "query"):
        return q, q
    return q, open_cache(out, name, spec, cp, placed, "document")


def open_states_pair(out: Path, encoders: EncodersParams, cp: CacheParams, layer: int,
                     q_table: Any, d_table: Any) -> tuple[StatesTable, StatesTable]:
    """Top-layers mode: the layer cache of the (shared) encoder's query texts, row for row the
    query vector view `q_table`'s (both views hold the same ids, sorted), so the splits' cache
    rows index both; and of its document texts (`d_table`'s rows), the same table unless
    documents have their own view (another prompt). `UserError` when a layer view holds other
    texts than its vector view."""
    name = encoders.query
    out_tables = []
    for role, vectors_table in (("query", q_table), ("document", d_table)):
        if role == "document" and d_table is q_table:
            out_tables.append(out_tables[0])
            continue
        table = open_states(out, name, encoders.models[name], layer, cp, role)
        if not table.ids.equals(vectors_table.ids):
            raise UserError(f"{table.directory}: the layer cache holds other texts than "
                            f"{vectors_table.directory}; run the cache stage")
        out_tables.append(table)
    return out_tables[0], out_tables[1]


def open_states(out: Path, name: str, spec: EncoderParams, layer: int, cp: CacheParams,
                role: str = "query") -> StatesTable:
    """The layer cache of `name`'s `role` texts: the view `out/<view>@layer<k>/` (fingerprint
    checked) read from the store entry it references (`reference.open_view`: streamed, nothing
    loaded). A view from before views were references holds its shards itself (checksums
    checked)."""
    fp = fingerprint(describe(name, spec, layer, role, chunks=False))  # the store entry's
    view = Path(out) / view_name(name, spec, role, layer)
    if not reference.is_reference(view) and (view / vectors.MANIFEST).is_file():
        return states.load(view, fingerprint=fp, checksums=True)
    ref = reference.read(view)
    chunks = describe(name, spec, layer, role).get("chunks")
    if ref is not None and ref.chunks != chunks:  # windows cut by other settings
        raise UserError(f"{view / reference.REF_FILE}: windows cut with chunks {ref.chunks}, the "
                        f"params say {chunks}; run the cache stage")
    return reference.open_view(view, store.root(cp.store), fp)
