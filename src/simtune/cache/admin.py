"""`cache verify` and `cache gc`: check a cache against its settings, bound the shared store."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

from simtune.cache import policy, reference, store, vectors, views
from simtune.cache.formats import Format
from simtune.cache.stage import texts_per_encoder
from simtune.encoders import FrozenEncoder, changes, describe, fingerprint
from simtune.errors import UserError
from simtune.params import CacheParams, EncoderParams, EncodersParams
from simtune.prepare.prepared import Prepared
from simtune.prepare.prepared import load as load_prepared

log = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    encoder: str
    rows: int
    problems: list[str]
    sampled: int
    max_abs_diff: float


STALE = ("not a view of the current settings (left by earlier ones); the cache stage "
         "removes it")


def verify(prepared_dir: Path, out: Path, encoders: EncodersParams, cp: CacheParams,
           sample: int, seed: int, device: torch.device, layer: int | None = None,
           teacher: str | None = None) -> list[VerifyResult]:
    """Full check of every view under `out`: checksums, schema and rows, fingerprint against the
    current settings (each encoder's vectors and, with `layer`, the query encoder's layer
    states), the sha256 of the store shards behind it, and `sample` random cached texts
    re-embedded and compared (pooled vectors and, of a layer view, token states). A view under
    `out` the params do not produce is a problem (`STALE`: the cache stage removes it), besides
    the checks that need no settings; `teacher` (`train.distill.teacher`): its view is one the
    params produce."""
    prepared = load_prepared(prepared_dir)
    root = store.root(cp.store)
    results, seen = [], set()
    produced = {t.view for t in texts_per_encoder(prepared, encoders, teacher)}
    for target, ids in texts_per_encoder(prepared, encoders).items():
        name, spec = target.name, encoders.models[target.name]
        fmts = [Format()] + ([Format(layer)] if layer is not None and name == encoders.query
                             else [])
        for fmt in fmts:
            label = views.view_name(name, spec, target.role, fmt.layer)
            seen.add(label)
            results.append(_verify_view(Path(out) / label, root, describe(
                name, spec, fmt.layer, target.role, chunks=fmt.layer is None)))
            if fmt.layer is None and not results[-1].problems:
                _compare(results[-1], Path(out) / label, prepared, ids, name, spec, target.role,
                         sample, seed, device)
            elif not results[-1].problems:
                _compare_states(results[-1], Path(out) / label, root, prepared, name, spec,
                                target.role, fmt.layer, sample, seed, device)
    for directory in sorted(Path(out).iterdir()):
        if directory.name not in seen and not directory.name.startswith(".") and (
                (directory / vectors.MANIFEST).is_file() or reference.is_reference(directory)
        ):  # a dot name: a temp dir, not a view
            results.append(_verify_view(directory, root, None))
            if directory.name not in produced:
                results[-1].problems.insert(0, f"{directory}: {STALE}")
    return results


def _verify_view(directory: Path, root: Path, description: dict | None) -> VerifyResult:
    """Checksums, schema, rows, fingerprint (against `description`, if given), store shards;
    a layer view (a reference): its store rows all there and their shards re-hashed."""
    name = directory.name
    if reference.is_reference(directory):
        rows, problems = reference.verify(directory, root, description and fingerprint(
            description))
        return VerifyResult(name, rows, problems, 0, float("nan") if problems else 0.0)
    problems = vectors.verify(directory)
    if problems:
        return VerifyResult(name, 0, problems, 0, float("nan"))
    manifest = vectors.read_manifest(directory)
    assert manifest is not None
    if description is not None and manifest.fingerprint != fingerprint(description):
        problems.append(f"{directory / vectors.MANIFEST}: filled with other encoder settings "
                        f"({changes(manifest.description, description)})")
    hashes = {h for joined in vectors.cached_hashes(directory, manifest).values()
              for h in joined.split("+")}  # a chunked text: its windows' hashes
    problems += store.check_behind(root, manifest, hashes)
    return VerifyResult(name, manifest.rows, problems, 0, float("nan") if problems else 0.0)


def _compare(result: VerifyResult, directory: Path, prepared: Prepared, ids: pa.Array,
             name: str, spec: EncoderParams, role: str, sample: int, seed: int,
             device: torch.device) -> None:
    """Re-embed `sample` random cached texts of the view (as `role` texts) and compare them
    with the stored ones."""
    table = vectors.load(directory)
    texts = prepared.text_map(ids)
    pool = sorted(set(table.ids.to_pylist()) & texts.keys())
    picked = random.Random(seed).sample(pool, min(sample, len(pool)))
    if not picked:
        return
    fresh = FrozenEncoder(name, spec, device, role).encode([texts[t] for t in picked], 64)
    stored = table.vectors[table.index(picked)].float()
    diff = float((fresh - stored).abs().max())
    scale = max(1.0, float(fresh.abs().max()))
    tol = (1e-4 if spec.dtype == "float32" else 2e-3) * scale
    if diff > tol:
        result.problems.append(f"{directory}: re-embedded vectors differ by {diff:.3g} "
                               f"(tolerance {tol:.3g})")
    result.sampled, result.max_abs_diff = len(picked), diff


def _compare_states(result: VerifyResult, view: Path, root: Path, prepared: Prepared,
                    name: str, spec: EncoderParams, role: str, layer: int, sample: int,
                    seed: int, device: torch.device) -> None:
    """Re-embed the token states after layer `layer` of `sample` random texts of the layer
    view (texts of one window: a window is the text itself) and compare them with the stored
    ones (read from the store entry), within the tolerance of `states_dtype`."""
    table = reference.open_view(view, root, checksums=False)  # the shards were just re-hashed
    ref = reference.read(view)
    assert ref is not None
    texts = prepared.text_map(ref.ids)
    single = [t for t, hs in zip(ref.ids.to_pylist(), ref.hashes.to_pylist(), strict=True)
              if len(hs) == 1 and t in texts]
    picked = random.Random(seed).sample(single, min(sample, len(single)))
    if not picked:
        return
    encoder = FrozenEncoder(name, spec, device, role)
    rows, _ = table.window_rows(table.index(picked))
    stored = table.read(rows)
    diff, scale = 0.0, 1.0
    with torch.inference_mode():
        for i in range(0, len(picked), 16):
            chunk = picked[i:i + 16]
            fresh = encoder.states(encoder.tokenize([texts[t] for t in chunk]), layer)
            for f, s in zip(fresh, stored[i:i + 16], strict=True):
                if f.shape != s.shape:
                    diff = float("inf")
                    continue
                diff = max(diff, float(abs(f - s.astype("float32")).max()))
                scale = max(scale, float(abs(f).max()))
    tol = (1e-4 if spec.states_dtype == "float32" else 2e-3) * scale
    if diff > tol:
        result.problems.append(f"{view}: re-embedded layer states differ by {diff:.3g} "
                               f"(tolerance {tol:.3g})")
    result.sampled, result.max_abs_diff = len(picked), diff


def gc(encoders: EncodersParams, cp: CacheParams, max_gb: float | None = None,
       dry_run: bool = False, layer: int | None = None, prune_missing: bool = False
       ) -> tuple[list[policy.Entry], list[policy.Entry], list[tuple[Path, str]]]:
    """Apply the store's size policy now: drop least-recently-used store entries until the store
    holds at most `max_gb` (default `cache.store_max_gb`; 0 keeps only the current settings).
    The entries of the current settings (each encoder's vectors; with `layer`, the query
    encoder's layer states) are always kept; what is not a store entry is never touched.
    A layer view whose folder is missing (a project moved or renamed) keeps its entry unless
    `prune_missing`; each such view is listed in skipped. Returns (kept, dropped, skipped:
    (path, why))."""
    root = store.root(cp.store)
    keep = set()
    for name in encoders.models:
        try:
            spec = encoders.models[name]
            layers = [None] + ([layer] if layer is not None and name == encoders.query else [])
            keep.update(fingerprint(describe(name, spec, k, r, chunks=False)) for k in layers
                        for r in ("query", "document"))
        except UserError as e:  # a model that is gone cannot be in use
            log.warning("%s: its vectors are not protected from gc", e)
    budget = cp.store_max_gb if max_gb is None else max_gb
    lost = reference.missing(root)
    dropped = policy.evict(root, int(budget * 1e9), keep, dry_run=dry_run,
                           prune_missing=prune_missing)
    gone = {e.fingerprint for e in dropped}
    kept = [e for e in policy.entries(root) if e.fingerprint not in gone]
    return kept, dropped, policy.skipped(root) + [
        (view, f"a layer view's folder that is missing (a project moved, renamed or deleted): "
               f"its ref keeps store entry {fp} (`cache gc --prune-missing` drops it)")
        for view, fp in ([] if prune_missing else lost)]
