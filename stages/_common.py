"""What every stage command shares: logging set-up and turning user mistakes into one line."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from simtune.errors import UserError

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


def user_errors(fn: F) -> F:
    """Run a stage; a `UserError` becomes `error: <one line>` on stderr and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        setup_logging()
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]
