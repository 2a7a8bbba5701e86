"""MkDocs hook: the generated parts of the site, built from the code so they cannot drift.

`reference/parameters.md` is written at build time from the pydantic schema.
The descriptions live once, in `src/simtune/params.py` (`documented_keys`); the values shown are
those of the checked-in `params.yaml`, and the allowed values come from the schema's `Literal`
annotations. The architecture page's module map (each module's docstring) and import rules
(pyproject.toml's import-linter contracts) are filled in the same way, and so are the benchmarks
page's summary and tables (bench/report.py, from the git-tracked bench/<name>.json files) and
every figure a page quotes from those files: `{{ bench.<name>.<key>...|<format> }}` becomes the
value at that path of bench/<name>.json (list items by index), formatted with Python's
`format(value, "<format>")` (e.g. `{{ bench.train_speed.cached_epoch_s|.2f }}`).
Two more sources in the same form: `{{ params.<key> }}`, the checked-in `params.yaml`'s value
(`{{ params.train.schedule.head.patience }}`), and `{{ run.<report>.<key>... }}`, a figure of
the default run from `docs/run/<report>.json`, the copy `make figures` (the maintainers') keeps
of `reports/<report>.json` (tests/test_figures.py checks each copy is the output the committed
dvc.lock records). Every generated table from a bench says, under it, the settings it ran under
where they are not today's params.yaml (bench/settings.py).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the backport (import-linter's dependency)
    import tomli as tomllib

import yaml
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/parameters.md"
SECTIONS = {
    "prepare": "which data to load and how to split it ([Your data](../data.md))",
    "encoders": "the frozen encoders and their settings ([Your encoder](../encoder.md))",
    "cache": "how vectors are filled, kept and read ([The cache and the store](../cache.md))",
    "negatives": "hard negatives mined from the cache ([Training](../training.md#hard-negatives))",
    "train": "the model, loss and schedule ([Training modes](../modes.md), "
             "[Training in detail](../training.md))",
    "evaluate": "the test-split evaluation ([Evaluation](../evaluation.md))",
    "sweep": "the settings search of `simtune sweep` ([Experiments](../experiments.md#sweeps))",
}


def _schema() -> Any:
    if str(ROOT / "src") not in sys.path:  # the checkout's code, not an installed copy
        sys.path.insert(0, str(ROOT / "src"))
    from simtune import params

    return params


def _field(model: Any, dotted: str) -> Any:
    """The pydantic field behind a dotted key (`<name>` steps into a mapping's value model)."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part == "<name>":
            continue
        field = model.model_fields[part]
        if i == len(parts) - 1:
            return field
        ann = field.annotation
        if typing.get_origin(ann) is dict:
            ann = typing.get_args(ann)[1]
        model = ann
    raise KeyError(dotted)


def _allowed(annotation: Any) -> str:
    """What the schema accepts, in words: `a` \\| `b` for a Literal, `list of int`, `mapping of
    str to ...`, alternatives joined by "or" (constraints like > 0 are left to the description)."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_allowed(a) for a in args)
    if origin is typing.Annotated:
        return _allowed(args[0])
    if origin is list:
        return f"list of {_allowed(args[0])}"
    if origin is dict:
        return f"mapping of {_allowed(args[0])} to {_allowed(args[1])}"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _value(raw: dict[str, Any], dotted: str) -> str:
    """The key's value in params.yaml, one `name: value` per entry under a `<name>` step."""
    head, _, rest = dotted.partition(".<name>.")
    node: Any = raw
    for part in head.split("."):
        node = node[part]
    if rest:  # entries may leave a key out (a sweep range has no `choices`): those are skipped
        return "<br>".join(f"{name}: `{_yaml(entry[rest])}`" for name, entry in node.items()
                           if rest in entry) or "(none)"
    return f"`{_yaml(node)}`"


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _dotted(key: str) -> str:
    """A dotted name as code that wraps only after a dot (a narrow column never cuts a name)."""
    escaped = key.replace("<", "&lt;").replace(">", "&gt;")
    return f'<code class="param-key">{escaped.replace(".", ".<wbr>")}</code>'


def _cell(text: str) -> str:
    """Markdown-table-safe: pipes escaped, and `<...>` outside code spans shown, not parsed."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else
                   p.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
                   for p in parts)


def render() -> str:
    """The whole page: one table per params.yaml section, every key of the schema in order."""
    params = _schema()
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    lines = [
        "# Parameters",
        "",
        "Every key of `params.yaml`, generated from the typed schema in "
        "`src/simtune/params.py` when the site is built (the descriptions live there, once). "
        "Unknown keys and wrong types are refused with one line naming the key; every float "
        "must be finite. *Value* is the one in the checked-in `params.yaml`; change it there "
        "or per experiment with `dvc exp run -S key=value`.",
        "",
    ]
    keys = params.documented_keys()
    for section, about in SECTIONS.items():
        lines += [f"## `{section}`", "", f"{about[0].upper()}{about[1:]}.", "",
                  "| key | value | allowed | meaning |", "|---|---|---|---|"]
        for key, description in keys:
            if key.split(".")[0] != section:
                continue
            field = _field(params.Params, key)
            lines.append(f"| {_dotted(key)} | {_value(raw, key)} | {_allowed(field.annotation)} "
                         f"| {_cell(description)} |")
        lines.append("")
    missing = {k.split(".")[0] for k, _ in keys} - set(SECTIONS)
    if missing:
        raise ValueError(f"params sections without a heading in {__file__}: {sorted(missing)}")
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    """Puts the generated page in place of the checked-in stub (which only says that it is
    generated, for readers of the repository itself; mkdocs >= 1.6: `File.generated`)."""
    stub = files.get_file_from_path(PAGE)
    if stub is not None:
        files.remove(stub)
    files.append(File.generated(config, PAGE, content=render()))
    return files


# --- the architecture page: the module map and the import rules, from the code itself ---------

def _first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def modules_table() -> str:
    """Every module of `src/simtune` and `stages`, with the first paragraph of its docstring."""
    lines = ["| module | what it is |", "|---|---|"]
    for package in (ROOT / "src" / "simtune", ROOT / "stages"):
        for path in sorted(package.rglob("*.py"), key=lambda p: (len(p.parts), str(p))):
            if "__pycache__" in path.parts or path.name == "__main__.py":
                continue
            dotted = ".".join(path.relative_to(package.parent).with_suffix("").parts)
            dotted = dotted.removesuffix(".__init__")
            lines.append(f"| {_dotted(dotted)} | {_cell(_first_paragraph(path))} |")
    return "\n".join(lines)


def contracts_list() -> str:
    """The import-linter contracts of pyproject.toml, as `lint-imports` checks them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    out = []
    for contract in config["contracts"]:
        fields = []
        for key, value in contract.items():
            if key in ("name", "type"):
                continue
            shown = " \\| ".join(value) if key == "layers" else value
            if isinstance(shown, list):
                shown = ", ".join(f"`{v}`" for v in shown)
            elif key != "layers":
                shown = f"`{shown}`"
            fields.append(f"    - {key.replace('_', ' ')}: {shown}")
        out += [f"- **{contract['name']}** (`{contract['type']}`)", "", *fields, ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Fills the architecture page's and the benchmarks page's generated parts, and every
    page's `{{ bench.... }}` figures."""
    markdown = bench_figures(markdown, page.file.src_uri)
    if page.file.src_uri == "benchmarks.md":
        return bench_page(markdown)
    if page.file.src_uri != "architecture.md":
        return markdown
    return (markdown.replace("<!-- generated:modules -->", modules_table())
            .replace("<!-- generated:contracts -->", contracts_list()))


# --- the benchmarks: figures from bench/<name>.json, which git tracks ---------------------------

def _report() -> Any:
    if str(ROOT) not in sys.path:  # the checkout's bench package (pure Python: no torch)
        sys.path.insert(0, str(ROOT))
    from bench import report

    return report


FIGURE = re.compile(r"\{\{\s*(bench|params|run)\.([\w.@-]+?)\s*(?:\|\s*([^}]*?)\s*)?\}\}")
# `{{ settings.<bench> }}`: the params.yaml values bench/<bench>.json ran under that differ
# today, in words (a page quoting an older bench says so: tests/test_figures.py)
SETTINGS = re.compile(r"\{\{\s*settings\.(\w+)\s*\}\}")
RUN = ROOT / "docs" / "run"  # the default run's reports, copied by `make figures`


def _source(kind: str, name: str) -> Any:
    """The tree a placeholder reads: bench/<name>.json, params.yaml or docs/run/<name>.json."""
    if kind == "params":
        return yaml.safe_load((ROOT / "params.yaml").read_text())[name]
    if kind == "run":
        return json.loads((RUN / f"{name}.json").read_text())
    results = _report().load()  # results.json at the top, each other file under its name
    return results if name == "results" else results[name]


def bench_figure(path: str, spec: str = "", kind: str = "bench") -> str:
    """The value at `path` (`<name>.<key>...`) of bench/<name>.json (or, by `kind`, of
    params.yaml's section <name> or the default run's docs/run/<name>.json), formatted with
    `spec`."""
    name, *keys = path.split(".")
    node: Any = _source(kind, name)
    for key in keys:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if node is None or isinstance(node, dict | list):  # would print `None` or a repr
        raise TypeError(f"{path} is {'null' if node is None else type(node).__name__}, "
                        "not a figure")
    return format(node, spec) if spec else str(node)


def bench_figures(markdown: str, where: str) -> str:
    """`markdown` with each `{{ bench.<path>|<format> }}` replaced by its figure; a path that
    names nothing fails the build, saying which page and placeholder."""
    def figure(match: re.Match[str]) -> str:
        try:
            return bench_figure(match.group(2), match.group(3) or "", match.group(1))
        except (KeyError, IndexError, ValueError, TypeError, FileNotFoundError) as err:
            source = {"bench": "bench/", "params": "params.yaml", "run": "docs/run/"}
            raise ValueError(f"{where}: {match.group(0)} names no figure in "
                             f"{source[match.group(1)]}: {err!r}") from err
    out = FIGURE.sub(figure, markdown)
    out = SETTINGS.sub(lambda m: _report().settings_text(
        m.group(1), _report().load(), yaml.safe_load((ROOT / "params.yaml").read_text())), out)
    left = re.search(r"\{\{\s*(bench|params|run)\.[^\n]*?\}\}|\{\{\s*(bench|params|run)\.\S*",
                     out)
    if left:  # `rows[0]`, a space in the path, an unclosed brace: it would print as written
        raise ValueError(f"{where}: {left.group(0)} is not a figure placeholder: write "
                         "{{ bench.<name>.<key>...|<format> }} (list items by index: .0.)")
    return out


def bench_page(markdown: str) -> str:
    """The benchmarks page's summary and tables, from bench/<name>.json."""
    report = _report()
    results = report.load()
    today = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name in ("train_sweep", "query_adapter"):
        marker = f"<!-- generated:bench-table {name} -->"
        if name not in results or marker not in markdown:
            continue
        # the sweep's settings are all train.* keys: named without the prefix, wrapped at commas
        table = results[name]["table"].replace(",train.", ", ").replace("| train.", "| ").replace(
            "| setting ", "| `train.` setting ")
        # the query-side bench's tables are one per set, each under its bold set name
        table = table if "**" in table else report.narrow(table)
        # under the table, the settings it ran under where they are not today's
        note = report.settings_note(name, results, today)
        markdown = markdown.replace(marker, f"{table.rstrip()}\n\n{note}" if note else table)
    if "long_docs" in results:
        markdown = markdown.replace("<!-- generated:bench-long-sets -->",
                                    report.long_sets(results["long_docs"]))
    return (markdown.replace("<!-- generated:bench-summary -->", report.summary(results, today))
            .replace("<!-- generated:bench-tables -->", report.page(results, today)))
