"""`encode`: embed a file of texts (one a line) with a trained model into a .npy, streaming."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from stages._common import dir_option, user_errors

app = typer.Typer(add_completion=False)


class Role(str, Enum):
    """Which of the model's prompts goes before each text."""

    query = "query"
    document = "document"


@app.command("encode")
@user_errors
def encode(
    texts: Path = typer.Argument(..., help="UTF-8 text file, one text a line", dir_okay=False),
    model: Path = dir_option("models/export", "the model: an export, models/head or any "
                             "folder `load_model` reads"),
    out: Path | None = typer.Option(None, help="the float32 .npy to write (row i = line i); "
                                    "default: TEXTS with the suffix .npy", dir_okay=False),
    role: Role = typer.Option(Role.query,
                              help="which of the model's prompts goes before each text "
                              "(document: a query-side head leaves the vectors the "
                              "frozen encoder's)"),
    batch_size: int = typer.Option(4096, min=1, help="lines read and embedded at a time "
                                   "(memory: the model plus one batch)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing OUT"),
) -> None:
    """Embed every line of TEXTS with MODEL into a float32 .npy (row i = line i), a batch at
    a time with a progress bar: memory stays the model plus one batch whatever the file's
    length, and OUT appears only when complete. A static student (train.mode static) encodes
    many times faster than MiniLM on a CPU (the measured ratio: docs/modes.md#static)."""
    from simtune.errors import UserError
    from simtune.model import load_model
    from simtune.static import encode_file

    out = out if out is not None else texts.with_suffix(".npy")
    if out.suffix != ".npy":
        raise UserError(f"{out}: the output is a .npy file; name it *.npy")
    if out.resolve() == texts.resolve():
        raise UserError(f"{out}: the output would replace the texts file")
    if out.exists() and not overwrite:
        raise UserError(f"{out}: exists; pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise UserError(f"{out.parent}: no such folder for the output")
    if not texts.is_file():  # before the model loads (seconds for an encoder)
        raise UserError(f"{texts}: no such file of texts (one text a line)")
    n = encode_file(load_model(model, "cpu"), texts, out, batch_size, role=role.value)
    print(f"{n} texts -> {out}")
