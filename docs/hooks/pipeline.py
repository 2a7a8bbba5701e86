"""MkDocs hook: the home page's picture of the pipeline, `images/pipeline.svg`, drawn at build
time from `dvc.yaml` (so it stays true): the stages in order, what each reads from another, the
machine-wide vector store behind `cache`, and what reruns when you change a params section, the
input data or the code. A plain SVG file, with no script and nothing fetched from the network.

"Reruns" is DVC's rule: a stage reruns when one of its own deps or params changed (a full dot);
a stage after it reruns when what it reads from that stage changed too (a hollow one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "images/pipeline.svg"
CODE = ("src/", "stages/")
# files that no stage may depend on (they are read by no stage's command)
UNTRACKED = ["stages/search.py", "stages/sweep.py", "docs/index.md", "tests/test_docs.py"]

LABEL_W, COL_W, BOX_W, BOX_H = 210, 128, 112, 50
TOP, ROW_H, LINE_H = 56, 24, 15
INK, MUTED, ACCENT, PAPER = "#1f2430", "#5f6678", "#3f51b5", "#ffffff"


@dataclass
class Stage:
    name: str
    deps: list[str]
    params: list[str]
    outs: list[str]
    reads: dict[str, list[str]] = field(default_factory=dict)  # upstream stage -> paths read


@dataclass
class Row:
    label: str
    kind: str  # "data" | "params" | "code"
    direct: list[str]


def _paths(entries: list[Any]) -> list[str]:
    """dvc.yaml's list of paths, each a string or a one-key mapping (`path: {options}`)."""
    return [e if isinstance(e, str) else next(iter(e)) for e in entries or []]


def _params(entries: list[Any]) -> list[str]:
    """Params keys, those of another params file (`{file: [keys]}`) included."""
    out = []
    for e in entries or []:
        out += [e] if isinstance(e, str) else [k for keys in e.values() for k in keys or []]
    return out


def load(path: Path = ROOT / "dvc.yaml") -> list[Stage]:
    """The stages of dvc.yaml in order, each with the stages whose outputs it reads."""
    raw = yaml.safe_load(path.read_text())["stages"]
    # `check` (params.yaml checked whole before any stage) makes nothing a user changes: not drawn
    checked = set(_paths(raw.pop("check", {}).get("outs")))
    stages = [Stage(name, [d for d in _paths(s.get("deps")) if d not in checked],
                    _params(s.get("params")),
                    _paths(s.get("outs")) + _paths(s.get("metrics")) + _paths(s.get("plots")))
              for name, s in raw.items()]
    for stage in stages:
        for other in stages:
            read = [d for d in stage.deps if d in other.outs]
            if read and other is not stage:
                stage.reads[other.name] = read
    return stages


def _covers(dep: str, path: str) -> bool:
    return path == dep or path.startswith(dep.rstrip("/") + "/")


def after(stages: list[Stage], changed: list[str]) -> list[str]:
    """The stages that read, directly or not, the outputs of the stages `changed`."""
    found: set[str] = set()
    frontier = set(changed)
    while frontier:
        frontier = {s.name for s in stages if set(s.reads) & frontier} - found - set(changed)
        found |= frontier
    return [s.name for s in stages if s.name in found]


def rows(stages: list[Stage]) -> list[Row]:
    """What a user changes, each with the stages it reruns itself: the input data, each
    params entry (entries rerunning the same stages share a row), each stage's own code, the
    core's params schema, and files no stage reads."""
    produced = {o for s in stages for o in s.outs}
    out = []
    for data in dict.fromkeys(d for s in stages for d in s.deps
                              if not d.startswith(CODE) and d not in produced):
        out.append(Row(f"your data `{data}`", "data",
                       [s.name for s in stages if data in s.deps]))
    keys: dict[tuple[str, ...], list[str]] = {}
    for key in dict.fromkeys(k for s in stages for k in s.params):
        hit = tuple(s.name for s in stages
                    if any(key == p or key.startswith(p + ".") for p in s.params))
        keys.setdefault(hit, []).append(key)
    out += [Row("params " + ", ".join(f"`{k}`" for k in ks), "params", list(hit))
            for hit, ks in keys.items()]
    for stage in stages:
        own = [f"stages/{stage.name}.py", f"src/simtune/{stage.name}/stage.py"]
        out.append(Row(f"the `{stage.name}` stage's code", "code",
                       [s.name for s in stages if any(_covers(d, p) for d in s.deps
                                                      for p in own)]))
    out.append(Row("core `simtune/params.py`", "code",
                   [s.name for s in stages if any(_covers(d, "src/simtune/params.py")
                                                   for d in s.deps)]))
    out.append(Row("`stages/search.py`, `stages/sweep.py`, docs, tests", "code",
                   [s.name for s in stages if any(_covers(d, p) for d in s.deps
                                                  for p in UNTRACKED)]))
    return out


