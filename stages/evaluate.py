"""`evaluate`: test-split retrieval metrics of the trained head against the frozen baseline."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import user_errors


@user_errors
def evaluate(
    params: Path = typer.Option(Path("params.yaml"), help="params file (`evaluate`, `encoders`)"),
    prepared: Path = typer.Option(Path("data/prepared"), help="prepared data directory"),
    cache: Path = typer.Option(Path("cache"), help="embedding cache root"),
    head: Path = typer.Option(Path("models/head"), help="trained head directory"),
    out: Path = typer.Option(Path("reports/metrics.json"),
                             help="headline metrics (trained, baseline, lift, counts)"),
    plot: Path = typer.Option(Path("reports/recall_at_k.json"), help="Recall@k plot data"),
    detail: Path = typer.Option(Path("reports/metrics_detail.json"),
                                help="detail report: metrics per test label (groups)"),
) -> None:
    """P@1, Recall@k, MRR@10, nDCG@10, MAP@R of the trained head vs the frozen encoder."""
    from simtune import evaluate as lib
    from simtune import params as P

    lib.run(P.load(params), prepared, cache, head, out, plot, detail)
