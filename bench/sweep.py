"""`simtune sweep` against the loop users have without it: a `dvc exp run --queue` grid.

Per data set (TREC-50 questions; news title -> body pairs), in a throw-away git copy of the
project (the machine's shared store, so a text embedded before is not embedded again):
  1. `dvc repro` with params.yaml's defaults in head mode (`train.mode: head`, the mode the
     sweep's space trains): the default model's validation and test metrics;
  2. the in-process sweep over the `sweep` section (TPE, the median pruner, the section's
     `fixed` schedule; a SQLite study in the copy): seconds and resident memory per trial;
  3. (TREC) the sweep's first `--queue` trials again as a DVC grid, `dvc exp run --queue train
     -S ...` each, run by `dvc queue start -j 1`: what those trials cost as DVC experiments
     (a process start-up, the cache reloaded, DVC's checkout and commit; no pruning);
  4. the best trial through the pipeline (`dvc exp run -S <the sweep's line>`): its validation
     value must equal the sweep's, then its test metrics beside the defaults'.
For news pairs the loss is MNRL (`train.loss.name=mnrl`) and its `scale` is swept in place of
SupCon's temperature.

    python -m bench.sweep [--trials 50] [--queue 10] [--sets trec,news_pairs]

Prints Markdown tables and writes bench/sweep.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import copy_project, machine, rss_mb, table, write_results
from bench.exp_queue import _run
from simtune import params as P

ROOT = Path(__file__).resolve().parents[1]
# data set -> params set on top of params.yaml, and space keys replaced
SETS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "trec": ({}, {}),
    "news_pairs": ({"prepare.source": "news_pairs", "train.loss.name": "mnrl"},
                   {"train.loss.temperature": None,
                    "train.loss.scale": {"low": 10.0, "high": 50.0, "log": True}}),
}
METRICS = ("p@1", "mrr@10", "ndcg@10", "map@r")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        raw = raw[part]
    raw[leaf] = value


def project_for(work: Path, name: str, trials: int) -> tuple[Path, dict[str, str]]:
    """A git copy of the project with the data set's params and the sweep's storage in it."""
    project = work / name
    copy_project(project)
    raw = P.read_yaml(project / "params.yaml")
    # the mode measured (the sweep's space and `fixed` are the head's): the defaults' run too
    raw["train"]["mode"] = "head"
    sets, space = SETS[name]
    for key, value in sets.items():
        _set(raw, key, value)
    for key, entry in space.items():
        if entry is None:
            raw["sweep"]["space"].pop(key)
        else:
            raw["sweep"]["space"][key] = entry
    raw["sweep"].update(trials=trials, timeout=0, study=f"bench-{name}")
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1",
           "PYTHONPATH": f"{project / 'src'}:{project}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], _commit("copy")):
        _run(project, env, *cmd)
    return project, env


def _commit(msg: str) -> list[str]:
    return ["git", "-c", "user.name=bench", "-c", "user.email=b@example.invalid", "commit",
            "-qm", msg]


def pipeline_result(project: Path, monitor: str) -> dict[str, Any]:
    """The workspace's validation value (train report) and test metrics (evaluate)."""
    train = json.loads((project / "reports" / "train.json").read_text())
    test = json.loads((project / "reports" / "metrics.json").read_text())
    # the metric the run selected by (`auto` resolved: the report says which)
    return {"val": train["best_val"][f"val/{train.get('monitor', monitor)}"],
            "kept_epoch": train["best_epoch"],
            "test": test["trained"], "lift": test["lift"]}