def _text(x: float, y: float, text: str, size: int = 13, fill: str = INK, weight: str = "normal",
          anchor: str = "start") -> str:
    """One line of text; `code` spans in a monospace font."""
    spans = []
    for i, part in enumerate(re.split(r"`([^`]*)`", text)):
        if part:
            font = ' font-family="ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"' \
                if i % 2 else ""
            spans.append(f"<tspan{font}>{escape(part)}</tspan>")
    return (f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" fill="{fill}" '
            f'font-weight="{weight}" text-anchor="{anchor}">{"".join(spans)}</text>')


def _short(path: str, width: int = 15) -> str:
    """A path as short as a box needs: whole when it fits, else its last part."""
    return path if len(path) <= width else path.rsplit("/", 1)[-1]


def _wrap(text: str, width: int = 30) -> list[str]:
    """Lines of at most about `width` characters, broken at ", " or spaces (never in code)."""
    lines, line = [], ""
    for word in re.split(r"(?<=,) |(?<!`) (?![^`]*`)", text):
        if line and len(line) + 1 + len(word.replace("`", "")) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*lines, line] if line else lines


def render(stages: list[Stage]) -> str:
    """The SVG: the chain of stages (what each reads from an earlier one than the previous is
    an arc), the store under `cache`, and the rerun table with one column per stage."""
    col = {s.name: LABEL_W + i * COL_W + COL_W / 2 for i, s in enumerate(stages)}
    width = LABEL_W + len(stages) * COL_W + 10
    parts: list[str] = []
    y0 = TOP + 40  # the boxes' top; the arcs run above them
    for i, stage in enumerate(stages):
        for source in stage.reads:
            j = [s.name for s in stages].index(source)
            x1, x2 = col[source], col[stage.name]
            if i - j == 1:
                parts.append(f'<line x1="{x1 + BOX_W / 2:.0f}" y1="{y0 + BOX_H / 2:.0f}" '
                             f'x2="{x2 - BOX_W / 2 - 2:.0f}" y2="{y0 + BOX_H / 2:.0f}" '
                             f'stroke="{INK}" stroke-width="1.6" marker-end="url(#arrow)"/>')
            else:
                lift, a, b = 14 + 9 * (i - j), x1 + 12 * (i - j) - 30, x2 - 8 * j - 4
                parts.append(f'<path d="M{a:.0f},{y0} C{a:.0f},{y0 - lift} '
                             f'{b:.0f},{y0 - lift} {b:.0f},{y0 - 2}" fill="none" '
                             f'stroke="{MUTED}" stroke-width="1" stroke-opacity="0.7" '
                             f'marker-end="url(#arrow-muted)"/>')
    for stage in stages:
        x = col[stage.name] - BOX_W / 2
        parts.append(f'<g class="stage" data-stage="{stage.name}">'
                     f'<rect x="{x:.0f}" y="{y0}" width="{BOX_W}" height="{BOX_H}" rx="8" '
                     f'fill="{ACCENT}"/>'
                     + _text(col[stage.name], y0 + 22, stage.name, 15, PAPER, "bold", "middle")
                     + _text(col[stage.name], y0 + 39, f"`{_short(stage.outs[0])}`"
                             if stage.outs else "", 11, "#dfe3f8", anchor="middle") + "</g>")
    inputs = [r for r in rows(stages) if r.kind == "data"]
    if inputs:
        parts.append(_text(LABEL_W - 16, y0 + 30, inputs[0].label.removeprefix("your data "),
                           12, MUTED, anchor="end"))
        first = col[stages[0].name] - BOX_W / 2
        parts.append(f'<line x1="{LABEL_W - 10}" y1="{y0 + 25}" x2="{first - 2:.0f}" '
                     f'y2="{y0 + 25}" stroke="{INK}" stroke-width="1.6" '
                     f'marker-end="url(#arrow)"/>')
    y = y0 + BOX_H + 18
    if "cache" in col:  # the store behind the cache stage (outside DVC)
        cx = col["cache"]
        parts.append(f'<line x1="{cx:.0f}" y1="{y0 + BOX_H}" x2="{cx:.0f}" y2="{y + 8}" '
                     f'stroke="{ACCENT}" stroke-width="1.6" stroke-dasharray="4 3" '
                     f'marker-start="url(#arrow-accent)" marker-end="url(#arrow-accent)"/>')
        parts.append(f'<g class="store"><path d="M{cx - 44:.0f},{y + 16} v26 a44,8 0 0 0 88,0 '
                     f'v-26" fill="#e8eaf6" stroke="{ACCENT}"/><ellipse cx="{cx:.0f}" '
                     f'cy="{y + 16}" rx="44" ry="8" fill="#c5cae9" stroke="{ACCENT}"/>'
                     + _text(cx, y + 40, "store", 12, INK, "bold", "middle") + "</g>")
        for k, line in enumerate([
                "The shared vector store: machine-wide, outside DVC. `cache` embeds each text",
                "once per encoder setting into it, and every workspace and experiment reuses",
                "it; its output `cache/` is the view of the rows this data needs."]):
            parts.append(_text(cx + 56, y + 22 + k * LINE_H, line, 12, MUTED))
        y += 74
    parts.append(_text(10, y + 14, "What reruns when you change…", 14, INK, "bold"))
    for stage in stages:
        parts.append(_text(col[stage.name], y + 34, stage.name, 12, MUTED, anchor="middle"))
    y += 42
    for k, row in enumerate(rows(stages)):
        lines = _wrap(row.label)
        height = max(ROW_H, LINE_H * len(lines) + 9)
        later = after(stages, row.direct)
        parts.append(f'<g class="row" data-label="{escape(row.label.replace("`", ""))}" '
                     f'data-direct="{" ".join(row.direct)}" data-after="{" ".join(later)}">')
        if k % 2 == 0:
            parts.append(f'<rect x="4" y="{y}" width="{width - 8}" height="{height}" '
                         f'fill="#f3f4f9"/>')
        for n, line in enumerate(lines):
            parts.append(_text(10, y + 16 + n * LINE_H, line, 12))
        mid = y + height / 2
        for stage in stages:
            x = col[stage.name]
            if stage.name in row.direct:
                parts.append(f'<circle cx="{x:.0f}" cy="{mid:.0f}" r="6" fill="{ACCENT}"/>')
            elif stage.name in later:
                parts.append(f'<circle cx="{x:.0f}" cy="{mid:.0f}" r="5" fill="{PAPER}" '
                             f'stroke="{ACCENT}" stroke-width="1.6"/>')
        if not row.direct:
            parts.append(_text(col[stages[0].name] - 6, mid + 4, "nothing reruns", 12, MUTED))
        parts.append("</g>")
        y += height
    y += 12
    parts.append(f'<circle cx="16" cy="{y + 8}" r="6" fill="{ACCENT}"/>')
    parts.append(_text(28, y + 12, "reruns (its own dep or params changed)", 12, MUTED))
    parts.append(f'<circle cx="{LABEL_W + 110}" cy="{y + 8}" r="5" fill="{PAPER}" '
                 f'stroke="{ACCENT}" stroke-width="1.6"/>')
    parts.append(_text(LABEL_W + 122, y + 12, "reruns if what it reads from an earlier stage "
                       "changed (DVC compares hashes)", 12, MUTED))
    height = y + 26
    arrow = ('<marker id="{id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
             'fill="{fill}"/></marker>')
    defs = "".join(arrow.format(id=i, fill=f) for i, f in
                   (("arrow", INK), ("arrow-muted", MUTED), ("arrow-accent", ACCENT)))
    title = "The simtune pipeline: " + " → ".join(s.name for s in stages)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height:.0f}" '
            f'width="{width}" height="{height:.0f}" role="img" '
            f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, '
            f'sans-serif"><title>{escape(title)}</title><defs>{defs}</defs>'
            f'<rect width="{width}" height="{height:.0f}" rx="10" fill="{PAPER}"/>'
            + _text(10, 24, "The pipeline (dvc.yaml), in the order DVC runs it", 14, INK, "bold")
            + _text(10, 42, "an arc: what a stage reads from an earlier stage than the one "
                    "before it", 12, MUTED)
            + "\n".join(parts) + "</svg>\n")


def on_files(files: Files, config: Any) -> Files:
    """Adds the picture to the site (there is no checked-in copy to drift)."""
    files.append(File.generated(config, IMAGE, content=render(load())))
    return files
