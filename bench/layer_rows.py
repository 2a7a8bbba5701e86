"""One row of bench/layers.py, in a process of its own (so each peak memory is its own).

    python -m bench.layer_rows fill|ours|st JOB.json

`fill` fills what the row needs (head: the vectors; top-K: its layer cache), `ours` trains and
scores with simtune, `st` with sentence-transformers' trainer (the peer, at the job's `lr` and
`warmup`); each scores the test and the validation split and prints one
`BENCH-RESULT {json}` line. A job names the row's params.yaml, prepared data, cache and work dir.
With `$SIMTUNE_BENCH_INLINE=1` (the smoke tests in tests/) every row runs in the calling process
instead: the imports once, a row's peak memory then not its own.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _maxrss_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_fill(job: dict) -> dict:
    """Fill what the row needs (head: vectors; top-K: its layer cache, vectors already there)."""
    from simtune import params as P
    from simtune.cache import reference, vectors
    from simtune.cache import stage as cache
    from simtune.cache.views import layer_for

    p = P.load(job["params"])
    t0 = time.perf_counter()
    layer = layer_for(p.encoders, p.train)
    cache.fill(Path(job["prepared"]), Path(job["cache"]), p.encoders, p.cache, layer=layer,
               teacher=P.teacher_of(p.train))
    seconds = time.perf_counter() - t0
    view = Path(job["cache"]) / (p.encoders.query + (f"@layer{layer}" if layer else ""))
    ref = reference.read(view)  # a layer view holds no states: they are the store's, once
    size = (ref.tokens * ref.dim * (2 if ref.dtype == "float16" else 4) if ref is not None
            else sum(s.bytes for s in vectors.read_manifest(view).shards))
    return {"fill_s": seconds, "cache_bytes": size, "layer": layer}


def _texts(prepared: Path) -> dict[str, str]:
    from simtune.prepare.prepared import load

    t = load(prepared).texts
    return dict(zip(t.column("text_id").to_pylist(), t.column("text").to_pylist(), strict=True))


def _score(p: Any, prepared: Path, cache_dir: Path, vectors_of: Any) -> dict[str, Any]:
    """Test and validation metrics of a model (`vectors_of(data) -> RowVectors`, by cache row)
    and of the frozen baseline, with the evaluate stage's own task and metric code (validation:
    the train stage's task, the val split against the same corpus), and each test query's P@1
    hit (0/1, in the task's order: the intervals and the paired differences)."""
    from simtune import heads
    from simtune.evaluate import stage as evaluate
    from simtune.retrieval.task import by_rows
    from simtune.train.data import load_data
    from simtune.train.stage import validation_task

    head_mode = p.train.model_copy(update={"mode": "head"})
    data = load_data(head_mode, p.encoders, p.cache, prepared, cache_dir, check_loss=False)
    task = evaluate.evaluation_task(data, p.evaluate.corpus, prepared)
    val_task = validation_task(data, p.train.head.side, p.evaluate.corpus)
    ks = tuple(sorted(set(p.evaluate.ks)))
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for name, fn in (("", _memo(vectors_of(data))),
                         ("baseline", _memo(evaluate.cached(
                             data, heads.build("identity", data.dim, 1, 0.0))))):
            test = task.score(by_rows(fn), ks)
            val = val_task.score(by_rows(fn), ks).metrics
            out[name or "test"] = test.metrics
            out[f"{name}_val" if name else "val"] = {k: val[k] for k in ("p@1", "mrr@10")}
            out[f"{name}_hits" if name else "test_hits"] = test.ranked.rel[:, 0].int().tolist()
    return out


def _memo(vectors: Any) -> Any:
    """`vectors` computed once per rows tensor and role (the train split is the corpus of both
    the test and the validation task: encoded once)."""
    seen: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def of(rows: torch.Tensor, role: str) -> torch.Tensor:
        key = (id(rows), role)
        if key not in seen:
            seen[key] = (rows, vectors(rows, role))  # rows kept: its id stays its own
        return seen[key][1]
    return of


def child_ours(job: dict) -> dict:
    from simtune import heads
    from simtune import params as P
    from simtune.evaluate.vectors import trained as trained_vectors
    from simtune.train import stage as train

    p = P.load(job["params"])
    prepared, cache_dir, work = Path(job["prepared"]), Path(job["cache"]), Path(job["work"])
    base = _maxrss_mb()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result = train.run(p, prepared, cache_dir, work / "head", work / "train.json", work / "live")
    peak = _maxrss_mb() - (0 if torch.cuda.is_available() else base)
    head_dir = work / "head"
    scores = _score(p, prepared, cache_dir, lambda data: trained_vectors(
        data, heads.load(head_dir), head_dir, p, prepared,
        (cache_dir, data.tables["query"], data.tables["doc"])))
    sec = result["seconds"]  # validation apart: the peer validates nothing in its loop
    return {"train_s": sec["train"], "val_s": sec["validation"], "total_s": sec["total"],
            "train_cpu_s": sec["train_cpu"], "epochs": result["epochs"],
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
    """sentence-transformers' own trainer on the same training split, loss, batch, weight decay
    and epochs, at the job's learning rate (`lr`) on its default schedule (linear decay) with a
    warmup of the job's share of the steps (`warmup`)."""
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
    # the row's mode (full: params_for) and its schedule in force (`t.run`)
    t, spec = P.effective(p.train), p.encoders.models[p.encoders.query]
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
        output_dir=str(work / "st"), num_train_epochs=t.run.max_epochs,
        per_device_train_batch_size=t.run.batch_size, learning_rate=job["lr"],
        weight_decay=t.weight_decay, lr_scheduler_type="linear", warmup_steps=job["warmup"],
        seed=t.seed, save_strategy="no", report_to="none", logging_steps=50,
        disable_tqdm=True, dataloader_drop_last=False)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss)
    base = _maxrss_mb()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _maxrss_mb() - (0 if torch.cuda.is_available() else base)
    model.eval()
    vectors_of = st_vectors(model, texts)
    return {"train_s": seconds, "val_s": 0.0, "total_s": seconds, "train_cpu_s": cpu,
            "lr": job["lr"],
            "warmup": job["warmup"], "epochs": t.run.max_epochs, "best_epoch": "last",
            "peak_mb": peak, **_score(p, prepared, cache_dir, vectors_of)}


