"""Cache fill speed on all TREC texts with MiniLM, against sentence-transformers and the bound.

Same run, same machine, same batch size and max_length:
  (a) simtune's fill (length-sorted batches, tokenising, writing Arrow shards) with
      `cache.backend: torch` and with `cache.backend: onnx` (its one-off export timed apart),
  (b) sentence-transformers `SentenceTransformer(<same dir>).encode`,
  (c) the bound: a bare loop of forward + mean pooling on pre-tokenised, length-sorted batches,
  (d) sentence-transformers' own ONNX backend (`backend="onnx"`), where it installs.
Plus: the largest difference between the two backends' vectors, a refill with nothing new (must
load no model), and opening a synthetic 1M x 384 cache. Fills go to a throwaway store.

    python bench/cache_fill.py [--repeats 2] [--rows 1000000] [--every 1] [--model DIR]

Prints a Markdown table and writes bench/cache_fill.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import machine, table, write_results
from simtune import params as P
from simtune.cache import backends, store, vectors
from simtune.cache import stage as cache
from simtune.encoders import FrozenEncoder, describe, fingerprint, model_dir, pool
from simtune.prepare import stage as prepare

ROOT = Path(__file__).resolve().parents[1]


def trec_texts() -> dict[str, str]:
    prepared = prepare.build(P.load(ROOT / "params.yaml").prepare)
    t = prepared.texts
    return dict(zip(t.column("text_id").to_pylist(), t.column("text").to_pylist(), strict=True))


def ours(encoder: FrozenEncoder, texts: dict[str, str], cp: P.CacheParams
         ) -> tuple[float, torch.Tensor]:
    """Seconds of one fill of every text into an empty store entry (an ONNX export already in
    the entry is kept: it is made once per encoder), and the vectors in `texts` order."""
    with tempfile.TemporaryDirectory() as d:
        entry = store.fingerprint_dir(store.root(cp.store),
                                       fingerprint(describe(encoder.name, encoder.spec)))
        for f in entry.glob("*"):
            if f.is_file():
                f.unlink()
        t0 = time.perf_counter()
        result = cache.fill_encoder(encoder.name, encoder.spec, texts, Path(d) / "c", cp,
                                    cache.Dist(), encoder_factory=lambda *a: encoder)
        seconds = time.perf_counter() - t0
        assert result.embedded == len(texts)
        table = vectors.load(Path(d) / "c")
        return seconds, table.vectors[table.index(list(texts))].float().clone()


def export_seconds(encoder: FrozenEncoder, cp: P.CacheParams) -> float:
    """The one-off ONNX export of `encoder` into its store entry (pooling included)."""
    entry = store.fingerprint_dir(store.root(cp.store),
                                   fingerprint(describe(encoder.name, encoder.spec)))
    t0 = time.perf_counter()
    backends.export(encoder, entry / backends.EXPORT_DIR / backends.MODEL_FILE)
    return time.perf_counter() - t0


def _clear(directory: Path) -> None:
    import shutil

    shutil.rmtree(directory, ignore_errors=True)


def sentence_transformers(path: Path, texts: list[str], batch: int, max_length: int,
                          backend: str = "torch") -> float:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu", backend=backend)
    model.max_seq_length = max_length
    model.encode(texts[:64], batch_size=batch)  # warm-up
    t0 = time.perf_counter()
    model.encode(texts, batch_size=batch, convert_to_tensor=True, show_progress_bar=False)
    return time.perf_counter() - t0


def st_onnx(path: Path, texts: list[str], batch: int, max_length: int, repeats: int
            ) -> float | str:
    """(d)'s seconds, or why it could not run (its `optimum-onnx` extra must install)."""
    try:
        return min(sentence_transformers(path, texts, batch, max_length, "onnx")
                   for _ in range(repeats))
    except Exception as e:
        return str(e).strip().split(".")[0][:100] if str(e).strip() else type(e).__name__


