"""The machine-wide shared store: every vector ever computed, keyed by fingerprint and content.

Layout (root: `cache.store`, or `$SIMTUNE_STORE` when set):

    <root>/vectors/<fingerprint>/   one directory per encoder fingerprint, in the shard format of
                                    `simtune.cache.vectors`, keyed by *content hash* (never by a
                                    user key, so every workspace and data set can share it)
        manifest.json, shard-*.arrow
        journal-r<rank>.json        only while a fill runs (a killed fill's shards are adopted)
        .lock                       held (flock) by the one process filling this fingerprint
        .verified.json              shards whose sha256 was checked, by (size, mtime, inode)
        .used                       touched on every use: the clock of the size policy
        onnx/model.onnx             `cache.backend: onnx` only: the encoder's export

Fingerprints live side by side, so switching a setting back and forth re-embeds nothing. Shards
are immutable once listed; a shard whose checksum fails is dropped (with a warning naming it)
and its rows are embedded again. The size policy evicts whole fingerprints, least recently used
first, never one in use (`evict`, run after each fill and by `simtune cache gc`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simtune.atomic import write_json
from simtune.cache import vectors
from simtune.errors import UserError

log = logging.getLogger("simtune.shared")
ENV = "SIMTUNE_STORE"
_VERIFIED, _USED, _LOCK = ".verified.json", ".used", ".lock"


def root(configured: str) -> Path:
    """The store root: `$SIMTUNE_STORE` if set (per machine or per test run), else the
    `cache.store` param, with `~` expanded."""
    return Path(os.environ.get(ENV) or configured).expanduser()


def fingerprint_dir(store_root: Path, fp: str) -> Path:
    return Path(store_root) / "vectors" / fp


@contextlib.contextmanager
def locked(directory: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `directory` (created if needed) for the block. Another process
    holding it makes this one wait, saying so once; the lock dies with its process (flock)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise UserError(f"{directory}: cannot use the shared cache store: "
                        f"{e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            log.info("%s: waiting for another process filling the same store entry", what)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def touch_used(directory: Path) -> None:
    with contextlib.suppress(OSError):
        (directory / _USED).write_text(f"{time.time():.0f}\n")


def last_used(directory: Path) -> float:
    for p in (directory / _USED, directory / vectors.MANIFEST):
        with contextlib.suppress(OSError):
            return p.stat().st_mtime
    return 0.0


def begin_fill(directory: Path, encoder: str, fingerprint: str, description: dict[str, Any],
               dtype: str) -> vectors.Manifest:
    """Make a store directory ready for a fill under `fingerprint` (rank 0, lock held).

    Adopts the journaled shards of an interrupted fill, drops shards that fail their checks
    (warning naming each), and removes files belonging to nothing (temp files, unjournaled
    shards). Returns the manifest, written."""
    try:
        manifest = vectors.read_manifest(directory)
    except UserError as e:
        log.warning("%s; starting this store entry afresh", e)
        manifest = None
    if manifest is not None and manifest.fingerprint != fingerprint:
        log.warning("%s: holds fingerprint %s, expected %s; starting it afresh",
                    directory / vectors.MANIFEST, manifest.fingerprint, fingerprint)
        manifest = None
    if manifest is None:
        manifest = vectors.Manifest(encoder, fingerprint, description, dtype)
    adopted = _adopt_journals(directory, manifest)
    if adopted:
        log.info("cache %s: kept %d shards of an interrupted fill", encoder, adopted)
    _drop_bad_shards(directory, manifest)
    keep = {s.file for s in manifest.shards} | {vectors.MANIFEST, _VERIFIED, _USED, _LOCK}
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


def _drop_bad_shards(directory: Path, manifest: vectors.Manifest) -> None:
    """Check each shard once (sha256, rows, schema), remembering good ones by (size, mtime,
    inode) so an unchanged shard is not re-hashed on every fill; drop the bad ones."""
    memo_path = directory / _VERIFIED
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    good, fresh_memo = [], {}
    for s in manifest.shards:
        path = directory / s.file
        try:
            st = path.stat()
            stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        except OSError:
            stamp = None
        if stamp is not None and memo.get(s.file) == stamp:
            good.append(s)
            fresh_memo[s.file] = stamp
            continue
        problem = _check(directory, s, manifest)
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


def _check(directory: Path, shard: vectors.Shard, manifest: vectors.Manifest) -> str | None:
    """The problem with one shard, or None if it is intact."""
    path = directory / shard.file
    try:
        if path.is_file() and vectors.sha256_of(path) != shard.sha256:
            return f"{path}: checksum mismatch (corrupted shard)"
        vectors.open_shard(directory, shard, manifest)
    except UserError as e:
        return str(e)
    except OSError as e:
        return f"{path}: unreadable cache shard: {e.strerror or e}"
    return None


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


@dataclass
class Entry:
    """One fingerprint directory of the store, for the size policy and `cache gc`."""

    path: Path
    fingerprint: str
    encoder: str
    rows: int
    bytes: int
    last_used: float


def entries(store_root: Path) -> list[Entry]:
    """Every fingerprint directory of the store, least recently used first."""
    out = []
    base = Path(store_root) / "vectors"
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if not d.is_dir():
            continue
        try:
            manifest = vectors.read_manifest(d)
        except UserError:
            manifest = None
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())  # ONNX export too
        out.append(Entry(d, d.name, manifest.encoder if manifest else "?",
                         manifest.rows if manifest else 0, size, last_used(d)))
    return sorted(out, key=lambda e: (e.last_used, e.fingerprint))


def evict(store_root: Path, max_bytes: int, keep: set[str], dry_run: bool = False
          ) -> list[Entry]:
    """Drop least-recently-used fingerprints (never those in `keep`, never one being filled)
    until the store holds at most `max_bytes`. Returns what was (or would be) dropped."""
    found = entries(store_root)
    total = sum(e.bytes for e in found)
    dropped = []
    for e in found:
        if total <= max_bytes:
            break
        if e.fingerprint in keep or _busy(e.path):
            continue
        if not dry_run:
            shutil.rmtree(e.path, ignore_errors=True)
        log.info("store: %s %s (%s, %d rows, %.1f MB, last used %s)",
                 "would drop" if dry_run else "dropped", e.fingerprint, e.encoder, e.rows,
                 e.bytes / 1e6, time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)))
        total -= e.bytes
        dropped.append(e)
    return dropped


def _busy(directory: Path) -> bool:
    """Whether another process holds the fill lock of `directory` right now."""
    try:
        fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
