"""Issue 51 item 1: the CPU thread policy (`simtune.threads`) against torch's default, on a
quiet machine and beside a load of our own, in one run.

Two workloads, each in a fresh process per policy (OpenMP reads its wait policy when torch
loads it, so a policy cannot change within a process):
- **top layers**: MiniLM's (the bundled encoder's) top `train.schedule.top_layers.layers`
  layers + params.yaml's head and loss, forward, backward and AdamW step on a batch of
  `top_layers.batch_size` cached states of 16 tokens (a TREC question's length); the epoch is
  TREC's 4,305 training questions, estimated from the measured steps (`steps` x per step);
- **head**: params.yaml's head and loss on cached 384-d vectors, whole epochs of TREC's 4,305
  at `head.batch_size`, measured.
The states and vectors are random: the cost depends on their shape, not their values.

Policies: **default** (torch's: all cores, spinning OpenMP waits; no `OMP_*` variable set) and
**simtune** (`simtune.threads.configure()` before torch loads, as every stage does). The load:
`--load` processes of a bounded busy loop (each ends by itself after `--load-seconds`), started
before and stopped by their PIDs after the loaded measurements. /proc/loadavg is recorded
beside each. `--tiny`: 1 step, 1 head epoch, a load of 1 (the smoke test).

    python -m bench.threads            # -> bench/threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TREC_TRAIN = 4305  # TREC's training questions (prepare's split of the default data set)
TOKENS = 16  # a TREC question's padded length in tokens (the measured step)
CLASSES = 6  # TREC's coarse labels
OMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS",
       "PYTEST_XDIST_WORKER_COUNT")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(step: Any, n: int) -> tuple[float, float]:
    """Wall and CPU seconds of `n` calls of `step` (after one warm-up call)."""
    step()
    w, c = time.perf_counter(), _cpu()
    for _ in range(n):
        step()
    return time.perf_counter() - w, _cpu() - c


def child(policy: str, steps: int, head_epochs: int) -> dict[str, Any]:
    """One process's measurement under `policy` ("default" | "simtune")."""
    line = None
    if policy == "simtune":
        from simtune import threads

        line = threads.configure().line()
    import torch

    from simtune import heads, layers
    from simtune import params as P
    from simtune.encoders import model_dir, pooled
    from simtune.train.losses import build_loss

    p = P.load(ROOT / "params.yaml")
    t, spec = p.train, p.encoders.models[p.encoders.query]
    sched = t.schedule
    path = model_dir(p.encoders.query, spec)
    torch.manual_seed(0)
    config = json.loads((path / "config.json").read_text())
    dim, depth = int(config["hidden_size"]), int(config["num_hidden_layers"])
    top = layers.top_model(path, depth - sched.top_layers.layers).train()

    def parts(batch: int, lr: float, params: list) -> tuple[Any, Any, Any, Any]:
        head = heads.build(t.head.type, dim, t.head.expansion, t.head.dropout)
        loss = build_loss("groups", t, CLASSES, dim)
        opt = torch.optim.AdamW([*params, *head.parameters(), *loss.parameters()], lr=lr)
        labels = torch.randint(0, CLASSES, (batch,))
        return head, loss, opt, labels

    b = sched.top_layers.batch_size
    # a step's cost does not depend on the rate: lr auto's highest probed one when not a number
    lr = sched.top_layers.lr
    lr = max(sched.top_layers.probe_rates) if lr == "auto" else lr
    head, loss, opt, labels = parts(b, lr, list(top.parameters()))
    states, mask = torch.randn(b, TOKENS, dim), torch.ones(b, TOKENS, dtype=torch.long)

    def top_step() -> None:
        hidden = top(inputs_embeds=states, attention_mask=mask).last_hidden_state
        opt.zero_grad()
        loss(head(pooled(hidden, mask, spec, 0)), labels).backward()
        opt.step()

    hb = sched.head.batch_size
    hhead, hloss, hopt, _ = parts(hb, sched.head.lr, [])
    vectors = torch.nn.functional.normalize(torch.randn(TREC_TRAIN, dim), dim=-1)
    all_labels = torch.randint(0, CLASSES, (TREC_TRAIN,))

    def head_epoch() -> None:
        for rows in torch.randperm(TREC_TRAIN).split(hb):
            hopt.zero_grad()
            hloss(hhead(vectors[rows]), all_labels[rows]).backward()
            hopt.step()

    top_wall, top_cpu = _timed(top_step, steps)
    head_wall, head_cpu = _timed(head_epoch, head_epochs)
    per_epoch = -(-TREC_TRAIN // b)
    return {"policy": policy, "threads": torch.get_num_threads(), "line": line,
            "wait": os.environ.get("OMP_WAIT_POLICY"), "spin": os.environ.get("GOMP_SPINCOUNT"),
            "top_step_s": top_wall / steps, "top_step_cpu_s": top_cpu / steps,
            "top_epoch_s": top_wall / steps * per_epoch, "top_steps_per_epoch": per_epoch,
            "head_epoch_s": head_wall / head_epochs, "head_epoch_cpu_s": head_cpu / head_epochs}


def _run_child(policy: str, steps: int, head_epochs: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in OMP}
    env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{ROOT}"
    # the simtune policy counts live simtune processes: this bench's own folder, alone in it
    env["SIMTUNE_RUNTIME"] = str(Path(tempfile.gettempdir()) / f"bench-threads-{os.getpid()}")
    proc = subprocess.run([sys.executable, "-m", "bench.threads", "--child", policy,
                           "--steps", str(steps), "--head-epochs", str(head_epochs)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"child {policy} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def start_load(n: int, seconds: float) -> list[subprocess.Popen]:
    """`n` processes of a busy loop, each bounded to `seconds` (they end by themselves)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY.format(s=seconds)]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for proc in procs:  # by PID, the bench's own children only
        proc.kill()
        proc.wait()


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure(label: str, steps: int, head_epochs: int, repeats: int) -> list[dict[str, Any]]:
    """Both policies, alternated `repeats` times (drift in the machine's load hits both)."""
    rows = []
    for r in range(repeats):
        for policy in ("default", "simtune"):
            before = loadavg()
            got = _run_child(policy, steps, head_epochs)
            rows.append({"condition": label, "repeat": r, "load_before": before,
                         "load_after": loadavg(), **got})
    return rows


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per condition: each policy's median epochs and the default / simtune ratios."""
    out = []
    for cond in dict.fromkeys(r["condition"] for r in rows):
        med = {pol: {k: _median([r[k] for r in rows if r["condition"] == cond
                                 and r["policy"] == pol])
                     for k in ("top_epoch_s", "top_step_cpu_s", "head_epoch_s",
                               "head_epoch_cpu_s", "load_before")}
               for pol in ("default", "simtune")}
        old, new = med["default"], med["simtune"]
        out.append({"condition": cond, **{f"{pol}_{k}": v for pol, m in med.items()
                                          for k, v in m.items()},
                    "top_speedup": old["top_epoch_s"] / new["top_epoch_s"],
                    "head_speedup": old["head_epoch_s"] / new["head_epoch_s"]})
    return out


def headline(summ: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The benchmarks page's rows: simtune's policy against torch's default, same run; targets
    (issue 51): beside the load >= 1.5x faster, quiet <= 5 % slower."""
    rows = []
    for s in summ:
        quiet = s["condition"] == "quiet"
        for what, key in (("top-layers", "top_epoch_s"), ("head", "head_epoch_s")):
            rows.append({"measure": f"{what} epoch, {s['condition']} (load "
                                    f"{s['default_load_before']:.1f}) (s)",
                         "ours": s[f"simtune_{key}"], "peer name": "torch's default threads",
                         "peer": s[f"default_{key}"],
                         "ratio": s[f"simtune_{key}"] / s[f"default_{key}"],
                         "target": "" if what == "head" else
                         "ours/peer <= 1.05" if quiet else "ours/peer <= 0.667"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=("default", "simtune"), help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=8, help="top-layers steps measured per run")
    ap.add_argument("--head-epochs", type=int, default=10, help="head epochs measured per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per policy and condition")
    ap.add_argument("--load", type=int, default=4, help="busy-loop processes of the load")
    ap.add_argument("--load-seconds", type=float, default=900, help="bound on each busy loop")
    ap.add_argument("--tiny", action="store_true", help="1 step, 1 head epoch, load 1")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.steps, a.head_epochs)))
        return
    if a.tiny:
        a.steps, a.head_epochs, a.repeats, a.load, a.load_seconds = 1, 1, 1, 1, 600
    from bench.common import machine, table, write_results

    rows = measure("quiet", a.steps, a.head_epochs, a.repeats)
    load = start_load(a.load, a.load_seconds)
    try:
        time.sleep(1 if a.tiny else 20)  # the load average follows the load (1-min average)
        rows += measure(f"beside {a.load} busy processes", a.steps, a.head_epochs, a.repeats)
    finally:
        stop_load(load)
    summ = summary(rows)
    cols = {"condition": "condition", "load": "default_load_before",
            "top epoch default s": "default_top_epoch_s",
            "top epoch simtune s": "simtune_top_epoch_s", "top speedup": "top_speedup",
            "top step CPU default s": "default_top_step_cpu_s",
            "top step CPU simtune s": "simtune_top_step_cpu_s",
            "head epoch default s": "default_head_epoch_s",
            "head epoch simtune s": "simtune_head_epoch_s", "head speedup": "head_speedup"}
    print(table([{c: s[k] for c, k in cols.items()} for s in summ], list(cols)))
    print(f"simtune policy: {next(r['line'] for r in rows if r['line'])}")
    out = write_results("threads", {"machine": machine(), "cores": len(os.sched_getaffinity(0)),
                                    "steps": a.steps, "head_epochs": a.head_epochs,
                                    "repeats": a.repeats, "load": a.load,
                                    "rows": headline(summ), "summary": summ, "runs": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
