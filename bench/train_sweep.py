"""Would other training defaults reach the default's test metrics in less time? The default TREC
train stage in head mode (`train.mode: head`, whatever params.yaml's default) under each setting
(one torch thread each, two settings at a time side by side), then the evaluate stage on each
kept head.

    python -m bench.train_sweep [SETTING ...]

A SETTING is comma-separated key=value overrides of params.yaml, e.g.
`train.schedule.head.batch_size=512,train.schedule.head.lr=0.01` (none given: the defaults and
the five settings below).

Needs the prepared TREC data and its cache in the workspace (`dvc repro cache`). One seed:
differences of ~0.01 in a test metric are within the noise of 538 test questions. Prints a
Markdown table and writes bench/train_sweep.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml

from bench.common import machine, table, write_results
from bench.train_speed import _evaluate, _stage_job
from simtune import params as P

ROOT = Path(__file__).resolve().parents[1]
BATCH, LR = "train.schedule.head.batch_size", "train.schedule.head.lr"
SETTINGS = ["", f"{BATCH}=512", f"{BATCH}=256", f"{LR}=0.01", f"{BATCH}=512,{LR}=0.01",
            f"{BATCH}=256,{LR}=0.002"]
METRICS = ("p@1", "mrr@10", "ndcg@10", "map@r")


def params_file(over: str, out: Path) -> Path:
    raw = P.read_yaml(ROOT / "params.yaml")
    raw["train"]["mode"] = "head"  # the mode measured (a setting may name another)
    for kv in filter(None, over.split(",")):
        key, value = kv.split("=", 1)
        *path, last = key.split(".")
        section = raw
        for part in path:
            section = section[part]
        section[last] = yaml.safe_load(value)
    f = out / f"{len(list(out.glob('*.yaml')))}.yaml"
    f.write_text(yaml.safe_dump(raw, sort_keys=False))
    return f


def main() -> None:
    settings = sys.argv[1:] or SETTINGS
    results = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in ("prepared", "cache"):  # the workspace's, as the train stage reads them
            (tmp / name).symlink_to(ROOT / ("data/prepared" if name == "prepared" else name))
        jobs = [(s, params_file(s, tmp)) for s in settings]
        for i in range(0, len(jobs), 2):
            procs = [(s, f, _stage_job(ROOT, tmp, f, tmp / f.stem, 1)) for s, f in jobs[i : i + 2]]
            for s, f, proc in procs:
                if proc.wait() != 0:
                    raise RuntimeError((tmp / f.stem / "log").read_text()[-2000:])
                report = json.loads((tmp / f.stem / "train.json").read_text())
                test = _evaluate(tmp, f, tmp / f.stem)
                results[s or "defaults"] = {
                    "wall_s": float((tmp / f.stem / "time").read_text().split()[-3]),
                    "kept": report["best_epoch"], "epochs": report["epochs"],
                    **{m: test[m] for m in METRICS}}
                print(s or "defaults", results[s or "defaults"], flush=True)
    rows = [{"setting": s, "train stage (s)": r["wall_s"], "kept / epochs":
             f"{r['kept']} / {r['epochs']}", **{m: r[m] for m in METRICS}}
            for s, r in results.items()]
    rendered = table(rows, ["setting", "train stage (s)", "kept / epochs", *METRICS])
    print(rendered)
    write_results("train_sweep", {"machine": machine(), "results": results, "table": rendered})


if __name__ == "__main__":
    main()
