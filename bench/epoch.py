"""A top-layers epoch: the train stage's (Lightning, validation, curves) vs a bare loop.

Same process, same threads (`--threads`, set once for both), same texts, layers, batch, batch
order (`EpochBatches`, the train seed), the same top model, head, loss and optimiser settings:
  pipeline   `simtune.train.stage.fit`, the train stage's fit (Lightning, the epoch loop's
             validation and dvclive curves), `--epochs` epochs; its training seconds are
             `EpochLoop.train_seconds` (the training epochs alone), its validation seconds
             apart (epoch 0, the frozen encoder, included)
  loop       the textbook loop over the same pieces: each batch's cached float16 states read
             and padded to the batch's longest text (`StatesTable.batch`), the top layers,
             mean pooling (`encoders.pooled`), the head, the loss, backward, fused AdamW
Each runs `--repeats` times, alternated (loop, pipeline, loop, ...): on a machine others share,
the least disturbed run of each counts (the shortest). The ratio is pipeline / loop per
training epoch (target <= 1.2); CPU seconds (this process, all threads) are kept beside the
wall seconds. `--profile N`: cProfile of N pipeline training steps, the top functions by
cumulative time in the JSON (where the difference goes).

Data: TREC (fine labels, the prepare stage's split), `--texts` questions sampled (0: all); the
layer cache is filled into a fresh store first (not timed here: bench.cache_fill measures it).

    python -m bench.epoch [--texts 0] [--layers 2] [--batch 64] [--threads 2] [--epochs 1]
                          [--repeats 2] [--profile 0] [--model minilm] [--max-length 0]

Prints a table and writes bench/epoch.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.common import machine, table, write_results

ROOT = Path(__file__).resolve().parents[1]


def params_for(work: Path, texts: int, layers: int, batch: int, epochs: int, model: str,
               store: Path, max_length: int = 0) -> Path:
    """params.yaml's values with TREC (`texts` sampled, 0: all) as a CSV, the top `layers`
    layers, `batch`, `epochs`, the fresh `store` and the encoder `model` (`max_length`: its
    window, 0: params.yaml's); written to `work/params.yaml`."""
    from bench.layers import write_data
    from simtune import params as P

    p = P.read_yaml(ROOT / "params.yaml")
    if texts:
        data = work / "trec.csv"
        write_data("trec", texts, 13, data)
        p["prepare"].update(source="file")
        p["prepare"]["file"].update(path=str(data), format="csv", kind="groups")
        p["prepare"]["file"]["columns"].update(text="text", label="label")
    p["encoders"]["models"]["minilm"]["model"] = model
    if max_length:
        p["encoders"]["models"]["minilm"]["max_length"] = max_length
    p["cache"].update(store=str(store), device="cpu")
    t = p["train"]
    t["mode"] = "top_layers"
    # a fixed rate (the one lr auto picks on TREC): both sides of the comparison train alike,
    # and the probe's steps are not part of an epoch's cost
    t["schedule"]["top_layers"].update(layers=layers, batch_size=batch, max_epochs=epochs,
                                       patience=epochs, lr=2e-4, head_lr=2e-4)
    path = work / "params.yaml"
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return path


def setup(params: Path, work: Path) -> tuple[Any, Any, Any]:
    """Prepare, fill the layer cache, load the data: (params, resolved train params, data)."""
    from simtune import params as P
    from simtune.cache import stage as cache
    from simtune.cache.views import layer_for
    from simtune.prepare import stage as prepare
    from simtune.train.data import load_data
    from simtune.train.stage import fit_schedule, in_force

    p = P.load(params)
    prepared, cache_dir = work / "prepared", work / "cache"
    prepare.run(p.prepare, prepared, work / "prepare.json")
    cache.fill(prepared, cache_dir, p.encoders, p.cache, layer=layer_for(p.encoders, p.train))
    t = in_force(p.train, p.encoders, prepared)
    data = load_data(t, p.encoders, p.cache, prepared, cache_dir)
    return p, fit_schedule(t, len(data.training), announce=False), data


def pipeline_epoch(p: Any, t: Any, data: Any, live: Path,
                   profile_steps: int = 0) -> dict[str, Any]:
    """The train stage's fit (`stage.fit`): training seconds per epoch, validation seconds,
    CPU seconds; with `profile_steps`, cProfile's top functions over that many steps."""
    import pytorch_lightning as pl

    from simtune.train.stage import fit
    from simtune.train.validation import validation_task

    task = validation_task(data, t.head.side, p.evaluate.corpus)
    prof = cProfile.Profile() if profile_steps else None

    class Profiled(pl.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
            if prof is not None and i == 1:  # the first step warms up: not profiled
                prof.enable()

        def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any,
                               i: int) -> None:
            if prof is not None and i == profile_steps:
                prof.disable()

    t0 = time.perf_counter()
    _, loop, _, seconds = fit(t, p.encoders, p.cache, data, task, "cpu", live,
                              progress=True, extra=lambda _: [Profiled()])
    out = {"train_s": loop.train_seconds, "train_cpu_s": loop.train_cpu_seconds,
           "validation_s": loop.validation_seconds, "fit_s": seconds,
           "wall_s": time.perf_counter() - t0}
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
        out["profile"] = s.getvalue()
    return out


def bare_epochs(t: Any, enc: Any, data: Any, epochs: int, grouped: bool = False
                ) -> dict[str, Any]:
    """The textbook loop over the same pieces (module docstring): seconds per epoch, CPU s;
    `grouped`: each batch's texts through the pipeline's representation instead
    (`CachedStates.forward`: length groups, each padded to its own longest)."""
    import pytorch_lightning as pl

    from simtune import heads
    from simtune.encoders import pooled
    from simtune.train import represent
    from simtune.train.losses import build_loss
    from simtune.train.sampling import EpochBatches

    pl.seed_everything(t.seed, workers=True, verbose=False)
    rep = represent.build("top_layers", enc, data.tables, None, t.schedule.full.train_embeddings)
    head = heads.build(t.head.type, data.dim, t.head.expansion, t.head.dropout)
    loss_fn = build_loss(data.kind, t, data.num_classes, data.dim)
    head.train()
    opt = torch.optim.AdamW(
        [{"params": [*head.parameters(), *loss_fn.parameters()], "lr": t.run.lr},
         {"params": [q for q in rep.parameters() if q.requires_grad], "lr": t.run.encoder_lr}],
        weight_decay=t.weight_decay, fused=True)
    tr = data.training
    rows, labels = tr.tensors["rows"], tr.tensors["labels"]
    batches = EpochBatches(len(tr), t.run.batch_size, t.seed, labels=labels,
                           m_per_label=t.m_per_label)
    spec = enc.models[enc.query]
    seconds, cpu = [], 0.0
    for epoch in range(epochs):
        batches.set_epoch(epoch)
        t0, c0 = time.perf_counter(), time.process_time()
        for idx in batches:
            i = torch.tensor(idx)
            if grouped:
                vectors = rep(tr, {"idx": i}, "text")
            else:
                states, mask = rep.table.batch(rows[i])
                hidden = rep.top(inputs_embeds=states, attention_mask=mask).last_hidden_state
                vectors = pooled(hidden, mask, spec, 0)
            loss = loss_fn(head(vectors), labels[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - t0)
        cpu += time.process_time() - c0
    return {"train_s": seconds, "train_cpu_s": cpu}


def _best(runs: list[dict]) -> tuple[float, float]:
    """(wall, CPU) seconds of the fastest training epoch of `runs` (CPU: per epoch)."""
    return (min(min(r["train_s"]) for r in runs),
            min(r["train_cpu_s"] / len(r["train_s"]) for r in runs))


def rows_of(loops: list[dict], groups: list[dict], pipes: list[dict]) -> list[dict]:
    """The summary rows: the fastest of each side per training epoch, their ratios."""
    (lw, lc), (gw, gc), (pw, pc) = _best(loops), _best(groups), _best(pipes)
    pv = min(r["validation_s"] for r in pipes)
    return [
        {"measure": "top-layers training epoch (s, wall)", "ours": pw,
         "peer name": "bare loop, batch padded to its longest", "peer": lw, "ratio": pw / lw,
         "target": "<= 1.2"},
        {"measure": "top-layers training epoch (CPU s)", "ours": pc,
         "peer name": "bare loop, batch padded to its longest", "peer": lc, "ratio": pc / lc,
         "target": "<= 1.2"},
        {"measure": "top-layers training epoch (s, wall)", "ours": pw,
         "peer name": "bare loop, the pipeline's length groups", "peer": gw, "ratio": pw / gw,
         "target": "Lightning, logging: <= 1.1"},
        {"measure": "top-layers training epoch (CPU s)", "ours": pc,
         "peer name": "bare loop, the pipeline's length groups", "peer": gc, "ratio": pc / gc,
         "target": "Lightning, logging: <= 1.1"},
        {"measure": "validation in the same fit (s: epoch 0 + each epoch's)", "ours": pv,
         "peer name": "the pipeline's training epoch", "peer": pw, "ratio": pv / pw,
         "target": ""},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=0, help="TREC questions sampled (0: all)")
    ap.add_argument("--layers", type=int, default=2, help="top layers trained")
    ap.add_argument("--batch", type=int, default=64, help="batch size")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    ap.add_argument("--epochs", type=int, default=1, help="training epochs per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side, alternated")
    ap.add_argument("--profile", type=int, default=0,
                    help="cProfile this many pipeline steps (first run; 0: off)")
    ap.add_argument("--model", default="minilm", help="encoders.models.minilm.model")
    ap.add_argument("--max-length", type=int, default=0, help="its max_length (0: params')")
    ap.add_argument("--name", default="epoch", help="results file: bench/<name>.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)  # both sides: the same threads
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="simtune-bench-epoch-") as d:
        work = Path(d)
        params = params_for(work, args.texts, args.layers, args.batch, args.epochs,
                            args.model, work / "store", args.max_length)
        p, t, data = setup(params, work)
        loops, groups, pipes = [], [], []
        for i in range(args.repeats):
            loops.append(bare_epochs(t, p.encoders, data, args.epochs))
            groups.append(bare_epochs(t, p.encoders, data, args.epochs, grouped=True))
            load.append(os.getloadavg()[0])
            pipes.append(pipeline_epoch(p, t, data, work / f"live{i}",
                                        args.profile if i == 0 else 0))
            load.append(os.getloadavg()[0])
            print(f"run {i + 1}: loop {loops[-1]['train_s']}, grouped {groups[-1]['train_s']}, "
                  f"pipeline {pipes[-1]['train_s']} "
                  f"(+ validation {pipes[-1]['validation_s']:.1f} s), load {load[-1]:.2f}",
                  flush=True)
        n = len(data.training)
    rows = rows_of(loops, groups, pipes)
    print(f"machine: {machine()}; {n:,} training texts, top {args.layers} layers, batch "
          f"{t.run.batch_size}, {args.threads} threads\n")
    print(table(rows, ["measure", "ours", "peer name", "peer", "ratio", "target"]))
    profile = pipes[0].pop("profile", None)
    if profile:
        print(profile)
    path = write_results(args.name, {
        "machine": machine(), "command": " ".join(["python -m bench.epoch", *sys.argv[1:]]),
        "texts": n, "layers": args.layers, "batch": t.run.batch_size, "threads": args.threads,
        "load_1min": load, "cores": os.cpu_count(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "loop": loops, "grouped": groups,
        "pipeline": pipes,
        "profile": profile, "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
