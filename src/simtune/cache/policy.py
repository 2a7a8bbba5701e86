"""The shared store's size policy: least recently used entries go first, never one in use by
the current params or referenced by a workspace's layer view (`reference.in_use`), never one
being filled, never anything under `<root>/vectors/` that is not a
store entry (a real directory holding a valid manifest of the fingerprint it is named after),
never through a symlink. Run after each fill (`cache.store_max_gb`) and by `simtune cache gc`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from simtune import atomic
from simtune.cache import reference, store, vectors
from simtune.errors import UserError

log = logging.getLogger(__name__)


def last_used(directory: Path) -> float:
    for p in (directory / store.USED, directory / vectors.MANIFEST):
        with contextlib.suppress(OSError):
            return p.stat().st_mtime
    return 0.0


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
    """Every store entry, least recently used first: a real directory (not a symlink) under
    `<root>/vectors/` holding a valid manifest of the fingerprint it is named after. Anything
    else there is not ours: see `skipped`."""
    out = []
    for d, manifest in _scan(store_root):
        if manifest is not None:
            out.append(Entry(d, d.name, manifest.encoder, manifest.rows, _size(d), last_used(d)))
    return sorted(out, key=lambda e: (e.last_used, e.fingerprint))


def skipped(store_root: Path) -> list[tuple[Path, str]]:
    """(path, why) of everything under `<root>/vectors/` that is not a store entry: the size
    policy and `cache gc` never touch it."""
    out = []
    for d, manifest in _scan(store_root):
        if manifest is None:
            out.append((d, "a symlink, not followed" if d.is_symlink() else
                        "not a store entry (no valid manifest of this fingerprint)"))
    return out


def _scan(store_root: Path) -> list[tuple[Path, vectors.Manifest | None]]:
    """Each thing under `<root>/vectors/` with its manifest, or None if it is not an entry."""
    base = Path(store_root) / "vectors"
    out: list[tuple[Path, vectors.Manifest | None]] = []
    for d in sorted(base.iterdir()) if base.is_dir() and not base.is_symlink() else []:
        manifest = None
        if d.is_dir() and not d.is_symlink():
            try:
                manifest = vectors.read_manifest(d)
            except UserError:
                manifest = None
            if manifest is not None and manifest.fingerprint != d.name:
                manifest = None
        out.append((d, manifest))
    return out


def entry_bytes(directory: Path) -> int:
    """Bytes a store entry holds on disk (`_size`)."""
    return _size(directory)


def _size(directory: Path) -> int:
    """Bytes of the regular files under `directory` (ONNX export too), links not followed."""
    total = 0
    for parent, _, files in os.walk(directory, followlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(parent, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def _remove(entry: Path) -> bool:
    """Remove the store entry `entry` holding its lock (a fill that took it since `evict`
    looked is left alone; one waiting for it then takes a new lock file, `atomic.locked`, in
    the folder it makes again). False when it is in use or could not all be removed."""
    try:
        with atomic.locked(entry / store.LOCK, busy="in use"):
            shutil.rmtree(entry, ignore_errors=True)
    except UserError:
        return False
    if entry.exists():
        log.warning("store: could not remove all of %s", entry)
        return False
    return True


def evict(store_root: Path, max_bytes: int, keep: set[str], dry_run: bool = False,
          prune_missing: bool = False) -> list[Entry]:
    """Drop least-recently-used store entries (never those in `keep`, never one being filled,
    never anything but an entry: `entries`, never one a layer view references, nor one whose
    view's folder is missing unless `prune_missing`: `reference.in_use`) until the store holds
    at most `max_bytes`. Returns what was (or would be) dropped."""
    found = entries(store_root)
    total = sum(e.bytes for e in found)
    keep = keep | reference.in_use(store_root, prune=not dry_run,  # what layer views read
                                   prune_missing=prune_missing)
    dropped = []
    for e in found:
        if total <= max_bytes:
            break
        if e.fingerprint in keep or atomic.is_locked(e.path / store.LOCK):
            continue
        if not dry_run and not _remove(e.path):
            continue
        log.info("store: %s %s (%s, %d rows, %.1f MB, last used %s)",
                 "would drop" if dry_run else "dropped", e.fingerprint, e.encoder, e.rows,
                 e.bytes / 1e6, time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)))
        total -= e.bytes
        dropped.append(e)
    return dropped
