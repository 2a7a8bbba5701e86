"""A BEIR / MTEB folder (`corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`) as pairs tables.

- Text ids are `q:<_id>` and `d:<_id>` (queries and documents have separate id spaces), with the
  original `_id` in the texts table's `source_id` column (evaluate's TREC run files use it). A
  document's text is `title + " " + text` when it has a title; texts are normalised as any other.
- One example per qrel, its score kept as the graded gain. The qrels file gives the split
  (`train`, `dev` -> `val`, `test`); a split without a file is cut, seeded, from the queries of the
  first present one (see `_splits`). Score <= 0 is judged non-relevant (BEIR's convention): such a
  qrel is never a training positive (it is dropped from `train`; evaluation ignores it anyway).
- Every document of the corpus is ranked at evaluation: a document without an example gets one
  `corpus` row (null query and score), so the cache embeds it and evaluate ranks it.
- A qrel naming an unknown (or empty) query or document is skipped, counted and logged with its
  file and line; a query in two qrels files, or one pair with two scores, is an error.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from simtune.errors import UserError, echo
from simtune.params import SPLITS, PrepareParams
from simtune.prepare.prepared import CORPUS, Prepared, fold, normalize
from simtune.prepare.sources import (
    Record,
    csv_rows,
    jsonl_rows,
    need_column,
    pick,
    read_text,
    scalar,
)
from simtune.prepare.split import assign

log = logging.getLogger(__name__)
QRELS_FILE = {"train": "train", "val": "dev", "test": "test"}  # our split -> qrels file stem


def prepare_beir(folder: Path, p: PrepareParams) -> Prepared:
    """A BEIR folder as pairs: one example per qrel (the score, a graded gain, kept), split by
    the qrels file it is in; unjudged documents stay in the corpus as `corpus` rows."""
    b = beir_records(folder)
    texts, source, empty = {}, {}, 0
    tid_of: dict[str, dict[str, str]] = {"d": {}, "q": {}}
    for prefix, (_, recs) in (("d", b.corpus), ("q", b.queries)):
        for r in recs:
            text = normalize(r.values["text"])
            if not fold(text):  # zero-width characters alone are empty too
                empty += 1
                continue
            tid = tid_of[prefix][r.values["id"]] = f"{prefix}:{r.values['id']}"
            texts[tid], source[tid] = text, r.values["id"]
    split_of: dict[str, str] = {}  # query text id -> split
    score_of: dict[tuple[str, str], float] = {}
    first_at: dict[Any, str] = {}
    rows = duplicates = 0
    skipped: list[str] = []
    for split, (path, recs) in b.qrels.items():
        for r in recs:
            rows, v, at = rows + 1, r.values, f"qrels/{path.name} {r.where}"
            q, d = tid_of["q"].get(v["query"]), tid_of["d"].get(v["doc"])
            if q is None or d is None:  # an unknown id, or a text dropped as empty
                what = (f"query-id {echo(v['query'])} not in queries.jsonl" if q is None else
                        f"corpus-id {echo(v['doc'])} not in corpus.jsonl")
                skipped.append(f"{path}: {r.where}: {what}")
                continue
            if split_of.setdefault(q, split) != split:
                raise UserError(f"{path}: {r.where}: query-id {echo(v['query'])} is also in "
                                f"{first_at[q]} (a query belongs to one split)")
            first_at.setdefault(q, at)
            if (q, d) in score_of:
                if score_of[q, d] != v["score"]:
                    raise UserError(f"{path}: {r.where}: score {v['score']:g} for a pair "
                                    f"judged {score_of[q, d]:g} at {first_at[q, d]}")
                duplicates += 1
                continue
            score_of[q, d], first_at[q, d] = v["score"], at
    if skipped:
        log.warning("%d qrels skipped (unknown or empty query or document); the first: %s",
                    len(skipped), skipped[0])
    _splits(folder, split_of, list(b.qrels), p)
    # score 0 is judged non-relevant (BEIR): never a training positive (evaluation ignores it)
    keep = {k: s for k, s in score_of.items() if s > 0 or split_of[k[0]] != "train"}
    order = sorted(keep, key=lambda k: (SPLITS.index(split_of[k[0]]), k))
    queries = {q for q, _ in order}
    judged = {d for _, d in order}
    unjudged = sorted(t for t in tid_of["d"].values() if t not in judged)
    examples = pa.table({
        "split": [split_of[q] for q, _ in order] + [CORPUS] * len(unjudged),
        "query_id": pa.array([q for q, _ in order] + [None] * len(unjudged), pa.string()),
        "doc_id": [d for _, d in order] + unjudged,
        "score": pa.array([keep[k] for k in order] + [None] * len(unjudged), pa.float32()),
    })
    kept = {t: texts[t] for t in texts if t in queries or t.startswith("d:")}
    counts = Counter(split_of[q] for q in queries)
    report = {
        "rows": rows, "dropped_empty": empty, "duplicates": duplicates, "texts": len(kept),
        "examples": dict(Counter(split_of[q] for q, _ in order)),
        "queries": {s: counts[s] for s in SPLITS}, "documents": len(tid_of["d"]),
        "unjudged_documents": len(unjudged), "qrels_skipped": len(skipped),
        "nonrelevant_train_qrels": len(score_of) - len(keep),
    }
    ids = sorted(kept)
    table = pa.table({"text_id": ids, "text": [kept[t] for t in ids],
                      "source_id": [source[t] for t in ids]})
    return Prepared("pairs", table, examples, report)


def _splits(folder: Path, split_of: dict[str, str], present: list[str],
                 p: PrepareParams) -> None:
    """Splits without a qrels file are cut (seeded, `prepare.split.fractions` renormalised)
    from the queries of the first present one of train, val, test."""
    missing = [s for s in SPLITS if s not in present]
    donor = present[0]
    if missing:
        share = {s: f if s == donor or s in missing else 0.0
                 for s, f in p.split.fractions.as_dict().items()}
        total = sum(share.values()) or 1.0
        pool = [q for q, s in split_of.items() if s == donor]
        split_of.update(assign(pool, {s: f / total for s, f in share.items()}, p.split.seed,
                               nonempty=True))
    counts = Counter(split_of.values())
    for s in SPLITS:
        if counts[s] == 0:
            name = QRELS_FILE[s if s in present else donor]
            raise UserError(f"{folder}: split '{s}' would be empty (" + (
                f"no usable qrels in qrels/{name}.tsv)" if s in present else
                f"{counts[donor]} queries of qrels/{name}.tsv to share by "
                "prepare.split.fractions)"))


# ---------------------------------------------------------------------------------------------
# reading the folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv

QRELS_SPLITS = {"train": "train", "dev": "val", "test": "test"}  # file stem -> our split


@dataclass(frozen=True)
class Beir:
    """A BEIR folder's raw content. Corpus and query records hold `id` and `text` (a document's
    `title` + " " + `text` when it has a title); each qrels file (our split -> (path, records))
    holds `query`, `doc` (ids) and `score` (a number) per line. Ids are unique per file."""

    corpus: tuple[Path, list[Record]]
    queries: tuple[Path, list[Record]]
    qrels: dict[str, tuple[Path, list[Record]]]


def beir_records(folder: Path) -> Beir:
    """Read a BEIR folder (the format BEIR and MTEB use); bad input names its file and line."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: BEIR folder not found")
    qrels_dir = folder / "qrels"
    files = sorted(qrels_dir.glob("*.tsv")) if qrels_dir.is_dir() else []
    if not files:
        raise UserError(f"{qrels_dir}: no qrels files (expected qrels/train.tsv, dev.tsv "
                        "and/or test.tsv)")
    qrels = {}
    for path in files:
        if path.stem not in QRELS_SPLITS:
            raise UserError(f"{path}: unknown qrels split '{path.stem}' (expected train, dev "
                            "or test)")
        header, rows = csv_rows(path, read_text(path, "file not found"), "\t")
        for col in ("query-id", "corpus-id", "score"):
            need_column(path, col, header)
        qrels[QRELS_SPLITS[path.stem]] = (path, [_qrel(path, where, row) for where, row in rows])
    return Beir(_beir_texts(folder / "corpus.jsonl", title=True),
                _beir_texts(folder / "queries.jsonl", title=False),
                {s: qrels[s] for s in ("train", "val", "test") if s in qrels})


def _beir_texts(path: Path, title: bool) -> tuple[Path, list[Record]]:
    text_of = read_text(path, "file not found (a BEIR folder needs corpus.jsonl and "
                        "queries.jsonl)")
    out, first_at = [], {}
    for where, row in jsonl_rows(path, text_of, ("_id", "text", "title")):
        rec = pick(path, where, row, {"id": "_id", "text": "text"})
        rid = rec.values["id"].strip()
        if not rid:
            raise UserError(f"{path}: {where}: empty '_id'")
        if rid in first_at:
            raise UserError(f"{path}: {where}: '_id' {echo(rid)} repeats {first_at[rid]}")
        first_at[rid] = where
        text = rec.values["text"]
        if title and (head := scalar(path, where, "title", row.get("title"), False)).strip():
            text = f"{head} {text}"
        out.append(Record(where, {"id": rid, "text": text}))
    return path, out


def _qrel(path: Path, where: str, row: dict[str, Any]) -> Record:
    if not row["score"].strip():
        raise UserError(f"{path}: {where}: column 'score': expected a number, got ''")
    return Record(where, {"query": row["query-id"].strip(), "doc": row["corpus-id"].strip(),
                          "score": scalar(path, where, "score", row["score"], True)})
