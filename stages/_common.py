"""What every stage command shares: logging set-up, path options that refuse the wrong kind of
path, and turning user mistakes into one line."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from simtune.errors import UserError

if TYPE_CHECKING:
    from simtune.params import PrepareParams

F = TypeVar("F", bound=Callable[..., Any])


def setup_logging(verbose: bool = False) -> None:
    """Log lines on stderr (stdout stays clean for data a command prints).

    Rich formatting on a terminal; plain unwrapped lines otherwise (DVC and CI logs).
    """
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=False)
        fmt = "%(message)s"
    else:
        handler = logging.StreamHandler(sys.stderr)
        fmt = "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=fmt,
                        handlers=[handler], force=True)


def file_option(default: str, help: str) -> Any:
    """A path option naming a file: a directory there is Typer's usage error, before any work."""
    return typer.Option(Path(default), help=help, dir_okay=False)


def dir_option(default: str, help: str) -> Any:
    """A path option naming a directory: a file there is Typer's usage error."""
    return typer.Option(Path(default), help=help, file_okay=False)


PARAMS_FILE = "params.yaml"  # DVC's default params file, the one dvc.yaml's stages list


def _yaml(name: str) -> Any:
    """A file of the stage's folder as DVC parses it (ruamel's safe loader, YAML 1.2)."""
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(Path(name).read_text(encoding="utf-8"))


def _at(tree: Any, key: str) -> str:
    """The value at dotted `key` as JSON (NaN equals NaN, absent is its own value)."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return "(absent)"
        tree = tree[part]
    return json.dumps(tree, sort_keys=True, default=str)


def check_params_unchanged(when: str) -> None:
    """`UserError` (one line) when a stage run by DVC (`$DVC_STAGE` names it; the folder
    holds dvc.yaml and dvc.lock) finds a params.yaml key dvc.yaml lists for it other than DVC
    recorded for the check stage in dvc.lock, which DVC writes as each stage ends.

    Two `dvc exp run` in one workspace: the second writes its `-S` values into params.yaml
    before DVC refuses it, and the first would train on them, record them and end on DVC's
    own error. The record is DVC's, in the run's own folder (`--temp` and queued runs have
    theirs), so it needs no output of its own: the check stage's bytes stay the same and a
    valid edit still reruns only the stages whose params it touches. A stage run by hand, or
    a folder without that record, is not compared; nor is anything DVC cannot parse (the
    stage's own reading says what is wrong)."""
    stage = os.environ.get("DVC_STAGE", "")
    if not stage or stage == "check":
        return
    try:
        declared = _yaml("dvc.yaml")["stages"][stage].get("params") or []
        checked = _yaml("dvc.lock")["stages"]["check"]["params"][PARAMS_FILE]
        now = _yaml(PARAMS_FILE)
    except Exception:  # no record to compare with, or a file only the stage may report on
        return
    keys = [k for k in declared if isinstance(k, str)] + [
        k for entry in declared if isinstance(entry, dict)
        for k in entry.get(PARAMS_FILE) or []]
    changed = [k for k in keys if _at(checked, k) != _at(now, k)]
    if changed:
        raise params_changed(changed, when)


def params_changed(keys: list[str], when: str,
                   who: str = "another dvc exp run, or an edit, meanwhile?") -> UserError:
    """The one line a stage refuses with when params.yaml's `keys` changed under it."""
    return UserError(f"{PARAMS_FILE}'s {', '.join(keys)} changed {when} ({who}): refused, so DVC "
                     "records no values this stage did not run on; run it again (dvc repro or "
                     "dvc exp run)")


def user_errors(fn: F) -> F:
    """Run a stage; a `UserError` becomes `error: <one line>` on stderr and exit status 1.

    So does an `OSError` about a path the user gave (permission denied, disk full, a file where
    a directory must be created): `error: <path>: <reason>`. Any other exception is a bug and
    keeps its traceback.

    Run by DVC, a stage also refuses when another DVC run holds the workspace, or when
    params.yaml changed since this run's first stage read it (`stages._runlock`) or its params
    since the check stage read them (`check_params_unchanged`), before it starts and again
    when it ends.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        setup_logging()
        from stages import _runlock

        try:
            _runlock.hold()  # one DVC run at a time, params.yaml as the run's first stage read it
            check_params_unchanged("since the check stage read it")
            result = fn(*args, **kwargs)
            stage = os.environ.get("DVC_STAGE", "")
            _runlock.unchanged(f"while the {stage} stage ran")
            check_params_unchanged(f"while the {stage} stage ran")
            return result
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(1) from None
        except OSError as e:
            if e.filename is None:
                raise
            print(f"error: {e.filename}: {e.strerror or e}", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


RAW = Path("data", "raw")  # the data folder dvc.yaml's prepare stage depends on


def require_raw_data(params_file: Path, prepare: PrepareParams) -> None:
    """In a DVC project (a `dvc.yaml` beside the params file), `UserError` unless the data
    file `prepare.file.path` lies under the project's data/raw, symlinks and `..` resolved:
    dvc.yaml's prepare stage depends on that folder alone, so a file elsewhere could change and
    rerun nothing. Called before the file is read. Elsewhere (a script, the library) any path
    is read: the rule is the pipeline's."""
    if prepare.source != "file" or not (params_file.parent / "dvc.yaml").is_file():
        return
    raw, path = params_file.parent / RAW, Path(str(prepare.file.path))
    try:
        where = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        raise UserError(f"prepare.file.path: {path}: cannot resolve it (a symlink loop?)"
                        ) from None
    if where == raw.resolve() or raw.resolve() in where.parents:
        return
    # a path that reads as under data/raw leaves it by a symlink: say where it leads
    lexical = Path(os.path.abspath(path))
    shown = (f" (it resolves to {where})" if Path(os.path.abspath(raw)) in lexical.parents
             else "")
    raise UserError(f"prepare.file.path: {path}{shown} must lie under {RAW}/ (dvc.yaml's "
                    "prepare stage depends on that folder alone, so a file elsewhere could "
                    "change and rerun nothing): move the file there and point "
                    "prepare.file.path at it")
