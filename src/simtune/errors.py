"""The one exception type for user mistakes.

Anything a user can fix (a bad params key, a missing file, a malformed row) raises `UserError`
with a single line that names the file, row or key. The stage commands print that line and exit
non-zero, never a traceback; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input: its message is one line, printed as is."""