def in_process(project: Path) -> dict[str, Any]:
    """The sweep as `simtune sweep` runs it (in this process, over the copy's data); seconds
    and resident memory after each trial."""
    import optuna

    from simtune import params as P
    from simtune.train import sweep as lib

    rows: list[dict[str, Any]] = []
    start = time.perf_counter()

    def record(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        rows.append({"trial": trial.number, "state": trial.state.name.lower(),
                     "value": trial.value, "params": trial.params,
                     "epochs": trial.user_attrs.get("epochs"),
                     "pruned_at": trial.user_attrs.get("pruned_at"),
                     "s": trial.duration.total_seconds() if trial.duration else None,
                     "rss_mb": rss_mb(), "peak_rss_mb": _peak_mb()})

    cwd = Path.cwd()
    os.chdir(project)  # sweep.storage is relative to the project
    try:
        p = P.load(project / "params.yaml")
        study = lib.run(p, project / "data" / "prepared", project / "cache",
                        project / "negatives", callbacks=[record])
    finally:
        os.chdir(cwd)
    from simtune.train import space
    from simtune.train.sweep_report import best_values

    return {"wall_s": time.perf_counter() - start, "trials": rows,
            "best_value": study.best_value, "best_line": space.overrides(best_values(study))}


def as_queue(project: Path, env: dict[str, str], fixed: dict[str, Any],
             trials: list[dict[str, Any]]) -> float:
    """The trials as a DVC grid: one queued `dvc exp run train -S ...` each (the sweep's fixed
    keys too), run by one queue worker; its wall seconds."""
    from simtune.train import space

    dvc = [sys.executable, "-m", "dvc"]
    for t in trials:
        line = space.overrides({**fixed, **t["params"]}).removeprefix("dvc exp run ")
        _run(project, env, *dvc, "exp", "run", "--queue", "train", *shlex.split(line))
    t0 = time.perf_counter()
    _run(project, env, *dvc, "queue", "start", "-j", "1")
    while any(s in _run(project, env, *dvc, "queue", "status").stdout
              for s in ("Queued", "Running")):
        time.sleep(1)
    seconds = time.perf_counter() - t0
    status = _run(project, env, *dvc, "queue", "status").stdout
    if status.count("Success") != len(trials):
        raise SystemExit(f"bench.sweep: the DVC queue did not finish every trial:\n{status}")
    return seconds


def measure(work: Path, name: str, trials: int, queue: int) -> dict[str, Any]:
    project, env = project_for(work, name, trials)
    raw = P.read_yaml(project / "params.yaml")
    monitor, dvc = raw["train"]["monitor"], [sys.executable, "-m", "dvc"]
    t0 = time.perf_counter()
    _run(project, env, *dvc, "repro")
    repro_s = time.perf_counter() - t0
    default = pipeline_result(project, monitor)
    for cmd in (["git", "add", "-A"], _commit("defaults")):
        _run(project, env, *cmd)
    print(f"{name}: defaults val {default['val']:.4f}, test p@1 {default['test']['p@1']:.4f} "
          f"({repro_s:.0f} s)", flush=True)
    sweep = in_process(project)
    rows = sweep["trials"]
    print(f"{name}: {len(rows)} trials in {sweep['wall_s']:.0f} s, best val "
          f"{sweep['best_value']:.4f}", flush=True)
    out: dict[str, Any] = {"repro_s": repro_s, "default": default, "sweep": sweep,
                           "fixed": raw["sweep"]["fixed"]}
    if queue:
        first = rows[:queue]
        queue_s = as_queue(project, env, raw["sweep"]["fixed"], first)
        out["queue"] = {"trials": len(first), "s": queue_s,
                        "in_process_s": sum(t["s"] for t in first)}
        print(f"{name}: the first {len(first)} trials, DVC queue {queue_s:.0f} s vs in-process "
              f"{out['queue']['in_process_s']:.0f} s", flush=True)
    t0 = time.perf_counter()
    _run(project, env, *dvc, "exp", "run", *shlex.split(sweep["best_line"])[3:])
    out["best_pipeline_s"] = time.perf_counter() - t0
    out["best"] = pipeline_result(project, monitor)
    out["best_reproduces_the_sweep"] = out["best"]["val"] == sweep["best_value"]
    return out


def tables(results: dict[str, Any], trials: int) -> str:
    lines, speed, quality = [], [], []
    for name, r in results.items():
        rows = r["sweep"]["trials"]
        done = [t for t in rows if t["state"] in ("complete", "pruned")]
        speed.append({"data": name, "run": f"in-process sweep, {len(rows)} trials "
                      f"({sum(t['state'] == 'pruned' for t in rows)} pruned)",
                      "s": r["sweep"]["wall_s"],
                      "trials/min": 60 * len(done) / r["sweep"]["wall_s"],
                      "RSS MB after 1 / last": f"{rows[0]['rss_mb']:.0f} / "
                                                 f"{rows[-1]['rss_mb']:.0f}"})
        if "queue" in r:
            q = r["queue"]
            speed.append({"data": name, "run": f"its first {q['trials']} trials, in-process",
                          "s": q["in_process_s"],
                          "trials/min": 60 * q["trials"] / q["in_process_s"]})
            speed.append({"data": name, "run": f"the same {q['trials']}, `dvc exp run --queue`"
                          " grid (1 worker)", "s": q["s"],
                          "trials/min": 60 * q["trials"] / q["s"]})
        for who, m, s in (("defaults (params.yaml)", r["default"], r["repro_s"]),
                          (f"best of {trials} (sweep, then `dvc exp run -S ...`)", r["best"],
                           r["sweep"]["wall_s"] + r["best_pipeline_s"])):
            quality.append({"data": name, "params": who, "val": m["val"], "kept epoch":
                            m["kept_epoch"], **{f"test {k}": m["test"][k] for k in METRICS},
                            "s": s})
    lines.append(table(speed, ["data", "run", "s", "trials/min", "RSS MB after 1 / last"]))
    lines.append(table(quality, ["data", "params", "val", "kept epoch",
                                 *(f"test {k}" for k in METRICS), "s"]))
    return "\n\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=50, help="trials of each sweep")
    ap.add_argument("--queue", type=int, default=10, help="trials rerun as a DVC grid (TREC)")
    ap.add_argument("--sets", default=",".join(SETS), help="data sets, comma-separated")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # a line per trial
    results = {}
    with tempfile.TemporaryDirectory(prefix="simtune-bench-sweep-") as d:
        for name in args.sets.split(","):
            results[name] = measure(Path(d), name, args.trials,
                                    args.queue if name == "trec" else 0)
    text = tables(results, args.trials)
    print(text)
    for name, r in results.items():
        print(f"{name}: the best trial through the pipeline reaches the sweep's validation "
              f"value: {r['best_reproduces_the_sweep']}; line: {r['sweep']['best_line']}")
    command = " ".join(["python -m bench.sweep", *sys.argv[1:]])
    path = write_results("sweep", {"machine": machine(), "command": command,
                                   "results": results, "table": text})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
