"""Write outputs so that a failure never leaves a half-written file or directory behind, and
so that two processes never write the same output at once.

Every output is first written under a temporary name next to its destination (same filesystem, so
the final `os.replace` is atomic) and renamed into place only when complete (`new_temp`: made
with the umask's permissions, not mkstemp's 0600, and held under a `flock` until renamed, so the
next write of the same output removes the temps a kill -9 left and never a live one). `locked`
holds an exclusive `flock` on a lock file for a block (the cache fill per store entry and view,
`train` per output): it dies with its process, so a killed run never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield an empty temp directory that replaces `dest` when the block exits without error.

    On error the temp directory is removed and `dest` (old contents, if any) is left untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp(dest, directory=True)
    try:
        with _naming(dest, tmp):  # a file the block writes inside tmp is named inside dest
            yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)
        raise
    try:
        _into_place(dest, tmp)
    finally:
        os.close(fd)  # the temp's flock: held until it is dest (or gone)


def _into_place(dest: Path, tmp: Path) -> None:
    """Rename the finished folder `tmp` to `dest`, the previous `dest` put back on failure."""
    old = None
    try:
        with _naming(dest, tmp):
            if dest.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
                os.replace(dest, old / dest.name)
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not dest.exists():  # put the previous output back
            os.replace(old / dest.name, dest)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _naming(dest: Path, tmp: Path, unnamed: bool = False) -> Iterator[None]:
    """An `OSError` naming the temp path `tmp` (or a path under it, or one starting with its
    name: `mkstemp`'s random suffix) is re-raised naming `dest` instead: the user knows their
    file, not `.params.yaml.tmp-kcyhpwby`, and the stage commands print `error: <filename>:
    <reason>`. With `unnamed` (a block that only writes `dest`), an error naming no file (a
    full disk while writing) names `dest` too."""
    try:
        yield
    except OSError as e:
        renamed = _renamed(e, dest, tmp, unnamed)
        if renamed is e:
            raise
        raise renamed from None


def _renamed(e: OSError, dest: Path, tmp: Path, unnamed: bool) -> OSError:
    name = None if e.filename is None else Path(os.fsdecode(e.filename))
    if name is None:
        if not unnamed:
            return e
        where = dest
    elif name.is_relative_to(tmp):
        where = dest / name.relative_to(tmp)
    elif str(name).startswith(str(tmp)):  # `tmp` is mkstemp's prefix, `name` the whole name
        where = dest
    else:
        return e
    reason = e.strerror or str(e).replace(str(tmp), str(dest))
    out = OSError(e.errno, f"cannot write: {reason}", str(where))
    out.__traceback__ = e.__traceback__
    return out


def lock_file(output: Path) -> Path:
    """The lock file of a stage output: `.<name>.lock` beside it (never inside it: the output
    is replaced whole, and DVC hashes what is inside)."""
    output = Path(output)
    return output.parent / f".{output.name}.lock"


@contextlib.contextmanager
def locked(path: Path, waiting: str | None = None, busy: str | None = None) -> Iterator[None]:
    """Hold an exclusive `flock` on the file `path` (created, with its folder, if needed) for
    the block. If another process holds it: with `busy`, raise `UserError(busy)` at once;
    otherwise log `waiting` (if given) once and wait. The file is never removed (unlinking a
    lock file races with a process about to take it); it holds nothing. Whoever removes it
    (the store's size policy drops a whole entry) holds it while doing so: a process that was
    waiting then finds its lock file gone and takes the new one instead."""
    said = False
    while True:
        fd = _lock_fd(path)
        try:
            said = _flock(fd, busy, None if said else waiting) or said
        except BaseException:
            os.close(fd)
            raise
        if _is_file_at(fd, path):
            break
        os.close(fd)  # locked a removed file: no one else would see this lock
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _lock_fd(path: Path) -> int:
    from simtune.errors import UserError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise UserError(f"{path}: cannot create the lock file: {e.strerror or e}") from None


def _flock(fd: int, busy: str | None, waiting: str | None) -> bool:
    """Take the exclusive flock of `fd`; True when it had to wait (and said `waiting`)."""
    from simtune.errors import UserError

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
    if busy is not None:
        raise UserError(busy) from None
    if waiting:
        logging.getLogger(__name__).info("%s", waiting)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return True


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path` (not removed or replaced)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (mine.st_ino, mine.st_dev)


def is_locked(path: Path) -> bool:
    """Whether another process holds the `flock` of the file `path` right now."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask: read from /proc (Linux), where setting it to read it back would
    let another thread create a file under umask 0 meanwhile."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_pattern(dest: Path, suffix: str = "") -> re.Pattern[str]:
    """The names `new_temp` gives `dest`'s temps: `.NAME.tmp-` + tempfile's 8 random
    characters + `suffix`. Only these are ever removed as stale."""
    return re.compile(rf"\.{re.escape(Path(dest).name)}\.tmp-[a-z0-9_]{{8}}{re.escape(suffix)}")


def remove_stale_temps(dest: Path, suffix: str = "") -> list[Path]:
    """Remove the temps of `dest` (`temp_pattern`) beside it that no process holds: a write
    killed before its rename (kill -9, power loss) left them; a live write holds its temp's
    flock, so it is skipped. Returns what was removed."""
    dest = Path(dest)
    pattern = temp_pattern(dest, suffix)
    try:
        names = [p for p in dest.parent.iterdir() if pattern.fullmatch(p.name)]
    except OSError:  # no folder yet (or unreadable: the write itself will say so)
        return []
    return [p for p in names if _remove_unheld(p)]


def _remove_unheld(path: Path) -> bool:
    """Remove `path` (a file or a folder) if no process holds its flock, holding it meanwhile
    (a writer that locks it after that finds it gone and makes another: `new_temp`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def new_temp(dest: Path, suffix: str = "", directory: bool = False) -> tuple[int, Path]:
    """A new temp file (or, `directory`, folder) beside `dest`, named by `temp_pattern`, with
    the umask's permissions (mkstemp's 0600 would stay on the renamed output), after removing
    the stale ones (`remove_stale_temps`). Returns (fd, path): `fd` holds the temp's flock
    until the caller closes it, after the rename (for a file, `fd` is open for writing). An
    OSError names `dest`, not the temp."""
    dest = Path(dest)
    remove_stale_temps(dest, suffix)
    prefix = f".{dest.name}.tmp-"
    while True:
        with _naming(dest, dest.parent / prefix):
            if directory:
                path = tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=dest.parent)
                fd = os.open(path, os.O_RDONLY)
            else:
                fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=dest.parent)
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a cleaner removes it
        if _is_file_at(fd, Path(path)):
            break
        os.close(fd)  # removed as stale between its creation and the lock: make another
    os.chmod(fd, (0o777 if directory else 0o666) & ~_umask())
    return fd, Path(path)


def write_bytes(dest: Path, data: bytes) -> None:
    """Write `data` to `dest` through a temp file in the same directory, then rename."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp(dest)
    try:
        with _naming(dest, tmp, unnamed=True):
            with os.fdopen(fd, "wb", closefd=False) as f:  # fd keeps the flock to the rename
                f.write(data)
            os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def write_json(dest: Path, obj: Any) -> None:
    """Atomically write `obj` as indented, key-sorted JSON (stable diffs in git)."""
    write_bytes(dest, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_meta(directory: Path, version: int, stage: str, what: str) -> dict[str, Any]:
    """`directory/meta.json` of a stage's output, present and of format `version`; otherwise
    one line naming the directory or file and the stage to run (`what`: what it should hold)."""
    from simtune.errors import UserError

    meta_path = Path(directory) / "meta.json"
    if not meta_path.is_file():
        raise UserError(f"{directory}: no {what} here (run the {stage} stage first)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:  # bad JSON, not UTF-8, unreadable
        raise UserError(f"{meta_path}: unreadable ({e}); run the {stage} stage again") from None
    if not isinstance(meta, dict):
        raise UserError(f"{meta_path}: not a JSON object; run the {stage} stage again")
    if meta.get("format_version") != version:
        raise UserError(f"{meta_path}: format version {meta.get('format_version')}, expected "
                        f"{version}; run the {stage} stage again")
    return meta
