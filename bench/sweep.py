"""`simtune sweep` in one process vs the same trials as separate train-stage processes (the cost
a `dvc exp run --queue` grid pays per trial at least: Python, torch and Lightning start-up and
the cache reloaded; DVC's own checkout and commit come on top), head mode on the workspace's
data (TREC by default); resident memory after the first and after the last in-process trial.

    python -m bench.sweep [--trials 50] [--subprocess 5] [--set train.max_epochs=20 ...]

The in-process sweep is the real one (TPE, the median pruner, a SQLite study in a temp dir) over
the workspace's `sweep` section; the first `--subprocess` trials (the pruner's start-up: never
pruned) are then rerun one `python -m stages train` process each, with the same params, and
must reach the same validation value. `--set` overrides params for both (e.g. a short
`train.max_epochs` for a quick check). Needs `data/prepared` and `cache` (`dvc repro cache`).
Prints a Markdown table and writes bench/sweep.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import machine, rss_mb, table, write_results

ROOT = Path(__file__).resolve().parents[1]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def _params(tmp: Path, trials: int, sets: list[str]) -> Path:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["sweep"].update(trials=trials, timeout=0, storage=str(tmp / "sweep.db"), study="bench")
    raw["train"]["mode"] = "head"
    for kv in sets:
        key, value = kv.split("=", 1)
        *parents, leaf = key.split(".")
        section = raw
        for part in parents:
            section = section[part]
        section[leaf] = yaml.safe_load(value)
    f = tmp / "params.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


def in_process(params_file: Path, prepared: Path, cache: Path) -> dict[str, Any]:
    """The sweep as `simtune sweep` runs it; seconds and resident memory after each trial."""
    import optuna

    from simtune import params as P
    from simtune.train import sweep as lib

    rows: list[dict[str, Any]] = []
    start = time.perf_counter()

    def record(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        rows.append({"trial": trial.number, "state": trial.state.name.lower(),
                     "value": trial.value, "params": trial.params,
                     "epochs": trial.user_attrs.get("epochs"),
                     "s": trial.duration.total_seconds() if trial.duration else None,
                     "rss_mb": rss_mb(), "peak_rss_mb": _peak_mb(),
                     "elapsed_s": time.perf_counter() - start})

    lib.run(P.load(params_file), prepared, cache, callbacks=[record])
    return {"wall_s": time.perf_counter() - start, "trials": rows}


def as_processes(params_file: Path, trials: list[dict[str, Any]], prepared: Path, cache: Path,
                 tmp: Path) -> list[dict[str, Any]]:
    """Each trial's params through the train stage, one process each (wall seconds)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "HF_HUB_OFFLINE": "1"}
    out = []
    for t in trials:
        raw = yaml.safe_load(params_file.read_text())
        for key, value in t["params"].items():
            *parents, leaf = key.split(".")
            section = raw
            for part in parents:
                section = section[part]
            section[leaf] = value
        d = tmp / f"trial{t['trial']}"
        d.mkdir()
        (d / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        cmd = [sys.executable, "-m", "stages", "train", "--params", str(d / "params.yaml"),
               "--prepared", str(prepared), "--cache", str(cache), "--out", str(d / "head"),
               "--report", str(d / "train.json"), "--live", str(d / "live")]
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=d, env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        report = json.loads((d / "train.json").read_text())
        monitor = raw["train"]["monitor"]
        out.append({"trial": t["trial"], "s": wall, "value": report["best_val"][f"val/{monitor}"],
                    "same_value": report["best_val"][f"val/{monitor}"] == t["value"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--subprocess", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--prepared", type=Path, default=ROOT / "data" / "prepared")
    ap.add_argument("--cache", type=Path, default=ROOT / "cache")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # a line per trial
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        params_file = _params(tmp, args.trials, args.sets)
        sweep = in_process(params_file, args.prepared.resolve(), args.cache.resolve())
        rows = sweep["trials"]
        first = [t for t in rows[: args.subprocess] if t["state"] == "complete"]
        procs = as_processes(params_file, first, args.prepared.resolve(),
                             args.cache.resolve(), tmp)
    same = {p["trial"] for p in procs}
    in_s = sum(t["s"] for t in rows if t["trial"] in same)
    sub_s = sum(p["s"] for p in procs)
    finished = [t for t in rows if t["state"] in ("complete", "pruned")]
    result = {
        "machine": machine(), "sets": args.sets, "trials": len(rows),
        "pruned": sum(t["state"] == "pruned" for t in rows),
        "in_process_trials_per_min": 60 * len(finished) / sweep["wall_s"],
        "same_trials": sorted(same),
        "same_trials_per_min": {"in_process": 60 * len(same) / max(in_s, 1e-9),
                                "processes": 60 * len(same) / max(sub_s, 1e-9)},
        "processes_reach_the_same_value": all(p["same_value"] for p in procs),
        "rss_mb": {"after_1": rows[0]["rss_mb"], f"after_{len(rows)}": rows[-1]["rss_mb"]},
        "peak_rss_mb": {"after_1": rows[0]["peak_rss_mb"],
                        f"after_{len(rows)}": rows[-1]["peak_rss_mb"]},
        "sweep": sweep, "processes": procs,
    }
    print(table([{"what": "in-process sweep (all trials, pruned included)",
                  "trials/min": result["in_process_trials_per_min"]},
                 {"what": f"in-process, trials {sorted(same)}",
                  "trials/min": result["same_trials_per_min"]["in_process"]},
                 {"what": "the same trials, one train process each",
                  "trials/min": result["same_trials_per_min"]["processes"]}],
                ["what", "trials/min"]))
    print(table([{"after trial": n, "RSS MB": r["rss_mb"], "peak RSS MB": r["peak_rss_mb"]}
                 for n, r in ((1, rows[0]), (len(rows), rows[-1]))],
                ["after trial", "RSS MB", "peak RSS MB"]))
    print(f"processes reach the sweep's values: {result['processes_reach_the_same_value']}")
    print(f"wrote {write_results('sweep', result)}")


if __name__ == "__main__":
    main()
