"""`train`: train the head (or, in full mode, the encoder too) on the prepared examples."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import user_errors


@user_errors
def train(
    params: Path = typer.Option(Path("params.yaml"), help="params file (`train`, `encoders`)"),
    prepared: Path = typer.Option(Path("data/prepared"), help="prepared data directory"),
    cache: Path = typer.Option(Path("cache"), help="embedding cache root"),
    out: Path = typer.Option(Path("models/head"), help="output directory of the trained head"),
    report: Path = typer.Option(Path("reports/train.json"), help="training report (metrics)"),
    live: Path = typer.Option(Path("reports/train_live"), help="dvclive curves directory"),
) -> None:
    """Train a head on the cached embeddings (Lightning; AMP, DDP, GradCache, early stopping)."""
    from simtune import params as P
    from simtune import train as lib

    lib.run(P.load(params), prepared, cache, out, report, live)
