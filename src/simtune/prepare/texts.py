"""`prepare.file.kind: texts`: unlabelled texts (one column) joined to a labelled data set.

Texts without labels can teach a student (distillation, `train.objective: distill`) but can
score nothing: no split of theirs could validate or evaluate. So they join a prepared groups
data set (`prepare.file.labelled`, a folder the prepare stage wrote): its train, val and test
examples, labels and texts are kept as they are (validation, the test evaluation and its
corpus are that data set's), and each new text becomes an example of split `unlabelled`
(label null). A text the labelled set already holds, an empty one or a repeat is not added,
compared by `prepared.fold`: case, Unicode form and zero-width characters aside (counted and
logged).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa

from simtune.errors import UserError
from simtune.params import SPLITS, PrepareParams
from simtune.prepare import sources
from simtune.prepare.prepared import UNLABELLED, Prepared, fold, load, normalize, text_id

log = logging.getLogger(__name__)


def _labelled(p: PrepareParams) -> Prepared:
    """The prepared groups data set `prepare.file.labelled` (one line when it is not one)."""
    folder = Path(str(p.file.labelled))
    if not folder.is_dir():
        raise UserError(f"prepare.file.labelled: {folder}: no such folder (prepare the labelled "
                        "data set there first)")
    labelled = load(folder)
    if labelled.kind != "groups" or labelled.unlabelled:
        raise UserError(f"prepare.file.labelled: {folder}: {labelled.kind} data"
                        f"{' with unlabelled texts' if labelled.unlabelled else ''}; a texts "
                        "file joins a labelled groups data set")
    return labelled


def _say_dropped(already: int, already_folded: int, duplicates: int, duplicates_folded: int,
                 p: PrepareParams) -> None:
    """Log the texts not joined: held by the labelled set, or repeats of a joined one."""
    if already or duplicates:
        log.info("prepare texts: not joined: %d texts already in %s (%d of them only by case, "
                 "Unicode form or zero-width characters), %d repeats (%d of them so)", already,
                 p.file.labelled, already_folded, duplicates, duplicates_folded)


def join_texts(path: Path, recs: list[sources.Record], p: PrepareParams) -> Prepared:
    """The labelled data set of `p.file.labelled` plus the file's new texts as `unlabelled`
    examples (sorted by id: deterministic)."""
    labelled = _labelled(p)
    # by content: a labelled set prepared with `columns.key` has the keys as its text ids;
    # by folded content: an upper-cased or zero-width-prefixed copy of a test text is that
    # text's very tokens for an uncased encoder (a leak of the test split into distillation)
    exact = set(labelled.texts.column("text").to_pylist())
    known = {fold(t) for t in exact}
    new: dict[str, str] = {}
    seen: dict[str, str] = {}  # folded key -> the text joined
    empty = duplicates = already = already_folded = duplicates_folded = 0
    for r in recs:
        text = normalize(r.values["text"])
        key = fold(text)
        if not key:  # zero-width characters alone are empty too
            empty += 1
        elif key in known:
            already += 1
            already_folded += text not in exact
        elif key in seen:
            duplicates += 1
            duplicates_folded += seen[key] != text
        else:
            new[text_id(text)] = seen[key] = text
    if not new:
        raise UserError(f"{path}: no new texts ({len(recs)} read, {empty} empty, {already} "
                        f"already in {p.file.labelled}, {duplicates} repeated)")
    _say_dropped(already, already_folded, duplicates, duplicates_folded, p)
    order = sorted(new)
    ex = labelled.examples
    examples = pa.concat_tables([ex.select(["split", "text_id", "label"]), pa.table({
        "split": [UNLABELLED] * len(order), "text_id": order,
        "label": pa.array([None] * len(order), ex.schema.field("label").type)})])
    all_texts = {**labelled.text_map(), **new}
    ids = sorted(all_texts)
    texts = pa.table({"text_id": ids, "text": [all_texts[t] for t in ids]})
    splits = ex.column("split").to_pylist()
    per_label: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SPLITS, 0))
    for split, label in zip(splits, ex.column("label").to_pylist(), strict=True):
        per_label[label][split] += 1
    report = {
        "rows": len(recs), "dropped_empty": empty, "duplicates": duplicates,
        "already_labelled": already, "already_labelled_folded": already_folded,
        "duplicates_folded": duplicates_folded, "labelled": str(p.file.labelled),
        "texts": len(ids),
        "examples": {**Counter(splits), UNLABELLED: len(order)},
        "labels": {s: sum(1 for c in per_label.values() if c[s]) for s in SPLITS},
        "per_label": dict(sorted(per_label.items())),
    }
    return Prepared("groups", texts, examples, report, unlabelled=len(order))
