"""bench.static's headline rows for the benchmarks page and its large-file run (the documented
`simtune.static.encode_file` path in a child process, its peak memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"share": 0.90, "speed_1t": 100.0, "fit_s": 60.0}


def _peak_mb(code: str) -> tuple[float, float]:
    """(peak resident MB, seconds) of `python -c code` (/usr/bin/time -v's maximum RSS)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    kb = next(int(line.rsplit(":", 1)[1]) for line in proc.stderr.splitlines()
              if "Maximum resident set size" in line)
    return kb / 1024, seconds


def encode_file_run(folder: Path, texts: list[str], lines: int, work: Path) -> dict[str, Any]:
    """The documented path for a large file (`simtune.static.encode_file`) on `lines` lines
    (`texts` repeated) with the static model `folder`, in a child process: its peak memory,
    against a child that only loads the model and encodes one batch, and its seconds."""
    src = work / "lines.txt"
    with src.open("w", encoding="utf-8") as f:
        for i in range(lines):
            f.write(texts[i % len(texts)].replace("\n", " ") + "\n")
    load = ("from simtune.model import load_model; "
            f"load_model({str(folder)!r}, 'cpu').encode(['x'] * 4096, 4096)")
    run = ("from pathlib import Path; from simtune.model import load_model; "
           "from simtune.static import encode_file; "
           f"encode_file(load_model({str(folder)!r}, 'cpu'), Path({str(src)!r}), "
           f"Path({str(work / 'lines.npy')!r}), progress=False)")
    load_mb, _ = _peak_mb(load)
    peak_mb, seconds = _peak_mb(run)
    out_mb = (work / "lines.npy").stat().st_size / 2**20
    (work / "lines.npy").unlink()
    return {"lines": lines, "peak_mb": peak_mb, "load_peak_mb": load_mb, "seconds": seconds,
            "output_mb": out_mb, "input_mb": src.stat().st_size / 2**20}


HEADLINE_ROW = "ours+labels"  # the pipeline's default (train.schedule.static.label_weight 0.1)


def _by(rows: list[dict[str, Any]], group: tuple[str, str], prefix: str) -> dict[str, Any]:
    """The row of (set, teacher) `group` whose name starts with `prefix` (lexical and frozen
    rows: the set's, teacher "-")."""
    name, teacher = group
    return next(r for r in rows if r.get("set", "trec") == name and r["row"].startswith(prefix)
                and r["teacher"] in (teacher, "-"))


def _key(column: str) -> str:
    """A column's name as a page's figure path can hold it ("texts/s 1t" -> texts_per_s_1t)."""
    return column.replace("/", "_per_").replace(" ", "_")


def group_key(set_name: str, teacher: str) -> str:
    """A (set, teacher)'s key in `headline`: trec's teacher name ("default": the figure paths
    the pages quote), the set's name for every other set (one trained teacher each)."""
    return teacher if set_name == "trec" else set_name


def _groups(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r.get("set", "trec"), r["teacher"]) for r in rows
                              if r["teacher"] != "-"))


def headline(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per set and teacher (`group_key`), the figures a page quotes: every row's P@1, share,
    speeds and fit s (the set's frozen and lexical rows too), by row name without its
    parenthesis ("ours+labels" -> ours_labels, "tf-idf" stays; columns by `_key`)."""
    out: dict[str, dict[str, Any]] = {}
    for name, teacher in _groups(rows):
        mine = out.setdefault(group_key(name, teacher), {})
        for r in rows:
            if r.get("set", "trec") != name or r["teacher"] not in (teacher, "-"):
                continue
            key = r["row"].split(" (")[0].replace(" ", "_").replace("+", "_")
            mine[key] = {_key(k): v for k, v in r.items() if k not in ("teacher", "row", "set")}
    return out


def headline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The benchmarks page's headline rows (measure, ours, peer, ratio, target): per set and
    teacher, the headline student's share of the teacher's lift (target on TREC's default
    export), its 1-thread speed against MiniLM's, its P@1 against model2vec's distill and own
    fit, BM25's and TF-IDF's, and its fit seconds."""
    out = []
    for group in _groups(rows):
        name, teacher = group
        frozen = _by(rows, group, "frozen")
        ours, t = _by(rows, group, HEADLINE_ROW), _by(rows, group, "teacher")
        where = f"{name}, teacher {teacher}"
        target = name == "trec" and teacher == "default"
        out += [
            {"measure": f"static student ({HEADLINE_ROW}) test P@1, {where} "
                        f"(frozen MiniLM {frozen['p@1']:.3f})", "ours": ours["p@1"],
             "peer name": f"the teacher ({teacher})", "peer": t["p@1"],
             "ratio": f"{ours['share']:.2f} of the lift",
             "target": f">= {TARGETS['share']:.2f} of the lift" if target else ""},
            {"measure": f"encode texts/s, 1 thread, static student ({where}) vs MiniLM",
             "ours": ours["texts/s 1t"], "peer name": "frozen MiniLM",
             "peer": frozen["texts/s 1t"], "ratio": ours["x MiniLM 1t"],
             "target": f"ours/peer >= {TARGETS['speed_1t']:.0f}"}]
        for prefix, peer in (("m2v distill", "model2vec distill"),
                             ("m2v-fit", "model2vec StaticModelForSimilarity.fit"),
                             ("bm25", "BM25 (bm25s)"), ("tf-idf", "TF-IDF (scikit-learn)")):
            other = _by(rows, group, prefix)
            out.append({"measure": f"test P@1, ours vs {prefix} ({where})",
                        "ours": ours["p@1"], "peer name": peer, "peer": other["p@1"],
                        "ratio": ours["p@1"] / other["p@1"] if other["p@1"] else "",
                        "target": "ours/peer > 1"})
        out.append({"measure": f"static student fit s ({where}, {os.cpu_count()} cores)",
                    "ours": ours["fit s"], "peer name": "", "peer": "", "ratio": "",
                    "target": f"<= {TARGETS['fit_s']:.0f}"})
    return out
