"""Where `simtune export --out DIR` may write: never over what a user owns.

The export replaces its folder whole (`simtune.atomic.atomic_dir`), so the folder must be new,
empty, or itself a simtune export: its `simtune.json` reads as one (a model's `ExportConfig` or a
static student's `StaticConfig`: either kind replaces the other, so the pipeline's
`models/export` follows a change of `train.mode`) and it holds nothing but the files that export
wrote (its `files`, at every depth: a user's file inside
`encoder/` or a module folder counts). Anything else is refused in one line naming the folder
and the first such file, before any work; an export written before `files` is refused too. A
link is written through (the folder it leads to is replaced, the link stays); a link to
nothing, to a file, or a loop of links is refused. The export's own inputs (the head folder
and the encoder folder it copies) and a DVC workspace's data folders are never an output, nor
inside or around one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from simtune import model_files, static
from simtune.errors import UserError, echo

# what an export folder holds at its top (`simtune.export.stage`, `st_layout`): the model card,
# simtune's files, sentence-transformers' files and module folders (`1_Pooling`, `3_Dense`, ...)
_EXPORT_FILES = {"simtune.json", "encoder", "head", "modules.json",
                 "config_sentence_transformers.json", "README.md",
                 "document_encoder", "router_config.json"}  # a query tower's (query_side)
_MODULE = re.compile(r"\d+_(Pooling|Normalize|Dense|Router|StaticEmbedding)")
# every path a static export wrote (`simtune.static.write` with its card) before its
# simtune.json recorded them
_STATIC_WRITTEN = sorted({"simtune.json", "modules.json", "config_sentence_transformers.json",
                          "README.md", f"{static.TABLE}/", f"{static.NORMALIZE}/",
                          *static.TABLE_FILES})
# a DVC workspace's folders of data (the pipeline's inputs and outputs but the models), by the
# `dvc.yaml` beside them: an export there would replace or join a stage's data
_WORKSPACE_DATA = ("data", "cache", "negatives", "reports", "checkpoints", ".dvc", ".git")
_TO_A_FOLDER = "export to a folder"


def destination(out: Path, inputs: Iterable[Path]) -> Path:
    """The folder to (re)place for `--out out` (a link followed to the folder it leads to);
    `UserError` naming `out` when that folder is not new, empty or a simtune export, when it is
    a file or a link to no folder, or when it is, holds or lies inside one of `inputs` or a
    workspace's data."""
    out = Path(out)
    where = _resolved(out)
    for path in inputs:
        source = _resolved(Path(path))
        relation = ("is" if where == source else "lies inside"
                    if where.is_relative_to(source) else "holds"
                    if source.is_relative_to(where) else None)
        if relation is not None:
            raise UserError(f"{out}: {relation} the export's own input {source}; export to "
                            "another folder")
    _outside_workspace_data(out, where)
    if where.exists() and not where.is_dir():
        raise UserError(f"{out}: not a folder; {_TO_A_FOLDER}")
    above = next(p for p in where.parents if p.exists())
    if not above.is_dir():
        raise UserError(f"{out}: {above} is a file, not a folder; {_TO_A_FOLDER}")
    if where.is_dir():
        _replaceable(out, where)
    return where


def _resolved(path: Path) -> Path:
    """`path` absolute, every link followed; `UserError` for a loop or a link to nothing (an
    export through it would create a folder wherever the link happens to point)."""
    try:
        where = path.resolve(strict=False)
    except (RuntimeError, OSError):  # Python 3.11: RuntimeError("Symlink loop from ...")
        raise UserError(f"{path}: a loop of links; {_TO_A_FOLDER}") from None
    if path.is_symlink() and not where.exists():
        if _loops(path):
            raise UserError(f"{path}: a loop of links; {_TO_A_FOLDER}")
        raise UserError(f"{path}: a link to nothing ({where}); {_TO_A_FOLDER}")
    return where


def _loops(path: Path) -> bool:
    try:
        path.stat()
    except OSError as e:
        return e.errno == 40  # ELOOP
    return False


def _outside_workspace_data(out: Path, where: Path) -> None:
    """Refuse `where` when it is a DVC workspace (a folder with `dvc.yaml`), or lies in one of
    its data folders."""
    for root in (where, *where.parents):
        if (root / "dvc.yaml").is_file():
            if where == root:
                raise UserError(f"{out}: a DVC workspace (dvc.yaml); export to a folder in it, "
                                "e.g. models/export")
            top = where.relative_to(root).parts[0]
            if top in _WORKSPACE_DATA:
                raise UserError(f"{out}: inside the workspace's {top}/ ({root}), which the "
                                "pipeline owns; export to another folder, e.g. models/export")
            return


def _replaceable(out: Path, where: Path) -> None:
    """An existing folder may be replaced when it is empty or a simtune export (a model's or a
    static student's) holding only what that export wrote (its simtune.json's `files`, at
    every depth): one line naming it and the first thing it holds beyond that otherwise. A
    model export written before `files` is not replaced: what it wrote is unknown."""
    entries = sorted(p.name for p in where.iterdir())
    if not entries:
        return
    try:
        recorded, error = _recorded(where / "simtune.json"), None
    except UserError as e:
        recorded, error = None, e
    if recorded is None:  # a user's folder, or an older export
        foreign = [name for name in entries
                   if name not in _EXPORT_FILES and not _MODULE.fullmatch(name)]
        if foreign:
            raise UserError(f"{out}: holds {_first(foreign)}, which no simtune export holds: "
                            f"not replaced ({_AWAY})")
        if error is not None:
            raise UserError(f"{out}: not a simtune export (its simtune.json: {error}): not "
                            f"replaced ({_AWAY})")
        raise UserError(f"{out}: an export written before simtune recorded the files it writes "
                        "(its simtune.json has no `files`), so what it holds beyond them is "
                        "unknown: not replaced (export to a new folder, or delete this one "
                        "yourself)")
    foreign = _unrecorded(where, set(recorded))
    if foreign:
        raise UserError(f"{out}: holds {_first(foreign)}, which the export there did not write "
                        f"(not in its simtune.json's files): not replaced ({_AWAY})")


def _recorded(config_path: Path) -> list[str] | None:
    """What the export whose simtune.json is `config_path` wrote (None: not recorded);
    `UserError` when the file reads as no export. A static export written before `files`
    holds a fixed set (`simtune.static.write`), so that set is what it wrote."""
    if static.is_static(config_path.parent):
        files = model_files.read(config_path, static.StaticConfig).files
        return _STATIC_WRITTEN if files is None else files
    return model_files.read(config_path, model_files.ExportConfig).files


_AWAY = "export to a new or empty folder, or move it away"


def _first(names: list[str]) -> str:
    more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
    return f"{echo(names[0])}{more}"


def _unrecorded(where: Path, recorded: set[str]) -> list[str]:
    """Paths under `where` (sorted; relative, posix) that `recorded` does not list: a file or a
    link (never followed), or an empty folder (named with a trailing "/"); a folder that holds
    anything is named by what it holds."""
    found = []
    for root, dirs, files in os.walk(where):  # links to folders are listed, not followed
        for name in (*dirs, *files):
            path = Path(root) / name
            rel = path.relative_to(where).as_posix()
            if path.is_dir() and not path.is_symlink():
                if f"{rel}/" not in recorded and not any(path.iterdir()):
                    found.append(f"{rel}/")
            elif rel not in recorded or path.is_symlink():  # the export writes no link
                found.append(rel)
    return sorted(found)
