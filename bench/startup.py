"""Issue 51 item 3: each stage's start-up, stage by stage, in one run of the pipeline on a git
copy of the project, beside the peers that bound it, measured in the same run.

A stage's **start-up** is what its process pays before and beside its work for being a fresh
process: the interpreter's own start (the `python -c pass` peer) plus every import it makes.
Imports are read from `-X importtime` (`PYTHONPROFILEIMPORTTIME=1`): the self time of each
module, summed by the package it belongs to, so the packages partition the total. An import
made mid-run (transformers' BERT when the encoder loads, Lightning when training starts)
counts as well: a process pays it whenever it makes it. The profiler adds a little to each
import, so the figures are an upper bound of a plain run's by a few percent.

Peers, each a fresh process, the smallest of `--repeats`: `python -c pass`, `import torch`,
`import transformers.models.bert.modeling_bert` (what loading a BERT-family encoder imports)
and `import pytorch_lightning`. The stages run once each, in dvc.yaml's order, by their
dvc.yaml commands, in a fresh store (a first `make run`'s case); each stage but train then runs
`--repeats` - 1 more times, and its start-up is the least disturbed of its runs, as the peers'
(its wall seconds stay the first run's); /proc/loadavg is recorded at the start and the end.
The run is kept short without changing what any stage imports: the top layers train one epoch
at a set rate (no probe), the head one epoch.

    python -m bench.startup                 # -> bench/startup.json (TREC, params.yaml's encoder)
    python -m bench.startup --model DIR --max-length 32 --texts 60   # a small copy (smoke test)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import copy_project, machine, table, write_results

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 3.0  # issue 51: every stage but train starts in <= 3 s on this machine
# package -> group: the packages that make up a stage's imports (the rest: "other"); a module
# counts for the first package not ours on its import chain (`imports`)
GROUPS = {"torch": "torch", "transformers": "transformers", "tokenizers": "transformers",
          "safetensors": "transformers", "huggingface_hub": "transformers",
          "pytorch_lightning": "lightning", "lightning_fabric": "lightning",
          "lightning_utilities": "lightning", "torchmetrics": "lightning", "dvclive": "lightning",
          "pyarrow": "data", "pandas": "data", "numpy": "data", "scipy": "scipy+sklearn",
          "sklearn": "scipy+sklearn", "sympy": "torch", "simtune": "simtune", "stages": "simtune"}
OURS = ("simtune", "stages")
COLUMNS = ("torch", "transformers", "lightning", "data", "scipy+sklearn", "simtune", "other")
PEERS = {"python -c pass": "pass",
         "import torch": "import torch",
         "import BERT (transformers)": "import transformers.models.bert.modeling_bert",
         "import pytorch_lightning": "import pytorch_lightning"}
SHORT = {"train.schedule.top_layers.max_epochs": 1, "train.schedule.top_layers.lr": 2e-4,
         "train.schedule.top_layers.head_lr": 2e-4, "train.schedule.top_layers.min_run_steps": 0,
         "train.schedule.full.max_epochs": 1, "train.schedule.full.lr": 2e-4,
         "train.schedule.full.head_lr": 2e-4, "train.schedule.full.min_run_steps": 0,
         "train.schedule.head.max_epochs": 1}


def imports(stderr: str) -> dict[str, float]:
    """Seconds of import by group (`GROUPS`, `COLUMNS`) from `-X importtime` lines. Each
    module's self time goes to the first package on its import chain that is not ours
    (`simtune`, `stages`; ours when there is none): what our code asked for, with all it pulls
    in (torch's compiler modules that transformers' import loads count as transformers')."""
    out = dict.fromkeys(COLUMNS, 0.0)
    found = [(int(m.group(1)), len(m.group(2)) // 2, m.group(3)) for m in (
        re.match(r"import time:\s+(\d+) \|\s+\d+ \| ( *)(\S+)", line)
        for line in stderr.splitlines()) if m]
    chain: list[str] = []  # the packages of the current module's ancestors, outermost first
    for self_us, depth, module in reversed(found):  # the profiler lists children first
        del chain[depth:]
        chain.append(module.split(".")[0])
        asked = next((p for p in chain if p not in OURS), chain[-1])
        out[GROUPS.get(asked, "other")] += self_us / 1e6
    return out


def _env(project: Path, store: Path) -> dict[str, str]:
    return {**os.environ, "SIMTUNE_STORE": str(store), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "DVC_NO_ANALYTICS": "1",
            "PYTHONPATH": f"{project / 'src'}{os.pathsep}{project}",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def timed(cmd: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """One process of shell command `cmd` under the import profiler: wall seconds, imports by
    group, the rest of its stderr's last line (its log) and its exit status."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True,
                          env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    wall = time.perf_counter() - t0
    log = [x for x in proc.stderr.splitlines() if not x.startswith("import time:")]
    if proc.returncode:
        raise SystemExit(f"bench.startup: {cmd} failed ({proc.returncode}):\n"
                         + "\n".join(log[-20:]))
    by = imports(proc.stderr)
    return {"wall_s": wall, "import_s": sum(by.values()), "imports": by}


def least_disturbed(first: dict[str, Any], again: list[dict[str, Any]]) -> dict[str, Any]:
    """A stage's first run (its wall seconds: the pipeline's work, a fresh store's fill) with
    the imports of the least disturbed of it and `again` (the same command rerun: its outputs
    exist, so it does less work, but imports the same modules), and every run's import
    seconds: one process's imports on a shared machine vary by ~1 s with the others' load."""
    best = min([first, *again], key=lambda r: r["import_s"])
    return {**first, "import_s": best["import_s"], "imports": best["imports"],
            "import_s_runs": [r["import_s"] for r in [first, *again]]}


def peers(cwd: Path, env: dict[str, str], repeats: int, names: list[str]
          ) -> dict[str, dict[str, Any]]:
    """Each of `PEERS` `names`' best (least disturbed) of `repeats` fresh processes."""
    out = {}
    for name in names:
        code = PEERS[name]
        runs = [timed(f'"{sys.executable}" -c "{code}"', cwd, env) for _ in range(repeats)]
        out[name] = min(runs, key=lambda r: r["wall_s"])
    return out


def stage_commands(project: Path) -> dict[str, str]:
    """dvc.yaml's stages -> their commands (one line each), in the pipeline's order."""
    import yaml

    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    return {name: " ".join(s["cmd"].split()) for name, s in stages.items()}


def setup(work: Path, args: argparse.Namespace) -> Path:
    """The git copy of the project in `work`/project with the run's settings (`SHORT`, and the
    small data and encoder when asked) written into its params.yaml."""
    from simtune.train.space import write_yaml

    project = work / "project"
    copy_project(project)
    values: dict[str, Any] = dict(SHORT)
    name = "encoders.models.minilm"
    if args.model:
        values[f"{name}.model"] = str(Path(args.model).resolve())
    if args.max_length:
        values[f"{name}.max_length"] = args.max_length
    if args.texts:  # generated sentences of 3 labels: a CSV in the copy's data/raw
        raw = project / "data" / "raw" / "startup.csv"
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text("text,label\n" + "".join(
            f"sentence {i} of {' '.join(['word'] * (3 + i % 9))},L{i % 3}\n"
            for i in range(args.texts)))
        values.update({"prepare.source": "file", "prepare.file.path": "data/raw/startup.csv"})
    write_yaml(project / "params.yaml", values)
    return project


def rows_of(stages: dict[str, dict[str, Any]], peer: dict[str, dict[str, Any]]
            ) -> list[dict[str, Any]]:
    """One summary row a stage: its start-up (the bare interpreter + its imports) beside the
    `import torch` peer of the same run, and the issue's target (none for train)."""
    bare, torch_s = peer["python -c pass"]["wall_s"], peer["import torch"]["wall_s"]
    # no ratio: the target bounds the seconds themselves (bench.report compares a row's ratio
    # when it has one); the peer shows what torch alone costs on the machine at that moment
    return [{"measure": f"{name} start-up s (interpreter + imports)",
             "ours": bare + s["import_s"], "peer name": "import torch", "peer": torch_s,
             "ratio": "", "target": "" if name == "train" else f"<= {TARGET_S:g} s"}
            for name, s in stages.items()]


def tables(stages: dict[str, dict[str, Any]], peer: dict[str, dict[str, Any]]) -> str:
    """The run as a Markdown table: each stage, then each peer; wall, start-up (the bare
    interpreter + the imports) and the imports by group."""
    bare = peer["python -c pass"]["wall_s"]
    columns = ["process", "wall s", "start-up s", *[f"{c} s" for c in COLUMNS]]
    rows = [{"process": name, "wall s": r["wall_s"], "start-up s": bare + r["import_s"],
             **{f"{c} s": r["imports"][c] for c in COLUMNS}}
            for name, r in [*stages.items(), *peer.items()]]
    return table(rows, columns)


def environment() -> dict[str, Any]:
    """Which environment the stages ran in: `make run`'s has no `dev` extra, so no pandas
    either, which pyarrow imports on a stage's first array wherever it is installed (~0.5 s)."""
    from importlib.util import find_spec

    return {"python": sys.executable, "dev_extra": find_spec("pytest") is not None,
            "pandas": find_spec("pandas") is not None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="encoder model folder (params.yaml's if empty)")
    ap.add_argument("--max-length", type=int, default=0, help="encoder window (0: params.yaml's)")
    ap.add_argument("--texts", type=int, default=0,
                    help="generated texts instead of params.yaml's data (0: params.yaml's)")
    ap.add_argument("--repeats", type=int, default=3, help="processes per peer and per stage "
                    "but train (the least disturbed import kept)")
    ap.add_argument("--upto", default="", help="run the stages up to this one only (all if empty)")
    ap.add_argument("--peers", default=",".join(PEERS), help="peers, comma-separated; the "
                    "first two ('python -c pass', 'import torch') are always run")
    ap.add_argument("--out", default="", help="results file path (instead of bench/'s)")
    args = ap.parse_args()
    names = list(dict.fromkeys([*list(PEERS)[:2], *args.peers.split(",")]))
    if set(names) - set(PEERS):
        ap.error(f"--peers: unknown {sorted(set(names) - set(PEERS))}; known: {list(PEERS)}")
    work = Path(tempfile.mkdtemp(prefix="simtune-startup-"))
    project = setup(work, args)
    env = _env(project, work / "store")
    load_before = os.getloadavg()
    peer = peers(project, env, args.repeats, names)
    commands = stage_commands(project)
    if args.upto and args.upto not in commands:
        raise SystemExit(f"bench.startup: --upto {args.upto}: not a stage ({list(commands)})")
    stages = {}
    for name, cmd in commands.items():
        stages[name] = timed(cmd, project, env)
        print(f"{name}: {stages[name]['wall_s']:.1f} s, imports {stages[name]['import_s']:.1f} s",
              flush=True)
        if name == args.upto:
            break
    again = {name: [timed(commands[name], project, env) for _ in range(args.repeats - 1)]
             for name in stages if name != "train"}  # train: minutes a run, its target is none
    for name, runs in again.items():
        stages[name] = least_disturbed(stages[name], runs)
    peer_after = peers(project, env, 1, names)  # the same peers after: the load may have moved
    text = tables(stages, peer)
    print(text)
    path = write_results("startup", {
        "machine": machine(), "command": "python -m bench.startup " + " ".join(sys.argv[1:]),
        "settings": {**SHORT, "model": args.model or None, "max_length": args.max_length or None,
                     "texts": args.texts or None, "upto": args.upto or None},
        "load_average_1min": [load_before[0], os.getloadavg()[0]],
        "environment": environment(),
        "stages": stages, "peers": peer, "peers_after": peer_after,
        "rows": rows_of(stages, peer), "table": text}, args.out or None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
