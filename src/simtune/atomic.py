"""Write outputs so that a failure never leaves a half-written file or directory behind.

Every output is first written under a temporary name next to its destination (same filesystem, so
the final `os.replace` is atomic) and renamed into place only when complete.
"""

from __future__ import annotations

import contextlib
import json
import os
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; outputs get the usual permissions
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, old / dest.name)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(dest: Path, data: bytes) -> None:
    """Write `data` to `dest` through a temp file in the same directory, then rename."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") != version:
        raise UserError(f"{meta_path}: format version {meta.get('format_version')}, expected "
                        f"{version}; run the {stage} stage again")
    return meta
