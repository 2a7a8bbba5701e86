"""`export`: a servable model directory (encoder, head, config)."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import user_errors


@user_errors
def export(
    head: Path = typer.Option(Path("models/head"), help="trained head directory"),
    out: Path = typer.Option(Path("models/export"), help="servable model directory"),
) -> None:
    """Write a servable model directory (encoder, head, config) for simtune.load_model.

    It also loads as SentenceTransformer(dir, trust_remote_code=True).
    """
    from simtune import model

    model.export(head, out)
    print(f"exported {out}")
