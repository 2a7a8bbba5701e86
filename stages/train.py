"""`train`: train the model of `train.mode` (head, top layers, full encoder, static table)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import typer

from stages._common import dir_option, file_option, user_errors

app = typer.Typer(add_completion=False)


@app.command("train")
@user_errors
def train(
    params: Path = file_option("params.yaml", "params file (`train`, `encoders`)"),
    prepared: Path = dir_option("data/prepared", "prepared data directory"),
    cache: Path = dir_option("cache", "embedding cache root"),
    out: Path = dir_option("models/head", "output directory of the trained head"),
    report: Path = file_option("reports/train.json", "training report: epochs, validation "
                               "detail, the time split"),
    metrics: Path = file_option("reports/train_metrics.json",
                                "DVC metrics: the kept epoch and the training seconds"),
    live: Path = dir_option("reports/train_live", "dvclive curves directory"),
    negatives: Path = dir_option("negatives", "mined negatives (read when "
                                 "train.hard_negatives > 0)"),
    checkpoint: Path = dir_option("checkpoints/train", "resumable checkpoint after each epoch: "
                                  "a killed run resumes from it; deleted on success"),
) -> None:
    """Train the model of train.mode: head, top_layers, full or static (auto picks full,
    top_layers or head from the data).

    A head on the cached vectors (head), the top layers on the cached token states
    (top_layers), the whole encoder (full) or a token table taught by a teacher (static);
    Lightning: AMP, DDP, GradCache, early stopping.
    A second train writing the same outputs at once is refused, not queued (`.<name>.lock`
    beside each output, held by local rank 0: the other ranks of a DDP launch are its own)."""
    from simtune import params as P
    from simtune.atomic import lock_file, locked, write_json
    from simtune.train import stage as lib

    p = P.load(params)
    with contextlib.ExitStack() as held:
        for output in (out, report, live) if os.environ.get("LOCAL_RANK", "0") == "0" else ():
            held.enter_context(locked(lock_file(output), busy=f"another train is writing "
                                      f"{output}; wait for it to finish (or stop it)"))
        result = lib.run(p, prepared, cache, out, report, live, negatives, checkpoint)
        if result:  # the first process writes the reports (the others return {})
            write_json(metrics, lib.headline(result))
