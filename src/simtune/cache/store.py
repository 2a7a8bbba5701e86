"""The machine-wide shared store: every vector ever computed, keyed by fingerprint and content.

Layout (root: `cache.store`, or `$SIMTUNE_STORE` when set):

    <root>/vectors/<fingerprint>/  one directory per encoder fingerprint, in the
                                   shard format of `simtune.cache.vectors`, keyed
                                   by *content hash* (never by a user key, so
                                   every workspace and data set can share it)
        manifest.json, shard-*.arrow
        journal-r<rank>.json       only while a fill runs (a killed fill's shards
                                   are adopted)
        .lock                      held (flock) by the one process filling this
                                   fingerprint
        .verified.json             shards whose sha256 was checked, by (size,
                                   mtime, inode, sha256); shards copied into a
                                   view are re-hashed anyway
        .used                      touched on every use: the clock of the size
                                   policy
        onnx/model.onnx            `cache.backend: onnx` only: the encoder's export
    <root>/refs/<fingerprint>/<key>.json
                                   a workspace layer view referencing that entry
                                   (its states are read from the store:
                                   `simtune.cache.reference`)
    <root>/speed.json              this machine's top-layers seconds per token, per
                                   model, layers, device and torch version
                                   (`train.auto.max_minutes`: `simtune.cache.budget`)

Fingerprints live side by side, so switching a setting back and forth re-embeds nothing. Shards
are immutable once listed; a shard whose checksum fails is dropped (with a warning naming it)
and its rows are embedded again. The size policy evicts whole fingerprints, least recently used
first, never one in use by the current params or referenced by a live view
(`simtune.cache.policy`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simtune import atomic
from simtune.atomic import write_json
from simtune.cache import vectors
from simtune.errors import UserError

log = logging.getLogger(__name__)
ENV = "SIMTUNE_STORE"
_VERIFIED, USED, LOCK = ".verified.json", ".used", ".lock"


def root(configured: str) -> Path:
    """The store root: `$SIMTUNE_STORE` if set (per machine or per test run), else the
    `cache.store` param, with `~` expanded. `UserError` when it, or the first of its parents
    that exists, is not a folder (a regular file there: every fill, verify and gc would
    otherwise fail or find nothing deep inside it)."""
    path = Path(os.environ.get(ENV) or configured).expanduser()
    setting = f"${ENV}" if os.environ.get(ENV) else "cache.store"
    for p in (path, *path.parents):
        if p.exists():  # symlinks followed: a link to a folder is a folder
            if not p.is_dir():
                which = setting if p == path else f"{setting} is {path}"
                raise UserError(f"{p}: not a folder, so it cannot hold the shared cache store "
                                f"({which})")
            break
    return path


def fingerprint_dir(store_root: Path, fp: str) -> Path:
    return Path(store_root) / "vectors" / fp


@contextlib.contextmanager
def locked(directory: Path, what: str) -> Iterator[None]:
    """Hold the exclusive lock of `directory` (created if needed) for the block: another
    process holding it makes this one wait, saying so once (`simtune.atomic.locked`)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{directory}: cannot use the shared cache store: "
                        f"{e.strerror or e}") from None
    with atomic.locked(directory / LOCK, waiting=f"{what}: waiting for another process "
                       "filling the same store entry"):
        yield


def touch_used(directory: Path) -> None:
    with contextlib.suppress(OSError):
        (directory / USED).write_text(f"{time.time():.0f}\n")


def begin_fill(directory: Path, encoder: str, fingerprint: str, description: dict[str, Any],
               dtype: str, needed: set[str] | frozenset[str] = frozenset()) -> vectors.Manifest:
    """Make a store directory ready for a fill under `fingerprint` (rank 0, lock held).

    Adopts the journaled shards of an interrupted fill, drops shards that fail their checks
    (warning naming each; `needed`: content hashes about to be copied into a view, whose shards
    are always re-hashed), and removes files belonging to nothing (temp files, unjournaled
    shards). A manifest off its schema, or saying other settings than `fingerprint`,
    `description`, `dtype`, is started afresh. Returns the manifest, written."""
    try:
        manifest = vectors.read_manifest(directory)
    except UserError as e:
        log.warning("%s; starting this store entry afresh", e)
        manifest = None
    if manifest is not None and (manifest.fingerprint, manifest.description, manifest.dtype) != (
            fingerprint, description, dtype):
        log.warning("%s: holds fingerprint %s (%s), expected %s (%s); starting it afresh",
                    directory / vectors.MANIFEST, manifest.fingerprint, manifest.dtype,
                    fingerprint, dtype)
        manifest = None
    if manifest is None:
        manifest = vectors.Manifest(encoder, fingerprint, description, dtype)
    adopted = _adopt_journals(directory, manifest)
    if adopted:
        log.info("cache %s: kept %d shards of an interrupted fill", encoder, adopted)
    _drop_bad_shards(directory, manifest, needed)
    if not manifest.shards:
        manifest.dim = None  # taken from the next shards written (a dim they disagreed with)
    keep = {s.file for s in manifest.shards} | {vectors.MANIFEST, _VERIFIED, USED, LOCK}
    for p in directory.iterdir():
        if p.is_file() and p.name not in keep:
            p.unlink()
    vectors.write_manifest(directory, manifest)
    return manifest


