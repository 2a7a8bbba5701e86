"""A static student (`train.mode: static`) against model2vec, on a prepared set and a teacher.

One run, one machine: the prepared data of a pipeline run (`--prepared`, default data/prepared
after `make run`: TREC, 538 test questions against the 4,306 training ones) and simtune exports
as teachers (`--teacher name=folder`, default `default=models/export`). Every row is scored by
the evaluate stage's own task and metric code (test P@1, MRR@10 against the train texts):
  frozen      the bundled MiniLM (evaluate's baseline)
  teacher     the export
  m2v         model2vec 0.10's `distill` of MiniLM (PCA 256, SIF): the student's start
  m2v-fit     model2vec's own `StaticModelForSimilarity.fit` to the teacher's vectors of the
              training texts (its MLP head on the distilled table), best of `--peer` settings
              by validation P@1
  ours-distill `simtune.train.static.fit` from model2vec's distilled table and the
              least-squares map (`init: distill`), + the labels (`--label-weight`)
  ours        the same fit from the teacher's own token vectors (`init: teacher`, the map at
              identity), the teacher alone
  ours+labels the same + `--label-weight` x SupCon on the train labels (the pipeline's default)
  ours+texts  ours (+ labels) with `--unlabelled` news titles and sentences added as unlabelled
              texts (their teacher vectors only)
Every fit runs params.yaml's `train.schedule.static` (lr, batch, epochs, patience) and
`train.loss.temperature`, `train.seed`, `train.monitor`.
Columns: P@1, MRR@10, "share" (the row's P@1 gain over frozen MiniLM / the teacher's), texts/s
on 1 thread and on every core (the test texts, `load_model(folder).encode` for ours), fit s.

    python -m bench.static [--prepared data/prepared] [--teacher default=models/export ...]
                           [--unlabelled 4000] [--small 0]

Prints a Markdown table and writes bench/static.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import machine, table, write_results
from bench.static_rows import HEADLINE_ROW, TARGETS, encode_file_run, headline, headline_rows

ROOT = Path(__file__).resolve().parents[1]


def load_data(prepared: Path, small: int) -> tuple[Any, dict[str, list[str]], list[str]]:
    """(Data with texts, texts per split, unlabelled texts) of a prepared groups folder;
    `small` > 0 keeps that many rows of each split (the smoke test)."""
    import pyarrow.compute as pc

    from simtune import examples
    from simtune.prepare import prepared as prep

    p = prep.load(prepared)
    ex = p.examples
    if small:
        keep = []
        for split in ("train", "val", "test"):
            keep += [i for i, s in enumerate(ex.column("split").to_pylist()) if s == split][:small]
        ex = ex.take(sorted(keep))
    texts = p.text_map()
    data = examples.load(p.kind, ex, texts=texts)
    unl = [] if p.kind != "groups" else [
        texts[t] for t in ex.filter(pc.equal(ex.column("split"), prep.UNLABELLED))
        .column("text_id").to_pylist()]
    by = {n: s.texts["texts"] for n, s in data.splits.items()} if p.kind == "groups" else {}
    return data, by, unl


def news_texts(n: int) -> list[str]:
    """`n` unlabelled texts: news titles, then their sentences (bench.layers' articles)."""
    from bench.layers import _news_articles

    out: list[str] = []
    for a in _news_articles():
        out.append(a["title"].strip())
        out += [s.strip() + "." for s in a["text"].split(". ") if 20 < len(s) < 200]
        if len(out) >= n:
            break
    return out[:n]


def scorer(data: Any) -> Any:
    """vectors of each split's texts -> (P@1, MRR@10) on the test task (against train)."""
    from simtune.retrieval.task import by_split, retrieval_task

    task = retrieval_task(data, "test", "train")

    def score(vecs: dict[str, torch.Tensor]) -> tuple[float, float]:
        s = task.score(by_split(data, lambda sp, role: vecs[_name(data, sp)]), (1, 10),
                       upto_r=False)
        return s.metrics["p@1"], s.metrics["mrr@10"]
    return score


def _name(data: Any, sp: Any) -> str:
    return next(n for n, s in data.splits.items() if s is sp)


def speed(encode: Any, texts: list[str], threads: int) -> float:
    """Texts/s of `encode(texts)` on `threads` torch threads, best of two passes."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            encode(texts)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return len(texts) / best


def validator(data: Any, tokens: dict[str, Any]) -> Any:
    """`simtune.train.static.Validate` over the val task (against the train texts)."""
    from simtune.retrieval.task import by_split, retrieval_task
    from simtune.train.validation import KS, separation

    task = retrieval_task(data, "val", "train")

    def validate(embed: Any) -> dict[str, float]:
        vecs = {n: embed(tokens[n]) for n in ("train", "val")}
        scored = task.score(by_split(data, lambda sp, role: vecs[_name(data, sp)]), KS)
        q, c = vecs["val"], vecs["train"]
        return {f"val/{k}": v for k, v in {**scored.metrics,
                                            "separation": separation(task, q, c)}.items()}
    return validate


def fit_settings(label_weight: float, epochs: int) -> Any:
    """params.yaml's static schedule (`train.schedule.static`, `train.loss.temperature`,
    `train.seed`, `train.monitor`) with `label_weight` and `epochs` (max_epochs)."""
    from simtune import params as P
    from simtune.train import static as st

    t = P.read_yaml(ROOT / "params.yaml")["train"]
    s = t["schedule"]["static"]
    return st.FitSettings(lr=s["lr"], batch_size=s["batch_size"], max_epochs=epochs,
                          patience=s["patience"], label_weight=label_weight,
                          temperature=t["loss"]["temperature"], seed=t["seed"],
                          monitor=t["monitor"])


def ours(data: Any, by: dict[str, list[str]], init: Any, target: torch.Tensor,
         extra: list[str], label_weight: float, epochs: int, out: Path,
         lsq: bool = False) -> dict[str, Any]:
    """Fit our student (train texts + `extra` unlabelled; `target`: the teacher's vectors of
    those texts, in that order) from the table `init` (`lsq`: the map by least squares, as the
    stage starts a distilled table; else at identity, as it starts the teacher's token
    vectors), write its folder; the fit's seconds include tokenising."""
    from simtune import static
    from simtune.train import static as st

    tokens = {n: st.Tokens.of(init, t) for n, t in by.items()}
    fit_texts = by["train"] + extra
    fit_tokens = st.Tokens.of(init, fit_texts)
    labels = torch.cat([data.splits["train"].tensors["labels"],
                        torch.full((len(extra),), -1, dtype=torch.long)])
    t0 = time.perf_counter()
    # as the train stage starts it (simtune.train.static_run.start_table)
    student = st.StaticStudent(init.weight, st.least_squares_map(
        st.StaticStudent(init.weight), fit_tokens, target) if lsq else None)
    result = st.fit(student, fit_tokens, target, validator(data, tokens),
                    fit_settings(label_weight, epochs), labels=labels)
    fit_s = time.perf_counter() - t0
    static.write(out, init.tokenizer, result.table, "teacher")
    return {"folder": out, "fit_s": fit_s, "epoch": result.best_epoch,
            "history": result.history}


