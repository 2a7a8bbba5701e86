"""Exact top-k for evaluation: simtune's tiled top-k vs faiss and a naive full similarity matrix,
on synthetic unit vectors; every method in its own process, all peers in the same run.

Shape 1 (10,000 x 100,000 x 384): ours vs faiss-cpu `IndexFlatIP.search` (the index is filled
before the clock and the memory baseline: the search alone is compared) and vs the naive full
matrix (torch). Shape 2 (100,000 x 1,000,000 x 384, memory bounded): the inputs are written in
chunks to .npy files in a temporary directory and memory-mapped; the peer is faiss `knn` (the
kernel of `IndexFlatIP.search`, without copying the 1.5 GB corpus into an index). On shape 2
both time the first --large-measured queries against the whole corpus, scaled to all queries.

Memory: peak growth of anonymous RSS during the call (file pages of the memory-mapped inputs
left out), sampled every 10 ms.

    python -m bench.eval_topk [--queries 10000] [--corpus 100000] [--large-queries 100000]
        [--large-corpus 1000000] [--large-measured 10000] [--dim 384] [--k 10]

Prints a Markdown table and writes bench/eval_topk.json. To skip shape 2: --large-corpus 0.
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

import numpy as np
import torch

from bench.common import PeakAnon, machine, table, write_results

ROOT = Path(__file__).resolve().parents[1]
CHILD = "import sys\nfrom bench.eval_topk import child\nchild(*sys.argv[1:])"
PEERS = {"faiss-index": "faiss-cpu `IndexFlatIP`", "faiss-knn": "faiss-cpu `knn` (brute force)",
         "naive": "naive full similarity matrix (torch)"}


def write_unit(path: Path, rows: int, dim: int, seed: int, chunk: int = 65_536) -> None:
    """A (rows, dim) float32 .npy of random unit vectors, written chunk by chunk."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    g = torch.Generator().manual_seed(seed)
    for s in range(0, rows, chunk):
        x = torch.randn(min(chunk, rows - s), dim, generator=g)
        out[s : s + len(x)] = torch.nn.functional.normalize(x, dim=-1).numpy()
    out.flush()
    del out


def child(how: str, qfile: str, cfile: str, measured: str, k: str, out: str, mmap: str,
          faiss_too: str = "1") -> None:
    """Run one method on the first `measured` queries; print seconds and peak memory (MB).
    `faiss_too` "1": faiss is imported by every method (the same libraries loaded)."""
    mode = "c" if mmap == "1" else None  # copy-on-write map: pages stay file pages
    q, c = np.load(qfile, mmap_mode=mode)[: int(measured)], np.load(cfile, mmap_mode=mode)
    kk = int(k)
    if faiss_too == "1":
        import faiss  # imported before the clock and the memory baseline, as is ours

    from simtune.retrieval.topk import topk

    if how == "faiss-index":
        index = faiss.IndexFlatIP(c.shape[1])
        index.add(c)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with PeakAnon() as mem:
        t0 = time.perf_counter()
        if how == "simtune":
            scores, idx = (x.numpy() for x in topk(torch.from_numpy(q), torch.from_numpy(c), kk))
        elif how == "faiss-index":
            scores, idx = index.search(q, kk)
        elif how == "faiss-knn":
            scores, idx = faiss.knn(q, c, kk, metric=faiss.METRIC_INNER_PRODUCT)
        else:  # naive: the whole queries x corpus matrix at once
            s, i = (torch.from_numpy(q) @ torch.from_numpy(c).T).topk(kk, dim=1)
            scores, idx = s.numpy(), i.numpy()
        seconds = time.perf_counter() - t0
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    np.save(f"{out}-idx.npy", idx)
    np.save(f"{out}-scores.npy", scores)
    print(json.dumps({"seconds": seconds, "peak_mb": mem.growth, "ru_maxrss_growth_mb": maxrss,
                      "threads": torch.get_num_threads()}))


