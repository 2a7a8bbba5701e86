"""Vectors a model outside the cache stage computes, kept in the shared store as the frozen
encoder's are: the trained model's corpus vectors for `simtune search` (`evaluate.corpus`).

The caller describes what decides the vectors (a dict: the trained model's files hashed, where
its input comes from, the role); its fingerprint (`encoders.fingerprint`) names one store entry
`<root>/vectors/<fingerprint>/` in the format of `cache.vectors`, rows keyed by content hash,
float32 (what the model computed, bit for bit). `stored` fills only the rows the entry lacks,
under the entry's lock (`store.locked`: two searches at once compute the corpus once), with the
store's checks: a shard holding a row about to be read is re-hashed (sha256) and checked against
the manifest, a damaged one is dropped with a warning and its rows computed again
(`store.begin_fill`), so a corrupted or truncated entry never serves a wrong vector. The size
policy (`policy.evict`) treats the entry as any other: least recently used goes first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from simtune.cache import policy, store, vectors
from simtune.encoders import fingerprint
from simtune.errors import UserError

DTYPE = "float32"  # what the model computed, exactly: a search ranks the same either way


@dataclass
class Stored:
    """`vectors` (n, D) float32 on the CPU, in the order of the keys asked for; `hits` keys the
    entry held, `computed` keys computed now (each key counted once), in `seconds`."""

    vectors: torch.Tensor
    hits: int
    computed: int
    seconds: float
    fingerprint: str


Compute = Callable[[list[int]], torch.Tensor]  # positions into the keys -> (m, D) vectors


def stored(store_root: Path, label: str, description: dict[str, Any], keys: list[str],
           compute: Compute, max_bytes: int, shard_rows: int) -> Stored:
    """The vectors of `keys` (content hashes; a key may repeat) under `description`: the rows
    its store entry holds, and `compute(positions)` -> (m, D) vectors of the keys at those
    positions (each missing key once, first position) for the others, written to the entry
    (shards of at most `shard_rows`) before anything is read back. Everything returned is read
    from the entry, so a first call and a later one give the same bytes. `label` names the
    entry in logs and `cache gc`. Non-finite computed vectors are refused (`UserError`), not
    stored. After a fill the size policy keeps the store under `max_bytes`."""
    fp = fingerprint(description)
    directory = store.fingerprint_dir(store_root, fp)
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    with store.locked(directory, label):
        manifest = store.begin_fill(directory, label, fp, description, DTYPE,
                                    needed=set(first))  # what is read back: re-hashed
        have = vectors.cached_hashes(directory, manifest)
        missing = [k for k in first if k not in have]
        start = time.perf_counter()
        if missing:
            _write(directory, manifest, fp, missing, compute([first[k] for k in missing]),
                   label, shard_rows)
        else:
            store.touch_used(directory)
        seconds = time.perf_counter() - start
        table = vectors.load(directory, fp)
        out = table.vectors[table.index(keys)].float()  # a gather: a copy, not the mapping
    if missing:
        policy.evict(store_root, max_bytes, keep={fp})
    return Stored(out, len(first) - len(missing), len(missing), seconds, fp)


def _write(directory: Path, manifest: vectors.Manifest, fp: str, keys: list[str],
           computed: torch.Tensor, label: str, shard_rows: int) -> None:
    """Write `computed` (m, D) as the rows of `keys` (m,): journaled shards, then the manifest
    (`store.finish_fill`): a process killed meanwhile leaves shards the next fill adopts."""
    if computed.ndim != 2 or len(computed) != len(keys):
        raise ValueError(f"computed {tuple(computed.shape)} vectors for {len(keys)} keys")
    bad = int((~torch.isfinite(computed).all(dim=1)).sum())
    if bad:
        raise UserError(f"{label}: the model gives non-finite vectors for {bad} of "
                        f"{len(keys)} texts; nothing stored (check the model: retrain it)")
    array = computed.detach().float().cpu().numpy()
    journal = store.Journal(directory, 0, fp)
    for a in range(0, len(keys), shard_rows):
        part = keys[a:a + shard_rows]
        journal.add(vectors.write_shard(directory, 0, part, part, array[a:a + shard_rows],
                                        manifest))
    store.finish_fill(directory)
