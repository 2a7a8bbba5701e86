"""Filling one store entry (`fill_encoder`) or two from one encoder pass (`fill_with_states`):
locks, the journaled fill of what the store lacks, the view written when complete. The cache
stage (`simtune.cache.stage.fill`) decides what to fill; this module fills it."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from simtune.cache import backends, batching, policy, reference, sinks, store, vectors, views
from simtune.cache.formats import Format
from simtune.encoders import FrozenEncoder, describe, fingerprint, resolve_device
from simtune.params import CacheParams, EncoderParams
from simtune.prepare.prepared import text_id
from simtune.progress import Progress

log = logging.getLogger(__name__)
VECTORS = Format()


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
    needed: int  # texts
    cached: int  # texts whose every window was in the store
    embedded: int  # windows embedded by this rank
    model_loaded: bool
    view: str = ""
    cut: dict | None = None  # `chunks.Cut.report()` of the vectors' view


def fill_encoder(name: str, spec: EncoderParams, texts: dict[str, str], view: Path,
                 cp: CacheParams, dist: Dist,
                 encoder_factory: Callable[..., Any] = FrozenEncoder,
                 fmt: Format = VECTORS, role: str = "query", keep: set[str] | None = None,
                 description: dict | None = None, windows: dict[str, list[str]] | None = None
                 ) -> FillResult:
    """Make `view` hold the vectors of `texts` (workspace id -> text), embedded as `role`
    texts (`query` | `document`: the prompt before each), under the current fingerprint.
    `windows` (workspace id -> its windows, `cache.cutting.split`): what is embedded and
    stored, each window as a text; the view holds each text's windows pooled (`chunks`).
    Texts the store lacks are embedded into it first (rank `r` of `w` embeds every w-th of the
    length-sorted missing texts) by `cp.backend` (`simtune.cache.backends`); nothing stored is
    touched before the encoder has loaded, and the view is replaced only when complete. The
    store shards copied into the view are re-hashed first. The size policy then keeps this
    fingerprint and those in `keep` (every entry the current params use)."""
    description = description or describe(name, spec, fmt.layer, role, chunks=False)
    fp = fingerprint(description)
    seen = describe(name, spec, fmt.layer, role)  # the view's: the chunk settings too
    root = store.root(cp.store)
    directory = store.fingerprint_dir(root, fp)
    windows = windows or {i: [t] for i, t in texts.items()}
    by_hash = {text_id(w): w for ws in windows.values() for w in ws}
    label = views.view_name(name, spec, role, fmt.layer)
    with _rank0_locks(dist, root, view, directory, label):
        if dist.rank == 0:
            views.say_what_changed(view, root, label, seen, fingerprint(seen))
            manifest = store.begin_fill(directory, label, fp, description, description["dtype"],
                                        needed=set(by_hash))
            views.import_view(view, directory, manifest, by_hash, fmt)
        dist.barrier()
        manifest = vectors.read_manifest(directory)
        assert manifest is not None
        have = vectors.cached_hashes(directory, manifest)
        missing = sorted(h for h in by_hash if h not in have)
        result = FillResult(name, len(texts), len(texts) - _count_missing(windows, missing), 0,
                            model_loaded=False, view=label)
        log.info("cache %s: %d cached, %d to embed", label, result.cached, len(missing))
        if missing:
            encoder = backends.select(encoder_factory(name, spec, _device(cp, dist), role),
                                      cp.backend, directory, fmt.layer)
            result.model_loaded = True
            sink = sinks.Sink(fmt, directory, manifest, dist.rank, set(missing), cp.shard_rows)
            result.embedded = _embed_missing(encoder, missing, by_hash, [sink], cp, dist)
        dist.barrier()
        if dist.rank == 0:
            final = store.finish_fill(directory)
            ids = {i: [text_id(w) for w in ws] for i, ws in windows.items()}
            if fmt.layer is None:
                views.write_view(view, directory, final, ids, cp.shard_rows, fmt, seen)
            else:  # layer states stay in the store: the view references them
                reference.write(view, directory, final, ids, root)
            log.info("cache %s: %d rows in %s (store entry %s: %d rows)", label, len(texts),
                     view, fp, final.rows)
            policy.evict(root, int(cp.store_max_gb * 1e9), keep={fp} | (keep or set()))
        dist.barrier()
    return result


def _count_missing(windows: dict[str, list[str]], missing: list[str]) -> int:
    """Workspace ids with a window among the `missing` content hashes."""
    if not missing:
        return 0
    gone = set(missing)
    return sum(any(text_id(w) in gone for w in ws) for ws in windows.values())


@contextlib.contextmanager
def _rank0_locks(dist: Dist, root: Path, view: Path, directory: Path, name: str
                 ) -> Iterator[None]:
    """Rank 0 holds the view's lock, then the store entry's (always in that order): one fill
    per store entry and per view at a time, on this machine."""
    if dist.rank != 0:
        yield
        return
    key = hashlib.blake2b(str(view.resolve()).encode(), digest_size=8).hexdigest()
    with store.locked(root / "views" / key, f"cache {name}"), \
            store.locked(directory, f"cache {name}"):
        yield


def _device(cp: CacheParams, dist: Dist) -> torch.device:
    device = resolve_device(cp.device)
    if device.type == "cuda" and dist.world > 1:
        return torch.device("cuda", dist.local_rank)
    return device


Encoder = FrozenEncoder | backends.OnnxEncoder


def fill_with_states(name: str, spec: EncoderParams, texts: dict[str, str], vector_view: Path,
                     layer_view: Path, cp: CacheParams, dist: Dist, layer: int,
                     encoder_factory: Callable[..., FrozenEncoder] = FrozenEncoder,
                     role: str = "query", keep: set[str] | None = None,
                     descriptions: tuple[dict, dict] | None = None,
                     windows: dict[str, list[str]] | None = None) -> list[FillResult]:
    """`fill_encoder` for top_layers mode: the pooled vectors (`vector_view`) and the token
    states after layer `layer` (`layer_view`) of `texts`, both store entries filled from ONE
    encoder forward pass over each batch of the texts either lacks (each entry keeps only the
    rows it lacks). Locks: each view's, then its entry's, vectors first (the order every fill
    takes them). `windows`: as `fill_encoder`'s (the vectors' view pools them; the layer view
    lists each text's windows). Returns the two entries' results (vectors, states)."""
    fmts = (VECTORS, Format(layer))
    descriptions = descriptions or (describe(name, spec, None, role, chunks=False),
                                    describe(name, spec, layer, role, chunks=False))
    seen = describe(name, spec, None, role)  # the vectors' view: the chunk settings too
    windows = windows or {i: [t] for i, t in texts.items()}
    fps = [fingerprint(d) for d in descriptions]
    root = store.root(cp.store)
    dirs = [store.fingerprint_dir(root, fp) for fp in fps]
    pairs = list(zip((vector_view, layer_view), dirs, strict=True))
    by_hash = {text_id(w): w for ws in windows.values() for w in ws}
    labels = [views.view_name(name, spec, role, f.layer) for f in fmts]
    with contextlib.ExitStack() as stack:
        for (view, directory), label in zip(pairs, labels, strict=True):
            stack.enter_context(_rank0_locks(dist, root, view, directory, label))
        if dist.rank == 0:
            for (view, directory), label, fmt, d, fp in zip(pairs, labels, fmts, descriptions,
                                                            fps, strict=True):
                shown = seen if fmt.layer is None else d
                views.say_what_changed(view, root, label, shown, fingerprint(shown))
                # vectors copied into the view are re-hashed; states are never copied (read
                # where they are): new shards are hashed, bit rot is `cache verify`'s to find
                manifest = store.begin_fill(directory, label, fp, d, d["dtype"], needed=set(
                    by_hash) if fmt.layer is None else set())
                views.import_view(view, directory, manifest, by_hash, fmt)
        dist.barrier()
        manifests = [vectors.read_manifest(d) for d in dirs]
        assert None not in manifests
        # each entry's cached hashes read once (a set), not once per text: the shards are
        # opened per call, so a test inside the comprehension was O(texts x shards) reads
        have = [set(vectors.cached_hashes(d, m)) for d, m in zip(dirs, manifests, strict=True)]
        missing = [sorted(h for h in by_hash if h not in cached) for cached in have]
        results = [FillResult(name, len(texts), len(texts) - _count_missing(windows, m), 0,
                              model_loaded=False, view=label)
                   for m, label in zip(missing, labels, strict=True)]
        for label, result, m in zip(labels, results, missing, strict=True):
            log.info("cache %s: %d cached, %d to embed", label, result.cached, len(m))
        todo = sorted(set(missing[0]) | set(missing[1]))
        if todo:
            encoder: Encoder = encoder_factory(name, spec, _device(cp, dist), role)
            if not missing[1]:  # vectors alone: any backend (layer states run on torch)
                encoder = backends.select(encoder, cp.backend, dirs[0], None)
            parts = {i: sinks.Sink(fmts[i], dirs[i], manifests[i], dist.rank, set(missing[i]),
                                   cp.shard_rows) for i in (0, 1) if missing[i]}
            _embed_missing(encoder, todo, by_hash, list(parts.values()), cp, dist)
            for i, sink in parts.items():
                results[i].model_loaded, results[i].embedded = True, sink.count
        dist.barrier()
        if dist.rank == 0:
            ids = {i: [text_id(w) for w in ws] for i, ws in windows.items()}
            for (view, directory), fmt, label, fp in zip(pairs, fmts, labels, fps, strict=True):
                final = store.finish_fill(directory)
                if fmt.layer is None:
                    views.write_view(view, directory, final, ids, cp.shard_rows, fmt, seen)
                else:  # the states stay in the store: the view references them
                    reference.write(view, directory, final, ids, root, describe(
                        name, spec, layer, role).get("chunks"))
                log.info("cache %s: %d rows in %s (store entry %s: %d rows)", label, len(texts),
                         view, fp, final.rows)
            policy.evict(root, int(cp.store_max_gb * 1e9), keep=set(fps) | (keep or set()))
        dist.barrier()
    return results


def _embed_missing(encoder: Encoder, missing: list[str], texts: dict[str, str],
                   parts: list[sinks.Sink], cp: CacheParams, dist: Dist) -> int:
    """Embed rank `dist.rank`'s share of the `missing` content hashes (`texts`: hash -> text),
    length-sorted, in `cp.batch_size` batches: one forward pass per batch feeds every sink
    (`sinks.launch`), each keeping the rows its entry lacks. Returns the texts this rank ran."""
    mine = batching.rank_order(missing, texts, dist.rank, dist.world)
    loader = batching.tokenised([texts[t] for t in mine], cp.batch_size, encoder,
                                cp.num_workers)
    fmts = [s.fmt for s in parts]
    lag = 1 if encoder.device.type == "cuda" else 0  # finish batch i once i + 1 runs
    with Progress(len(mine), f"embedding with {encoder.name}") as progress, torch.inference_mode():
        # the ONNX backend runs `streams` batches at once (one thread each); torch one at a time
        launched = batching.ordered_map(lambda item: (item[0], sinks.launch(encoder, item[1],
                                                                            fmts)),
                                        loader, getattr(encoder, "streams", 1))
        for idx, finish in batching.lagged(launched, lag):
            hashes = [mine[j] for j in idx]
            for sink, rows in zip(parts, finish(), strict=True):
                sink.add(hashes, rows)
            progress.update(len(idx))
        for sink in parts:
            sink.flush()
    return len(mine)
