"""The benchmarks page's generated part, from the bench/<name>.json files each benchmark writes.

The documentation build (docs/hooks/generate.py) renders it into docs/benchmarks.md, so the page
always shows the figures of the JSON files in the checkout; `python -m bench.run_all` prints it.
It holds a summary (every target, met or missed, computed here from the rows' figures) and the
full tables, each in a collapsible block and split so that no table has more than 7 columns.
Pure Python (no torch): the docs build imports it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.settings import DEPENDS, flat, settings_changed, settings_note, settings_text

HERE = Path(__file__).resolve().parent
MAX_COLUMNS = 7
# the benchmarks whose rows make the headline table, in the page's order, with their titles
AREAS = {"cache_fill": "Cache fill", "train_speed": "Training speed",
         "startup": "Stage start-up",
         "eval_topk": "Exact top-k", "negatives": "Hard negatives and Matryoshka",
         "layers": "Top layers against the peer", "layers_full": "Full fine-tuning per epoch",
         "scale": "The top_layers cache at scale", "sweep": "Sweeps",
         "long_docs": "Long documents against the baselines",
         "distill": "Distillation against the peer",
         "small_data": "Small data against the frozen encoder", "noop": "Reruns",
         "query_adapter": "Query-side head (keep your index)",
         "static": "Static student (a token table) against model2vec",
         "gpu": "GPU"}
BENCHES = ("cache_fill", "train_speed", "startup", "eval_topk", "negatives", "layers",
           "layers_full", "sweep", "scale", "long_docs", "distill", "small_data",
           "query_adapter", "static")
# the page's columns: the peer's name and figure share one ("against"), so that the verdict fits
COLUMNS = ["measure", "ours", "against", "ratio", "target", "met"]


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A Markdown table of `rows` (dicts) with `columns`."""
    fmt = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(f[i]) for f in fmt)) for i, c in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths, strict=True)) + " |"
    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, fmt)])


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"
    return str(x)


# --- targets: met or missed, from the figures ---------------------------------------------------

_BOUND = re.compile(r"^(?:clearly\s+)?(?:(?:ours/peer|peer/ours)\s+)?(>=|<=|<<|<|>|=|~)\s*"
                    r"([+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?)")
_NUMBER = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?)")


def _number(x: Any) -> float | None:
    """A figure as a number: floats and ints as they are, a string by its leading number
    ("0.99 of the lift", "+0.020"), anything else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x)
    m = _NUMBER.match(str(x))
    return float(m.group(1)) if m else None


def compared(row: dict[str, Any]) -> float | None:
    """The figure a row's target bounds: its ratio to the peer where it has one, else ours."""
    ratio = _number(row.get("ratio", ""))
    return ratio if ratio is not None else _number(row.get("ours", ""))


def verdict(row: dict[str, Any]) -> str | None:
    """"met", "missed" or "not run" for a row with a target, None for a row without one (or
    whose target describes rather than bounds: "bounded", "exact up to ties").

    A bound is `[ours/peer | peer/ours] OP number` (the ratio column holds that quotient), OP
    one of >=, <=, <, >, = and ~ (within 1 %) and << (at most a tenth); "clearly < 1" is < 1;
    a note after the bound ("(not met: ...)") does not change the verdict, the figures do."""
    target = str(row.get("target", "")).strip()
    if target == "no model load":
        return "met" if "model loaded: False" in str(row.get("peer name", "")) else "missed"
    if target == "same kept epoch":
        return "met" if row.get("ours") == row.get("peer") else "missed"
    if target == "runs nothing":
        return "met" if row.get("ran_nothing") else "missed"
    m = _BOUND.match(target)
    if m is None:
        return None
    if "not run" in str(row.get("peer name", "")):
        return "not run"
    op, bound = m.group(1), float(m.group(2))
    value = compared(row)
    if value is None:
        return "not run"
    ok = {">=": value >= bound, "<=": value <= bound, "<": value < bound, ">": value > bound,
          "=": abs(value - bound) <= 1e-9, "~": abs(value - bound) <= 0.01 * abs(bound),
          "<<": value <= bound / 10}[op]
    return "met" if ok else "missed"


# --- what a bench ran under: bench/settings.py (the names kept here for their callers) ----------

__all__ = ["DEPENDS", "flat", "settings_changed", "settings_note", "settings_text"]


