"""`search`: nearest neighbours of a text in the prepared corpus, from the shell."""

from __future__ import annotations

from pathlib import Path

import typer

from stages._common import dir_option, file_option, user_errors

app = typer.Typer(add_completion=False)


@app.command("search")
@user_errors
def search(
    query: str = typer.Argument(..., help="the text to search for"),
    k: int = typer.Option(5, min=1, help="how many neighbours"),
    params: Path = file_option("params.yaml", "params file"),
    head: Path = dir_option("models/head", "trained head (or export) directory"),
    prepared: Path = dir_option("data/prepared", "prepared data directory"),
    cache: Path = dir_option("cache", "embedding cache root"),
    hybrid: bool | None = typer.Option(
        None, "--hybrid/--no-hybrid", show_default=False,
        help="rank by reciprocal-rank fusion of the model and BM25 (RRF scores); default: "
        "params evaluate.hybrid.enabled"),
) -> None:
    """The nearest texts of the prepared corpus to QUERY, with cosine (or, hybrid, RRF)
    scores; on groups data each text's label beside it. The first search after a train embeds
    the corpus under the trained model and keeps it in the shared store (cache.store): later
    searches embed the query alone."""
    from simtune import params as P
    from simtune.evaluate.search import search as lib
    from simtune.evaluate.search import show

    for line in show(lib(P.load(params), query, k, head, prepared, cache, hybrid)):
        print(line)
