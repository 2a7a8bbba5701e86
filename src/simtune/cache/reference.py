"""Layer views as references: `cache/<encoder>@layer<k>/` names the store rows that hold its
states and holds none of them. Every byte of the states is stored once, in the store entry.

A view holds two small files, the same bytes on any machine for the same data and settings
(stable DVC hashes: a teammate's or a refilled view is the view DVC already has):

- `reference.json`: format version, encoder, the store entry's fingerprint and the description
  it hashes, dtype, hidden size, rows and tokens;
- `rows.arrow`: `text_id` (the workspace's ids, sorted) and `hashes: list<string>`, the content
  hashes of the store rows holding each text's states, in order (one per text today; the
  windows of a long text later).

Reading (`open_view`) resolves the hashes in the store entry (`cache.store`) and reads the
immutable store shards directly (`states.StatesTable`); it opens them at once and a running
train keeps them open, so nothing it reads changes under it, not even an eviction.

The store keeps a *ref* per view, `<root>/refs/<fingerprint>/<key>.json` (key: hash of the
view's path), written by the fill and by each open, dropped once that view names another entry
or is removed: the size policy never drops an entry a live ref names. A ref whose view's folder
is gone altogether (a project moved or renamed: its path is not there) is kept, and said by
`cache gc`, until `cache gc --prune-missing`; the moved view renews its ref at its next open.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from simtune.atomic import atomic_dir, write_bytes, write_json
from simtune.cache import states, store, vectors
from simtune.errors import UserError

log = logging.getLogger(__name__)
REF_FILE, ROWS_FILE, KIND, VERSION = "reference.json", "rows.arrow", "layer-states", 1
REFS = "refs"
REFILL = "run `dvc repro -f -s cache` (or `simtune cache`) to refill it"


@dataclass
class Reference:
    """A layer view: `ids` (N,) workspace text ids, `hashes` (N,) list<string> content hashes
    of its store rows, and the store entry's identity."""

    encoder: str
    fingerprint: str
    description: dict[str, Any]
    dtype: str
    dim: int
    rows: int
    tokens: int
    ids: pa.Array
    hashes: pa.ListArray
    chunks: dict[str, Any] | None = None  # the chunk settings that cut the windows (None: off)


def is_reference(view: Path) -> bool:
    return (Path(view) / REF_FILE).is_file()


def read(view: Path) -> Reference | None:
    """The reference a layer view holds, or None when it holds none; a damaged one is a
    `UserError` naming the file."""
    path = Path(view) / REF_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
        if meta.get("kind") != KIND or meta.get("format_version") != VERSION:
            raise ValueError(f"kind {meta.get('kind')!r}, version {meta.get('format_version')!r}")
        table = pa.ipc.open_file(pa.memory_map(str(Path(view) / ROWS_FILE))).read_all()
        ids = table.column("text_id").combine_chunks()
        hashes = table.column("hashes").combine_chunks()
        if not pa.types.is_list(hashes.type) or len(ids) != meta["rows"] or ids.null_count:
            raise ValueError(f"{ROWS_FILE} holds {len(ids)} rows of {table.schema}")
        fields = {k: meta[k] for k in ("encoder", "fingerprint", "description", "dtype", "dim",
                                       "rows", "tokens")}
        fields["chunks"] = meta.get("chunks")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pa.ArrowException) as e:
        raise UserError(f"{path}: damaged layer view ({str(e)[:200]}); {REFILL}") from None
    return Reference(**fields, ids=ids, hashes=hashes)


def write(view: Path, entry: Path, manifest: vectors.Manifest, ids: dict[str, list[str]],
          store_root: Path, chunks: dict[str, Any] | None = None) -> None:
    """Replace `view` (atomically) by a reference to the rows of `ids` (workspace id ->
    content hashes of its windows, cut by the `chunks` settings) in store entry `entry`,
    sorted by id, and register it in the store. Every hash must be in the entry."""
    keys = sorted(ids)
    hashes = pa.array([ids[k] for k in keys], pa.list_(pa.string()))
    table = _resolve(entry, manifest, pa.array(keys, pa.string()), hashes, view)
    rows = pa.table({"text_id": pa.array(keys, pa.string()), "hashes": hashes})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, rows.schema) as writer:
        writer.write_table(rows)
    with atomic_dir(view) as tmp:
        write_bytes(tmp / ROWS_FILE, sink.getvalue().to_pybytes())
        write_json(tmp / REF_FILE, {
            "format_version": VERSION, "kind": KIND, "encoder": manifest.encoder,
            "fingerprint": manifest.fingerprint, "description": manifest.description,
            "dtype": manifest.dtype, "dim": manifest.dim, "rows": len(keys),
            "tokens": int(table.length_np.sum()), **({"chunks": chunks} if chunks else {})})
    register(store_root, view, manifest.fingerprint)