def run_shape(tmp: Path, tag: str, how: tuple[str, ...], nq: int, n: int, dim: int, k: int,
              measured: int, mmap: bool, faiss: bool = True) -> dict:
    """Write the inputs, run each method in its own process, compare indices and scores
    (`faiss` False: the faiss methods of `how` are left out, and no method imports it)."""
    how = how if faiss else tuple(h for h in how if not h.startswith("faiss"))
    qf, cf = tmp / f"{tag}-q.npy", tmp / f"{tag}-c.npy"
    write_unit(qf, nq, dim, seed=0)
    write_unit(cf, n, dim, seed=1)
    runs = {}
    for h in how:
        proc = subprocess.run([sys.executable, "-c", CHILD, h, str(qf), str(cf), str(measured),
                               str(k), str(tmp / f"{tag}-{h}"), "1" if mmap else "0",
                               "1" if faiss else "0"], cwd=ROOT,
                              capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{h} failed:\n{proc.stderr[-2000:]}")
        runs[h] = json.loads(proc.stdout.strip().splitlines()[-1])
    qf.unlink()
    cf.unlink()
    ours_i, ours_s = (np.load(tmp / f"{tag}-simtune-{x}.npy") for x in ("idx", "scores"))
    for h in how[1:]:
        peer_i, peer_s = (np.load(tmp / f"{tag}-{h}-{x}.npy") for x in ("idx", "scores"))
        runs[h]["same_indices"] = float((peer_i == ours_i).mean())
        # rank by rank: indices that differ with equal scores (to float rounding) are ties
        runs[h]["max_score_diff_at_rank"] = float(np.abs(peer_s - ours_s).max())
    return runs


def rows_for(runs: dict, measure: str, memory: str, scale: float, targets: dict) -> list[dict]:
    ours = runs["simtune"]
    rows = [{"measure": measure, "ours": ours["seconds"] * scale, "peer name": PEERS[h],
             "peer": runs[h]["seconds"] * scale, "ratio": ours["seconds"] / runs[h]["seconds"],
             "target": targets[h][0]} for h in runs if h != "simtune"]
    rows += [{"measure": memory, "ours": ours["peak_mb"], "peer name": PEERS[h],
              "peer": runs[h]["peak_mb"], "ratio": ours["peak_mb"] / max(runs[h]["peak_mb"], 1),
              "target": targets[h][1]} for h in runs if h != "simtune"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--corpus", type=int, default=100_000)
    ap.add_argument("--large-queries", type=int, default=100_000)
    ap.add_argument("--large-corpus", type=int, default=1_000_000)
    ap.add_argument("--large-measured", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--no-faiss", action="store_true", help="leave the faiss peers out (where "
                    "faiss-cpu, a `.[bench]` extra, is not installed: the smoke test)")
    a = ap.parse_args()
    result: dict = {"machine": machine(), **vars(a), "load_before": os.getloadavg()}
    targets = {"faiss-index": ("ours/peer <= 1.0", "ours/peer <= 2"), "naive": ("", "bounded"),
               "faiss-knn": ("ours/peer <= 1.0", "ours/peer <= 2")}
    with tempfile.TemporaryDirectory(prefix="simtune-topk-") as d:
        tmp = Path(d)
        runs = run_shape(tmp, "small", ("simtune", "faiss-index", "naive"), a.queries,
                         a.corpus, a.dim, a.k, a.queries, mmap=False, faiss=not a.no_faiss)
        result["small"] = runs
        rows = rows_for(runs, f"exact top-{a.k}, {a.queries:,} x {a.corpus:,} x {a.dim} (s)",
                        f"peak memory of the top-{a.k} (MB)", 1.0, targets)
        if a.large_corpus:
            measured = min(a.large_measured, a.large_queries)
            scale = a.large_queries / measured
            runs = run_shape(tmp, "large", ("simtune", "faiss-knn"), a.large_queries,
                             a.large_corpus, a.dim, a.k, measured, mmap=True,
                             faiss=not a.no_faiss)
            result["large"] = runs
            rows += rows_for(runs, f"exact top-{a.k}, {a.large_queries:,} x {a.large_corpus:,}"
                             f" x {a.dim}, memory-mapped (s; {measured:,} queries timed,"
                             f" x {scale:g})", f"peak memory of that top-{a.k} (MB)", scale,
                             targets)
    result["load_after"] = os.getloadavg()
    result["rows"] = rows
    print(f"machine: {machine()}; load average before/after: {result['load_before'][0]:.2f}"
          f" / {result['load_after'][0]:.2f}")
    for shape in ("small", "large"):
        for h, r in result.get(shape, {}).items():
            if "same_indices" in r:
                print(f"{shape}: vs {h}: same indices {r['same_indices']:.4%}, largest score"
                      f" difference at equal rank {r['max_score_diff_at_rank']:.2g}")
    print()
    print(table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"]))
    print(f"\nwrote {write_results('eval_topk', result)}")


if __name__ == "__main__":
    sys.exit(main())
