"""What a cache entry holds, behind one small adapter used by the fill, the views and the store:
pooled vectors (`vectors`) or the token states after a layer (`states`).

A batch of computed rows is a `Rows`: the (n, D) array of vectors, or the list of n (T_i, H)
state arrays; `take`, `cat` and `split` work on either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune.cache import states, vectors

Rows = Any  # np.ndarray (n, D) | list[np.ndarray (T_i, H)]


@dataclass(frozen=True)
class Format:
    """`layer` None: pooled vectors; k: the token states after layer k."""

    layer: int | None = None

    def suffix(self) -> str:
        """The view directory's name after the encoder's: `minilm`, `minilm@layer4`."""
        return "" if self.layer is None else f"@layer{self.layer}"

    def compute(self, encoder: Any, batch: dict[str, torch.Tensor]) -> Rows:
        if self.layer is None:
            return encoder.embed(batch).cpu().numpy()
        return encoder.states(batch, self.layer)

    def write(self, directory: Path, rank: int, ids: list[str], hashes: list[str], rows: Rows,
              manifest: vectors.Manifest, name: str | None = None) -> vectors.Shard:
        writer = vectors.write_shard if self.layer is None else states.write_shard
        return writer(directory, rank, ids, hashes, rows, manifest, name=name)

    def load(self, directory: Path, fingerprint: str | None = None, checksums: bool = False
             ) -> Any:
        loader = vectors.load if self.layer is None else states.load
        return loader(directory, fingerprint=fingerprint, checksums=checksums)

    def gather(self, table: Any, rows: torch.Tensor) -> Rows:
        """The stored rows `rows` of a loaded table, in its dtype."""
        if self.layer is None:
            return table.vectors[rows].numpy()
        return table.read(rows)

    def shard_rows(self, directory: Path, shard: vectors.Shard, manifest: vectors.Manifest) -> Rows:
        """Every row of one shard."""
        if self.layer is None:
            table = vectors.open_shard(directory, shard, manifest)
            return vectors.table_vectors(table, manifest.dim or 0).numpy()
        loaded = states.from_shards(directory, manifest,
                                    [states.ShardIndex(directory, shard, manifest)])
        return loaded.read(torch.arange(len(loaded)))

    def nbytes(self, rows: Rows) -> int:
        return int(rows.nbytes) if self.layer is None else sum(int(r.nbytes) for r in rows)


def take(rows: Rows, index: list[int]) -> Rows:
    return rows[index] if isinstance(rows, np.ndarray) else [rows[i] for i in index]


def cat(parts: list[Rows]) -> Rows:
    if parts and isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return [r for p in parts for r in p]


def split(rows: Rows, n: int) -> tuple[Rows, Rows]:
    return rows[:n], rows[n:]