def _today() -> dict[str, Any]:
    from simtune.params import read_yaml  # the checked loader (duplicate keys, merge keys)

    return read_yaml(HERE.parent / "params.yaml")


def _noted(markdown: list[str], name: str, results: dict[str, Any], today: dict[str, Any]
           ) -> list[str]:
    """`markdown` (a table's lines) with its settings note after it, where it has one."""
    note = settings_note(name, results, today)
    return [*markdown, note, ""] if note else markdown


# --- the figures, from bench/<name>.json --------------------------------------------------------

def load(directory: Path = HERE) -> dict[str, Any]:
    """bench/results.json's machine and no-op rerun time with every other bench/<name>.json the
    checkout holds under its name (each benchmark's own file is its newest run)."""
    summary = directory / "results.json"
    results: dict[str, Any] = json.loads(summary.read_text()) if summary.is_file() else {}
    for path in sorted(directory.glob("*.json")):
        if path != summary:
            results[path.stem] = json.loads(path.read_text())
    return results


def headline_rows(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each area's rows of the headline table. Full fine-tuning's seconds per epoch come from
    layers_full, the run that measures those two rows alone (layers keeps its own in its table)."""
    areas: dict[str, list[dict[str, Any]]] = {}
    for name in BENCHES:
        rows = [r for r in results.get(name, {}).get("rows", [])
                if not (name == "layers" and "full fine-tuning, train s per epoch" in r["measure"])]
        if rows:
            areas[name] = rows
    noop = results.get("noop_repro")
    if noop:
        areas["noop"] = [{"measure": "no-op `dvc repro` of the whole pipeline (s)",
                          "ours": noop["seconds"], "peer name": "", "peer": "", "ratio": "",
                          "target": "runs nothing", "ran_nothing": noop["ran_nothing"]}]
    if (results.get("gpu") or {}).get("rows"):
        areas["gpu"] = results["gpu"]["rows"]
    return areas


def _judged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the page shows them: the peer's name and figure in one cell, and the verdict."""
    out = []
    for row in rows:
        against = str(row.get("peer name", ""))
        if row.get("peer", "") != "":
            against = f"{against}: {_cell(row['peer'])}" if against else _cell(row["peer"])
        out.append(dict(row, against=against, met=verdict(row) or ""))
    return out


def _shown(value: float, bound: float) -> str:
    """`value` with as few digits as still tell it apart from `bound` (0.898 against 0.9)."""
    for digits in range(3, 8):
        text = f"{value:.{digits}g}"
        if float(text) != bound:
            return text
    return f"{value:g}"


def _miss(row: dict[str, Any]) -> str:
    target = str(row["target"]).split(" (")[0].strip()
    figure = row["measure"] + (f" vs {row['peer name']}" if row.get("peer name") else "")
    if verdict(row) == "not run":  # the peer's name says why, at length: the table keeps it
        return f"{figure.split(': not run')[0]}: not run ({target})"
    m = _BOUND.match(target)
    value = compared(row)
    if isinstance(row.get("ratio"), str) and row["ratio"].strip():
        shown = row["ratio"]  # as the benchmark wrote it ("0.00 of the lift", "+0.000")
    elif m and value is not None:
        shown = _shown(value, float(m.group(2)))
    else:
        shown = _cell(row["ours"])
    return f"{figure}: {shown} ({target})"


def summary(results: dict[str, Any], today: dict[str, Any] | None = None) -> str:
    """One screen: how many targets were met, and each miss with its figure and target; then
    the areas whose bench ran under settings other than `today`'s (default: the checkout's
    params.yaml), each table below saying which."""
    today = _today() if today is None else today
    areas = headline_rows(results)
    counts = {"met": 0, "missed": 0, "not run": 0}
    lines = ["| benchmark | targets met | missed: figure, value (target) |", "|---|---|---|"]
    for name, rows in areas.items():
        judged = [(r, verdict(r)) for r in rows]
        judged = [(r, v) for r, v in judged if v is not None]
        for _, v in judged:
            counts[v] += 1
        if not judged:
            continue
        met = sum(v == "met" for _, v in judged)
        misses = [_cell_text(_miss(r)) for r, v in judged if v != "met"]
        lines.append(f"| [{AREAS[name]}](#{_anchor(AREAS[name])}) | {met} of {len(judged)} | "
                     f"{'<br>'.join(misses) or 'none'} |")
    total = sum(counts.values())
    gpu = (results.get("gpu") or {}).get("machine", "")
    head = (f"**{counts['met']} of {total} targets met, {counts['missed']} missed"
            + (f", {counts['not run']} not run" if counts["not run"] else "") + "** "
            f"in `bench/*.json` ({results.get('machine', 'machine unknown')}"
            + (f"; the GPU rows on a lent {gpu.split('GPU ')[-1]}" if gpu else "") + "). "
            "A target bounds the ratio to the peer, or the figure itself where there is none.")
    other = [f"[{AREAS[name]}](#{_anchor(AREAS[name])})" for name in areas
             if settings_note(_source(name), results, today)]
    tail = ("\n*Run under other settings than today's params.yaml, or an earlier version's* "
            f"(each table says which): {', '.join(other)}.\n" if other else "")
    return head + "\n\n" + "\n".join(lines) + "\n" + tail


def _cell_text(text: str) -> str:
    return text.replace("|", "\\|")


def _anchor(title: str) -> str:
    """The id Python-Markdown's toc gives a heading (ASCII titles only)."""
    slug = re.sub(r"[^\w\s-]", "", title.lower()).strip()
    return re.sub(r"[\s-]+", "-", slug)


# --- the full tables: at most 7 columns, each in a collapsible block ---------------------------

def split_table(lines: list[str], keys: int = 1, first: tuple[str, ...] = ()) -> list[list[str]]:
    """A Markdown table (its lines) as tables of at most MAX_COLUMNS columns, each repeating the
    first `keys` columns; columns named in `first` come in the first part, the rest in order."""
    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
    header, *body = [cells(line) for line in lines if not re.fullmatch(r"[|\s:-]+", line)]
    if len(header) <= MAX_COLUMNS:
        return [lines]
    rest = list(range(keys, len(header)))
    front = [i for i in rest if header[i] in first]
    order = front + [i for i in rest if i not in front]
    width = MAX_COLUMNS - keys
    groups = [order[:len(front)]] if front else []
    tail = order[len(front):]
    groups += [tail[i:i + width] for i in range(0, len(tail), width)]
    parts = []
    for group in groups:
        columns = [*range(keys), *group]
        rows = ["| " + " | ".join(row[i] for i in columns) + " |" for row in (header, *body)]
        parts.append([rows[0], "|" + "---|" * len(columns), *rows[1:]])
    return parts


def narrow(markdown: str, keys: int = 1, first: tuple[str, ...] = ()) -> str:
    """`markdown` with every table in it split to at most MAX_COLUMNS columns."""
    out: list[str] = []
    block: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            block.append(line)
            continue
        if block:
            out += "\n\n".join("\n".join(p) for p in split_table(block, keys, first)).split("\n")
            block = []
        out.append(line)
    return "\n".join(out).rstrip() + "\n"


def collapsible(title: str, markdown: str) -> str:
    """A pymdownx.details block, closed until the reader opens it."""
    body = "\n".join(f"    {line}" if line else "" for line in markdown.strip().splitlines())
    return f'??? note "{title}"\n\n{body}\n'


def columns(markdown: str) -> list[int]:
    """The column count of every table in `markdown` (for the test that none is too wide)."""
    counts = []
    previous = ""
    for line in markdown.splitlines():
        line = line.strip()
        if line.startswith("|") and re.fullmatch(r"\|[\s:|-]+", line) and previous.startswith("|"):
            counts.append(len(re.split(r"(?<!\\)\|", previous)[1:-1]))
        previous = line
    return counts


def _source(area: str) -> str:
    """The bench file an area of the headline table comes from (the no-op rerun: results)."""
    return "results" if area == "noop" else area


def page(results: dict[str, Any], today: dict[str, Any] | None = None) -> str:
    """The tables part of docs/benchmarks.md: the headline rows per area, with each row's
    verdict, then every benchmark's own tables; under each table, the settings it ran under
    where they differ from `today` (params.yaml's tree; default: the checkout's) or are not
    recorded (bench.settings.settings_note)."""
    today = _today() if today is None else today
    out = [f"Measured on {results.get('machine', 'machine unknown')} with `make bench`. "
           "Open a block for its rows; *met* is the row's verdict against its target.", ""]
    areas = headline_rows(results)
    out += ["### The headline rows", ""]
    for name, rows in areas.items():
        if name == "gpu":
            continue
        judged = _judged(rows)
        targets = [r for r in judged if r["met"]]
        met = sum(r["met"] == "met" for r in targets)
        out += [f"#### {AREAS[name]}", "",
                collapsible(f"{len(rows)} rows, {met} of {len(targets)} targets met",
                            table(judged, COLUMNS)), ""]
        out = _noted(out, _source(name), results, today)
    if "layers" in results:
        layers = results["layers"]
        out += ["### Time to quality", "",
                f"`{layers['command']}` (encoder rows and the peer: {layers['epochs']} "
                "epoch(s)); each set's first table holds the quality and the shares of the "
                "peer's lift and time, the second the costs:", "",
                collapsible("Every encoder, data set and mode",
                            narrow(layers["table"], first=_QUALITY)), ""]
        out = _noted(out, "layers", results, today)
    for name, heading in (("layers_full", "Full fine-tuning against the peer"),
                          ("sweep", "Sweeps"), ("scale", "The top_layers cache at scale"),
                          ("distill", "Distillation"), ("small_data", "Small data"),
                          ("static", "Static student"),
                          ("panel", "The panel's tables"),
                          ("panel_floor", "The step floor's panel (few-shot)"),
                          ("panel_fewshot", "The panel's few-shot entries, today's default")):
        if name not in results:
            continue
        bench = results[name]
        # the columns that name a row
        keys = {"scale": 2, "panel": 3, "panel_floor": 3, "panel_fewshot": 3}.get(name, 1)
        out += [f"### {heading}", "", f"`{bench['command']}`:", "",
                collapsible("The tables", narrow(bench["table"], keys=keys,
                                                 first=_QUALITY)), ""]
        out = _noted(out, name, results, today)
        if bench.get("note"):
            out += [bench["note"], ""]
        if bench.get("gpu"):
            gpu = bench["gpu"]
            out += [f"On {gpu['machine']}: `{gpu['command']}` (the figures that depend on "
                    "the device; bytes and DVC's bookkeeping are the rows above):", "",
                    collapsible("The GPU rows", narrow(gpu["table"], keys=2,
                                                       first=_QUALITY)), ""]
            if gpu.get("note"):
                out += [gpu["note"], ""]
    if "long_docs" in results:
        long = results["long_docs"]
        out += ["### Long documents", "",
                f"`{long['command']}` (top-2 rows: {long['top2_epochs']} epoch(s)):", "",
                collapsible("Both sets, every setting",
                            narrow(long["table"], keys=2,
                                   first=("P@1", "MRR@10", "MAP@R", "LR acc"))), ""]
        out = _noted(out, "long_docs", results, today)
        skipped = long.get("skipped", [])
        if skipped:
            out += ["Not measured:", "", *(f"- {n}" for n in skipped), ""]
    if "gpu" in areas:
        gpu = results["gpu"]
        judged = _judged(gpu["rows"])
        out += ["### GPU", "", f"`python -m bench.gpu` on {gpu['machine']} (the figures kept "
                "in bench/gpu.json; `make bench` measures them again where a GPU is present):",
                "", collapsible("Every GPU row", table(judged, COLUMNS)), ""]
        out = _noted(out, "gpu", results, today)
    return "\n".join(out).rstrip() + "\n"


def long_sets(long: dict[str, Any]) -> str:
    """The long-documents bench's data sets: where they come from and how long their texts are
    (bench/long_docs.json's `sets`)."""
    lines = ["| set | documents | labels (same label = similar) | median MiniLM tokens | "
             "over 128 | over 512 |", "|---|---|---|---|---|---|"]
    for name, info in long["sets"].items():
        tokens = info["tokens"]
        lines.append(f"| {name}<br>`{info['package']}` | {info['documents']:,} | "
                     f"{info['labels']} | {tokens['median_tokens']} | "
                     f"{tokens['share_over_128']:.0%} | {tokens['share_over_512']:.0%} |")
    return "\n".join(lines)


_QUALITY = ("P@1", "MRR@10", "nDCG@10", "lift / peer's", "time / peer's", "beats head",
            "val", "kept epoch", "test p@1", "test mrr@10")
