"""The `cache` stage: embed every text each frozen encoder must see, once, into `cache/<name>/`.

Incremental and safe: only ids missing under the current fingerprint are embedded; a changed
fingerprint drops the old shards first (the log says why); shards are written atomically and
journaled, so a killed fill resumes where it stopped. Under `torchrun` each rank embeds a slice.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from simtune import store
from simtune.encoders import FrozenEncoder, changes, describe, fingerprint, resolve_device
from simtune.errors import UserError
from simtune.params import CacheParams, EncoderParams, EncodersParams
from simtune.prepare import Prepared, text_id
from simtune.prepare import load as load_prepared
from simtune.progress import Progress

log = logging.getLogger("simtune.cache")


@dataclass
class Dist:
    """This process's place in a `torchrun` launch (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def dist_from_env() -> Dist:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): gloo on CPU, NCCL on
    GPUs. Ranks other than 0 log warnings only."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.distributed.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local_rank)
        torch.distributed.init_process_group(backend="nccl" if cuda else "gloo")
    rank = torch.distributed.get_rank()
    if rank:
        logging.getLogger("simtune").setLevel(logging.WARNING)
    return Dist(rank, world, local_rank)


@dataclass
class FillResult:
    encoder: str
    needed: int
    cached: int
    embedded: int  # by this rank
    model_loaded: bool


def texts_per_encoder(prepared: Prepared, encoders: EncodersParams) -> dict[str, pa.Array]:
    """Distinct text ids each encoder must embed: groups' texts and pairs' queries go to
    `encoders.query`, pairs' documents to `encoders.document` (one set if they are the same)."""
    ex = prepared.examples
    if prepared.kind == "groups":
        roles = {encoders.query: [ex.column("text_id")]}
    else:
        roles = {encoders.query: [ex.column("query_id")]}
        roles.setdefault(encoders.document, []).append(ex.column("doc_id"))
    return {name: pc.unique(pa.chunked_array([c for col in cols for c in col.chunks],
                                             pa.string()))
            for name, cols in roles.items()}


def fill(prepared_dir: Path, out: Path, encoders: EncodersParams, cp: CacheParams,
         dist: Dist | None = None) -> list[FillResult]:
    """Fill `out/<name>/` for every encoder the prepared data needs."""
    prepared = load_prepared(prepared_dir)
    if prepared.texts.num_rows == 0:
        raise UserError(f"{prepared_dir}: prepared data has no texts")
    dist = dist or dist_from_env()
    results = []
    for name, ids in texts_per_encoder(prepared, encoders).items():
        texts = _texts_of(prepared, ids)
        results.append(fill_encoder(name, encoders.models[name], texts, Path(out) / name, cp,
                                    dist))
    return results


def _texts_of(prepared: Prepared, ids: pa.Array) -> dict[str, str]:
    t = prepared.texts.filter(pc.is_in(prepared.texts.column("text_id"), value_set=ids))
    return dict(zip(t.column("text_id").to_pylist(), t.column("text").to_pylist(), strict=True))


def fill_encoder(name: str, spec: EncoderParams, texts: dict[str, str], directory: Path,
                 cp: CacheParams, dist: Dist,
                 encoder_factory: Callable[..., FrozenEncoder] = FrozenEncoder) -> FillResult:
    """Embed the ids of `texts` (id -> text) that `directory` lacks under the current
    fingerprint; rank `r` of `w` embeds every w-th of the length-sorted missing texts."""
    description = describe(name, spec)
    fp = fingerprint(description)
    if dist.rank == 0:
        manifest = store.begin_fill(directory, name, fp, description, spec.dtype)
        _drop_changed_texts(directory, manifest, texts)
    dist.barrier()
    manifest = store.read_manifest(directory)
    assert manifest is not None
    have = store.cached_hashes(directory, manifest)
    missing = sorted(t for t in texts if t not in have)
    cached = len(texts) - len(missing)
    log.info("cache %s: %d cached, %d to embed", name, cached, len(missing))
    result = FillResult(name, len(texts), cached, 0, model_loaded=False)
    if missing:
        encoder = encoder_factory(name, spec, _device(cp, dist))
        result.model_loaded = True
        result.embedded = _embed_missing(encoder, missing, texts, directory, manifest, cp, dist)
    dist.barrier()
    if dist.rank == 0:
        final = store.finish_fill(directory)
        log.info("cache %s: %d rows in %d shards", name, final.rows, len(final.shards))
    dist.barrier()
    return result


def _drop_changed_texts(directory: Path, manifest: store.Manifest, texts: dict[str, str]) -> None:
    """With custom keys, a key may now name another text: its cached row is stale, drop it.
    Rows whose id is their content hash (the default ids) cannot go stale and are not rehashed.
    """
    stale = {i for i, h in store.cached_hashes(directory, manifest).items()
             if i != h and i in texts and h != text_id(texts[i])}
    if stale:
        log.warning("cache %s: %d keys now name a changed text: dropping their vectors",
                    manifest.encoder, len(stale))
        store.drop_rows(directory, manifest, stale)


