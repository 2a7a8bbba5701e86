"""The layer-state cache format: each text's token states after layer k of a frozen encoder.

The vector cache one level lower (same directory layout, manifest, fingerprints and shared store
as `simtune.cache.vectors`): shards are uncompressed Arrow IPC files with columns `text_id`,
`text_hash` and `states: large_list<float32|float16>` holding the text's (T_i, H) states
flattened row-major (T_i = its token count after truncation, no padding). Schema metadata adds
`simtune.hidden` (H).

Reading never loads the table: a `StatesTable` knows, for each of its N rows, the shard file,
the byte offset of its values and its token count, and `batch` reads just the rows of a batch
with positional reads (`os.preadv`) into the padded batch buffer. The kernel's page cache holds
what is read (not counted in the process's resident memory), so memory stays one batch however
large the table; a row is read exactly as stored. `to(device)` makes the table resident (one
flat (sum T_i, H) tensor, e.g. on the GPU when it fits) for tables that should live there.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from simtune.cache import vectors
from simtune.errors import UserError

READ_ROWS = 4096  # rows per read when a table is made resident


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


class ShardIndex:
    """Where each row of one opened shard lies in its file: `ids`, `hashes` (n,) Arrow
    strings, `start` (n,) int64 byte offset of the row's first value, `length` (n,) int64
    token count. Built from the mapped file, which is closed afterwards."""

    def __init__(self, directory: Path, shard: vectors.Shard, manifest: vectors.Manifest
                 ) -> None:
        self.path = Path(directory) / shard.file
        vectors.open_shard(Path(directory), shard, manifest)  # every check of the file
        hidden = int(manifest.dim or 0)
        itemsize = np.dtype(vectors.DTYPES[manifest.dtype][1]).itemsize
        mapped = pa.memory_map(str(self.path), "r")  # lives while the id columns use it
        table = pa.ipc.open_file(mapped).read_all()
        mapped.seek(0)
        base = mapped.read_buffer().address  # buffer address - base: offset in the file
        starts, lengths = [], []
        for chunk in table.column("states").chunks:
            offs = chunk.offsets.to_numpy()
            if hidden and ((offs - offs[0]) % hidden).any():
                raise UserError(f"{self.path}: damaged layer cache shard (a row is not whole "
                                f"tokens of hidden size {hidden})")
            values = chunk.values
            at = values.buffers()[1].address - base + values.offset * itemsize
            starts.append(at + offs[:-1].astype(np.int64) * itemsize)
            lengths.append(np.diff(offs) // max(hidden, 1))
        self.start = np.concatenate(starts) if starts else np.empty(0, np.int64)
        self.length = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
        end = self.start + self.length * hidden * itemsize
        if len(end) and (self.start.min() < 0 or end.max() > shard.bytes):
            raise UserError(f"{self.path}: damaged layer cache shard (values outside the file)")
        self.ids = pa.concat_arrays(table.column("text_id").chunks) if table.num_rows else (
            pa.array([], pa.string()))
        self.hashes = pa.concat_arrays(table.column("text_hash").chunks) if table.num_rows \
            else pa.array([], pa.string())


class StatesTable:
    """N rows of layer states: `ids` (N,) text ids, `length` (N,) int64 token counts, each row
    either read from its shard file on demand (`files[file[i]]` at byte `start[i]`) or, once
    resident (`to`), taken from `flat` (sum T_i, H) at token offset `tok[i]`. Values keep
    the stored `dtype`; `batch` gives float32."""

    def __init__(self, directory: Path, manifest: vectors.Manifest, ids: pa.Array,
                 files: list[Path], file: np.ndarray, start: np.ndarray, length: np.ndarray,
                 windows: np.ndarray | None = None) -> None:
        self.directory, self.manifest, self.ids = directory, manifest, ids
        # long texts cut into windows (`simtune.chunks`): text i's rows are windows[i]:
        # windows[i + 1] (None: row i is text i)
        self.windows = windows
        self.hidden = int(manifest.dim or 0)
        self.np_dtype = np.dtype(vectors.DTYPES[manifest.dtype][1])
        self.files, self.file, self.start = files, file, start
        self.length_np = np.asarray(length, dtype=np.int64)
        self.length = torch.from_numpy(self.length_np)  # on the resident tensor's device
        self.flat: torch.Tensor | None = None
        self.tok: torch.Tensor | None = None
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._checking: list[Future] = []  # shard hashes under way (`check_sums`)

    def __len__(self) -> int:
        return len(self.ids)

    def window_rows(self, texts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W,) the rows of the (n,) `texts`' windows, text after text, and (n,) windows per
        text; (`texts`, None) when no text has several."""
        if self.windows is None:
            return texts, None
        t = texts.cpu().numpy()
        first, counts = self.windows[t], self.windows[t + 1] - self.windows[t]
        rows = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        return torch.from_numpy(rows).to(texts.device), torch.from_numpy(counts)

    def text_tokens(self, texts: torch.Tensor) -> torch.Tensor:
        """(n,) tokens of each text's windows together (its length when it has one)."""
        rows, counts = self.window_rows(texts)
        length = self.lengths(rows).cpu()
        if counts is None:
            return length
        owner = torch.repeat_interleave(torch.arange(len(texts)), counts)
        return torch.zeros(len(texts), dtype=length.dtype).index_add(0, owner, length)

    def __getstate__(self) -> dict:  # a spawned process opens its own files
        self._checked()  # and gets a checked table
        return {**self.__dict__, "_fds": {}, "_checking": []}

    def __del__(self) -> None:
        try:
            if getattr(self, "_pid", None) == os.getpid():
                for fd in getattr(self, "_fds", {}).values():
                    os.close(fd)
        except (OSError, AttributeError, TypeError):  # at interpreter exit: the OS closes them
            pass

    @property
    def device(self) -> torch.device:
        """Where `batch` gathers (the resident tensor's device; cpu when streamed)."""
        return self.length.device

    @property
    def nbytes(self) -> int:
        return int(self.length_np.sum()) * self.hidden * self.np_dtype.itemsize

    def index(self, text_ids: list[str]) -> torch.Tensor:
        """Row numbers (int64) of `text_ids`; every id must be cached."""
        rows = pc.index_in(pa.array(text_ids, pa.string()), value_set=self.ids)
        if rows.null_count:
            raise UserError(f"{self.directory}: {rows.null_count} text ids are not in the layer "
                            "cache; run the cache stage")
        return torch.from_numpy(rows.to_numpy().astype(np.int64))

    def lengths(self, rows: torch.Tensor) -> torch.Tensor:
        """(B,) token counts of `rows`, on the table's device."""
        return self.length[rows.to(self.length.device)]

    def _fd(self, i: int) -> int:
        """Shard `i`'s descriptor, opened once (a forked process reads through its parent's:
        positional reads share no file offset; only the opening process closes them)."""
        if i not in self._fds:
            try:
                self._fds[i] = os.open(self.files[i], os.O_RDONLY)
            except OSError as e:
                raise UserError(f"{self.files[i]}: cannot read the layer cache shard "
                                f"({e.strerror or e}); run the cache stage") from None
        return self._fds[i]

    def open_files(self) -> StatesTable:
        """Open every shard file now: what this process reads cannot change or vanish under it
        (store shards are never rewritten; an evicted one stays readable while open)."""
        for i in range(len(self.files)):
            self._fd(i)
        return self

    def check_sums(self, background: bool = False) -> StatesTable:
        """Re-hash every shard file this table reads (sha256, streamed; several files at once:
        hashlib releases the GIL) against the manifest: a shard rewritten with rows, hashes and
        schema intact (negated states) or bit rot reads as valid states otherwise. One
        `UserError` naming the first corrupt file. Opens the files first: what is checked is
        what is read. `background`: hash in a thread while the caller goes on (a train builds
        its model meanwhile); the first `batch` or `read` waits for it, so no row is ever
        served unchecked."""
        self.open_files()
        pool = ThreadPoolExecutor(max(1, min(len(self.files), os.cpu_count() or 1)))
        self._checking = [pool.submit(self._sha256, i) for i in range(len(self.files))]
        pool.shutdown(wait=False)
        if not background:
            self._checked()
        return self

    def _checked(self) -> None:
        """Wait for the shard checks `check_sums` started (if any); `UserError` on a mismatch."""
        if not self._checking:
            return
        expected = {s.file: s.sha256 for s in self.manifest.shards}
        got, self._checking = [f.result() for f in self._checking], []
        for path, digest in zip(self.files, got, strict=True):
            if expected.get(Path(path).name) != digest:
                self._checking = [_failed(path)]  # every later read refuses too
                self._checked()

    def _sha256(self, i: int) -> str:
        """sha256 of shard `i` read through its open descriptor (positional reads)."""
        h, fd, at = hashlib.sha256(), self._fd(i), 0
        while chunk := os.pread(fd, 1 << 22, at):
            h.update(chunk)
            at += len(chunk)
        return h.hexdigest()

    def _read_into(self, out: np.ndarray, rows: np.ndarray) -> None:
        """Row `rows[j]`'s stored values into `out[j, :T]` (out: (B, >= T, H), stored dtype)."""
        for j, r in enumerate(rows.tolist()):
            n = int(self.length_np[r])
            if not n:
                continue
            view = out[j, :n]
            got = os.preadv(self._fd(int(self.file[r])), [view], int(self.start[r]))
            if got != view.nbytes:
                raise UserError(f"{self.files[int(self.file[r])]}: layer cache shard ends "
                                "early (truncated); run `simtune cache verify`")

    def batch(self, rows: torch.Tensor, device: torch.device | str = "cpu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) rows -> float32 states (B, T, H) padded with zeros to the batch's longest text,
        and the attention mask (B, T) (1 = real token), on `device`."""
        self._checked()
        length = self.lengths(rows)
        width = int(length.max()) if len(rows) else 0
        pos = torch.arange(width, device=length.device)
        mask = pos[None, :] < length[:, None]
        if self.flat is None:
            out = np.zeros((len(rows), width, self.hidden), dtype=self.np_dtype)
            self._read_into(out, rows.cpu().numpy())
            states = torch.from_numpy(out).to(device, non_blocking=True).float()
        else:
            assert self.tok is not None
            index = (self.tok[rows.to(self.tok.device)][:, None] + pos[None, :]).masked_fill(
                ~mask, 0)
            states = self.flat[index.reshape(-1)].reshape(len(rows), width, -1)
            states = states.to(device, non_blocking=True).float() * mask.to(device)[..., None]
        return states, mask.to(device=device, dtype=torch.long)

    def read(self, rows: torch.Tensor) -> list[np.ndarray]:
        """The (T_i, H) stored-dtype values of each of `rows` (one read per row)."""
        self._checked()
        out = []
        for r in rows.tolist():
            a = np.empty((1, int(self.length_np[r]), self.hidden), dtype=self.np_dtype)
            if self.flat is None:
                self._read_into(a, np.array([r]))
            else:
                assert self.tok is not None
                t = int(self.tok[r])
                a[0] = self.flat[t:t + a.shape[1]].cpu().numpy()
            out.append(a[0])
        return out

    def to(self, device: torch.device | str) -> StatesTable:
        """The same rows resident on `device`: one flat (sum T_i, H) tensor in row order, read
        `READ_ROWS` rows at a time (a cpu table stays streamed: `resident` makes it resident)."""
        if self.flat is None and torch.device(device).type == "cpu":
            return self
        return self.resident(device)

    def resident(self, device: torch.device | str) -> StatesTable:
        """A copy of this table held whole on `device` (the layout before tables were read
        where they are stored: a flat (sum T_i, H) tensor, gathered per batch)."""
        out = StatesTable(self.directory, self.manifest, self.ids, self.files, self.file,
                          self.start, self.length_np, self.windows)
        total = int(self.length_np.sum())
        dtype = getattr(torch, self.manifest.dtype)
        flat = torch.empty(total, self.hidden, dtype=dtype, device=device)
        tok = torch.from_numpy(np.concatenate([[0], np.cumsum(self.length_np)]))
        for a in range(0, len(self.length_np), READ_ROWS):  # every row: windows, not texts
            rows = torch.arange(a, min(a + READ_ROWS, len(self.length_np)))
            flat[int(tok[a]):int(tok[rows[-1] + 1])] = torch.from_numpy(
                np.concatenate(self.read(rows))).to(device)
        out.flat, out.tok = flat, tok[:-1].to(device)
        out.length = out.length.to(device)
        return out


def _failed(path: Path) -> Future:
    """A finished check whose result is the corrupt-shard error naming `path`."""
    done: Future = Future()
    done.set_exception(UserError(f"{path}: checksum mismatch (corrupted shard); run `simtune "
                                 "cache verify`, then `simtune cache` to repair it"))
    return done


def from_shards(directory: Path, manifest: vectors.Manifest, indexes: list[ShardIndex]
                ) -> StatesTable:
    """A `StatesTable` of every row of the opened shards `indexes`, in shard order."""
    chunks = [x.ids for x in indexes]
    ids = pa.concat_arrays(chunks) if chunks else pa.array([], pa.string())
    file = np.concatenate([np.full(len(x.start), k, np.int32) for k, x in enumerate(indexes)]
                          or [np.empty(0, np.int32)])
    start = np.concatenate([x.start for x in indexes] or [np.empty(0, np.int64)])
    length = np.concatenate([x.length for x in indexes] or [np.empty(0, np.int64)])
    return StatesTable(directory, manifest, ids, [x.path for x in indexes], file, start, length)


def load(directory: Path, fingerprint: str | None = None, checksums: bool = False
         ) -> StatesTable:
    """Open a directory of layer-state shards (a store entry, or a view from before views were
    references), with the checks of `vectors.load`."""
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
    if manifest.shards and manifest.dim is None:
        raise UserError(f"{directory / vectors.MANIFEST}: damaged cache manifest (no dim, but "
                        "shards; a fill was interrupted: run the cache stage)")
    return from_shards(directory, manifest, [ShardIndex(directory, s, manifest)
                                             for s in manifest.shards])
