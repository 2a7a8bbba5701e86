"""One bench/panel.json from several `python -m bench.panel --out FILE` runs (entries or seeds run
apart, e.g. beside other work or in another session), with the summary, checks and tables
recomputed over all their runs.

The parts must have run under the same commit and params.yaml (`run_under`, which
`bench.common.write_results` records): runs under other settings are other measurements, and
the merge refuses them, naming the file. A row name defined differently in two parts, or the
same (entry, seed) run twice, is refused too. Each part's command, load and completeness stay
in `parts`.

    python -m bench.panel_merge PART.json [PART.json ...] [--out bench/panel.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench import panel_report as report


class MergeError(ValueError):
    """Parts that are not one measurement (the message names the file and what differs)."""


def merged(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The panel payload of all `parts` ({file name: its payload}), in the given order."""
    if not parts:
        raise MergeError("no part given")
    names = list(parts)
    first = parts[names[0]]
    rows: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for name in names:
        part = parts[name]
        if part.get("run_under") != first.get("run_under"):
            raise MergeError(f"{name}: ran under another commit or params.yaml than {names[0]}")
        for row, spec in part["rows"].items():
            if rows.setdefault(row, spec) != spec:
                raise MergeError(f"{name}: row '{row}' is defined otherwise than before")
        for run in part["runs"]:
            key = (run["entry"], run["seed"])
            if key in seen:
                raise MergeError(f"{name}: {run['entry']} seed {run['seed']} is run twice")
            seen.add(key)
            runs.append(run)
        for entry, info in part["entries"].items():
            if entry in entries:  # seeds run apart: one entry, its seconds summed
                entries[entry] = {**info, "seconds": entries[entry]["seconds"] + info["seconds"],
                                  "cpu_s": entries[entry].get("cpu_s", 0) + info.get("cpu_s", 0)}
            else:
                entries[entry] = info
    trained = [r for r in rows if r != "frozen"]
    summed = report.summary(runs, trained)
    checks = report.checks(summed)
    return {"machine": first["machine"],
            "command": "python -m bench.panel_merge " + " ".join(names),
            "complete": all(parts[n]["complete"] for n in names), "git": first["git"],
            "parts": [{"file": n, "command": parts[n]["command"], "load": parts[n]["load"],
                       "complete": parts[n]["complete"]} for n in names],
            "halves": first["halves"], "rows": rows, "train_params": first["train_params"],
            "entries": entries, "runs": runs, "summary": summed, "checks": checks,
            "table": report.rendered(summed, checks),
            "skipped": list(dict.fromkeys(s for n in names for s in parts[n]["skipped"])),
            "run_under": first.get("run_under")}


NEEDED = ("machine", "command", "complete", "git", "load", "halves", "rows", "train_params",
          "entries", "runs", "skipped")


def read_part(path: Path) -> dict[str, Any]:
    """A `bench.panel --out` file, its keys checked."""
    part = json.loads(path.read_text())
    missing = [k for k in NEEDED if not isinstance(part, dict) or k not in part]
    if missing:
        raise MergeError(f"{path}: not a bench.panel file (no {', '.join(missing)})")
    return part


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("parts", nargs="+", type=Path, help="bench.panel --out files")
    ap.add_argument("--out", type=Path, default=None, help="default: bench/panel.json")
    args = ap.parse_args(argv)
    try:
        if len({p.name for p in args.parts}) < len(args.parts):
            raise MergeError("two parts of one file name (the merge names each part by it)")
        payload = merged({p.name: read_part(p) for p in args.parts})
    except (OSError, json.JSONDecodeError, MergeError) as e:
        print(f"bench.panel_merge: {e}", file=sys.stderr)
        return 1
    out = args.out or report.target()
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(out)
    print(payload["table"])
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
