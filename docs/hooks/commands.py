"""MkDocs hook: `reference/commands.md`, the command reference, written at build time from the
Typer app in `stages/` (the same click objects `simtune --help` prints), so that every command,
its help text and its options with their defaults are documented once, in the code.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/commands.md"


def root_command() -> tuple[Any, Any]:
    """The `simtune` click group of the checkout's code, and its context."""
    for path in (ROOT, ROOT / "src"):  # the checkout's code, not an installed copy
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    from typer.main import get_command

    import stages

    root = get_command(stages.app)
    return root, root.context_class(root, info_name="simtune")


def commands() -> Iterator[tuple[list[str], Any, Any]]:
    """(`["cache", "verify"]`, the command, its context) for every command and subcommand, in
    the app's order, groups before their subcommands; the root group itself is not listed."""

    def walk(group: Any, ctx: Any, path: list[str]) -> Iterator[tuple[list[str], Any, Any]]:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            sub = command.context_class(command, parent=ctx, info_name=name)
            yield [*path, name], command, sub
            if hasattr(command, "list_commands"):
                yield from walk(command, sub, [*path, name])

    root, ctx = root_command()
    yield from walk(root, ctx, [])


def options(command: Any, ctx: Any) -> list[tuple[str, str, str]]:
    """(`--name <type>`, default, help) of each parameter as `--help` shows it, `--help`
    itself left out. The default and the accepted range are those of the help record's
    `[default: x; x>=0]` tail (the range in words); a required argument's default is
    `required`."""
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or param.name == "help":
            continue
        name, text = record
        name = re.sub(r" range>", ">", name)  # `<int range>`: the range is said in words
        default, notes = "", []
        tail = re.search(r"\s*\[([^\[\]]*)\]$", text)
        if tail:
            text = text[:tail.start()]
            for item in tail.group(1).split("; "):
                if item.startswith("default: "):
                    default = item.removeprefix("default: ")
                elif item == "required":
                    default = "required"
                else:
                    notes.append(_range(item))
        rows.append((name, default, " ".join([text, *(f"({n})" for n in notes)])))
    return rows


def _range(note: str) -> str:
    """click's `x>=1`, `x<=9`, `0<=x<=1` in words."""
    low = re.fullmatch(r"x>=(\S+)", note)
    high = re.fullmatch(r"x<=(\S+)", note)
    both = re.fullmatch(r"(\S+)<=x<=(\S+)", note)
    if low:
        return f"at least {low.group(1)}"
    if high:
        return f"at most {high.group(1)}"
    return f"{both.group(1)} to {both.group(2)}" if both else note


def help_text(command: Any) -> list[str]:
    """The command's help as paragraphs (click's lines joined)."""
    return [" ".join(p.split()) for p in (command.help or "").split("\n\n") if p.strip()]


def _md(text: str, cell: bool = False) -> str:
    """Markdown-safe: `<...>` outside code spans shown, not parsed; in a table cell, `|`
    escaped too."""
    parts = re.split(r"(`[^`]*`)", text)
    out = "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;")
                  for p in parts)
    return out.replace("|", "\\|") if cell else out


def _code(text: str) -> str:
    """Inline code that wraps only at its spaces (`--run-trained <file>` never cut mid-name)."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<code class="param-key">{escaped.replace("|", "&#124;")}</code>'


def _default(value: str) -> str:
    return value if value in ("", "required") else _code(value)


def dvc_stages() -> dict[str, str]:
    """dvc.yaml's stages by the command their `cmd` runs (`python -m stages <command>`)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, stage in stages.items():
        found = re.search(r"python -m stages ((?:[a-z_]+ ?)+)", " ".join(stage["cmd"].split()))
        if found:
            out[found.group(1).strip()] = name
    return out


def render() -> str:
    """The whole page: an index of the commands, then one section per command."""
    listed = list(commands())
    by_dvc = dvc_stages()
    lines = [
        "# Commands",
        "",
        "Every command of `simtune` (the same as `python -m stages`), generated from the Typer "
        "app in `stages/` when the site is built: what `--help` prints, with each option's "
        "default. Every command also takes `--help`. The DVC stages run them with the paths "
        "of `dvc.yaml`; `dvc repro` is the usual way to run a stage, the command is what it "
        "runs.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for path, command, _ in listed:
        title = " ".join(path)
        first = help_text(command)[0] if command.help else ""
        lines.append(f"| [{_code('simtune ' + title)}](#{'-'.join(['simtune', *path])}) "
                     f"| {_md(first.split('. ')[0].rstrip('.'), cell=True)} |")
    for path, command, ctx in listed:
        title = " ".join(path)
        stage = by_dvc.get(title)
        where = (f"Run by the DVC stage `{stage}` (`dvc repro`)." if stage else
                 "Not a DVC stage: run it yourself.")
        usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(),
                       " ".join(command.collect_usage_pieces(ctx)))
        lines += ["", f"## simtune {title}", "", *[_md(p) + "\n" for p in help_text(command)],
                  where, "", "```", f"simtune {title} {usage}",
                  f"python -m stages {title} {usage}", "```", ""]
        rows = options(command, ctx)
        if rows:
            lines += ["| option | default | meaning |", "|---|---|---|"]
            lines += [f"| {_code(name)} | {_default(default)} | {_md(text, cell=True)} |"
                      for name, default, text in rows]
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: Any) -> Files:
    """Puts the generated page in place of the checked-in stub (mkdocs >= 1.6)."""
    stub = files.get_file_from_path(PAGE)
    if stub is not None:
        files.remove(stub)
    files.append(File.generated(config, PAGE, content=render()))
    return files
