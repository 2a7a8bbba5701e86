"""The Arrow embedding cache format: atomic shard writer, memory-mapped reader, manifest.

One format serves both places vectors live: a workspace *view* `cache/<encoder>/` (what the
pipeline reads; a DVC output) and each fingerprint directory of the machine-wide shared store
(`simtune.cache.store`). A directory holds:

- shards: uncompressed Arrow IPC files, one record batch each, columns `text_id: string` (the
  key: the workspace's id in a view, the content hash in the store), `text_hash: string`
  (content hash of the embedded text) and `embedding: fixed_size_list<float32|float16>[dim]`;
  schema metadata `simtune.format_version` and `simtune.fingerprint`. Written under a temp name,
  then renamed. Store shards are `shard-<token>-r<rank>.arrow`, view shards `part-<n>.arrow`;
  a manifest naming any other file is damaged (no path ever leaves the directory).
- `manifest.json`: format version, encoder name, fingerprint (+ the description it hashes, so a
  rebuild can say what changed), dim, dtype, and each shard's file, rows, bytes and sha256.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from simtune.atomic import write_json
from simtune.cache import schema
from simtune.encoders import sha256_of
from simtune.errors import UserError

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DTYPES = {"float32": (pa.float32(), np.float32), "float16": (pa.float16(), np.float16)}


@dataclass
class Shard:
    file: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class Manifest:
    encoder: str
    fingerprint: str
    description: dict[str, Any]
    dtype: str
    dim: int | None = None
    shards: list[Shard] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rows": self.rows}


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest of `directory`, or None if there is none. A damaged one (not JSON, or any
    field off the checked schema of `simtune.cache.schema`) is a `UserError`."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: damaged cache manifest ({str(e)[:200]})") from None
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if isinstance(version, int) and version != FORMAT_VERSION:
        raise UserError(f"{path}: cache format version {version}, this simtune "
                        f"reads {FORMAT_VERSION}; run the cache stage")
    checked = schema.validate(raw, path)
    fields = checked.model_dump(exclude={"rows", "shards"})
    return Manifest(**fields, shards=[Shard(**s.model_dump()) for s in checked.shards])


def valid_shard_name(name: str) -> bool:
    """Whether `name` is a plain shard file name (no directory part, our own pattern)."""
    return isinstance(name, str) and bool(schema.SHARD_NAME.match(name))


def write_manifest(directory: Path, manifest: Manifest) -> None:
    write_json(Path(directory) / MANIFEST, manifest.to_json())


def write_shard(directory: Path, rank: int, ids: list[str], hashes: list[str],
                vectors: np.ndarray, manifest: Manifest, name: str | None = None) -> Shard:
    """Write one shard atomically. `ids`, `hashes`: (n,) keys and content hashes;
    `vectors`: (n, dim) array, cast to the manifest's dtype. `name`: the file name (default: a
    fresh random store shard name of `rank`)."""
    arrow_type, np_type = DTYPES[manifest.dtype]
    dim = vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np_type).reshape(-1), arrow_type)
    schema = pa.schema([("text_id", pa.string()), ("text_hash", pa.string()),
                        ("embedding", pa.list_(arrow_type, dim))],
                       metadata={"simtune.format_version": str(FORMAT_VERSION),
                                 "simtune.fingerprint": manifest.fingerprint})
    batch = pa.record_batch([pa.array(ids, pa.string()), pa.array(hashes, pa.string()),
                             pa.FixedSizeListArray.from_arrays(flat, dim)], schema=schema)
    return write_batch(directory, name or f"shard-{secrets.token_hex(6)}-r{rank}.arrow", batch)


def write_batch(directory: Path, name: str, batch: pa.RecordBatch) -> Shard:
    """Write one record batch as the shard file `name`: under a temp name, checksummed, then
    renamed (a failure leaves no file behind and is a `UserError` naming the shard)."""
    final, tmp = Path(directory) / name, Path(directory) / f".{name}.tmp"
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        shard = Shard(name, batch.num_rows, tmp.stat().st_size, sha256_of(tmp))
        os.replace(tmp, final)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        reason = e.strerror or str(e).replace(str(tmp), str(final))  # Arrow's names the temp
        raise UserError(f"{final}: cannot write cache shard: {reason}") from None
    return shard


def cached_hashes(directory: Path, manifest: Manifest) -> dict[str, str]:
    """text id -> content hash of every cached row (reads only those two columns)."""
    out: dict[str, str] = {}
    for s in manifest.shards:
        t = open_shard(Path(directory), s, manifest)
        out.update(zip(t.column("text_id").to_pylist(), t.column("text_hash").to_pylist(),
                       strict=True))
    return out


def shard_dim(path: Path) -> int:
    """The embedding width (or a layer-state shard's hidden size) from the schema alone."""
    with pa.memory_map(str(path), "r") as f:
        schema = pa.ipc.open_file(f).schema
    if "embedding" in schema.names:
        return int(schema.field("embedding").type.list_size)
    return int((schema.metadata or {}).get(b"simtune.hidden", b"0"))  # a layer-state shard


def open_shard(directory: Path, shard: Shard, manifest: Manifest) -> pa.Table:
    """Memory-map one shard, checking size, rows, schema (columns, dtype, dim: see
    `schema.check_table`), nulls and fingerprint against the manifest."""
    path = directory / shard.file
    if not path.is_file():
        raise UserError(f"{path}: cache shard listed in the manifest is missing")
    size = path.stat().st_size
    if size != shard.bytes:
        raise UserError(f"{path}: cache shard is {size} bytes, the manifest says {shard.bytes} "
                        "(truncated or overwritten)")
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        table = reader.read_all()
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: unreadable cache shard: {e}") from None
    meta = reader.schema.metadata or {}
    if meta.get(b"simtune.fingerprint", b"").decode() != manifest.fingerprint:
        raise UserError(f"{path}: shard fingerprint does not match {directory / MANIFEST}")
    if table.num_rows != shard.rows:
        raise UserError(f"{path}: {table.num_rows} rows, the manifest says {shard.rows}")
    schema.check_table(path, reader.schema, manifest.dtype, manifest.dim)
    schema.check_nulls(path, table)
    return table


class CacheTable:
    """A loaded cache: `vectors` (N, dim) tensor in the stored dtype, `ids` (N,) text ids.

    With one shard (the usual case after a single fill) `vectors` is a zero-copy view of the
    memory-mapped file: read-only, paged in on demand. Several shards are concatenated (a copy).
    """

    def __init__(self, directory: Path, manifest: Manifest, ids: pa.Array,
                 vectors: torch.Tensor) -> None:
        self.directory, self.manifest, self.ids, self.vectors = directory, manifest, ids, vectors

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def index(self, text_ids: Any) -> torch.Tensor:
        """Row numbers (int64 tensor) of `text_ids`; every id must be cached."""
        rows = pc.index_in(pa.array(text_ids, pa.string()), value_set=self.ids)
        if rows.null_count:
            missing = pc.filter(pa.array(text_ids, pa.string()), pc.is_null(rows))
            raise UserError(f"{self.directory}: {len(missing)} text ids are not in the cache "
                            f"(first: {missing[0]}); run the cache stage")
        return torch.from_numpy(rows.to_numpy().astype(np.int64))

    def to(self, device: torch.device | str) -> CacheTable:
        """The same table with `vectors` moved (copied) to `device` once."""
        return CacheTable(self.directory, self.manifest, self.ids, self.vectors.to(device))


def load(directory: Path, fingerprint: str | None = None, checksums: bool = False) -> CacheTable:
    """Open a cache. Checks every shard's size, rows, schema and fingerprint (and, with
    `checksums`, its sha256); any mismatch, or a `fingerprint` other than the cache's, is a
    `UserError` naming the file. Never returns a partially valid table."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        raise UserError(f"{directory}: no cache here (run the cache stage)")
    if list(directory.glob("journal-r*.json")):
        raise UserError(f"{directory}: a fill was interrupted; run the cache stage to finish it")
    if fingerprint is not None and manifest.fingerprint != fingerprint:
        raise UserError(f"{directory / MANIFEST}: cache fingerprint {manifest.fingerprint} does "
                        f"not match the current encoder settings ({fingerprint}); "
                        "run the cache stage")
    if checksums:
        for s in manifest.shards:
            if sha256_of(directory / s.file) != s.sha256:
                raise UserError(f"{directory / s.file}: checksum mismatch (corrupted shard)")
    tables = [open_shard(directory, s, manifest) for s in manifest.shards]
    if tables and manifest.dim is None:
        raise UserError(f"{directory / MANIFEST}: damaged cache manifest (no dim, but shards; "
                        "a fill was interrupted: run the cache stage)")
    dim = manifest.dim or 0
    if not tables:
        empty = torch.empty(0, dim, dtype=getattr(torch, manifest.dtype))
        return CacheTable(directory, manifest, pa.array([], pa.string()), empty)
    id_chunks = [c for t in tables for c in t.column("text_id").chunks]
    ids = id_chunks[0] if len(id_chunks) == 1 else pa.concat_arrays(id_chunks)  # 1: no copy
    parts = [table_vectors(t, dim) for t in tables]
    vectors = parts[0] if len(parts) == 1 else torch.cat(parts)
    return CacheTable(directory, manifest, ids, vectors)


def table_vectors(table: pa.Table, dim: int) -> torch.Tensor:
    chunks = table.column("embedding").chunks
    arrays = [c.flatten().to_numpy(zero_copy_only=True).reshape(-1, dim) for c in chunks]
    with warnings.catch_warnings():
        # the mapped file is read-only; the tensor is too (documented), so torch's warning is noise
        warnings.simplefilter("ignore", UserWarning)
        parts = [torch.from_numpy(a) for a in arrays]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def verify(directory: Path) -> list[str]:
    """Every problem found by a full check (checksums, sizes, rows, duplicate ids); [] if none."""
    directory = Path(directory)
    problems = []
    try:
        manifest = read_manifest(directory)
    except UserError as e:
        return [str(e)]
    if manifest is None:
        return [f"{directory}: no cache here"]
    seen: set[str] = set()
    for s in manifest.shards:
        path = directory / s.file
        try:
            if path.is_file() and sha256_of(path) != s.sha256:
                problems.append(f"{path}: checksum mismatch (corrupted shard)")
                continue
            ids = open_shard(directory, s, manifest).column("text_id").to_pylist()
        except UserError as e:
            problems.append(str(e))
            continue
        dup = seen.intersection(ids)
        if dup:
            problems.append(f"{path}: {len(dup)} text ids also in another shard")
        seen.update(ids)
    return problems


def place(table: CacheTable, cache_type: str) -> CacheTable:
    """Keep the table where training reads it (Quaterion's CacheType): `cpu` keeps it in host
    memory (pinned when a GPU will read it), `gpu` moves it to the GPU once, `auto` picks `gpu`
    when CUDA is available and the table takes under half the free GPU memory."""
    cuda = torch.cuda.is_available()
    if cache_type == "gpu" and not cuda:
        raise UserError("cache.cache_type: 'gpu' requested but CUDA is not available")
    if cache_type == "auto":
        size = table.vectors.numel() * table.vectors.element_size()
        cache_type = "gpu" if cuda and size < 0.5 * torch.cuda.mem_get_info()[0] else "cpu"
    if cache_type == "gpu":
        return table.to("cuda")
    if cuda:
        return CacheTable(table.directory, table.manifest, table.ids, table.vectors.pin_memory())
    return table
