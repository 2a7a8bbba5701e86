"""Run every benchmark, collect bench/results.json and refresh the benchmarks page's tables.

    python -m bench.run_all        (what `make bench` runs, after `make run`)
    python -m bench.run_all --collect-only   (reuse the bench/<name>.json files already there)

Each benchmark runs in its own process and writes bench/<name>.json; this script adds the no-op
`dvc repro` time of the workspace pipeline, writes bench/results.json and replaces the tables
between the `<!-- bench:start -->` and `<!-- bench:end -->` markers of the documentation's
benchmarks page (docs/benchmarks.md; the README keeps only the headline results). `bench.gpu`
runs where a GPU is present; elsewhere its last figures (bench/gpu.json) are shown as such.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

from bench.common import HERE, machine, table

ROOT = HERE.parent
PAGE = ROOT / "docs" / "benchmarks.md"  # the tables go between its bench:start/end markers
BENCHES = ("cache_fill", "train_speed", "eval_topk", "negatives", "layers", "layers_full",
           "sweep", "scale", "long_docs")
# train_speed runs two train stages side by side: one torch thread each, or on 2 cores each
# stage's second thread spin-waits for a core the other stage holds (0.93 instead of 0.82)
ARGS = {"train_speed": ["--threads", "1"],
        # our full fine-tuning and the peer again, alone: their seconds per epoch
        "layers_full": ["--rows", "full,st", "--sets", "trec,news_pairs", "--name", "layers_full"]}
MODULE = {"layers_full": "layers"}  # a results file written by another bench's script


def noop_repro() -> dict:
    dvc = [sys.executable, "-m", "dvc"]
    status = subprocess.run([*dvc, "status", "--json"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    if status not in ("{}", ""):
        subprocess.run([*dvc, "repro"], cwd=ROOT, check=True)
    t0 = time.perf_counter()
    out = subprocess.run([*dvc, "repro"], cwd=ROOT, capture_output=True, text=True, check=True)
    return {"seconds": time.perf_counter() - t0, "ran_nothing": "Running stage" not in out.stdout}


def time_to_quality(layers: dict) -> str:
    """bench/layers.py's full table, under its own heading, with the command that made it."""
    return (f"\n\n### Time to quality\n\n`{layers['command']}` (encoder rows and the peer: "
            f"{layers['epochs']} epoch(s)):\n\n{layers['table']}")


def full_and_sweep(results: dict) -> str:
    """bench/layers_full.json's, bench/sweep.json's and bench/scale.json's tables, each under
    its own heading."""
    full, sweep, scale = results["layers_full"], results["sweep"], results["scale"]
    return (f"\n\n### Full fine-tuning against the peer\n\n`{full['command']}`:\n\n"
            f"{full['table']}\n\n### Sweeps\n\n`{sweep['command']}`:\n\n{sweep['table']}"
            f"\n\n### The top_layers cache at scale\n\n`{scale['command']}`:\n\n"
            f"{scale['table']}\n\n{scale['note']}")


def long_docs(results: dict) -> str:
    """bench/long_docs.json's tables (one per long-text set) under their own heading."""
    long = results["long_docs"]
    notes = "".join(f"\n- {n}" for n in long.get("skipped", []))
    return (f"\n\n### Long documents\n\n`{long['command']}` (top-2 rows: "
            f"{long['top2_epochs']} epoch(s)):\n\n{long['table'].rstrip()}\n"
            + (f"\nNot measured:\n{notes}\n" if notes else ""))


def gpu(collect_only: bool) -> tuple[dict | None, str]:
    """bench/gpu.py's results: measured now where a GPU is present, else the last ones kept in
    bench/gpu.json (measured on a lent GPU machine), said so under their own heading."""
    if torch.cuda.is_available() and not collect_only:
        subprocess.run([sys.executable, "-m", "bench.gpu"], cwd=ROOT, check=True)
        how = "measured in this run"
    else:
        how = "no GPU here: the figures kept in bench/gpu.json"
    path = HERE / "gpu.json"
    if not path.is_file():
        return None, ""
    results = json.loads(path.read_text())
    return results, (f"\n\n### GPU\n\n`python -m bench.gpu` on {results['machine']} ({how}):"
                     f"\n\n{results['table']}")


def main() -> None:
    collect_only = "--collect-only" in sys.argv  # reuse the bench/<name>.json already written
    results = {"machine": machine()}
    for name in BENCHES:
        if not collect_only:
            subprocess.run([sys.executable, "-m", f"bench.{MODULE.get(name, name)}",
                            *ARGS.get(name, [])], cwd=ROOT, check=True)
        results[name] = json.loads((HERE / f"{name}.json").read_text())
    results["gpu"], gpu_section = gpu(collect_only)
    results["noop_repro"] = noop_repro()
    # full fine-tuning's seconds per epoch against the peer: from layers_full, the run that
    # measures those two rows alone (the time-to-quality table keeps its own, in its table)
    rows = [r for name in BENCHES for r in results[name].get("rows", [])
            if not (name == "layers" and "full fine-tuning, train s per epoch" in r["measure"])]
    rows.append({"measure": "no-op `dvc repro` of the whole pipeline (s)",
                 "ours": results["noop_repro"]["seconds"], "peer name": "", "peer": "",
                 "ratio": "", "target": "runs nothing"})
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    rendered = (f"Measured on {results['machine']} with `make bench`:\n\n"
                + table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"])
                + time_to_quality(results["layers"]) + full_and_sweep(results)
                + long_docs(results) + gpu_section)
    print(rendered)
    PAGE.write_text(between_markers(PAGE.read_text(), rendered))


def between_markers(text: str, rendered: str) -> str:
    """`text` with what lies between its bench markers replaced by `rendered`; a page without
    both markers is an error (the tables would silently go nowhere)."""
    start, end = "<!-- bench:start -->", "<!-- bench:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{PAGE}: no {start} ... {end} markers to write the tables between")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{rendered}\n{end}{rest.split(end, 1)[1]}"


if __name__ == "__main__":
    sys.exit(main())
