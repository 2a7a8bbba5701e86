"""Exact top-k for evaluation: simtune's streaming top-k vs faiss IndexFlatIP vs a naive full
similarity matrix, on synthetic unit vectors; each in its own process for its own peak memory.

    python -m bench.eval_topk [--queries 10000] [--corpus 100000] [--dim 384] [--k 10]

Prints a Markdown table and writes bench/eval_topk.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.common import machine, table, write_results

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import sys
from bench.eval_topk import child
child(sys.argv[1], *map(int, sys.argv[2:6]))
"""


def _data(queries: int, corpus: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(queries, dim, generator=g), dim=-1)
    c = torch.nn.functional.normalize(torch.randn(corpus, dim, generator=g), dim=-1)
    return q, c


def child(how: str, queries: int, corpus: int, dim: int, k: int) -> None:
    """Run one method; print seconds, peak RSS growth (MB) and a checksum of the indices."""
    q, c = _data(queries, corpus, dim)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if how == "simtune":
        from simtune.metrics import topk

        _, idx = topk(q, c, k, chunk=512)
    elif how == "faiss":
        import faiss

        index = faiss.IndexFlatIP(dim)
        index.add(c.numpy())
        _, found = index.search(q.numpy(), k)
        idx = torch.from_numpy(found)
    else:  # naive: the whole queries x corpus matrix at once
        idx = (q @ c.T).topk(k, dim=1).indices
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    torch.save(idx, f"/tmp/simtune-topk-{how}.pt")
    print(json.dumps({"seconds": seconds, "peak_mb": peak}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--corpus", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    a = ap.parse_args()
    out = {}
    for how in ("simtune", "faiss", "naive"):
        proc = subprocess.run([sys.executable, "-c", CHILD, how, str(a.queries), str(a.corpus),
                               str(a.dim), str(a.k)], cwd=ROOT, capture_output=True, text=True,
                              check=True)
        out[how] = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = torch.load("/tmp/simtune-topk-simtune.pt")
    agree = {how: float((torch.load(f"/tmp/simtune-topk-{how}.pt") == ours).float().mean())
             for how in ("faiss", "naive")}
    rows = [{"measure": f"top-{a.k}, {a.queries:,} x {a.corpus:,} x {a.dim} (s)",
             "ours": out["simtune"]["seconds"], "peer name": peer,
             "peer": out[how]["seconds"], "ratio": out["simtune"]["seconds"] / out[how]["seconds"],
             "target": target} for how, peer, target in (
                 ("faiss", "faiss-cpu IndexFlatIP", "ours/peer <= 1.5"),
                 ("naive", "naive full matrix (torch)", ""))]
    rows += [{"measure": "peak memory growth (MB)", "ours": out["simtune"]["peak_mb"],
              "peer name": peer, "peer": out[how]["peak_mb"],
              "ratio": out["simtune"]["peak_mb"] / max(out[how]["peak_mb"], 1e-9),
              "target": "bounded"} for how, peer in (("faiss", "faiss-cpu IndexFlatIP"),
                                                     ("naive", "naive full matrix (torch)"))]
    print(f"machine: {machine()}; identical top-{a.k} indices: vs faiss "
          f"{agree['faiss']:.4%}, vs naive {agree['naive']:.4%}\n")
    print(table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"]))
    path = write_results("eval_topk", {"machine": machine(), **vars(a), "runs": out,
                                       "agreement": agree, "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
