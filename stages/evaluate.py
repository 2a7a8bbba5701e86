"""`evaluate`: test-split retrieval metrics of the trained head against the frozen baseline and
BM25 (and, with `evaluate.hybrid.enabled`, their RRF hybrid)."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import dir_option, file_option, user_errors

app = typer.Typer(add_completion=False)


@app.command("evaluate")
@user_errors
def evaluate(
    params: Path = file_option("params.yaml", "params file (`evaluate`, `encoders`)"),
    prepared: Path = dir_option("data/prepared", "prepared data directory"),
    cache: Path = dir_option("cache", "embedding cache root"),
    head: Path = dir_option("models/head", "trained head directory"),
    out: Path = file_option("reports/evaluate.json", "the report: every metric of trained, "
                            "baseline and BM25 (and the hybrid), the lifts and their "
                            "significance, counts"),
    metrics: Path = file_option("reports/metrics.json", "DVC metrics: the headline metrics of "
                                "the trained model and their lift"),
    plot: Path = file_option("reports/recall_at_k.json", "Recall@k plot data"),
    detail: Path = file_option("reports/metrics_detail.json",
                               "detail report: metrics per test label (groups)"),
    run_trained: Path = file_option("reports/run_trained.trec",
                                    "TREC run file of the trained model's rankings"),
    run_baseline: Path = file_option("reports/run_baseline.trec",
                                     "TREC run file of the frozen encoder's rankings"),
) -> None:
    """P@1, Recall@k, MRR@10, nDCG@10, MAP@R of the trained model vs the frozen encoder and BM25,
    the lifts' paired significance, and both models' rankings as TREC run files."""
    from simtune import params as P
    from simtune.atomic import write_json
    from simtune.evaluate import report
    from simtune.evaluate import stage as lib

    result = lib.run(P.load(params), prepared, cache, head, out, plot, detail,
                     (run_trained, run_baseline))
    write_json(metrics, report.headline(result))
