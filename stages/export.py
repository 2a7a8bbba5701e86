"""`export`: a servable model directory (encoder, head, config)."""

from __future__ import annotations

from pathlib import Path

from stages._common import dir_option, user_errors


@user_errors
def export(
    head: Path = dir_option("models/head", "trained head directory"),
    out: Path = dir_option("models/export", "servable model directory"),
) -> None:
    """Write a servable model directory (encoder, head, config) for simtune.load_model.

    It also loads as SentenceTransformer(dir, trust_remote_code=True).
    """
    from simtune import model

    model.export(head, out)
    print(f"exported {out}")
