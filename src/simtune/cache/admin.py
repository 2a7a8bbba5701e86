"""`cache verify` and `cache gc`: check a cache against its settings, bound the shared store."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from simtune.cache import store, vectors
from simtune.cache.stage import texts_per_encoder
from simtune.encoders import FrozenEncoder, changes, describe, fingerprint
from simtune.errors import UserError
from simtune.params import CacheParams, EncodersParams
from simtune.prepare.prepared import load as load_prepared

log = logging.getLogger("simtune.cache")


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
    for target, ids in texts_per_encoder(prepared, encoders).items():
        name = target.name
        spec, directory = encoders.models[name], Path(out) / target.view
        problems = vectors.verify(directory)
        description = describe(name, spec, role=target.role)
        manifest = None if problems else vectors.read_manifest(directory)
        if manifest is not None and manifest.fingerprint != fingerprint(description):
            problems.append(f"{directory / vectors.MANIFEST}: filled with other encoder settings "
                            f"({changes(manifest.description, description)})")
        if problems:
            results.append(VerifyResult(target.view, 0, problems, 0, float("nan")))
            continue
        table = vectors.load(directory)
        texts = prepared.text_map(ids)
        pool = sorted(set(table.ids.to_pylist()) & texts.keys())
        picked = random.Random(seed).sample(pool, min(sample, len(pool)))
        diff = 0.0
        if picked:
            encoder = FrozenEncoder(name, spec, device, target.role)
            fresh = encoder.encode([texts[t] for t in picked], 64)
            stored = table.vectors[table.index(picked)].float()
            diff = float((fresh - stored).abs().max())
            scale = max(1.0, float(fresh.abs().max()))
            tol = (1e-4 if spec.dtype == "float32" else 2e-3) * scale
            if diff > tol:
                problems.append(f"{directory}: re-embedded vectors differ by {diff:.3g} "
                                f"(tolerance {tol:.3g})")
        results.append(VerifyResult(target.view, len(table), problems, len(picked), diff))
    return results


def gc(encoders: EncodersParams, cp: CacheParams, max_gb: float | None = None,
       dry_run: bool = False) -> tuple[list[store.Entry], list[store.Entry]]:
    """Apply the store's size policy now: drop least-recently-used fingerprints until the store
    holds at most `max_gb` (default `cache.store_max_gb`; 0 keeps only the current settings).
    The fingerprints of the current `encoders` settings are always kept.
    Returns (kept, dropped) entries."""
    root = store.root(cp.store)
    keep = set()
    for name, spec in encoders.models.items():
        try:
            keep.update(fingerprint(describe(name, spec, role=r)) for r in ("query", "document"))
        except UserError as e:  # a model that is gone cannot be in use
            log.warning("%s: its vectors are not protected from gc", e)
    budget = cp.store_max_gb if max_gb is None else max_gb
    dropped = store.evict(root, int(budget * 1e9), keep, dry_run=dry_run)
    gone = {e.fingerprint for e in dropped}
    kept = [e for e in store.entries(root) if e.fingerprint not in gone]
    return kept, dropped
