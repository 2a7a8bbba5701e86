"""The `prepare` stage: raw records -> normalised, deduplicated, split tables (`prepared`)."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from simtune.errors import UserError, echo
from simtune.params import SPLITS, PrepareParams
from simtune.prepare import sources
from simtune.prepare.prepared import UNLABELLED, Prepared, fold, normalize, text_id, write
from simtune.prepare.split import assign

log = logging.getLogger(__name__)


def records(p: PrepareParams) -> tuple[Path, str, list[sources.Record]]:
    """(source path, kind, raw records) for the configured source."""
    if p.source == "trec":
        path, recs = sources.trec_records(p.trec_labels)
        return path, "groups", recs
    if p.source == "news_pairs":
        path, recs = sources.news_pairs_records()
        return path, "pairs", recs
    path, recs = sources.file_records(p.file)
    return path, p.file.kind, recs


def build(p: PrepareParams) -> Prepared:
    """Load, validate, normalise, deduplicate and split; raises `UserError` on bad input."""
    if p.source == "file" and sources.file_format(p.file) == "beir":
        from simtune.prepare.beir import prepare_beir

        return prepare_beir(Path(str(p.file.path)), p)
    path, kind, recs = records(p)
    if kind == "texts":
        from simtune.prepare.texts import join_texts

        return join_texts(path, recs, p)
    if kind == "groups":
        return _groups(path, recs, p)
    return _pairs(path, recs, p)


def _missing_labels(p: PrepareParams) -> frozenset[str]:
    """The label values that mean "no label" (`prepare.file.missing_labels`, normalised like a
    label); a built-in data set has none."""
    if p.source != "file":
        return frozenset()
    return frozenset(normalize(v) for v in p.file.missing_labels) - {""}


def _groups(path: Path, recs: list[sources.Record], p: PrepareParams) -> Prepared:
    seen: dict[str, tuple[str, str]] = {}
    first_at: dict[str, str] = {}
    id_of: dict[str, str] = {}  # folded text -> the id of its first form
    conflicted: set[str] = set()
    missing_values = _missing_labels(p)
    missing: Counter[str] = Counter()
    empty = duplicates = duplicates_folded = 0
    for r in recs:
        text, label = normalize(r.values["text"]), normalize(r.values["label"])
        if label in missing_values:
            # `nan` from an export is no class: kept, it would make one class of unrelated texts
            missing[label] += 1
            label = ""
        if not fold(text) or not fold(label):  # zero-width characters alone are empty too
            empty += 1
            continue
        # the id is the content hash of the text's first form (a case or zero-width twin is
        # the same tokens for the encoder: one text), or the user's own key (then one key must
        # mean one text)
        keyed = "key" in r.values
        tid = _key(path, r) if keyed else id_of.setdefault(fold(text), text_id(text))
        if tid not in seen:
            seen[tid], first_at[tid] = (text, label), r.where
        elif keyed and seen[tid][0] != text:
            raise UserError(f"{path}: {r.where}: key {echo(tid)} already names another text "
                            f"({first_at[tid]})")
        elif seen[tid][1] == label:
            duplicates += 1
            duplicates_folded += seen[tid][0] != text
        else:
            # one text under two labels is ambiguous ground truth: keep none of it
            conflicted.add(tid)
    for tid in conflicted:
        del seen[tid]
    _require_rows(path, len(recs), empty, len(seen), sum(missing.values()))
    _require_shared_labels(path, [lab for _, lab in seen.values()])
    split_of = _split_groups(path, {tid: lab for tid, (_, lab) in seen.items()}, p)
    order = sorted(seen, key=lambda t: (SPLITS.index(split_of[t]), seen[t][1], t))
    examples = pa.table({
        "split": [split_of[t] for t in order],
        "text_id": order,
        "label": [seen[t][1] for t in order],
    })
    per_label: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SPLITS, 0))
    for t in order:
        per_label[seen[t][1]][split_of[t]] += 1
    report = {
        "rows": len(recs), "dropped_empty": empty, "duplicates": duplicates,
        "duplicates_folded": duplicates_folded, "missing_labels": dict(sorted(missing.items())),
        "conflicting_labels": len(conflicted), "texts": len(seen),
        "examples": dict(Counter(split_of.values())),
        "labels": {s: sum(1 for c in per_label.values() if c[s]) for s in SPLITS},
        "per_label": dict(sorted(per_label.items())),
    }
    return Prepared("groups", _texts_table({t: seen[t][0] for t in order}), examples, report)


def _key(path: Path, r: sources.Record) -> str:
    key = str(r.values["key"]).strip()
    if not key:
        raise UserError(f"{path}: {r.where}: empty key")
    if any(c.isspace() for c in key):  # evaluate's TREC run files split ids on whitespace
        raise UserError(f"{path}: {r.where}: key {echo(key)} holds whitespace (ids are written "
                        "to whitespace-separated run files)")
    return key


def _split_groups(path: Path, label_of: dict[str, str], p: PrepareParams) -> dict[str, str]:
    fractions, seed = p.split.fractions.as_dict(), p.split.seed
    by_label: dict[str, list[str]] = defaultdict(list)
    for tid, lab in label_of.items():
        by_label[lab].append(tid)
    if p.split.by == "label":
        needed = sum(1 for f in fractions.values() if f > 0)
        if len(by_label) < needed:
            raise UserError(f"{path}: split by label needs at least {needed} labels, "
                            f"the data has {len(by_label)}")
        label_split = assign(by_label, fractions, seed, nonempty=True)
        split_of = {tid: label_split[lab] for tid, lab in label_of.items()}
    else:  # by row, stratified: each label is split on its own
        split_of = {}
        for lab, tids in by_label.items():
            split_of.update(assign(tids, fractions, seed, salt=lab))
    _require_splits(path, split_of.values(), fractions,
                    [len(t) for t in by_label.values()] if p.split.by == "row" else None)
    return split_of


def _pairs(path: Path, recs: list[sources.Record], p: PrepareParams) -> Prepared:
    texts: dict[str, str] = {}
    score_of: dict[tuple[str, str], float] = {}
    id_of: dict[str, str] = {}  # folded text -> the id of its first form
    empty = duplicates = duplicates_folded = 0
    for r in recs:
        query, doc = normalize(r.values["query"]), normalize(r.values["positive"])
        if not fold(query) or not fold(doc):  # zero-width characters alone are empty too
            empty += 1
            continue
        # a case or zero-width twin is its first form's text (one query, one split)
        key = (id_of.setdefault(fold(query), text_id(query)),
               id_of.setdefault(fold(doc), text_id(doc)))
        if key in score_of:
            duplicates += 1
            duplicates_folded += (texts[key[0]], texts[key[1]]) != (query, doc)
            continue
        score_of[key] = float(r.values.get("score", 1.0))
        texts.setdefault(key[0], query)
        texts.setdefault(key[1], doc)
    _require_rows(path, len(recs), empty, len(score_of))
    fractions = p.split.fractions.as_dict()
    # split by query: all pairs of one query land in one split, so no query is seen at test
    query_split = assign((q for q, _ in score_of), fractions, p.split.seed, nonempty=True)
    _require_splits(path, query_split.values(), fractions)
    order = sorted(score_of, key=lambda k: (SPLITS.index(query_split[k[0]]), k))
    examples = pa.table({
        "split": [query_split[q] for q, _ in order],
        "query_id": [q for q, _ in order],
        "doc_id": [d for _, d in order],
        "score": pa.array([score_of[k] for k in order], pa.float32()),
    })
    queries = Counter(query_split.values())
    report = {
        "rows": len(recs), "dropped_empty": empty, "duplicates": duplicates,
        "duplicates_folded": duplicates_folded, "texts": len(texts),
        "examples": dict(Counter(query_split[q] for q, _ in order)),
        "queries": {s: queries[s] for s in SPLITS},
        "documents": len({d for _, d in score_of}),
    }
    return Prepared("pairs", _texts_table(texts), examples, report)


def _require_rows(path: Path, rows: int, empty: int, usable: int, missing: int = 0) -> None:
    if usable == 0:
        # a file whose every label reads as missing (`nan`) says so: its fields are not empty
        why = (f", {missing} of them a label that reads as missing: "
               "prepare.file.missing_labels" if missing else "")
        raise UserError(f"{path}: no usable rows ({rows} read, {empty} with an empty field{why})")


def _require_shared_labels(path: Path, labels: list[str]) -> None:
    """`UserError` when no label has two texts: groups data learns and is scored by texts that
    share a label (a split would be empty too, but the fractions are not the cause)."""
    if max(Counter(labels).values()) < 2:
        raise UserError(f"{path}: no label has two texts ({len(labels)} texts, each under a "
                        "label of its own): texts that share a label are the similar ones, so "
                        "groups data needs labels of several texts")


def _require_splits(path: Path, assigned: Any, fractions: dict[str, float],
                    label_sizes: list[int] | None = None) -> None:
    """`UserError` naming the first empty split. `label_sizes` (groups split by row: each
    label's texts split on their own) says how many labels have two texts or more, since a
    label of a few texts rounds to none for a small fraction."""
    counts = Counter(assigned)
    for s in SPLITS:
        if counts[s] == 0 and label_sizes is not None and fractions[s] > 0:
            shared = sum(1 for n in label_sizes if n >= 2)
            raise UserError(f"{path}: split '{s}' would be empty: {shared} of "
                            f"{len(label_sizes)} labels have 2 or more texts, and each label's "
                            "texts are split on their own (a label of few texts has none for "
                            f"fraction {fractions[s]:g}); give the labels more texts or change "
                            "prepare.split.fractions")
        if counts[s] == 0:
            raise UserError(f"{path}: split '{s}' would be empty (fraction {fractions[s]:g} of "
                            f"{sum(counts.values())} items); change prepare.split.fractions")


def _texts_table(texts: dict[str, str]) -> pa.Table:
    ids = sorted(texts)
    return pa.table({"text_id": ids, "text": [texts[t] for t in ids]})


def run(p: PrepareParams, out: Path, report_path: Path) -> Prepared:
    """The whole stage: build, log what was dropped and why, write."""
    labelled = p.file.labelled if p.source == "file" and p.file.kind == "texts" else None
    if labelled is not None and Path(labelled).resolve() == Path(out).resolve():
        raise UserError(f"prepare.file.labelled: {labelled} is the stage's output folder "
                        "(--out): the joined data would replace the labelled set; prepare "
                        "the texts into another folder")
    prepared = build(p)
    r = prepared.report
    # what an empty row lacks, in the kind's own words (pairs have no label, texts no label)
    empty = {"groups": "empty text or label", "pairs": "empty query or positive"}.get(
        prepared.kind, "empty text")
    log.info("read %d rows: %d dropped (%s), %d duplicates%s%s",
             r["rows"], r["dropped_empty"], empty, r["duplicates"],
             f" ({r['duplicates_folded']} of them only by case, Unicode form or zero-width "
             "characters)" if r.get("duplicates_folded") else "",
             f", {r['conflicting_labels']} texts dropped (one text, several labels)"
             if r.get("conflicting_labels") else "")
    if r.get("missing_labels"):
        counts = ", ".join(f"{echo(v)} {n}" for v, n in r["missing_labels"].items())
        log.info("%d of the dropped rows have a label that reads as missing (%s; "
                 "prepare.file.missing_labels)", sum(r["missing_labels"].values()), counts)
    log.info("%s: %d texts; examples %s", prepared.kind, r["texts"],
             ", ".join(f"{s} {r['examples'].get(s, 0)}" for s in (*SPLITS, UNLABELLED)
                       if s in SPLITS or s in r["examples"]))
    write(prepared, out, report_path)
    log.info("wrote %s and %s", out, report_path)
    return prepared