def _device(cp: CacheParams, dist: Dist) -> torch.device:
    device = resolve_device(cp.device)
    if device.type == "cuda" and dist.world > 1:
        return torch.device("cuda", dist.local_rank)
    return device


class _Batches(torch.utils.data.Dataset):
    """Item i = (positions, tokenised batch i); tokenisation runs in DataLoader workers."""

    def __init__(self, texts: list[str], batches: list[list[int]], encoder: FrozenEncoder) -> None:
        self.texts, self.batches, self.tokenize = texts, batches, encoder.tokenize

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[list[int], dict[str, torch.Tensor]]:
        idx = self.batches[i]
        return idx, self.tokenize([self.texts[j] for j in idx])


def _embed_missing(encoder: FrozenEncoder, missing: list[str], texts: dict[str, str],
                   directory: Path, manifest: store.Manifest, cp: CacheParams,
                   dist: Dist) -> int:
    # sort by token length so batches hold similar lengths (little padding); rank r takes every
    # w-th text, so all ranks get the same mix of lengths
    lengths: list[int] = []
    for i in range(0, len(missing), 8192):
        lengths += encoder.token_lengths([texts[t] for t in missing[i : i + 8192]])
    order = sorted(range(len(missing)), key=lambda i: (lengths[i], missing[i]))
    mine = [missing[i] for i in order[dist.rank :: dist.world]]
    batches = [list(range(i, min(i + cp.batch_size, len(mine))))
               for i in range(0, len(mine), cp.batch_size)]
    if cp.num_workers:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers are the parallelism
    loader = torch.utils.data.DataLoader(
        _Batches([texts[t] for t in mine], batches, encoder), batch_size=None,
        num_workers=cp.num_workers, pin_memory=encoder.device.type == "cuda")
    journal = store.Journal(directory, dist.rank, manifest.fingerprint)
    buf_ids: list[str] = []
    buf_vecs: list[np.ndarray] = []

    def flush(rows: int) -> None:
        """Write the first `rows` buffered rows as one shard, keep the rest buffered."""
        vecs = np.concatenate(buf_vecs)
        ids = buf_ids[:rows]
        hashes = [text_id(texts[t]) for t in ids]
        journal.add(store.write_shard(directory, dist.rank, ids, hashes, vecs[:rows], manifest))
        del buf_ids[:rows]
        buf_vecs[:] = [vecs[rows:]]

    with Progress(len(mine), f"embedding with {encoder.name}") as progress, torch.inference_mode():
        for idx, batch in loader:
            buf_vecs.append(encoder.embed(batch).cpu().numpy())
            buf_ids.extend(mine[j] for j in idx)
            progress.update(len(idx))
            while len(buf_ids) >= cp.shard_rows:
                flush(cp.shard_rows)
        if buf_ids:
            flush(len(buf_ids))
    return len(mine)


def open_cache(out: Path, name: str, spec: EncoderParams, cp: CacheParams) -> store.CacheTable:
    """Load `out/<name>/` for training or evaluation: fingerprint must match the current encoder
    settings, every shard's checksum must match, then the table is placed per `cache_type`
    (or its `mapping` entry). Hashing the model files here loads no weights."""
    fp = fingerprint(describe(name, spec))
    table = store.load(Path(out) / name, fingerprint=fp, checksums=True)
    return store.place(table, cp.mapping.get(name, cp.cache_type))


@dataclass
class VerifyResult:
    encoder: str
    rows: int
    problems: list[str]
    sampled: int
    max_abs_diff: float


def verify(prepared_dir: Path, out: Path, encoders: EncodersParams, sample: int, seed: int,
           device: torch.device) -> list[VerifyResult]:
    """Full check of each encoder's cache: checksums, rows, fingerprint against the current
    settings, and `sample` random cached texts re-embedded and compared."""
    prepared = load_prepared(prepared_dir)
    results = []
    for name, ids in texts_per_encoder(prepared, encoders).items():
        spec, directory = encoders.models[name], Path(out) / name
        problems = store.verify(directory)
        description = describe(name, spec)
        manifest = None if problems else store.read_manifest(directory)
        if manifest is not None and manifest.fingerprint != fingerprint(description):
            problems.append(f"{directory / store.MANIFEST}: filled with other encoder settings "
                            f"({changes(manifest.description, description)})")
        if problems:
            results.append(VerifyResult(name, 0, problems, 0, float("nan")))
            continue
        table = store.load(directory)
        texts = _texts_of(prepared, ids)
        pool = sorted(set(table.ids.to_pylist()) & texts.keys())
        picked = random.Random(seed).sample(pool, min(sample, len(pool)))
        diff = 0.0
        if picked:
            fresh = FrozenEncoder(name, spec, device).encode([texts[t] for t in picked], 64)
            stored = table.vectors[table.index(picked)].float()
            diff = float((fresh - stored).abs().max())
            scale = max(1.0, float(fresh.abs().max()))
            tol = (1e-4 if spec.dtype == "float32" else 2e-3) * scale
            if diff > tol:
                problems.append(f"{directory}: re-embedded vectors differ by {diff:.3g} "
                                f"(tolerance {tol:.3g})")
        results.append(VerifyResult(name, len(table), problems, len(picked), diff))
    return results
