"""The pipeline's stage commands: `python -m stages <stage>` or `simtune <stage>`.

Each stage is a thin Typer command (paths in, its `params.yaml` section, a call into the library);
heavy libraries are imported inside the commands so `--help` stays fast.
"""

from __future__ import annotations

import typer

from stages.cache import app as cache_app
from stages.evaluate import evaluate
from stages.export import export
from stages.negatives import negatives
from stages.prepare import prepare
from stages.search import search
from stages.train import train

app = typer.Typer(
    name="simtune",
    help="simtune: fine-tune similarity models fast on cached frozen-encoder embeddings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("prepare")(prepare)
app.add_typer(cache_app, name="cache")
app.command("negatives")(negatives)
app.command("train")(train)
app.command("evaluate")(evaluate)
app.command("export")(export)
app.command("search")(search)


@app.callback()
def _root() -> None:
    """simtune: fine-tune similarity models fast on cached frozen-encoder embeddings."""


def main() -> None:
    """Console-script entry point."""
    app()
