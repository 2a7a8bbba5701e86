"""The layer-state cache format: each text's token states after layer k of a frozen encoder.

The vector cache one level lower (same directory layout, manifest, fingerprints, shared store and
views as `simtune.store`): shards are uncompressed Arrow IPC files with columns `text_id`,
`text_hash` and `states: large_list<float32|float16>` holding the text's (T_i, H) states
flattened row-major (T_i = its token count after truncation, no padding). Schema metadata adds
`simtune.hidden` (H). Reading maps the files: `StatesTable.flat` is a (sum T_i, H) view of the
mapped values and `offsets` (N + 1,) the token offset of each row: a batch gathers its rows and
pads them to its own longest text (`StatesTable.batch`).
"""

from __future__ import annotations

import secrets
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from simtune.cache import vectors
from simtune.errors import UserError


def write_shard(directory: Path, rank: int, ids: list[str], hashes: list[str],
                states: list[np.ndarray], manifest: vectors.Manifest, name: str | None = None
                ) -> vectors.Shard:
    """Write one shard atomically. `states[i]`: (T_i, H) array of text i (cast to the
    manifest's dtype)."""
    arrow_type, np_type = vectors.DTYPES[manifest.dtype]
    hidden = int(states[0].shape[1]) if states else int(manifest.dim or 0)
    lengths = np.array([s.shape[0] for s in states], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths * hidden)]).astype(np.int64)
    flat = np.concatenate([np.asarray(s, dtype=np_type).reshape(-1) for s in states]) if (
        states) else np.empty(0, np_type)
    values = pa.array(flat, arrow_type)
    schema = pa.schema([("text_id", pa.string()), ("text_hash", pa.string()),
                        ("states", pa.large_list(arrow_type))],
                       metadata={"simtune.format_version": str(vectors.FORMAT_VERSION),
                                 "simtune.fingerprint": manifest.fingerprint,
                                 "simtune.hidden": str(hidden)})
    batch = pa.record_batch([pa.array(ids, pa.string()), pa.array(hashes, pa.string()),
                             pa.LargeListArray.from_arrays(pa.array(offsets), values)],
                            schema=schema)
    return vectors.write_batch(directory, name or f"shard-{secrets.token_hex(6)}-r{rank}.arrow",
                             batch)


class StatesTable:
    """A loaded layer cache: `flat` (sum T_i, H) in the stored dtype, `offsets` (N + 1,) token
    offsets (int64), `ids` (N,) text ids. Zero-copy for a single-shard view."""

    def __init__(self, directory: Path, manifest: vectors.Manifest, ids: pa.Array,
                 flat: torch.Tensor, offsets: torch.Tensor) -> None:
        self.directory, self.manifest, self.ids = directory, manifest, ids
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, text_ids: list[str]) -> torch.Tensor:
        """Row numbers (int64) of `text_ids`; every id must be cached."""
        rows = pc.index_in(pa.array(text_ids, pa.string()), value_set=self.ids)
        if rows.null_count:
            raise UserError(f"{self.directory}: {rows.null_count} text ids are not in the layer "
                            "cache; run the cache stage")
        return torch.from_numpy(rows.to_numpy().astype(np.int64))

    def lengths(self, rows: torch.Tensor) -> torch.Tensor:
        return self.offsets[rows + 1] - self.offsets[rows]

    def batch(self, rows: torch.Tensor, device: torch.device | str = "cpu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) rows -> float32 states (B, T, H) padded with zeros to the batch's longest text,
        and the attention mask (B, T) (1 = real token), on `device`."""
        rows = rows.to(self.offsets.device)
        start, length = self.offsets[rows], self.lengths(rows)
        width = int(length.max()) if len(rows) else 0
        pos = torch.arange(width, device=start.device)
        mask = pos[None, :] < length[:, None]
        index = (start[:, None] + pos[None, :]).masked_fill(~mask, 0)
        states = self.flat.to(start.device)[index.reshape(-1)].reshape(len(rows), width, -1)
        states = states.to(device, non_blocking=True).float() * mask.to(device)[..., None]
        return states, mask.to(device=device, dtype=torch.long)

    def to(self, device: torch.device | str) -> StatesTable:
        return StatesTable(self.directory, self.manifest, self.ids, self.flat.to(device),
                           self.offsets.to(device))


def load(directory: Path, fingerprint: str | None = None, checksums: bool = False
         ) -> StatesTable:
    """Open a layer cache view or store entry, with the checks of `vectors.load`."""
    directory = Path(directory)
    manifest = vectors.read_manifest(directory)
    if manifest is None:
        raise UserError(f"{directory}: no layer cache here (run the cache stage)")
    if fingerprint is not None and manifest.fingerprint != fingerprint:
        raise UserError(f"{directory / vectors.MANIFEST}: layer cache fingerprint does not match "
                        "the current encoder settings; run the cache stage")
    if checksums:
        for s in manifest.shards:
            if vectors.sha256_of(directory / s.file) != s.sha256:
                raise UserError(f"{directory / s.file}: checksum mismatch (corrupted shard)")
    tables = [vectors.open_shard(directory, s, manifest) for s in manifest.shards]
    if tables and manifest.dim is None:
        raise UserError(f"{directory / vectors.MANIFEST}: damaged cache manifest (no dim, but "
                        "shards; a fill was interrupted: run the cache stage)")
    return assemble(directory, manifest, tables)


def assemble(directory: Path, manifest: vectors.Manifest, tables: list[pa.Table]) -> StatesTable:
    """A `StatesTable` over opened shards (zero-copy for one shard). A row whose value count is
    not a multiple of the hidden size is a damaged shard (`UserError`)."""
    hidden = int(manifest.dim or 0)
    ids_chunks = [c for t in tables for c in t.column("text_id").chunks]
    ids = pa.concat_arrays(ids_chunks) if ids_chunks else pa.array([], pa.string())
    flats, lengths = [], []
    for t in tables:
        for chunk in t.column("states").chunks:
            offs = chunk.offsets.to_numpy()
            if hidden and ((offs - offs[0]) % hidden).any():
                raise UserError(f"{directory}: damaged layer cache shard (a row is not whole "
                                f"tokens of hidden size {hidden})")
            lengths.append(np.diff(offs) // max(hidden, 1))
            values = chunk.values.to_numpy(zero_copy_only=True)[offs[0]:offs[-1]]
            flats.append(values.reshape(-1, hidden))
    with warnings.catch_warnings():  # a read-only mapped buffer, documented
        warnings.simplefilter("ignore", UserWarning)
        parts = [torch.from_numpy(f) for f in flats]
    dtype = getattr(torch, manifest.dtype)
    flat = parts[0] if len(parts) == 1 else (torch.cat(parts) if parts else torch.empty(
        0, hidden, dtype=dtype))
    counts = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    return StatesTable(directory, manifest, ids, flat, offsets)


def table_rows(table: StatesTable, rows: torch.Tensor) -> list[np.ndarray]:
    """The (T_i, H) states of `rows`, as numpy arrays in the stored dtype (for views)."""
    flat = table.flat.numpy()
    offs = table.offsets.tolist()
    return [flat[offs[r]:offs[r + 1]] for r in rows.tolist()]
