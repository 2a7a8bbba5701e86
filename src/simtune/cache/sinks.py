"""Where a fill's computed rows go: one `Sink` per store entry being filled, and `compute`, the
one encoder forward pass that feeds every sink of a batch.

A top_layers fill fills two store entries at once, the pooled vectors and the token states
after layer k, from the same forward pass over each batch (`FrozenEncoder.embed_states`): one
encoder pass yields everything the mode caches. Each sink keeps only the rows its entry lacks
(`wanted`), buffers them and writes store shards of at most `shard_rows` rows (or
`SHARD_BYTES`: layer states are large, memory stays bounded), journaled for a resumable fill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune.cache import formats, store, vectors
from simtune.cache.formats import Format
from simtune.encoders import unpad

SHARD_BYTES = 256 << 20


class Sink:
    """The rows one store entry (`directory`, under `manifest`) lacks, as `fmt` rows; rank
    `rank` writes its own shards and journal."""

    def __init__(self, fmt: Format, directory: Path, manifest: vectors.Manifest, rank: int,
                 wanted: set[str], shard_rows: int) -> None:
        self.fmt, self.directory, self.manifest, self.rank = fmt, directory, manifest, rank
        self.wanted, self.shard_rows = wanted, shard_rows
        self.journal = store.Journal(directory, rank, manifest.fingerprint)
        self.ids: list[str] = []
        self.buf: list[formats.Rows] = []
        self.held = 0  # bytes buffered
        self.count = 0  # rows this rank computed for the entry

    def add(self, hashes: Sequence[str], rows: formats.Rows) -> None:
        """Buffer the rows of `hashes` (content hashes, in the order of `rows`) this entry
        wants, writing full shards as they fill."""
        take = [i for i, h in enumerate(hashes) if h in self.wanted]
        if not take:
            return
        rows = rows if len(take) == len(hashes) else formats.take(rows, take)
        self.buf.append(rows)
        self.held += self.fmt.nbytes(rows)
        self.ids.extend(hashes[i] for i in take)
        self.count += len(take)
        while len(self.ids) >= self.shard_rows:
            self.flush(self.shard_rows)
        if self.held >= SHARD_BYTES:
            self.flush(len(self.ids))

    def flush(self, rows: int | None = None) -> None:
        """Write the first `rows` (default: all) buffered rows as one shard; keep the rest."""
        rows = len(self.ids) if rows is None else rows
        if not rows:
            return
        head, rest = formats.split(formats.cat(self.buf), rows)
        ids = self.ids[:rows]  # store rows are keyed by their content hash
        self.journal.add(self.fmt.write(self.directory, self.rank, ids, ids, head,
                                        self.manifest))
        del self.ids[:rows]
        self.buf = [rest]
        self.held = self.fmt.nbytes(rest)


def compute(encoder: Any, batch: dict[str, torch.Tensor], fmts: Sequence[Format]
            ) -> list[formats.Rows]:
    """The rows of each of `fmts` for one tokenised batch, from ONE forward pass: pooled
    vectors (n, D) float32 and/or each text's (T_i, H) float32 token states after layer k.
    At most one layer format."""
    return launch(encoder, batch, fmts)()


def launch(encoder: Any, batch: dict[str, torch.Tensor], fmts: Sequence[Format]
           ) -> Callable[[], list[formats.Rows]]:
    """Start `compute`'s forward pass and return what finishes it. On a GPU nothing waits
    here: the caller launches the next batch before it finishes this one (`batching.lagged`),
    so the GPU runs batch i + 1 while the host copies back and writes batch i's rows."""
    layers = [f.layer for f in fmts if f.layer is not None]
    if not layers:
        vectors = _to_host(encoder.embed(batch))
        return lambda: [vectors() for _ in fmts]
    (layer,) = layers
    want_vectors = len(fmts) > 1
    pooled, hidden, mask = encoder.forward_states(batch, layer, vectors=want_vectors)
    parts = [_to_host(t) for t in (hidden, mask, *([pooled] if want_vectors else []))]

    def finish() -> list[formats.Rows]:
        host = [part() for part in parts]
        states = unpad(host[0], host[1])
        return [states if f.layer is not None else host[2] for f in fmts]
    return finish


def _to_host(t: torch.Tensor) -> Callable[[], np.ndarray]:
    """`t` as a host array, read on call. From a GPU the copy runs on a side stream after this
    batch's forward only, so reading batch i does not wait for batch i + 1, queued behind it.
    Into pageable memory: the copy blocks this thread, not the GPU's queue."""
    if t.device.type != "cuda":
        array = t.numpy()
        return lambda: array
    done = torch.cuda.Event()
    done.record()

    def read() -> np.ndarray:
        side = _side_stream(t.device)
        side.wait_event(done)
        with torch.cuda.stream(side):
            return t.cpu().numpy()
    return read


_SIDE: dict[torch.device, Any] = {}


def _side_stream(device: torch.device) -> Any:
    if device not in _SIDE:
        _SIDE[device] = torch.cuda.Stream(device)
    return _SIDE[device]
