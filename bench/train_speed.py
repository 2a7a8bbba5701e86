"""Training speed: cached head epochs vs the frozen encoder in the loop; GradCache memory/time.

Same run, same machine:
  (s) the default TREC train stage (`python -m stages train`, head mode, batch 1024) of this
  tree against the same stage of `--before` (the commit before issue #13: validation every
  epoch), each run `--repeats` times at once side by side, so both see the same machine load
  (the shortest wall time counts; CPU time and load are recorded); then each kept head's test
  metrics (the evaluate stage) and this tree computing every validation metric every epoch
  (`train.schedule.head.val_every: 1`, the same training and kept epoch);
  (a) one epoch of head training on the cached MiniLM vectors of TREC (batch 256),
  (b) the same head, data, batch, loss and optimiser with the frozen encoder in the loop;
  GradCache in full mode (MiniLM trainable, news title->body pairs, MNRL, batch 256):
  (c) one step without GradCache, (d) with chunks of 32, (e) sentence-transformers
  CachedMultipleNegativesRankingLoss with mini-batch 32. Each of (c)-(e) runs in its own process
  so its peak memory is its own (RSS on CPU, torch.cuda.max_memory_allocated on a GPU).

    python -m bench.train_speed [--steps 1] [--max-length 128] [--before REV] [--repeats 2]
    python -m bench.train_speed --stage-only   (only (s); the other rows kept from the json)

Prints a Markdown table and writes bench/train_speed.json.
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

import torch
import yaml

from bench.common import machine, table, write_results
from simtune import heads
from simtune import params as P
from simtune.cache import stage as cache
from simtune.encoders import FrozenEncoder, model_dir, pool, trim_padding
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import write as write_prepared
from simtune.train.gradcache import step as gradcache_step
from simtune.train.losses import GroupLoss, PairLoss

ROOT = Path(__file__).resolve().parents[1]
BATCH = 256


def _setup() -> tuple[P.Params, dict, torch.Tensor, torch.Tensor, list[str]]:
    p = P.load(ROOT / "params.yaml")
    prepared = prepare.build(p.prepare)
    ex = prepared.examples.filter(prepared.examples.column("split").to_numpy(zero_copy_only=False)
                                  == "train")
    ids = ex.column("text_id").to_pylist()
    labels = ex.column("label").to_pylist()
    classes = {lab: i for i, lab in enumerate(sorted(set(labels)))}
    texts = prepared.text_map()
    return p, texts, torch.tensor([classes[x] for x in labels]), ids, [texts[i] for i in ids]


def _head_and_opt(dim: int) -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    head = heads.build("mlp", dim, 2, 0.1)
    loss = GroupLoss("supcon", "cosine", 0.05, 0.2, "batch_hard", 20.0)
    return head, loss, torch.optim.AdamW(head.parameters(), lr=1e-3)


def epoch_cached(vectors: torch.Tensor, labels: torch.Tensor) -> float:
    head, loss_fn, opt = _head_and_opt(vectors.shape[1])
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for s in range(0, len(perm) - BATCH + 1, BATCH):
        idx = perm[s : s + BATCH]
        loss = loss_fn(head(vectors[idx].float()), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def epoch_frozen_in_loop(encoder: FrozenEncoder, texts: list[str], labels: torch.Tensor) -> float:
    head, loss_fn, opt = _head_and_opt(encoder.dim)
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for s in range(0, len(perm) - BATCH + 1, BATCH):
        idx = perm[s : s + BATCH]
        with torch.inference_mode():
            x = encoder.embed(encoder.tokenize([texts[i] for i in idx]))
        loss = loss_fn(head(x.clone()), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


GRADCACHE_CHILD = """
import json, resource, sys, time, torch
from bench.train_speed import gradcache_child
how, chunk, max_length, steps = sys.argv[1], *map(int, sys.argv[2:5])
print(json.dumps(gradcache_child(how, chunk, max_length, steps)))
"""


def news_batch(n: int) -> tuple[list[str], list[str]]:
    p = P.load(ROOT / "params.yaml")
    raw = p.prepare.model_copy(update={"source": "news_pairs"})
    prepared = prepare.build(raw)
    texts = prepared.text_map()
    ex = prepared.examples.to_pydict()
    seen, q, d = set(), [], []
    for qi, di in zip(ex["query_id"], ex["doc_id"], strict=True):
        if qi not in seen and len(q) < n:
            seen.add(qi)
            q.append(texts[qi])
            d.append(texts[di])
    return q, d


def gradcache_child(how: str, chunk: int, max_length: int, steps: int) -> dict:
    """One configuration in a fresh process: seconds per step and peak memory."""
    torch.manual_seed(0)
    p = P.load(ROOT / "params.yaml")
    spec = p.encoders.models["minilm"]
    path = model_dir("minilm", spec)
    q_texts, d_texts = news_batch(BATCH)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    if how == "st":
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

        model = SentenceTransformer(str(path), device=str(dev))
        model.train()  # as its trainer does: dropout on, like ours (the loaded encoder is in eval)
        model.max_seq_length = max_length
        loss_fn = CachedMultipleNegativesRankingLoss(model, mini_batch_size=chunk)
        feats = [model.tokenize(q_texts), model.tokenize(d_texts)]
        feats = [{k: v.to(dev) if torch.is_tensor(v) else v for k, v in f.items()} for f in feats]
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)

        def one_step() -> None:
            opt.zero_grad()
            loss_fn(feats, None).backward()
            opt.step()
    else:
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        enc = transformers.AutoModel.from_pretrained(path, local_files_only=True).to(dev).train()
        loss_fn = PairLoss("mnrl", "cosine", 20.0, False, 0.0)
        ids = torch.arange(BATCH, device=dev)
        tokens = [dict(tok(t, padding=True, truncation=True, max_length=max_length,
                           return_tensors="pt").to(dev)) for t in (q_texts, d_texts)]
        opt = torch.optim.AdamW(enc.parameters(), lr=2e-5)

        def encode(t: dict) -> torch.Tensor:
            h = enc(**t).last_hidden_state
            return torch.nn.functional.normalize(pool(h, t["attention_mask"], "mean"), dim=-1)

        def loss_of(reps: torch.Tensor) -> torch.Tensor:  # rows: all queries, then all documents
            return loss_fn(reps[:BATCH], reps[BATCH:], ids, ids + BATCH,
                           torch.ones(BATCH, device=dev))

        def one_step() -> None:
            opt.zero_grad()
            if chunk:  # as the train stage does: query chunks, then document chunks
                parts = [trim_padding({k: v[s : s + chunk] for k, v in t.items()})
                         for t in tokens for s in range(0, BATCH, chunk)]
                gradcache_step(encode, parts, loss_of)
            else:
                loss_of(torch.cat([encode(t) for t in tokens])).backward()
            opt.step()

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        one_step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base)
    return {"seconds_per_step": min(times), "peak_mb": peak,
            "memory": "cuda max_memory_allocated" if cuda else "RSS growth during the steps"}


BEFORE = "b7f51e0"  # the base of issue #13 ("Epoch time"): validation every epoch


def _stage_job(code: Path, data: Path, params: Path, out: Path, threads: int
               ) -> subprocess.Popen:
    """The train stage of the tree at `code` on the prepared data and cache under `data`, run
    from `data` (the same cwd for every tree: dvclive looks for a DVC repository there)."""
    env = {**os.environ, "PYTHONPATH": f"{code / 'src'}:{code}", "HF_HUB_OFFLINE": "1"}
    if threads:  # torch's intra-op threads (0: its default, one per core)
        env["OMP_NUM_THREADS"] = str(threads)
    out.mkdir(parents=True, exist_ok=True)
    cmd = ["/usr/bin/time", "-f", "%e %U %S", "-o", str(out / "time"), sys.executable, "-m",
           "stages", "train", "--params", str(params), "--prepared", str(data / "prepared"),
           "--cache", str(data / "cache"), "--out", str(out / "head"), "--report",
           str(out / "train.json"), "--live", str(out / "live")]
    return subprocess.Popen(cmd, cwd=data, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(out / "log", "w"))


def _evaluate(data: Path, params: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "HF_HUB_OFFLINE": "1"}
    r = out / "eval"
    subprocess.run([sys.executable, "-m", "stages", "evaluate", "--params", str(params),
                    "--prepared", str(data / "prepared"), "--cache", str(data / "cache"),
                    "--head", str(out / "head"), "--out", str(r / "metrics.json"),
                    "--metrics", str(r / "headline.json"),
                    "--plot", str(r / "plot.json"), "--detail", str(r / "detail.json"),
                    "--run-trained", str(r / "trained.trec"), "--run-baseline",
                    str(r / "baseline.trec")], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    return json.loads((r / "metrics.json").read_text())["trained"]


def train_stage(before: str, repeats: int, threads: int) -> dict:
    """(s): wall/CPU seconds of the train stage, before vs now, run side by side `repeats`
    times; the kept epochs, the report's time split, and the test metrics of each kept head."""
    p = P.load(ROOT / "params.yaml")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        old = tmp / "before"
        old.mkdir()
        archive = subprocess.run(["git", "archive", before], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        prepared = prepare.build(p.prepare)
        write_prepared(prepared, tmp / "prepared", tmp / "prepare.json")
        cache.fill(tmp / "prepared", tmp / "cache", p.encoders, p.cache)  # the shared store
        # this tree's params.yaml in the mode measured, whatever its default (`auto`)
        now = P.read_yaml(ROOT / "params.yaml")
        now["train"]["mode"] = "head"
        (tmp / "now.yaml").write_text(yaml.safe_dump(now, sort_keys=False))
        now["train"]["schedule"]["head"]["val_every"] = 1
        (tmp / "every.yaml").write_text(yaml.safe_dump(now, sort_keys=False))
        runs: dict[str, list[dict]] = {"before": [], "now": [], "now, val_every 1": []}
        plan = [("before", old, old / "params.yaml"), ("now", ROOT, tmp / "now.yaml")]
        for i in range(repeats + 1):
            # the last round: this tree validating every epoch, beside the default once more
            jobs = plan if i < repeats else [plan[1], ("now, val_every 1", ROOT,
                                                      tmp / "every.yaml")]
            load = os.getloadavg()[0]
            procs = [(name, params, tmp / f"{name}-{i}", _stage_job(
                code, tmp, params, tmp / f"{name}-{i}", threads)) for name, code, params in jobs]
            for name, _, out, proc in procs:
                if proc.wait() != 0:
                    raise RuntimeError(f"{name}: {(out / 'log').read_text()[-2000:]}")
                wall, user, sys_s = map(float, (out / "time").read_text().split()[-3:])
                report = json.loads((out / "train.json").read_text())
                # this tree's evaluate (its params: `before`'s lack the schedule's
                # val_every) on each kept head, once per setting
                test = _evaluate(tmp, tmp / "now.yaml", out) if not runs[name] else None
                runs[name].append({"wall_s": wall, "cpu_s": user + sys_s, "load_1min": load,
                                   "report": report, "test": test})
    return runs


def stage_rows(stage: dict) -> list[dict]:
    runs, before = stage["runs"], stage["before"]
    now, old, every = runs["now"], runs["before"], runs["now, val_every 1"]
    w_now, w_old = min(r["wall_s"] for r in now), min(r["wall_s"] for r in old)
    c_now, c_old = min(r["cpu_s"] for r in now), min(r["cpu_s"] for r in old)
    threads = f"{stage['threads']} threads"
    t_now, t_old, t_every = now[0]["test"], old[0]["test"], every[0]["test"]
    r_now, r_every = now[0]["report"], every[0]["report"]
    sec = r_now["seconds"]
    floor = sec["train"] / w_old  # the training steps alone, validation and start-up at zero
    met = "met" if w_now / w_old <= 0.5 else (
        f"not met: the training steps alone take {floor:.2f} of before's stage")
    return [
        {"measure": "train stage, TREC default head mode (s, wall, best of "
                    f"{len(now)} side by side, {threads})", "ours": w_now,
         "peer name": f"before issue #13 ({before}: validation every epoch)", "peer": w_old,
         "ratio": w_now / w_old, "target": f"ours/peer <= 0.5 ({met})"},
        {"measure": "training steps alone in that stage (s: forward, loss, backward, AdamW "
                    f"of {r_now['epochs']} epochs)", "ours": sec["train"],
         "peer name": "before's whole stage", "peer": w_old, "ratio": floor,
         "target": "the bound on the ratio above at these epochs"},
        {"measure": f"train stage CPU time (s, user + sys, {threads})", "ours": c_now,
         "peer name": f"before ({before})", "peer": c_old, "ratio": c_now / c_old,
         "target": ""},
        {"measure": "test MRR@10 of the kept head", "ours": t_now["mrr@10"],
         "peer name": f"before ({before})", "peer": t_old["mrr@10"],
         "ratio": t_now["mrr@10"] / t_old["mrr@10"], "target": ">= 1"},
        {"measure": "kept epoch / epochs (val_every 5: every metric every 5 epochs)",
         "ours": f"{r_now['best_epoch']} / {r_now['epochs']}",
         "peer name": "same code, val_every 1",
         "peer": f"{r_every['best_epoch']} / {r_every['epochs']}", "ratio": "",
         "target": "same kept epoch"},
        {"measure": "validation per epoch (s; share of train + validation)",
         "ours": _val_share(sec), "peer name": "same code, val_every 1",
         "peer": _val_share(r_every["seconds"]), "ratio": "", "target": ""},
        {"measure": "test MRR@10, val_every 5 vs 1", "ours": t_now["mrr@10"],
         "peer name": "same code, val_every 1", "peer": t_every["mrr@10"],
         "ratio": t_now["mrr@10"] / t_every["mrr@10"], "target": "= 1"},
    ]


def _val_share(sec: dict) -> str:
    share = sec["validation"] / (sec["train"] + sec["validation"])
    return f"{sec['per_epoch_validation']:.3f} ({share:.0%})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="full-mode steps (the fastest counts)")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--before", default=BEFORE, help="commit whose train stage is the peer")
    ap.add_argument("--repeats", type=int, default=2, help="side-by-side train stage runs")
    ap.add_argument("--threads", type=int, default=0,
                    help="OMP_NUM_THREADS of the train stage runs (0: torch's default)")
    ap.add_argument("--stage-only", action="store_true",
                    help="only the train stage rows; the others are kept from the json")
    args = ap.parse_args()
    stage = {"threads": args.threads or "default", "before": args.before,
             "runs": train_stage(args.before, args.repeats, args.threads)}
    if args.stage_only:
        previous = json.loads((ROOT / "bench" / "train_speed.json").read_text())
        stale = {r["measure"] for r in previous.get("stage_rows", [])}
        previous.update(stage=stage, stage_rows=stage_rows(stage))
        previous["rows"] = [r for r in previous["rows"] if r["measure"] not in stale
                            ] + previous["stage_rows"]
        print(table(previous["stage_rows"], ["measure", "ours", "peer name", "peer", "ratio",
                                             "target"]))
        print(f"\nwrote {write_results('train_speed', previous)}")
        return
    rows, payload = other_rows(args.steps, args.max_length)
    payload.update(stage=stage, stage_rows=stage_rows(stage))
    rows += payload["stage_rows"]
    print(table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"]))
    print(f"\nwrote {write_results('train_speed', {**payload, 'rows': rows})}")


def other_rows(steps: int, max_length: int) -> tuple[list[dict], dict]:
    """(a)-(e): the rows and the json payload (without its `rows`)."""
    p, texts, labels, ids, listed = _setup()
    spec = p.encoders.models["minilm"]
    with tempfile.TemporaryDirectory() as d:
        cp = p.cache.model_copy(update={"device": "cpu"})
        cache.fill_encoder("minilm", spec, {i: texts[i] for i in ids}, Path(d), cp, cache.Dist())
        from simtune.cache import vectors

        loaded = vectors.load(Path(d))
        vectors = loaded.vectors[loaded.index(ids)]
        t_cached = min(epoch_cached(vectors, labels) for _ in range(3))
    encoder = FrozenEncoder("minilm", spec, torch.device("cpu"))
    t_frozen = epoch_frozen_in_loop(encoder, listed, labels)
    runs = {}
    for name, how, chunk in (("full batch", "ours", 0), ("GradCache 32", "ours", 32),
                             ("sentence-transformers CachedMNRL 32", "st", 32)):
        proc = subprocess.run([sys.executable, "-c", GRADCACHE_CHILD, how, str(chunk),
                               str(max_length), str(steps)], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    full, gc = runs["full batch"], runs["GradCache 32"]
    st = runs["sentence-transformers CachedMNRL 32"]
    rows = [
        {"measure": "epoch, TREC train, batch 256 (s)", "ours": t_cached,
         "peer name": "same head, frozen MiniLM in the loop", "peer": t_frozen,
         "ratio": t_frozen / t_cached, "target": "peer/ours >= 100"},
        {"measure": "full-mode step, GradCache 32 (s)", "ours": gc["seconds_per_step"],
         "peer name": "no GradCache", "peer": full["seconds_per_step"],
         "ratio": gc["seconds_per_step"] / full["seconds_per_step"], "target": "ours/peer <= 1.4"},
        {"measure": "full-mode peak memory, GradCache 32 (MB)", "ours": gc["peak_mb"],
         "peer name": "no GradCache", "peer": full["peak_mb"],
         "ratio": gc["peak_mb"] / max(full["peak_mb"], 1e-9), "target": "clearly < 1"},
        {"measure": "full-mode step, GradCache 32 (s)", "ours": gc["seconds_per_step"],
         "peer name": "sentence-transformers CachedMNRL 32", "peer": st["seconds_per_step"],
         "ratio": gc["seconds_per_step"] / st["seconds_per_step"], "target": "ours/peer <= 1.0"},
        {"measure": "full-mode peak memory, GradCache 32 (MB)", "ours": gc["peak_mb"],
         "peer name": "sentence-transformers CachedMNRL 32", "peer": st["peak_mb"],
         "ratio": gc["peak_mb"] / max(st["peak_mb"], 1e-9), "target": ""},
    ]
    print(f"machine: {machine()}; MiniLM, batch {BATCH}, max_length {max_length}, "
          f"memory: {gc['memory']}\n")
    return rows, {"machine": machine(), "batch": BATCH, "max_length": max_length,
                  "cached_epoch_s": t_cached, "frozen_epoch_s": t_frozen, "full_mode": runs}


if __name__ == "__main__":
    sys.exit(main())
