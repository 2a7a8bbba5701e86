"""bench.small_data's draws: one fixed held-out test set per data set, and per size and seed the
training and validation examples from the rest (issue 43, item 6).

A set is prepared once, whole, by the prepare stage's own code (`simtune.prepare.stage.build`:
its normalising, case and zero-width folding, repeats and conflicting labels), so a text here is
a text as `simtune prepare` sees it. Then its split is replaced:

- test (`held_out`): fixed per set, whatever the size and seed: `test_count(n)` of its n texts
  (groups) or queries (pairs) = the larger of 20 % of the set and min(500, n // 2) (500 where the
  set has 1,000 or more; half a smaller set, so its other half stays to draw from). Stratified by
  label (largest remainder; a label gives at most half its texts), within a label the texts
  ranked by a hash of their text id (`simtune.prepare.split.rank`), so the same set gives the
  same test set in any file order.
- train and val (`draw`): from the rest, per seed: each label's remaining texts ranked by a hash
  of (seed, text id), the first `size` to train, the next `val_count(size)` = max(2, size // 4) to
  validation (`all`: every remaining text, a ninth of each label to validation, as prepare's
  0.8/0.1 fractions would); a label with fewer gives what it has, train first. Pairs: the same
  over queries, one stratum, validation max(8, size // 4) queries.

`subset` writes the drawn examples as a prepared folder (`simtune.prepare.prepared.write`) with
these explicit splits: the later stages read it as they read `simtune prepare`'s output. A test
query ranks against that run's train texts (groups, `evaluate.corpus: train`) or every document of
the subset (pairs).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from simtune.params import SPLITS
from simtune.prepare.prepared import Prepared, write
from simtune.prepare.split import rank

TEST_SHARE, TEST_MIN = 0.2, 500
TEST_SEED = 43  # the held-out draw's hash seed: one test set per data set, for every run


def test_count(n: int) -> int:
    """How many of a set's `n` texts (groups) or queries (pairs) are held out for test."""
    return max(min(TEST_MIN, n // 2), math.ceil(TEST_SHARE * n))


def val_count(size: int, kind: str = "groups") -> int:
    """Validation examples of a run of `size`: per label (groups), or queries (pairs)."""
    return max(2 if kind == "groups" else 8, size // 4)


def strata(prepared: Prepared) -> dict[str, list[str]]:
    """The keys a set is split by, per stratum: groups' text ids by label, pairs' query ids in
    one stratum (a query's pairs stay together, as prepare splits them)."""
    ex = prepared.examples
    if prepared.kind == "groups":
        out: dict[str, list[str]] = defaultdict(list)
        for tid, lab in zip(ex.column("text_id").to_pylist(), ex.column("label").to_pylist(),
                            strict=True):
            out[lab].append(tid)
        return dict(out)
    return {"": sorted(set(ex.column("query_id").to_pylist()))}


def held_out(by_label: dict[str, list[str]]) -> set[str]:
    """The set's fixed test keys: `test_count` of them, stratified (module docstring)."""
    total = sum(len(v) for v in by_label.values())
    want = test_count(total)
    ideal = {lab: want * len(v) / total for lab, v in by_label.items()}
    counts = dict.fromkeys(by_label, 0)
    cap = {lab: len(v) // 2 for lab, v in by_label.items()}
    for _ in range(want):  # largest remainder, one at a time, within each label's cap
        room = [lab for lab in by_label if counts[lab] < cap[lab]]
        if not room:
            break
        counts[max(room, key=lambda lab: (ideal[lab] - counts[lab], lab))] += 1
    out: set[str] = set()
    for lab, keys in by_label.items():
        out.update(sorted(keys, key=lambda k: rank(TEST_SEED, f"test\x1f{k}"))[:counts[lab]])
    return out


def draw(by_label: dict[str, list[str]], test: set[str], size: int | None, seed: int,
         kind: str = "groups") -> dict[str, str]:
    """key -> split of one run: the fixed `test`, and `size` per label (pairs: queries) to
    train and `val_count(size)` to validation from the rest, ranked by (seed, key)."""
    split = dict.fromkeys(test, "test")
    for keys in by_label.values():
        rest = sorted((k for k in keys if k not in test),
                      key=lambda k: rank(seed, f"small-data\x1f{k}"))
        n_train = len(rest) - len(rest) // 9 if size is None else min(size, len(rest))
        n_val = len(rest) - n_train if size is None else val_count(size, kind)
        split.update(dict.fromkeys(rest[:n_train], "train"))
        split.update(dict.fromkeys(rest[n_train:n_train + n_val], "val"))
    return split


def digest(keys: set[str]) -> str:
    """A short fingerprint of a key set (runs record their test set's: one per data set)."""
    return hashlib.blake2b("\n".join(sorted(keys)).encode(), digest_size=8).hexdigest()


def subset(full: Prepared, split_of: dict[str, str]) -> Prepared:
    """`full`'s examples whose key (groups: text id, pairs: query id) `split_of` names, with
    that split, and the texts they use; ordered as prepare orders them."""
    ex = full.examples
    groups = full.kind == "groups"
    cols = {c: ex.column(c).to_pylist() for c in ex.column_names if c != "split"}
    keys = cols["text_id" if groups else "query_id"]
    rows = [i for i, k in enumerate(keys) if k in split_of]
    second = "label" if groups else "doc_id"
    rows.sort(key=lambda i: (SPLITS.index(split_of[keys[i]]), cols[second][i], keys[i]))
    table = pa.table({"split": [split_of[keys[i]] for i in rows],
                      **{c: pa.array([v[i] for i in rows], ex.schema.field(c).type)
                         for c, v in cols.items()}})
    ids = set(keys[i] for i in rows) | ({cols["doc_id"][i] for i in rows} if not groups
                                         else set())
    texts = full.texts.filter(pc.is_in(full.texts.column("text_id"),
                                       value_set=pa.array(sorted(ids), pa.string())))
    report: dict[str, Any] = {"texts": texts.num_rows,
                              "examples": dict(Counter(table.column("split").to_pylist()))}
    if groups:
        per_label: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SPLITS, 0))
        for s, lab in zip(table.column("split").to_pylist(), table.column("label").to_pylist(),
                          strict=True):
            per_label[lab][s] += 1
        report["per_label"] = dict(sorted(per_label.items()))
    return Prepared(full.kind, texts, table, report)


def write_subset(full: Prepared, split_of: dict[str, str], out: Path, report: Path) -> Prepared:
    """`subset` written as a prepared folder (`out`) and its counts (`report`), atomically."""
    prepared = subset(full, split_of)
    write(prepared, out, report)
    return prepared