def m2v_fit(by: dict[str, list[str]], init_folder: Path, tvec: dict[str, torch.Tensor],
            data: Any, settings: list[dict[str, Any]], epochs: int) -> dict[str, Any]:
    """model2vec's own similarity fit to the teacher's vectors `tvec` (per split) at each of
    `settings`, the best by val P@1."""
    from model2vec import StaticModel
    from model2vec.train import StaticModelForSimilarity

    y, y_val = tvec["train"], tvec["val"]
    best: dict[str, Any] = {}
    from simtune.retrieval.task import by_split, retrieval_task

    val_task = retrieval_task(data, "val", "train")
    for setting in settings:
        t0 = time.perf_counter()
        model = StaticModelForSimilarity.from_static_model(
            model=StaticModel.from_pretrained(str(init_folder)), **setting["model"])
        model.fit(by["train"], y, X_val=by["val"], y_val=y_val, max_epochs=epochs,
                  device="cpu", **setting["fit"])
        fit_s = time.perf_counter() - t0

        def enc(texts: list[str], m: Any = model) -> torch.Tensor:
            return torch.from_numpy(m.encode(texts)).float()
        vecs = {n: enc(by[n]) for n in ("train", "val")}
        p1 = val_task.score(by_split(data, lambda sp, role, v=vecs: v[_name(data, sp)]),
                            (1,), upto_r=False).metrics["p@1"]
        if not best or p1 > best["val_p1"]:
            best = {"val_p1": p1, "encode": enc, "fit_s": fit_s, "setting": setting}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prepared", type=Path, default=ROOT / "data" / "prepared")
    ap.add_argument("--teacher", action="append", default=None,
                    help="name=export folder (repeatable; default default=models/export)")
    ap.add_argument("--unlabelled", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=None,
                    help="max epochs (default: params.yaml's train.schedule.static)")
    ap.add_argument("--label-weight", type=float, default=None,
                    help="the +labels rows' weight (default: params.yaml's)")
    ap.add_argument("--small", type=int, default=0, help="rows per split (smoke test)")
    ap.add_argument("--encoder", default="minilm", help="the frozen encoder (model folder)")
    ap.add_argument("--pca", type=int, default=None,
                    help="the distilled start's width (default: params.yaml's pca_dims)")
    ap.add_argument("--peer", default="lr3e-3,lr1e-3", help="m2v-fit settings (lr...,nolayer)")
    ap.add_argument("--file-lines", type=int, default=0,
                    help="encode a file of this many lines (the texts repeated) with the first "
                    "teacher's headline student through simtune.static.encode_file in a child "
                    "process: its peak memory (/usr/bin/time -v) and seconds (0: skip)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each of our students' folders here (<teacher>-<row>)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from simtune import params as P
    from simtune import static
    from simtune.encoders import model_dir
    from simtune.model import ExportEncoder, load_model
    from simtune.params import EncoderParams
    from simtune.train import static_init

    schedule = P.read_yaml(ROOT / "params.yaml")["train"]["schedule"]["static"]
    args.epochs = args.epochs or schedule["max_epochs"]
    args.pca = args.pca or schedule["pca_dims"]
    args.label_weight = (schedule["label_weight"] if args.label_weight is None
                         else args.label_weight)
    teachers = dict(t.split("=", 1) for t in (args.teacher or
                                               [f"default={ROOT / 'models' / 'export'}"]))
    data, by, unl = load_data(args.prepared, args.small)
    extra = unl + news_texts(args.unlabelled) if args.unlabelled else unl
    score = scorer(data)
    from simtune import params as P

    raw = P.read_yaml(ROOT / "params.yaml")["encoders"]["models"]["minilm"]
    spec = EncoderParams(**{**raw, "model": args.encoder})
    enc_dir = model_dir("frozen", spec, "--encoder")
    store = Path(os.environ.get("SIMTUNE_STORE") or Path.home() / ".cache" / "simtune")
    t0 = time.perf_counter()
    init = static_init.distilled_init(enc_dir, args.pca, store)
    init_s = time.perf_counter() - t0
    test = by["test"]
    threads = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="bench-static-"))
    from sentence_transformers import SentenceTransformer

    frozen = SentenceTransformer(str(enc_dir), device="cpu")

    def fenc(texts: list[str]) -> torch.Tensor:
        return torch.from_numpy(frozen.encode(texts, batch_size=64))
    vec = {n: fenc(t) for n, t in by.items()}
    f_p1, f_mrr = score(vec)
    f_1t, f_all = speed(fenc, test, 1), speed(fenc, test, threads)
    rows: list[dict[str, Any]] = [{"teacher": "-", "row": "frozen MiniLM", "p@1": f_p1,
                                   "mrr@10": f_mrr, "share": 0.0, "texts/s 1t": f_1t,
                                   "texts/s all": f_all, "x MiniLM 1t": 1.0, "fit s": 0.0}]
    init_folder = work / "m2v"
    static.write(init_folder, init.tokenizer, init.weight, None)
    # model2vec's own folder format for its peer fit (the same table and tokenizer)
    from model2vec import StaticModel

    StaticModel(vectors=init.weight.numpy(), tokenizer=init.tokenizer, normalize=True
                ).save_pretrained(str(work / "m2v-own"))
    peers = [{"model": {"n_layers": 0 if "nolayer" in s else 1},
              "fit": {"learning_rate": float(s.replace("nolayer", "").replace("lr", "") or
                                             1e-3)}} for s in args.peer.split(",")]
    for tname, tpath in teachers.items():
        teacher = load_model(tpath, "cpu")
        tvec = {n: teacher.encode(t, batch_size=128) for n, t in by.items()}
        t_p1, _ = score(tvec)
        lift = t_p1 - f_p1

        def row(name: str, vecs: dict[str, torch.Tensor], encode: Any, fit_s: float,
                lift: float = lift, tname: str = tname, **more: Any) -> dict[str, Any]:
            p1, mrr = score(vecs)
            s1 = speed(encode, test, 1)
            s_all = speed(encode, test, threads)
            return {"teacher": tname, "row": name, "p@1": p1, "mrr@10": mrr,
                    "share": (p1 - f_p1) / lift if lift else float("nan"),
                    "texts/s 1t": s1, "texts/s all": s_all,
                    "x MiniLM 1t": s1 / f_1t, "x MiniLM all": s_all / f_all,
                    "fit s": fit_s, **more}

        def tenc(texts: list[str], m: Any = teacher) -> torch.Tensor:
            return m.encode(texts, batch_size=64)
        rows.append(row("teacher", tvec, tenc, 0.0))
        t_1t = rows[-1]["texts/s 1t"]
        m = load_model(init_folder, "cpu")
        rows.append(row(f"m2v distill (PCA {args.pca})", {n: m.encode(t, 1024)
                                                          for n, t in by.items()},
                        lambda t, m=m: m.encode(t, 1024), init_s))
        peer = m2v_fit(by, work / "m2v-own", tvec, data, peers, args.epochs)
        t_extra = teacher.encode(extra, batch_size=128) if extra else torch.empty(0, 1)
        rows.append(row("m2v-fit (its best: " + str(peer["setting"]) + ")",
                        {n: peer["encode"](t) for n, t in by.items()}, peer["encode"],
                        peer["fit_s"]))
        t0 = time.perf_counter()  # the teacher's start: each token through it (cached)
        start = static_init.teacher_init(ExportEncoder(teacher, tname), Path(tpath), store)
        start_s = time.perf_counter() - t0
        for name, lw, ex, start_table in (
                ("ours-distill", args.label_weight, unl, init),
                ("ours", 0.0, unl, start), ("ours+labels", args.label_weight, unl, start),
                ("ours+texts", 0.0, extra, start),
                ("ours+texts+labels", args.label_weight, extra, start)):
            if name.startswith("ours+texts") and not args.unlabelled:
                continue
            target = torch.cat([tvec["train"], t_extra[: len(ex)]]) if ex else tvec["train"]
            got = ours(data, by, start_table, target, ex, lw, args.epochs,
                       work / f"{tname}-{name}", lsq=start_table is init)
            m = load_model(got["folder"], "cpu")
            rows.append(row(f"{name} ({len(ex)} unlabelled)",
                            {n: m.encode(t, 1024) for n, t in by.items()},
                            lambda t, m=m: m.encode(t, 1024), got["fit_s"],
                            epoch=got["epoch"],
                            **({"start s": start_s} if start_table is start else {})))
            rows[-1]["x teacher 1t"] = rows[-1]["texts/s 1t"] / t_1t
            if args.keep is not None:
                import shutil

                shutil.copytree(got["folder"], args.keep / f"{tname}-{name}",
                                dirs_exist_ok=True)
    file_run = None
    if args.file_lines:
        first = next(iter(teachers))
        folder = work / f"{first}-{HEADLINE_ROW}"
        file_run = encode_file_run(folder, [t for ts in by.values() for t in ts],
                                   args.file_lines, work)
        print(f"encode_file of {args.file_lines:,} lines: peak {file_run['peak_mb']:.0f} MB "
              f"(the model alone {file_run['load_peak_mb']:.0f} MB), "
              f"{file_run['seconds']:.1f} s")
    cols = ["teacher", "row", "p@1", "mrr@10", "share", "texts/s 1t", "texts/s all",
            "x MiniLM 1t", "x MiniLM all", "fit s", "start s"]
    shown = table(rows, cols)
    print(shown)
    command = "python -m bench.static " + " ".join(sys.argv[1:])
    path = write_results("static", {"machine": machine(), "command": command.strip(),
                                    "results": rows, "rows": headline_rows(rows),
                                    "headline": headline(rows), "table": shown,
                                    "targets": TARGETS, "init_s": init_s,
                                    "encode_file": file_run,
                                    "threads": threads})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
