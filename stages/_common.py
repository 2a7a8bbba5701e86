"""What every stage command shares: logging set-up, path options that refuse the wrong kind of
path, and turning user mistakes into one line."""

from __future__ import annotations

import functools
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


def user_errors(fn: F) -> F:
    """Run a stage; a `UserError` becomes `error: <one line>` on stderr and exit status 1.

    So does an `OSError` about a path the user gave (permission denied, disk full, a file where
    a directory must be created): `error: <path>: <reason>`. Any other exception is a bug and
    keeps its traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        setup_logging()
        try:
            return fn(*args, **kwargs)
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
