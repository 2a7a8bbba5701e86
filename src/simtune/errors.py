"""The one exception type for user mistakes, and how a user's value is echoed in its line.

Anything a user can fix (a bad params key, a missing file, a malformed row) raises `UserError`
with a single line that names the file, row or key. The stage commands print that line and exit
non-zero, never a traceback; any other exception is a bug and keeps its traceback. A value from
the user's input is echoed through `echo` (or `shorten`), so a 200,000-element label or a
1 MB field still gives a short line.
"""

from __future__ import annotations

from typing import Any

ECHO_CHARS = 80  # characters of a user's value shown in an error line


class UserError(Exception):
    """A mistake in the user's input: its message is one line, printed as is."""


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` cut to `limit` characters plus "…" when longer; newlines shown as `\\n`."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "…"


def echo(value: Any, limit: int = ECHO_CHARS) -> str:
    """`repr(value)` for an error line, cut to `limit` characters plus "…"."""
    return shorten(repr(value), limit)
