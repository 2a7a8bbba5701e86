"""Cache fill speed on all TREC texts with MiniLM, against sentence-transformers and the bound.

Same run, same machine, same batch size and max_length:
  (a) simtune's fill (length-sorted batches, tokenising, writing Arrow shards),
  (b) sentence-transformers `SentenceTransformer(<same dir>).encode`,
  (c) the bound: a bare loop of forward + mean pooling on pre-tokenised, length-sorted batches.
Plus: a refill with nothing new (must load no model), and opening a synthetic 1M x 384 cache.

    python bench/cache_fill.py [--repeats 2] [--rows 1000000]

Prints a Markdown table and writes bench/cache_fill.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import best_of, machine, table, write_results
from simtune import cache, prepare, store
from simtune import params as P
from simtune.encoders import FrozenEncoder, model_dir, pool

ROOT = Path(__file__).resolve().parents[1]


def trec_texts() -> dict[str, str]:
    prepared = prepare.build(P.load(ROOT / "params.yaml").prepare)
    t = prepared.texts
    return dict(zip(t.column("text_id").to_pylist(), t.column("text").to_pylist(), strict=True))


def ours(encoder: FrozenEncoder, texts: dict[str, str], cp: P.CacheParams) -> float:
    with tempfile.TemporaryDirectory() as d:
        def run() -> cache.FillResult:
            return cache.fill_encoder(encoder.name, encoder.spec, texts, Path(d) / "c", cp,
                                      cache.Dist(), encoder_factory=lambda *a: encoder)

        seconds, result = best_of(lambda: (_clear(Path(d) / "c"), run())[1], 1)
        assert result.embedded == len(texts)
        return seconds


def _clear(directory: Path) -> None:
    import shutil

    shutil.rmtree(directory, ignore_errors=True)


def sentence_transformers(path: Path, texts: list[str], batch: int, max_length: int) -> float:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    model.max_seq_length = max_length
    model.encode(texts[:64], batch_size=batch)  # warm-up
    t0 = time.perf_counter()
    model.encode(texts, batch_size=batch, convert_to_tensor=True, show_progress_bar=False)
    return time.perf_counter() - t0


def bound(encoder: FrozenEncoder, texts: list[str], batch: int) -> float:
    lengths = encoder.token_lengths(texts)
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    batches = [encoder.tokenize([texts[j] for j in order[i : i + batch]])
               for i in range(0, len(order), batch)]
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            h = encoder.model(**b).last_hidden_state
            torch.nn.functional.normalize(pool(h, b["attention_mask"], "mean"), dim=-1)
    return time.perf_counter() - t0


def refill(encoder: FrozenEncoder, texts: dict[str, str], cp: P.CacheParams) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cache.fill_encoder(encoder.name, encoder.spec, texts, Path(d), cp, cache.Dist(),
                           encoder_factory=lambda *a: encoder)

        def must_not_load(*a):
            raise AssertionError("refill loaded the model")

        t0 = time.perf_counter()
        r = cache.fill_encoder(encoder.name, encoder.spec, texts, Path(d), cp, cache.Dist(),
                               encoder_factory=must_not_load)
        return {"seconds": time.perf_counter() - t0, "embedded": r.embedded,
                "model_loaded": r.model_loaded}


OPEN_CHILD = """
import json, sys, time
from bench.common import rss_mb
from simtune import store
before = rss_mb()
t0 = time.perf_counter()
t = store.load(sys.argv[1], checksums=sys.argv[2] == "1")
seconds = time.perf_counter() - t0
after_open = rss_mb() - before
rows = t.index(t.ids.slice(0, 1000))
batch = t.vectors[rows].float()
print(json.dumps({"seconds": seconds, "rss_growth_mb": after_open,
                  "rss_growth_after_index_and_gather_mb": rss_mb() - before, "rows": len(t)}))
"""


def open_synthetic(rows: int, dim: int = 384) -> dict:
    """Write a rows x dim float32 single-shard cache, open it in a fresh process."""
    import json

    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        manifest = store.Manifest("synthetic", "f" * 32, {}, "float32", dim)
        ids = [f"{i:032x}" for i in range(rows)]
        vectors = np.random.default_rng(0).standard_normal((rows, dim), dtype=np.float32)
        manifest.shards.append(store.write_shard(directory, 0, ids, ids, vectors, manifest))
        store.write_manifest(directory, manifest)
        del vectors, ids
        out = {"table_mb": rows * dim * 4 / 2**20}
        for label, flag in (("open", "0"), ("open_with_checksums", "1")):
            proc = subprocess.run([sys.executable, "-c", OPEN_CHILD, str(directory), flag],
                                  cwd=ROOT, capture_output=True, text=True, check=True)
            out[label] = json.loads(proc.stdout)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the synthetic cache")
    args = ap.parse_args()
    torch.manual_seed(0)
    p = P.load(ROOT / "params.yaml")
    spec = p.encoders.models["minilm"]
    cp = p.cache.model_copy(update={"device": "cpu"})
    texts = trec_texts()
    listed = list(texts.values())
    encoder = FrozenEncoder("minilm", spec, torch.device("cpu"))
    encoder.encode(listed[:64], cp.batch_size)  # warm-up
    n = len(listed)
    t_ours = min(ours(encoder, texts, cp) for _ in range(args.repeats))
    t_st = min(sentence_transformers(model_dir("minilm", spec), listed, cp.batch_size,
                                     spec.max_length) for _ in range(args.repeats))
    t_bound = min(bound(encoder, listed, cp.batch_size) for _ in range(args.repeats))
    re = refill(encoder, texts, cp)
    syn = open_synthetic(args.rows)
    rows = [
        {"measure": "fill, TREC texts/s (a: simtune)", "ours": n / t_ours,
         "peer": n / t_st, "peer name": "(b) sentence-transformers encode",
         "ratio": t_st / t_ours, "target": ">= 1.0"},
        {"measure": "fill, TREC texts/s (a: simtune)", "ours": n / t_ours,
         "peer": n / t_bound, "peer name": "(c) bare forward+pool bound",
         "ratio": t_bound / t_ours, "target": ">= 0.9"},
        {"measure": "refill, nothing new (s)", "ours": re["seconds"],
         "peer": "", "peer name": f"model loaded: {re['model_loaded']}", "ratio": "",
         "target": "no model load"},
        {"measure": f"open {args.rows:,} x 384 cache (s)", "ours": syn["open"]["seconds"],
         "peer": syn["open_with_checksums"]["seconds"], "peer name": "same, sha256 checked",
         "ratio": "", "target": "< 1 s"},
        {"measure": "RSS growth on open (MB)", "ours": syn["open"]["rss_growth_mb"],
         "peer": syn["table_mb"], "peer name": "table size (MB)",
         "ratio": syn["open"]["rss_growth_mb"] / syn["table_mb"], "target": "<< 1"},
    ]
    print(f"machine: {machine()}; {n} TREC texts, MiniLM, batch {cp.batch_size}, "
          f"max_length {spec.max_length}\n")
    print(table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"]))
    path = write_results("cache_fill", {"machine": machine(), "texts": n,
                                        "batch_size": cp.batch_size,
                                        "max_length": spec.max_length,
                                        "seconds": {"ours": t_ours, "sentence_transformers": t_st,
                                                    "bound": t_bound},
                                        "refill": re, "synthetic_open": syn, "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