def open_view(view: Path, store_root: Path, fingerprint: str | None = None,
              checksums: bool = True) -> states.StatesTable:
    """The states of a layer view, read from the store entry it names (`states.StatesTable`,
    streamed). Its fingerprint must be `fingerprint` (the current settings), the entry present
    with every row, and (`checksums`) every store shard it reads intact (sha256, hashed in the
    background from the open on; the first batch read waits for it: `StatesTable.check_sums`);
    otherwise a one-line `UserError` saying what to run. Registers the ref."""
    ref = read(view)
    if ref is None:
        raise UserError(f"{view}: no layer cache here (run the cache stage)")
    if fingerprint is not None and ref.fingerprint != fingerprint:
        raise UserError(f"{Path(view) / REF_FILE}: layer cache fingerprint does not match the "
                        "current encoder settings; run the cache stage")
    entry = store.fingerprint_dir(store_root, ref.fingerprint)
    with contextlib.suppress(OSError):  # first: no eviction between resolving and opening
        register(store_root, view, ref.fingerprint)
        store.touch_used(entry)
    manifest = _entry_manifest(view, entry)
    table = _resolve(entry, manifest, ref.ids, ref.hashes, view)
    if (manifest.dtype, manifest.dim) != (ref.dtype, ref.dim):
        raise UserError(f"{entry}: holds {manifest.dtype} states of width {manifest.dim}, the "
                        f"view {view} says {ref.dtype}, {ref.dim}; {REFILL}")
    return table.check_sums(background=True) if checksums else table.open_files()


def _entry_manifest(view: Path, entry: Path) -> vectors.Manifest:
    try:
        manifest = vectors.read_manifest(entry)
    except UserError as e:
        raise UserError(f"{e}; {view} names it: {REFILL}") from None
    if manifest is None:
        raise UserError(f"{view}: its layer states (store entry {entry.name}) are not in this "
                        f"machine's store {entry.parent.parent}; {REFILL}")
    return manifest


def _resolve(entry: Path, manifest: vectors.Manifest, ids: pa.Array, hashes: pa.ListArray,
             view: Path) -> states.StatesTable:
    """The table of `ids`: text i's windows are the store rows of content hashes `hashes[i]`
    (one for a text that fits), read in that order (`StatesTable.window_rows`)."""
    counts = pc.list_value_length(hashes).to_numpy(zero_copy_only=False).astype(np.int64)
    windows = (np.concatenate([[0], np.cumsum(counts)]) if len(counts) and (counts != 1).any()
               else None)
    wanted = pc.list_flatten(hashes)
    indexes = []
    for s in manifest.shards:
        try:
            indexes.append(states.ShardIndex(entry, s, manifest))
        except UserError as e:
            raise UserError(f"{e}; {view} reads it: {REFILL}") from None
    have = pa.concat_arrays([x.hashes for x in indexes]) if indexes else pa.array([], pa.string())
    pos = pc.index_in(wanted, value_set=have)
    if pos.null_count:
        raise UserError(f"{view}: {pos.null_count} of its {len(ids)} texts' states are not in "
                        f"store entry {entry}; {REFILL}")
    at = pos.to_numpy().astype(np.int64)
    file = np.concatenate([np.full(len(x.start), k, np.int32) for k, x in enumerate(indexes)]
                          or [np.empty(0, np.int32)])[at]
    start = np.concatenate([x.start for x in indexes] or [np.empty(0, np.int64)])[at]
    length = np.concatenate([x.length for x in indexes] or [np.empty(0, np.int64)])[at]
    used, file = np.unique(file, return_inverse=True)  # the shards this view reads, alone
    return states.StatesTable(Path(view), manifest, ids, [indexes[k].path for k in used],
                              file.astype(np.int32), start, length, windows)


