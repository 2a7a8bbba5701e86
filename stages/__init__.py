"""The pipeline's stage commands: `python -m stages <stage>` or `simtune <stage>`.

Each stage is a thin Typer command (paths in, its `params.yaml` section, a call into its package
`simtune.<stage>`), in its own module here, imported only when that command runs: so a stage runs
(and DVC tracks) its own code and the core, never another stage's command. Heavy libraries are
imported inside the commands, so `--help` stays fast.

Importing this package sets the process's CPU thread policy (`simtune.threads.configure`): it
must come before torch loads, and every way a stage starts (`python -m stages`, the `simtune`
console script, DVC's commands, Lightning's DDP ranks re-running the command) imports it first.
"""

from __future__ import annotations

import importlib

import click
import typer
from typer.core import TyperGroup

from simtune import threads

threads.configure()  # before any command imports torch (its OpenMP reads the policy at load)

# command -> the module of `stages` that defines it (as that module's Typer `app`), in pipeline
# order; `search`, `encode` and `sweep` are commands, not DVC stages
COMMANDS = {"check": "check", "prepare": "prepare", "cache": "cache", "negatives": "negatives",
            "train": "train", "evaluate": "evaluate", "export": "export", "search": "search",
            "encode": "encode", "sweep": "sweep", "compare": "compare"}


class _LazyGroup(TyperGroup):
    """Lists every command; imports a command's module only when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"stages.{COMMANDS[cmd_name]}")
        command = typer.main.get_command(module.app)
        command.name = cmd_name
        command.help = unwrap(command.help)
        return command


def unwrap(doc: str | None) -> str | None:
    """A docstring's paragraphs each on one line: the source's line breaks would otherwise
    reach `--help`'s panels and break sentences mid-way; the terminal wraps them instead."""
    if doc is None:
        return None
    return "\n\n".join(" ".join(p.split()) for p in doc.strip().split("\n\n"))


app = typer.Typer(
    name="simtune",
    cls=_LazyGroup,
    help="simtune: fine-tune similarity models fast on cached frozen-encoder embeddings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """simtune: fine-tune similarity models fast on cached frozen-encoder embeddings."""


def main() -> None:
    """Console-script entry point."""
    app()