def st_vectors(model: Any, texts: dict[str, str]) -> Any:
    """`_score`'s `vectors_of` for a sentence-transformers model: each row's text encoded
    (batch 64), unit rows."""
    def vectors_of(data: Any) -> Any:
        def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
            ids = data.row_ids["doc" if role == "doc" else "query"]
            return model.encode([texts[ids[r]] for r in rows.tolist()], batch_size=64,
                                convert_to_tensor=True, normalize_embeddings=True).cpu()
        return vectors
    return vectors_of


def child(what: str, job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    fn = {"fill": child_fill, "ours": child_ours, "st": child_st}[what]
    print("BENCH-RESULT " + json.dumps(fn(job)))


INLINE = "SIMTUNE_BENCH_INLINE"


def inline(fn: Any, job: dict) -> dict:
    """`fn(job)` in this process, under the job's store as a child would see it."""
    old = os.environ.get("SIMTUNE_STORE")
    os.environ["SIMTUNE_STORE"] = job["store"]
    try:
        return fn(json.loads(json.dumps(job)))  # a copy, as a child reads it from its file
    finally:
        if old is None:
            del os.environ["SIMTUNE_STORE"]
        else:
            os.environ["SIMTUNE_STORE"] = old


def run_row(what: str, job: dict, work: Path) -> dict:
    """The row's `what` ("fill" | "ours" | "st") in a process of its own (in this one under
    `$SIMTUNE_BENCH_INLINE=1`); its result."""
    fn = {"fill": child_fill, "ours": child_ours, "st": child_st}[what]
    if os.environ.get(INLINE) == "1":
        return inline(fn, job)
    path = work / f"job-{what}.json"
    path.write_text(json.dumps(job))
    env = dict(os.environ, SIMTUNE_STORE=job["store"])
    proc = subprocess.run([sys.executable, "-m", "bench.layer_rows", what, str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"bench.layers: {what} {job['row']} failed")
    line = next(x for x in proc.stdout.splitlines()[::-1] if x.startswith("BENCH-RESULT "))
    return json.loads(line.removeprefix("BENCH-RESULT "))


if __name__ == "__main__":
    sys.exit(child(sys.argv[1], sys.argv[2]))
