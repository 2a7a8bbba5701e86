"""Run every benchmark, collect bench/results.json and refresh the benchmarks page's tables.

    python -m bench.run_all        (what `make bench` runs, after `make run`)
    python -m bench.run_all --collect-only   (reuse the bench/<name>.json files already there)

Each benchmark runs in its own process and writes bench/<name>.json; this script adds the no-op
`dvc repro` time of the workspace pipeline, writes bench/results.json and prints the tables. The
documentation's benchmarks page renders the same tables and its summary of met and missed
targets from these files when the site is built (bench/report.py; the README keeps only the
headline results). `bench.gpu` runs where a GPU is present; elsewhere its last figures
(bench/gpu.json) are shown as such.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

from bench import report
from bench.common import HERE, machine, run_under
from bench.report import BENCHES

ROOT = HERE.parent
# train_speed runs two train stages side by side: one torch thread each, or on 2 cores each
# stage's second thread spin-waits for a core the other stage holds (0.93 instead of 0.82)
ARGS = {"train_speed": ["--threads", "1"],
        # our full fine-tuning and the peer again, alone: their seconds per epoch
        "layers_full": ["--rows", "full,st", "--sets", "trec,news_pairs", "--name", "layers_full"],
        # the page's runs (hours at its defaults on 2 cores: 5 seeds, 6 sizes, SetFit to 64)
        "small_data": ["--sizes", "8,32,all", "--seeds", "3", "--top2-sizes", "8,32",
                       "--setfit-sizes", "32", "--setfit-seeds", "2"],
        "query_adapter": ["--limit", "news_pairs=1500"],
        # the default export (make run's models/export) as the teacher; the documented path
        # for a large file measured on 1M lines
        "static": ["--file-lines", "1000000"]}
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


def gpu(collect_only: bool) -> dict | None:
    """bench/gpu.py's results: measured now where a GPU is present, else the last ones kept in
    bench/gpu.json (measured on a lent GPU machine)."""
    if torch.cuda.is_available() and not collect_only:
        subprocess.run([sys.executable, "-m", "bench.gpu"], cwd=ROOT, check=True)
    path = HERE / "gpu.json"
    return json.loads(path.read_text()) if path.is_file() else None


def main() -> None:
    collect_only = "--collect-only" in sys.argv  # reuse the bench/<name>.json already written
    results = {"machine": machine()}
    for name in BENCHES:
        if not collect_only:
            subprocess.run([sys.executable, "-m", f"bench.{MODULE.get(name, name)}",
                            *ARGS.get(name, [])], cwd=ROOT, check=True)
        results[name] = json.loads((HERE / f"{name}.json").read_text())
    results["gpu"] = gpu(collect_only)
    results["noop_repro"] = noop_repro()
    results["run_under"] = run_under()  # the no-op rerun's commit and params
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(report.summary(results))
    print(report.page(results))


if __name__ == "__main__":
    sys.exit(main())
