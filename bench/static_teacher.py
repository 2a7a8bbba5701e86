"""bench.static's teachers for the sets it prepares itself (bbc, news-pairs): the set prepared
whole and split as bench.small_data splits it, the teacher trained by the real pipeline as
bench.small_data's `pipeline` trains it, exported by the export stage's own function.

- Data: `bench.small_data.records` of the set, written as a file for `prepare.source: file` and
  prepared whole by the prepare stage's code; `bench.small_data_split`'s fixed held-out test
  set, and the whole rest to train with a ninth to validation (`size=None`, seed 1).
- Teacher: params.yaml as shipped (`train.mode: auto`; the mode auto chose is recorded), with
  the `overrides` given (`--teacher-set`, e.g. a limit on the top layers' epochs), MiniLM (or
  `model`) as the encoder: cache fill, train, evaluate (`bench.small_data.pipeline`), then
  `simtune.export.stage.export` into `export/`.
- `limit` > 0: a seeded sample of that many records first (groups: stratified by label), a
  bound on the teacher's training time (`--limit`).
- Kept under `work/<set>-<key>/` (key: the set, `small`, `limit`, the model, a hash of the
  records it trains on and of params.yaml's train, encoders and cache sections with the
  overrides), with its own store
  (`work/store`): a rerun finds `teacher.json` there and reuses the export ("teacher
  reused: <folder>").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SEED = 1  # the draw's seed (bench.small_data's first) and the teacher's train.seed


def key(name: str, raw: dict[str, Any], overrides: list[tuple[str, Any]], model: str,
        small: int, rows: list[tuple[str, str]], limit: int = 0) -> str:
    """`<set>-<hash>`: what decides the teacher (module docstring), nothing of the checkout;
    `rows`, the records it trains on, are hashed too, so a changed sample is a new teacher."""
    what = {"set": name, "small": small, "model": model, "overrides": overrides,
            **({"limit": limit} if limit else {}),
            "records": hashlib.blake2b(json.dumps(rows).encode(), digest_size=8).hexdigest(),
            **{s: raw[s] for s in ("train", "encoders", "cache")}}
    digest = hashlib.blake2b(json.dumps(what, sort_keys=True, default=str).encode(),
                             digest_size=6).hexdigest()
    return f"{name}{f'-small{small}' if small else ''}-{digest}"


def _records(name: str, small: int, limit: int = 0) -> list[tuple[str, str]]:
    """The set's records; `limit` > 0: a seeded sample of that many (groups: each label its
    share), in file order; `small` > 0: that many per label (groups) or pairs, in file
    order."""
    from bench.small_data import PAIR_SETS, records

    rows = records(name)
    if limit and limit < len(rows):
        by: dict[str, list[int]] = {}
        for i, (_, label) in enumerate(rows):
            by.setdefault("" if name in PAIR_SETS else label, []).append(i)
        # each label's share of `limit`, by largest remainder: exactly `limit` in all (plain
        # rounding gave 99 of 100 on TREC coarse)
        exact = {lab: limit * len(idx) / len(rows) for lab, idx in by.items()}
        count = {lab: int(x) for lab, x in exact.items()}
        for lab in sorted(exact, key=lambda lab: count[lab] - exact[lab])[
                :limit - sum(count.values())]:
            count[lab] += 1
        rng = random.Random(SEED)
        keep = [i for lab, idx in by.items() for i in rng.sample(idx, count[lab])]
        rows = [rows[i] for i in sorted(keep)]
    if not small:
        return rows
    if name in PAIR_SETS:
        return rows[:small]
    seen: dict[str, int] = {}
    out = []
    for text, label in rows:
        if seen.get(label, 0) < small:
            seen[label] = seen.get(label, 0) + 1
            out.append((text, label))
    return out


def teacher(name: str, work: Path, overrides: list[tuple[str, Any]], model: str = "",
            small: int = 0, limit: int = 0) -> dict[str, Any]:
    """The set's prepared folder and trained teacher export (module docstring), trained now or
    reused: {"prepared", "export", "info"} (info: the mode auto chose and why, the teacher's
    and the frozen encoder's test P@1 from evaluate, seconds, `reused`)."""
    from bench import small_data as bsd
    from bench import small_data_split as split
    from simtune import params as P
    from simtune.export.model_card import CardInputs, read_report
    from simtune.export.stage import export
    from simtune.prepare import stage as prepare

    raw = bsd.base_params()
    rows = _records(name, small, limit)
    folder = work / key(name, raw, overrides, model, small, rows, limit)
    done = folder / "teacher.json"
    if done.is_file() and (folder / "export").is_dir() and (folder / "prepared").is_dir():
        print(f"teacher reused: {folder}", flush=True)
        info = {**json.loads(done.read_text()), "reused": True}
        return {"prepared": folder / "prepared", "export": folder / "export", "info": info}
    if folder.exists():  # a run killed half-way: start it again
        shutil.rmtree(folder)
    kind = "pairs" if name in bsd.PAIR_SETS else "groups"
    args = argparse.Namespace(model=model, max_length=0, set=overrides)
    data = bsd.write_data(rows, kind, folder / "all.jsonl")
    p = P.validate(bsd.run_params(raw, data, kind, work / "store", SEED, "default", args))
    t0 = time.perf_counter()
    full = prepare.build(p.prepare)
    by = split.strata(full)
    test = split.held_out(by)
    split.write_subset(full, split.draw(by, test, None, SEED, kind), folder / "prepared",
                       folder / "prepare.json")
    run = folder / "run"
    vectors_s = bsd.fill_vectors(p, folder / "prepared", run / "cache")
    got = bsd.pipeline(p, folder / "prepared", run / "cache", run)
    export(run / "model", folder / "export.tmp",
           CardInputs(p, read_report(folder / "prepare.json"), read_report(run / "evaluate.json")))
    (folder / "export.tmp").rename(folder / "export")
    info = {"set": name, "kind": kind, "mode": got["mode"], "mode_reason": got["mode_reason"],
            "teacher_p@1": got["trained"], "frozen_p@1": got["frozen"],
            "kept_epoch": got["kept_epoch"], "epochs": got["epochs"],
            "fill_s": vectors_s + got["fill_s"], "train_s": got["train_s"],
            "seconds": time.perf_counter() - t0, "overrides": overrides, "limit": limit,
            "test_keys": len(test), "test_digest": split.digest(test),
            "examples": json.loads((folder / "prepare.json").read_text()).get("examples")}
    shutil.rmtree(run / "cache", ignore_errors=True)  # the vectors live in work/store
    done.write_text(json.dumps(info, indent=2) + "\n")
    print(f"{name}: teacher trained ({got['mode']}, test P@1 {got['trained']:.3f}, frozen "
          f"{got['frozen']:.3f}, {info['seconds']:.0f} s): {folder / 'export'}", flush=True)
    return {"prepared": folder / "prepared", "export": folder / "export",
            "info": {**info, "reused": False}}