def _adopt_journals(directory: Path, manifest: vectors.Manifest) -> int:
    """Add the journaled shards that exist with the journaled size to `manifest`."""
    known = {s.file for s in manifest.shards}
    adopted = 0
    for path in sorted(directory.glob("journal-r*.json")):
        try:
            journal = json.loads(path.read_text())
            shards = [vectors.Shard(**d) for d in journal.get("shards", [])]
        except (ValueError, TypeError):
            continue
        if journal.get("fingerprint") != manifest.fingerprint:
            continue
        for s in shards:
            f = directory / s.file
            if (vectors.valid_shard_name(s.file) and s.file not in known and f.is_file()
                    and f.stat().st_size == s.bytes):
                manifest.shards.append(s)
                known.add(s.file)
                adopted += 1
    return adopted


def _drop_bad_shards(directory: Path, manifest: vectors.Manifest,
                     needed: set[str] | frozenset[str]) -> None:
    """Check each shard against the manifest (size, rows, schema, dim, dtype: cheap, the file
    is mapped) and its sha256; drop the bad ones. The sha256 of a good shard is remembered by
    (size, mtime, inode, sha256) so an unchanged shard is not re-hashed on every fill, except
    a shard holding `needed` rows: what goes into a view is always re-hashed (bit rot keeps
    size and mtime)."""
    memo_path = directory / _VERIFIED
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    good, fresh_memo = [], {}
    for s in manifest.shards:
        path = directory / s.file
        try:
            st = path.lstat()
            stamp = [st.st_size, st.st_mtime_ns, st.st_ino, s.sha256]
        except OSError:
            stamp = None
        problem = _check(directory, s, manifest, memo.get(s.file) == stamp, needed)
        if problem:
            log.warning("%s; dropping its %d rows from the store, they will be embedded again",
                        problem, s.rows)
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        good.append(s)
        fresh_memo[s.file] = stamp
    manifest.shards = good
    write_json(memo_path, fresh_memo)


def _check(directory: Path, shard: vectors.Shard, manifest: vectors.Manifest,
           hashed: bool = False, wanted: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The problem with one shard, or None if it is intact. `hashed`: its sha256 was checked
    before and it has not changed since, so it is re-hashed only if it holds `wanted` rows
    (content hashes)."""
    path = directory / shard.file
    try:
        if path.is_symlink() or not path.is_file():
            return f"{path}: cache shard listed in the manifest is missing (or not a file)"
        if not hashed and vectors.sha256_of(path) != shard.sha256:
            return f"{path}: checksum mismatch (corrupted shard)"
        table = vectors.open_shard(directory, shard, manifest)
        copied = bool(wanted) and not wanted.isdisjoint(table.column("text_hash").to_pylist())
        if hashed and copied and vectors.sha256_of(path) != shard.sha256:
            return f"{path}: checksum mismatch (corrupted shard)"
    except UserError as e:
        return str(e)
    except OSError as e:
        return f"{path}: unreadable cache shard: {e.strerror or e}"
    return None


REPAIR = ("run `simtune cache` to repair it: the fill drops the bad store shard and takes its rows "
          "back from the view, or embeds them again")


def check_behind(store_root: Path, view_manifest: vectors.Manifest, hashes: set[str]
                 ) -> list[str]:
    """Problems of the store shards a view was copied from: every shard of its store entry
    holding one of the view's content `hashes` is re-hashed (sha256, no memo); an unreadable
    one counts too. [] when intact, or when this machine's store has no such entry. A view of
    chunked texts names its windows' hashes: its entry is the one of its settings less the
    chunk settings (`encoders.window_level`)."""
    from simtune.encoders import fingerprint, window_level

    entry = fingerprint_dir(store_root, fingerprint(window_level(view_manifest.description)))
    try:
        manifest = vectors.read_manifest(entry)
    except UserError as e:
        return [f"{e}; {REPAIR}"]
    if manifest is None:
        return []
    return [f"{problem}; {REPAIR}" for s in manifest.shards
            if (problem := _check(entry, s, manifest, hashed=True, wanted=hashes))]


class Journal:
    """The shards one rank has completed in the running fill (atomically rewritten)."""

    def __init__(self, directory: Path, rank: int, fingerprint: str) -> None:
        self.path = Path(directory) / f"journal-r{rank}.json"
        self.fingerprint, self.shards = fingerprint, []

    def add(self, shard: vectors.Shard) -> None:
        self.shards.append(shard)
        try:
            write_json(self.path, {"fingerprint": self.fingerprint,
                                   "shards": [asdict(s) for s in self.shards]})
        except OSError as e:
            raise UserError(f"{self.path}: cannot write fill journal: {e.strerror or e}") from None


def finish_fill(directory: Path) -> vectors.Manifest:
    """Fold every rank's journal into the manifest and remove the journals (rank 0, at the end).
    The dim comes from the shards themselves, whichever rank wrote them."""
    manifest = vectors.read_manifest(directory)
    assert manifest is not None, "begin_fill() writes the manifest first"
    _adopt_journals(directory, manifest)
    if manifest.dim is None and manifest.shards:
        manifest.dim = vectors.shard_dim(directory / manifest.shards[0].file)
    vectors.write_manifest(directory, manifest)
    for path in directory.glob("journal-r*.json"):
        path.unlink()
    touch_used(directory)
    return manifest
