"""The experiment loop on the default data set: a 6-experiment grid run as DVC's queue (2 workers)
vs the same 6 run one after another in the workspace, in a throw-away git copy of the project
(`train.mode: head`, the mode the grid's keys train); texts embedded by each experiment and the
disk used by the shared store, the views and DVC.

    python -m bench.exp_queue [--workers 2]

Prints a Markdown table and writes bench/exp_queue.json.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import copy_project, machine, table, write_results
from simtune.train.space import write_yaml

ROOT = Path(__file__).resolve().parents[1]
GRID = {"train.schedule.head.lr": ["0.001", "0.003", "0.01"],
        "train.head.type": ["mlp", "skip_connection"]}


def _run(cwd: Path, env: dict, *cmd: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def _embedded(text: str) -> int:
    return sum(int(m) for m in re.findall(r"cached, (\d+) to embed", text))


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="simtune-exp-"))
    project, store = work / "project", work / "store"
    copy_project(project)
    # the mode measured, whatever params.yaml's default (`auto` would pick the top layers on
    # TREC, where the grid's head learning rate trains nothing)
    write_yaml(project / "params.yaml", {"train.mode": "head"})
    env = {**os.environ, "SIMTUNE_STORE": str(store), "HF_HUB_OFFLINE": "1",
           "DVC_NO_ANALYTICS": "1", "PYTHONPATH": f"{project / 'src'}:{project}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    dvc = [sys.executable, "-m", "dvc"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=bench", "-c", "user.email=b@example.invalid", "commit",
                 "-qm", "copy"]):
        _run(project, env, *cmd)
    t0 = time.perf_counter()
    first = _run(project, env, *dvc, "repro")
    baseline_s = time.perf_counter() - t0
    _run(project, env, "git", "add", "-A")
    _run(project, env, "git", "-c", "user.name=bench", "-c", "user.email=b@example.invalid",
         "commit", "-qm", "baseline")
    sets = [f"{k}={','.join(v)}" for k, v in GRID.items()]
    _run(project, env, *dvc, "exp", "run", "--queue", *itertools.chain(*(["-S", s] for s in sets)))
    t0 = time.perf_counter()
    _run(project, env, *dvc, "queue", "start", "-j", str(args.workers))
    while any(s in _run(project, env, *dvc, "queue", "status").stdout
              for s in ("Queued", "Running")):
        time.sleep(2)
    queue_s = time.perf_counter() - t0
    status = _run(project, env, *dvc, "queue", "status").stdout
    names = [line.split()[1] for line in status.splitlines() if "Success" in line]
    queue_embedded = sum(_embedded(_run(project, env, *dvc, "queue", "logs", n).stdout)
                         for n in names)
    t0 = time.perf_counter()
    serial_embedded = 0
    for values in itertools.product(*GRID.values()):
        sets = [f"{k}={v}" for k, v in zip(GRID, values, strict=True)]
        proc = _run(project, env, *dvc, "exp", "run", *itertools.chain(*(["-S", s] for s in sets)))
        serial_embedded += _embedded(proc.stderr)
    serial_s = time.perf_counter() - t0
    disk = {"store": _size(store), "view": _size(project / "cache"),
            "dvc_cache": _size(project / ".dvc" / "cache")}
    rows = [
        {"measure": "first `dvc repro` on TREC (s; embeds 5,380 texts)", "ours": baseline_s,
         "texts embedded": _embedded(first.stderr)},
        {"measure": f"6 experiments, `dvc queue start -j {args.workers}` (s)", "ours": queue_s,
         "texts embedded": queue_embedded, "finished": len(names)},
        {"measure": "the same 6, `dvc exp run` one by one in the workspace (s)",
         "ours": serial_s, "texts embedded": serial_embedded, "finished": 6},
        {"measure": "disk: shared store / view cache/ / .dvc/cache (MB)",
         "ours": f"{disk['store'] / 1e6:.1f} / {disk['view'] / 1e6:.1f} / "
                 f"{disk['dvc_cache'] / 1e6:.1f}"},
    ]
    print(table(rows, ["measure", "ours", "texts embedded", "finished"]))
    write_results("exp_queue", {"machine": machine(), "rows": rows, "disk_bytes": disk})
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
