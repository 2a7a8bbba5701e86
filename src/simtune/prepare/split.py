"""Deterministic splitting: the same keys and seed always give the same split, in any input order.

Each key is ranked by a seeded hash (stable across Python runs and machines, unlike `hash()`), the
ranked keys are cut into consecutive runs whose sizes follow the fractions (largest remainder).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from simtune.params import SPLITS


def rank(seed: int, key: str) -> bytes:
    """Seeded pseudo-random sort key of `key`."""
    return hashlib.blake2b(f"{seed}\x1f{key}".encode(), digest_size=8).digest()


def allocate(n: int, fractions: dict[str, float], seed: int, salt: str,
             nonempty: bool) -> dict[str, int]:
    """Split `n` items into counts per split following `fractions` (largest remainder).

    Ties between remainders are broken by a seeded hash of (`salt`, split) so that many small
    strata do not all round in favour of the same split. With `nonempty`, each split with a
    positive fraction gets at least one item (taken from the largest), if `n` allows.
    """
    ideal = {s: n * fractions[s] for s in SPLITS}
    counts = {s: int(ideal[s]) for s in SPLITS}
    order = sorted(SPLITS, key=lambda s: (-(ideal[s] - counts[s]), rank(seed, f"{salt}\x1f{s}")))
    for s in order[: n - sum(counts.values())]:
        counts[s] += 1
    if nonempty:
        for s in SPLITS:
            if counts[s] == 0 and fractions[s] > 0:
                donor = max(SPLITS, key=lambda d: counts[d])
                if counts[donor] > 1:
                    counts[donor] -= 1
                    counts[s] += 1
    return counts


def assign(keys: Iterable[str], fractions: dict[str, float], seed: int, salt: str = "",
           nonempty: bool = False) -> dict[str, str]:
    """Map each distinct key to a split name; deterministic for (`keys` as a set, `seed`)."""
    ranked: Sequence[str] = sorted(set(keys), key=lambda k: rank(seed, k))
    counts = allocate(len(ranked), fractions, seed, salt, nonempty)
    out: dict[str, str] = {}
    start = 0
    for s in SPLITS:
        for k in ranked[start : start + counts[s]]:
            out[k] = s
        start += counts[s]
    return out
