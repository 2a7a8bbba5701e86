"""Small-data probe of the train stage's selection and schedule (issue 34, items 1-4): the frozen
encoder against the trained head on subsets of a prepared, cached data set, in process.

    python -m bench.selection_probe --project . --per-label 8 16 32 64 --seeds 0 1 2 \
        --set train.min_steps=0 --set train.min_steps=8

Groups data: `per-label` training examples of each label (the train split subsampled, seed
s; val and test as prepared; the test ranks the subsampled train texts, as evaluate's default
corpus does). Pairs data: `--pairs N` training pairs instead. Each `--set` (repeatable,
`key=value[,key=value]`) is one variant; each prints frozen and trained test P@1 (mean over
seeds), the kept epochs and the wall seconds. A helper for measuring choices, not the bench
(`bench/small_data.py` is the full one).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from simtune import heads
from simtune import params as P
from simtune.examples import Data, Split
from simtune.retrieval.task import retrieval_task
from simtune.train.data import load_data
from simtune.train.stage import fit, in_force, quiet_lightning
from simtune.train.validation import Validator, frozen


def subsample(data: Data, per_label: int, pairs: int, seed: int) -> Data:
    """`data` with its train split cut to `per_label` rows of each label (or `pairs` rows)."""
    tr = data.splits["train"]
    g = torch.Generator().manual_seed(seed)
    if data.kind == "groups":
        labels = tr.tensors["labels"]
        keep = torch.cat([idx[torch.randperm(len(idx), generator=g)[:per_label]]
                          for lab in labels.unique()
                          for idx in [torch.nonzero(labels == lab).flatten()]])
    else:
        keep = torch.randperm(len(tr), generator=g)[:pairs]
    keep = keep.sort().values
    out = copy.copy(data)
    out.splits = {**data.splits, "train": Split({k: v[keep] for k, v in tr.tensors.items()},
                                                {k: [v[i] for i in keep.tolist()]
                                                 for k, v in tr.texts.items()})}
    return out


def test_p1(data: Data, module: Any, state: dict[str, Any] | None, corpus: str) -> float:
    """Test P@1 of the module's head (at `state`, or at identity when None)."""
    head = heads.build("identity", data.dim, 1, 0.0)  # the frozen encoder
    if state is not None:
        module.head.load_state_dict(state["head"])
        module.rep.load_state_dict(state["rep"])
        head = module.head
    task = retrieval_task(data, "test", corpus)
    module.eval()
    with torch.inference_mode():
        scores, _ = Validator(data, task, module.rep.embed_split, head, frozen(module.rep))(False)
    return scores["p@1"]


def variant(raw: dict[str, Any], assignment: str) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    for part in filter(None, assignment.split(",")):
        key, value = part.split("=", 1)
        node = out
        *path, last = key.split(".")
        for k in path:
            node = node[k]
        node[last] = yaml.safe_load(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--project", type=Path, default=Path("."))
    ap.add_argument("--per-label", type=int, nargs="*", default=[8, 16, 32, 64])
    ap.add_argument("--pairs", type=int, nargs="*", default=[])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--params", type=Path, help="default: the project's params.yaml")
    a = ap.parse_args()
    quiet_lightning()
    logging.basicConfig(level=logging.WARNING)
    root = a.project
    raw = P.read_yaml(a.params or root / "params.yaml")
    raw["train"]["mode"] = "head"  # the head is what this probes (a --set may name another)
    rows = []
    sizes = [("per_label", n) for n in a.per_label] + [("pairs", n) for n in a.pairs]
    for assignment in a.set or [""]:
        p = P.Params.model_validate(variant(raw, assignment))
        t = in_force(p.train, p.encoders, root / "data/prepared")
        full = load_data(t, p.encoders, p.cache, root / "data/prepared", root / "cache")
        corpus = "train" if full.kind == "groups" and p.evaluate.corpus == "train" else "all"
        for what, n in sizes:
            if (what == "pairs") != (full.kind == "pairs"):
                continue
            res = []
            for seed in a.seeds:
                data = subsample(full, n, n, seed)
                val_corpus = "train" if corpus == "train" else "split"
                start = time.perf_counter()
                module, loop, _, _ = fit(t, p.encoders, p.cache, data,
                                         retrieval_task(data, "val", val_corpus), "cpu", None,
                                         progress=False)
                wall = time.perf_counter() - start
                trained = test_p1(data, module, loop.state, corpus)
                base = test_p1(data, module, None, corpus)
                res.append({"frozen": base, "trained": trained, "kept": loop.best_epoch,
                            "epochs": len(loop.train_seconds), "s": wall,
                            "train_n": len(data.splits["train"])})
            lift = [r["trained"] - r["frozen"] for r in res]
            row = {"variant": assignment or "default", what: n, "runs": res,
                   "frozen": statistics.mean(r["frozen"] for r in res),
                   "trained": statistics.mean(r["trained"] for r in res),
                   "lift": statistics.mean(lift), "lift_min": min(lift),
                   "s": statistics.mean(r["s"] for r in res)}
            rows.append(row)
            print(f"{row['variant'][:60]:60s} {what}={n:5d} n={res[0]['train_n']:5d} "
                  f"frozen {row['frozen']:.4f} trained {row['trained']:.4f} "
                  f"lift {row['lift']:+.4f} (min {row['lift_min']:+.4f}) kept "
                  f"{[r['kept'] for r in res]} of {[r['epochs'] for r in res]} "
                  f"{row['s']:.1f} s", flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