def view_key(view: Path) -> str:
    return hashlib.blake2b(str(Path(view).resolve()).encode(), digest_size=8).hexdigest()


def register(store_root: Path, view: Path, fingerprint: str) -> None:
    """Record that `view` uses store entry `fingerprint`; drop its refs to any other."""
    key = view_key(view)
    base = Path(store_root) / REFS
    for old in base.glob(f"*/{key}.json"):
        if old.parent.name != fingerprint:
            old.unlink(missing_ok=True)
    path = base / fingerprint / f"{key}.json"
    if not path.is_file():
        write_json(path, {"view": str(Path(view).resolve())})


def unregister(store_root: Path, view: Path) -> None:
    """Drop the refs of `view` (it is being removed), and the ref folders left empty."""
    for old in (Path(store_root) / REFS).glob(f"*/{view_key(view)}.json"):
        old.unlink(missing_ok=True)
    prune_empty(store_root)


def prune_empty(store_root: Path) -> None:
    """Remove the ref folders `<root>/refs/<fingerprint>/` that hold no ref any more."""
    for folder in (Path(store_root) / REFS).glob("*/"):
        with contextlib.suppress(OSError):  # not empty (a ref written meanwhile): kept
            folder.rmdir()


def _ref_state(path: Path) -> tuple[Path | None, str]:
    """(the view a ref names, its state): `live` (it names the ref's entry), `missing` (its
    folder's folder is gone: the project was moved, renamed or deleted; nothing here tells
    which), `gone` (removed from a folder that is still there, or names another entry)."""
    try:
        view = Path(json.loads(path.read_text())["view"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, "gone"
    try:  # the view's reference.json alone: which entry it names
        alive = json.loads((view / REF_FILE).read_text())["fingerprint"] == path.parent.name
    except (OSError, ValueError, KeyError, TypeError):
        alive = False
    if alive:
        return view, "live"
    return view, "missing" if not view.parent.exists() else "gone"


def missing(store_root: Path) -> list[tuple[Path, str]]:
    """(view, fingerprint) of every ref whose view's folder is gone (`_ref_state`)."""
    out = []
    for path in sorted((Path(store_root) / REFS).glob("*/*.json")):
        view, state = _ref_state(path)
        if state == "missing" and view is not None:
            out.append((view, path.parent.name))
    return out


def in_use(store_root: Path, prune: bool = True, prune_missing: bool = False) -> set[str]:
    """Fingerprints some view references: a ref whose view still names its entry, or whose
    view's folder is gone (a project moved or renamed keeps its layer states: its ref is
    renewed at its next open) unless `prune_missing`. Refs of views removed or moved on to
    other settings are removed (`prune`), and so are missing ones with `prune_missing`."""
    live = set()
    for path in sorted((Path(store_root) / REFS).glob("*/*.json")):
        _, state = _ref_state(path)
        if state == "live" or (state == "missing" and not prune_missing):
            live.add(path.parent.name)
        elif prune:
            path.unlink(missing_ok=True)
    if prune:
        prune_empty(store_root)
    return live


def verify(view: Path, store_root: Path, fingerprint: str | None) -> tuple[int, list[str]]:
    """(rows, problems) of a layer view: the reference readable, naming `fingerprint` (when
    given), every row in the store entry, and the entry's shards holding them re-hashed."""
    try:
        ref = read(view)
        if ref is None:
            return 0, [f"{view}: no layer view here"]
        problems = []
        if fingerprint is not None and ref.fingerprint != fingerprint:
            problems.append(f"{Path(view) / REF_FILE}: filled with other encoder settings")
        wanted = set(pc.list_flatten(ref.hashes).to_pylist())
        problems += store.check_behind(store_root, ref, wanted)  # type: ignore[arg-type]
        if not problems:  # the shards were just re-hashed: not twice
            open_view(view, store_root, checksums=False)
    except UserError as e:
        return 0, [str(e)]
    return ref.rows, problems
