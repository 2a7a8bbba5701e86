"""A panel no one tuned to (issue 50, item 2): frozen, head, the default and candidate rules as
rows, over the bench's sets and four new ones, each with a fixed test set.

Entries (`PANEL`): a data set at a training size, in one half. The rule is chosen on the
"choose" half and reported on the "report" half as well (a fixed split, stated in the JSON):

  choose  trec (TREC-50, all), trec-coarse-16, trec-coarse-64, bbc, news-pairs, food-fr
  report  trec-coarse-32, outlets, chat-multi, icd10cm, healthtweets, icd10cm-16,
          chat-multi-16 (16 per label: the same test sets as icd10cm and chat-multi)

Each entry's records (bench.small_data's sets, `bench.panel_data`'s new ones), each
(text, label) once, are first cut to its `--limit` (`LIMITS`; a label-stratified sample
drawn with a fixed seed, the same in every run), then drawn as bench.small_data draws
(`bench.small_data_split`): one fixed test set per entry (20 % of it, at least min(500,
half)), and per seed `size` per label (pairs: queries) to train from the rest (`all`: the
whole rest, a ninth to validation). Each run goes through the real pipeline
(`bench.small_data.pipeline`: cache fill, train, evaluate).

Rows: `frozen` (the encoder alone: evaluate's baseline of the default run), `head`
(`train.mode: head`), `default` (params.yaml as in the tree) and each `--row NAME=KEY=VALUE
[,KEY=VALUE...]`: params.yaml with those keys (read as YAML) on top, e.g.
`--row lr5e-5=train.schedule.top_layers.lr=5e-5,train.schedule.full.lr=5e-5`. A row whose
run would be the same as one already run on that subset (the same params once `auto` is
resolved and only the schedule in force kept) is that run (`same_as`).

Per entry: mean ± sd over seeds (n - 1) of test P@1, MRR@10 and MAP@R per row; whether the
default is >= frozen within the seeds' sd (the larger of the two rows' sds: 0 with one seed)
and within 0.01 P@1 of the best row.

    python -m bench.panel [--entries trec,bbc,...] [--seeds 3] [--from-seed 1]
        [--rows frozen,head,default] [--row NAME=KEY=VALUE[,KEY=VALUE...]]...
        [--limit ENTRY=N]... [--set KEY=VALUE]... [--model DIR] [--max-length N]
        [--tiny] [--out FILE] [--keep DIR]

Prints a Markdown table and writes bench/panel.json (rewritten after each run): the halves,
each entry's set, size, limit, test set, wall and CPU seconds, each row's settings, every run
(wall and CPU seconds, the resolved mode and why, the kept epoch, the load average before and
after: the wall seconds of a run on a shared machine say as much about the others' load).
Entries or seeds run apart (`--out` files) join into one bench/panel.json with
`python -m bench.panel_merge` (the same commit and params.yaml only).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import panel_report as report
from bench import small_data as sd


@dataclass(frozen=True)
class Entry:
    name: str  # the entry's id
    set: str  # bench.small_data's or bench.panel_data's set
    size: int | None  # per label (pairs: training queries); None: all of the rest
    half: str  # "choose" or "report"


PANEL = (Entry("trec", "trec-fine", None, "choose"),
         Entry("trec-coarse-16", "trec-coarse", 16, "choose"),
         Entry("trec-coarse-32", "trec-coarse", 32, "report"),
         Entry("trec-coarse-64", "trec-coarse", 64, "choose"),
         Entry("bbc", "bbc", None, "choose"),
         Entry("outlets", "outlets", None, "report"),
         Entry("news-pairs", "news-pairs", 200, "choose"),
         Entry("food-fr", "food-fr", None, "choose"),
         Entry("chat-multi", "chat-multi", None, "report"),
         Entry("icd10cm", "icd10cm", None, "report"),
         Entry("healthtweets", "healthtweets", None, "report"),
         # few-shot on short texts nobody tuned to (full mode): the step floor's report half
         Entry("icd10cm-16", "icd10cm", 16, "report"),
         Entry("chat-multi-16", "chat-multi", 16, "report"))
# records kept per entry (0: all), so that the panel fits in well under an hour on 2 cores:
# the long-document sets' 256-token windows cost most; TREC coarse keeps small_data's test set
# (a limit of 1,100 or more keeps 1,000 texts past prepare's folding of repeats: 500 to test)
LIMITS = {"trec": 2500, "bbc": 1100, "outlets": 1100, "food-fr": 2500, "chat-multi": 2500,
          "icd10cm": 2500, "healthtweets": 2500, "icd10cm-16": 2500, "chat-multi-16": 2500}
BUILTIN = ("frozen", "head", "default")
LIMIT_SEED = 50  # the limit's sample: one per entry, whatever the run's seed


def records(entry: Entry) -> list[tuple[str, str]]:
    return sd.records(entry.set)


def available(entry: Entry) -> str | None:
    return sd.available(entry.set)


def limited(rows: list[tuple[str, str]], n: int, kind: str) -> list[tuple[str, str]]:
    """Exactly `n` of the records (0: all), in file order: label-stratified (groups: each
    label's share, largest remainders first), a plain sample (pairs)."""
    if not n or n >= len(rows):
        return rows
    rng = random.Random(LIMIT_SEED)
    if kind == "pairs":
        keep = set(rng.sample(range(len(rows)), n))
    else:
        by: dict[str, list[int]] = {}
        for i, (_, label) in enumerate(rows):
            by.setdefault(label, []).append(i)
        share = {lab: n * len(ix) / len(rows) for lab, ix in sorted(by.items())}
        count = {lab: int(x) for lab, x in share.items()}
        for lab in sorted(share, key=lambda lab: (count[lab] - share[lab], lab))[
                :n - sum(count.values())]:
            count[lab] += 1
        keep = {i for lab, ix in sorted(by.items()) for i in rng.sample(ix, count[lab])}
    return [r for i, r in enumerate(rows) if i in keep]


def row_spec(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """`lr5e-5=train.schedule.top_layers.lr=5e-5,train.schedule.full.lr=5e-5` -> the name and
    its (key, value) pairs (a comma starts a new key only where `KEY=` follows)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest or not re.fullmatch(r"[\w.@+-]+", name):
        raise argparse.ArgumentTypeError(f"--row {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE]")
    if name in BUILTIN:
        raise argparse.ArgumentTypeError(f"--row {text!r}: '{name}' is a built-in row")
    return name, [_number(*sd._override(part)) for part in re.split(r",(?=[\w.]+=)", rest)]


def _number(key: str, value: Any) -> tuple[str, Any]:
    """YAML 1.1 reads `5e-5` (no dot) as text: a number written so is a number."""
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value):
        return key, float(value)
    return key, value


def resolved_key(p: Any, prepared: Path) -> str:
    """What a run trains, as text: params with `auto` resolved and only the schedule in force,
    its section's every key (the probe's, the step floor's) with the values in force (two rows
    with the same key are the same run)."""
    import json

    from simtune.cache.modes import resolve

    t = resolve(p.train, p.encoders, prepared)
    dump = p.model_dump(mode="json")
    dump["train"]["mode"] = t.mode
    dump["train"]["schedule"] = {**dump["train"]["schedule"][t.mode], **{
        k: v for k, v in t.run.model_dump(mode="json").items() if "reason" not in k}}
    return json.dumps(dump, sort_keys=True)


class Panel:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root = args, root
        self.store = root / "store"
        self.raw = sd.base_params()
        self.git = sd.git_commit()
        self.runs: list[dict[str, Any]] = []
        self.entries: dict[str, dict[str, Any]] = {}
        self.skipped: list[str] = []

    def rows(self) -> dict[str, list[tuple[str, Any]]]:
        """Trained rows in order: head, default, then the candidates (their overrides)."""
        out = {r: [] for r in ("head", "default") if r in self.args.rows}
        return {**out, **dict(self.args.row)}

    def params(self, row: str, data: Path, kind: str, seed: int) -> Any:
        from simtune import params as P

        extra = [] if row in ("head", "default") else dict(self.args.row)[row]
        ns = argparse.Namespace(model=self.args.model, max_length=self.args.max_length,
                                set=[*(self.args.set or []), *extra])
        return P.validate(sd.run_params(self.raw, data, kind, self.store, seed,
                                        "head" if row == "head" else "default", ns))

    def held_out(self, entry: Entry) -> tuple[Any, dict[str, list[str]], set[str], Path]:
        from bench import small_data_split as split
        from simtune.prepare import stage as prepare

        kind = "pairs" if entry.set in sd.PAIR_SETS else "groups"
        every = list(dict.fromkeys(records(entry)))  # TREC's file holds most questions 3x
        limit = self.args.limit.get(entry.name, LIMITS.get(entry.name, 0))
        kept = limited(every, limit, kind)
        data = sd.write_data(kept, kind, self.root / entry.name / "all.jsonl")
        full = prepare.build(self.params("default", data, kind, 1).prepare)
        by = split.strata(full)
        test = split.held_out(by)
        self.entries[entry.name] = {
            "set": entry.set, "size": entry.size or "all", "half": entry.half, "kind": kind,
            "records": len(every), "limit": limit, "kept": len(kept),
            "keys": sum(len(v) for v in by.values()), "labels": len(by) if kind == "groups"
            else None, "test": len(test), "digest": split.digest(test), "seconds": 0.0,
            "cpu_s": 0.0}
        print(f"{entry.name}: {len(test)} of {self.entries[entry.name]['keys']} "
              f"{'texts' if kind == 'groups' else 'queries'} held out for test", flush=True)
        return full, by, test, data

    def one(self, entry: Entry, held: tuple[Any, dict[str, list[str]], set[str], Path],
            seed: int) -> None:
        from bench import small_data_split as split
        from simtune.errors import UserError

        full, by, test, data = held
        work = self.root / entry.name / f"seed-{seed}"
        run: dict[str, Any] = {"entry": entry.name, "half": entry.half, "seed": seed,
                               "load_before": os.getloadavg(),
                               "rows": {}}
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            split_of = split.draw(by, test, entry.size, seed, full.kind)
            split.write_subset(full, split_of, work / "prepared", work / "prepare.json")
            prepared, cache_dir = work / "prepared", work / "cache"
            params = {r: self.params(r, data, full.kind, seed) for r in self.rows()}
            run["vectors_s"] = sd.fill_vectors(next(iter(params.values())), prepared, cache_dir)
            done: dict[str, str] = {}
            for row, p in params.items():
                key = resolved_key(p, prepared)
                if key in done:
                    run["rows"][row] = {**run["rows"][done[key]], "same_as": done[key]}
                    continue
                run["rows"][row] = sd.pipeline(p, prepared, cache_dir, work / row)
                done[key] = row
        except UserError as e:
            self.skip(f"{entry.name} seed {seed}: the pipeline refused it ({e})")
        except Exception as e:  # one failed run must not lose the others' figures
            traceback.print_exc()
            self.skip(f"{entry.name} seed {seed}: FAILED ({type(e).__name__}: {e})")
        # the CPU seconds of every thread of this process: on a shared machine the wall
        # seconds say more about the others' load than about the run
        run["seconds"], run["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
        run["load_after"] = os.getloadavg()
        self.entries[entry.name]["seconds"] += run["seconds"]
        self.entries[entry.name]["cpu_s"] += run["cpu_s"]
        self.runs.append(run)
        print(f"{entry.name} seed {seed} ({run['seconds']:.0f} s, {run['cpu_s']:.0f} CPU s, load "
              f"{run['load_after'][0]:.1f}): " + report.run_line(run), flush=True)
        self.save(complete=False)

    def skip(self, note: str) -> None:
        if note not in self.skipped:
            self.skipped.append(note)
            print(f"note: {note}", flush=True)

    def save(self, complete: bool) -> dict[str, Any]:
        from bench.common import machine, write_results

        summed = report.summary(self.runs, list(self.rows()))
        checks = report.checks(summed)
        payload = {
            "machine": machine(), "command": " ".join(["python -m bench.panel", *sys.argv[1:]]),
            "complete": complete, "git": self.git, "load": os.getloadavg(),
            "halves": {h: [e.name for e in PANEL if e.half == h] for h in ("choose", "report")},
            "rows": {"frozen": "the encoder alone (evaluate's baseline of the default run)",
                     "head": {"train.mode": "head"}, "default": "params.yaml as in the tree",
                     **{n: dict(kv) for n, kv in self.args.row}},
            "train_params": self.raw["train"], "entries": self.entries, "runs": self.runs,
            "summary": summed, "checks": checks, "table": report.rendered(summed, checks),
            "skipped": self.skipped}
        write_results("panel", payload, self.args.out or None)
        return payload


def _limit(text: str) -> tuple[str, int]:
    name, sep, n = text.partition("=")
    if not sep or not n.isdigit():
        raise argparse.ArgumentTypeError(f"--limit {text!r}: expected ENTRY=N")
    return name, int(n)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", default=",".join(e.name for e in PANEL),
                    help="panel entries, comma-separated")
    ap.add_argument("--seeds", type=int, default=3, help="runs per entry (seeds from --from-seed)")
    ap.add_argument("--from-seed", type=int, default=1)
    ap.add_argument("--rows", default=",".join(BUILTIN), help="built-in rows to run")
    ap.add_argument("--row", action="append", type=row_spec, default=[],
                    metavar="NAME=KEY=VALUE[,KEY=VALUE]", help="a candidate row (repeatable)")
    ap.add_argument("--limit", action="append", type=_limit, default=[], metavar="ENTRY=N",
                    help="records kept of an entry (0: all; default: LIMITS)")
    ap.add_argument("--set", action="append", type=sd._override, metavar="KEY=VALUE",
                    help="a params.yaml key for every row")
    ap.add_argument("--model", default="", help="encoder model folder (params.yaml's if empty)")
    ap.add_argument("--max-length", type=int, default=0, help="encoder window (0: params.yaml's)")
    ap.add_argument("--tiny", action="store_true", help="a smoke run: trec-coarse-16 cut to 300 "
                    "at 4 per label and healthtweets cut to 240, one seed, 3 head epochs, "
                    "1 layer epoch")
    ap.add_argument("--keep", default="", help="keep the workspace in this folder")
    ap.add_argument("--out", default="", help="results file path (instead of bench/'s)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.entries, args.seeds = "trec-coarse-16,healthtweets", 1
        args.limit = [("trec-coarse-16", 300), ("healthtweets", 240), *args.limit]
    args.limit = dict(args.limit)
    args.rows = [r for r in args.rows.split(",") if r]
    names = [n for n in args.entries.split(",") if n]
    known = {e.name: e for e in PANEL}
    for bad in [n for n in names if n not in known] + [r for r in args.rows if r not in BUILTIN]:
        raise SystemExit(f"bench.panel: unknown entry or row '{bad}'")
    if "frozen" in args.rows and "default" not in args.rows:
        raise SystemExit("bench.panel: the frozen row is the default run's baseline: "
                         "--rows needs default with it")
    args.chosen = [known[n] for n in names]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="simtune-bench-panel-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        panel = Panel(args, root)
        if args.tiny:  # seconds, not minutes: a short schedule; 4 per label
            schedule = panel.raw["train"]["schedule"]
            schedule["head"].update(max_epochs=3, patience=3)
            schedule["top_layers"].update(max_epochs=1, patience=1)
            schedule["full"].update(max_epochs=1, patience=1)
            args.chosen = [Entry(e.name, e.set, 4 if e.size else None, e.half)
                           for e in args.chosen]
        t0 = time.perf_counter()
        for entry in args.chosen:
            if why := available(entry):
                panel.skip(f"{entry.name}: {why}")
                continue
            held = panel.held_out(entry)
            for seed in range(args.from_seed, args.from_seed + args.seeds):
                panel.one(entry, held, seed)
        payload = panel.save(complete=True)
    print(f"\nmachine: {payload['machine']}; {time.perf_counter() - t0:.0f} s, load "
          f"{' '.join(f'{x:.2f}' for x in payload['load'])}\n")
    print(payload["table"])
    for note in panel.skipped:
        print(f"note: {note}")
    print(f"\nwrote {args.out or report.target()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
