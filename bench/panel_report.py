"""bench.panel's summary, checks and tables (pure Python over its runs).

A run: {"entry", "half", "seed", "vectors_s", "rows": {row: bench.small_data.pipeline's result
(`metrics`: trained and frozen P@1, MRR@10, MAP@R), or that of the row it is the same run as
(`same_as`)}}. The frozen row is the default run's baseline.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from bench.report import table
from bench.small_data import _cell  # one mean ± sd cell format for both tables

METRICS = ("p@1", "mrr@10", "map@r")
CLOSE = 0.01  # the default within this much P@1 of the best row


def run_line(run: dict[str, Any]) -> str:
    """`frozen 0.450, head 0.610, default 0.868 (top_layers)`: one run's test P@1 per row."""
    rows = run["rows"]
    parts = [f"frozen {rows['default']['frozen']:.3f}"] if "default" in rows else []
    parts += [f"{r} {v['trained']:.3f}" + (f" ({v['mode']})" if r != "head" else "")
              for r, v in rows.items()]
    return ", ".join(parts) or "no row measured"


def mean_sd(xs: list[float]) -> dict[str, Any] | None:
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else None,
            "n": len(xs)}


def _values(run: dict[str, Any], row: str) -> tuple[dict[str, float], float, Any] | None:
    """(metrics, seconds, the row's run) of one row in one run; None: not measured there."""
    rows = run["rows"]
    if row == "frozen":
        if "default" not in rows:
            return None
        return rows["default"]["metrics"]["frozen"], run["vectors_s"], None
    if row not in rows:
        return None
    return rows[row]["metrics"]["trained"], rows[row]["seconds"], rows[row]


def summary(runs: list[dict[str, Any]], trained: list[str]) -> list[dict[str, Any]]:
    """Per entry and row: mean ± sd over seeds of each metric and of the seconds (frozen: the
    vector fill; a trained row: its layer fill and training), the modes it trained in, the
    kept epochs, and how many of its runs were another row's run (`same_as`)."""
    out = []
    for name in dict.fromkeys(r["entry"] for r in runs):
        mine = [r for r in runs if r["entry"] == name]
        for row in ("frozen", *trained):
            got = [v for r in mine if (v := _values(r, row)) is not None]
            if not got:
                continue
            s: dict[str, Any] = {"entry": name, "half": mine[0]["half"], "row": row,
                                 **{m: mean_sd([g[0][m] for g in got]) for m in METRICS},
                                 "seconds": mean_sd([g[1] for g in got])}
            if row != "frozen":
                s["modes"] = dict(Counter(g[2]["mode"] for g in got))
                s["kept_epochs"] = [g[2]["kept_epoch"] for g in got]
                s["same_as"] = [g[2].get("same_as") for g in got]
            out.append(s)
    return out


def checks(summed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per entry with default and frozen rows: the default's P@1 lift over frozen, whether it
    is >= frozen within the seeds' sd (the larger of the two rows' sds; 0 with one seed), the
    best row by mean P@1 and whether the default is within `CLOSE` of it."""
    out = []
    for name in dict.fromkeys(s["entry"] for s in summed):
        rows = {s["row"]: s for s in summed if s["entry"] == name}
        if not {"default", "frozen"} <= rows.keys():
            continue
        d, f = rows["default"]["p@1"], rows["frozen"]["p@1"]
        sd = max(d["sd"] or 0.0, f["sd"] or 0.0)
        best = max(rows, key=lambda r: rows[r]["p@1"]["mean"])
        gap = d["mean"] - rows[best]["p@1"]["mean"]
        out.append({"entry": name, "half": rows["default"]["half"],
                    "lift": d["mean"] - f["mean"], "sd": sd,
                    "default_ge_frozen": d["mean"] >= f["mean"] - sd, "best": best,
                    "default_minus_best": gap, "default_within_0.01_of_best": gap >= -CLOSE})
    return out


def rendered(summed: list[dict[str, Any]], checked: list[dict[str, Any]]) -> str:
    """The rows table (per entry and row), then the checks table."""
    if not summed:
        return "(no run measured yet)"
    rows = [{"entry": s["entry"], "half": s["half"], "row": s["row"],
             "mode": ", ".join(f"{m} {n}" if len(s["modes"]) > 1 else m
                               for m, n in s["modes"].items()) if s.get("modes") else "",
             "P@1": _cell(s["p@1"]), "MRR@10": _cell(s["mrr@10"]), "MAP@R": _cell(s["map@r"]),
             "s": _cell(s["seconds"], 0), "seeds": s["p@1"]["n"]} for s in summed]
    out = table(rows, ["entry", "half", "row", "mode", "P@1", "MRR@10", "MAP@R", "s", "seeds"])
    if checked:
        out += "\n\n" + table([{
            "entry": c["entry"], "half": c["half"], "default - frozen": f"{c['lift']:+.3f}",
            ">= frozen (sd)": f"{'yes' if c['default_ge_frozen'] else 'NO'} ({c['sd']:.3f})",
            "best": c["best"], "default - best": f"{c['default_minus_best']:+.3f}",
            "within 0.01": "yes" if c["default_within_0.01_of_best"] else "NO"}
            for c in checked], ["entry", "half", "default - frozen", ">= frozen (sd)", "best",
                                "default - best", "within 0.01"])
    return out


def target() -> Path:
    from bench.common import HERE, OUT_ENV

    return Path(os.environ.get(OUT_ENV) or HERE) / "panel.json"