def bound(encoder: FrozenEncoder, texts: list[str], batch: int) -> tuple[float, float]:
    """Seconds of (c), and of tokenising its batches (length pass included), untimed in (c)."""
    t0 = time.perf_counter()
    lengths = encoder.token_lengths(texts)
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    batches = [encoder.tokenize([texts[j] for j in order[i : i + batch]])
               for i in range(0, len(order), batch)]
    tokenise = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            h = encoder.model(**b).last_hidden_state
            torch.nn.functional.normalize(pool(h, b["attention_mask"], "mean"), dim=-1)
    return time.perf_counter() - t0, tokenise


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
from simtune.cache import vectors
before = rss_mb()
t0 = time.perf_counter()
t = vectors.load(sys.argv[1], checksums=sys.argv[2] == "1")
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
        # the manifest schema checks that the fingerprint is the hash of the description
        description = {"synthetic": True, "dim": dim}
        manifest = vectors.Manifest("synthetic", fingerprint(description), description,
                                    "float32", dim)
        ids = [f"{i:032x}" for i in range(rows)]
        block = np.random.default_rng(0).standard_normal((rows, dim), dtype=np.float32)
        manifest.shards.append(vectors.write_shard(directory, 0, ids, ids, block, manifest))
        vectors.write_manifest(directory, manifest)
        del block, ids
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
    ap.add_argument("--every", type=int, default=1, help="take every k-th TREC text (quick runs)")
    ap.add_argument("--model", default="", help="encoder model folder in place of MiniLM "
                    "(the smoke test's tiny random BERT)")
    ap.add_argument("--max-length", type=int, default=0, help="tokens per text (0: params.yaml's)")
    args = ap.parse_args()
    torch.manual_seed(0)
    os.environ[store.ENV] = tempfile.mkdtemp(prefix="simtune-bench-store-")  # never the user's
    p = P.load(ROOT / "params.yaml")
    spec = p.encoders.models["minilm"]
    if args.model or args.max_length:
        spec = spec.model_copy(update={"model": args.model or spec.model,
                                       "max_length": args.max_length or spec.max_length})
    cp = p.cache.model_copy(update={"device": "cpu", "backend": "torch"})
    cp_onnx = cp.model_copy(update={"backend": "onnx"})
    texts = dict(list(trec_texts().items())[:: args.every])
    listed = list(texts.values())
    path = model_dir("minilm", spec)
    encoder = FrozenEncoder("minilm", spec, torch.device("cpu"))
    encoder.encode(listed[:64], cp.batch_size)  # warm-up
    n = len(listed)
    t_export = export_seconds(encoder, cp)
    runs: dict[str, list[float]] = {"torch": [], "onnx": [], "st": [], "bound": []}
    tokenise = []
    for _ in range(args.repeats):  # interleaved: a busy spell on the machine hits every one
        t, v_torch = ours(encoder, texts, cp)
        runs["torch"].append(t)
        t, v_onnx = ours(encoder, texts, cp_onnx)
        runs["onnx"].append(t)
        runs["st"].append(sentence_transformers(path, listed, cp.batch_size, spec.max_length))
        t, t_tok = bound(encoder, listed, cp.batch_size)
        runs["bound"].append(t)
        tokenise.append(t_tok)
    t_ours, t_onnx, t_st, t_bound = (min(runs[k]) for k in ("torch", "onnx", "st", "bound"))
    diff = float((v_onnx - v_torch).abs().max())
    t_st_onnx = st_onnx(path, listed, cp.batch_size, spec.max_length, args.repeats)
    re = refill(encoder, texts, cp)
    syn = open_synthetic(args.rows)
    fill, fill_onnx = "fill, TREC texts/s (a: simtune)", "fill, TREC texts/s (a: backend onnx)"
    def throughput(measure: str, t: float, t_peer: float, peer: str, target: str) -> dict:
        """A texts/s row: ours and the peer's rates over the same n texts, ratio peer time/ours."""
        return {"measure": measure, "ours": n / t, "peer": n / t_peer, "peer name": peer,
                "ratio": t_peer / t, "target": target}

    st, bare = "(b) sentence-transformers encode", "(c) bare forward+pool bound"
    rows = [
        throughput(fill, t_ours, t_st, st, ">= 1.0"),
        throughput(fill, t_ours, t_bound, bare, ">= 0.9"),
        throughput(fill_onnx, t_onnx, t_st, st, ">= 1.0"),
        throughput(fill_onnx, t_onnx, t_bound, bare, ">= 1.3" + (
            "" if t_bound / t_onnx >= 1.3 else " (not met: the same MatMul kernels dominate "
            "both; ORT fuses LayerNorm and GELU, its BERT optimizer finds no attention to fuse "
            "in this export and ran 0.9x)")),
        {"measure": fill_onnx, "ours": n / t_onnx,
         "peer": n / t_st_onnx if isinstance(t_st_onnx, float) else "",
         "peer name": "(d) sentence-transformers backend='onnx'" + (
             "" if isinstance(t_st_onnx, float) else f": not run ({t_st_onnx})"),
         "ratio": t_st_onnx / t_onnx if isinstance(t_st_onnx, float) else "",
         "target": ">= 1.0"},
        {"measure": "max abs difference, onnx vs torch vectors", "ours": diff, "peer": "",
         "peer name": "", "ratio": "", "target": "<= 1e-6"},
        {"measure": "one-off ONNX export (s)", "ours": t_export, "peer": "",
         "peer name": "kept per encoder fingerprint", "ratio": "", "target": ""},
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
    load = os.getloadavg()[0]
    print(f"machine: {machine()}; {n} TREC texts, MiniLM, batch {cp.batch_size}, "
          f"max_length {spec.max_length}; load average {load:.2f} at the end\n")
    print(table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"]))
    path = write_results("cache_fill", {
        "machine": machine(), "texts": n, "batch_size": cp.batch_size,
        "max_length": spec.max_length, "threads": torch.get_num_threads(),
        "load_average_1min_at_end": load,
        "seconds": {"ours": t_ours, "ours_onnx": t_onnx, "onnx_export": t_export,
                    "sentence_transformers": t_st, "sentence_transformers_onnx": t_st_onnx,
                    "bound": t_bound, "bound_tokenisation": min(tokenise)},
        "all_runs": runs, "max_abs_diff_onnx_torch": diff,
        "refill": re, "synthetic_open": syn, "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
