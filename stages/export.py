"""`export`: a servable model directory (encoder, head, sentence-transformers files, model card)."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import dir_option, file_option, user_errors

app = typer.Typer(add_completion=False)


@app.command("export")
@user_errors
def export(
    head: Path = dir_option("models/head", "trained head directory"),
    out: Path = dir_option("models/export", "servable model directory"),
    params: Path = file_option("params.yaml", "params file (the model card's training settings)"),
    metrics: Path = file_option("reports/evaluate.json",
                                "evaluate's report: the model card's test metrics (optional)"),
    data_report: Path = file_option("reports/prepare.json",
                                    "prepare's report: data set size for the card (optional)"),
) -> None:
    """Write a servable model directory for simtune.load_model and SentenceTransformer(dir).

    Every head type loads with plain SentenceTransformer(dir), no trust_remote_code; the log
    line says so, or says when a head needs trust_remote_code=True. README.md in it is the
    model card (Hugging Face / sentence-transformers format).
    """
    from simtune import params as P
    from simtune.export import stage as lib
    from simtune.export.model_card import CardInputs, read_report
    from simtune.static import is_static

    if is_static(head):  # a static student (train.mode static): StaticEmbedding + Normalize
        from simtune.export import static

        static.export(head, out, static.figures(read_report(metrics)))
        return
    card = CardInputs(P.load(params), read_report(data_report), read_report(metrics))
    lib.export(head, out, card)
