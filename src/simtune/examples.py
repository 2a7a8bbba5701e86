"""The examples of each split as tensors: what training, validation and evaluate index with.

Groups: `rows` (N,) cache rows of the texts, `labels` (N,) class indices (labels sorted).
Pairs: `q_rows`, `d_rows` (N,) cache rows of query and document, `q_ids`, `d_ids` (N,) ids of
the distinct texts (interned across splits, so equal texts share an id), `scores` (N,) float32.
Rows are present when a cache table is given (head and top_layers modes); texts (`texts`, or
`q_texts`/`d_texts`) when a text map is given (full mode).

A table is anything with `index(text_ids) -> LongTensor` (a cache view's `CacheTable`): this module
reads the prepared examples' columns and nothing of any stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import torch

SPLIT_NAMES = ("train", "val", "test")


class RowIndex(Protocol):
    def index(self, ids: list[str]) -> torch.Tensor: ...


@dataclass
class Split:
    """One split's examples as tensors (see the module docstring) and, in full mode, texts."""

    tensors: dict[str, torch.Tensor]
    texts: dict[str, list[str]]

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))


@dataclass
class Splits:
    """Every split; `label_names[c]` is class c's label (groups; pairs: []); `intern` maps a
    pair text id to its `q_ids`/`d_ids` value (pairs; groups: {}); `queries` the query text id
    of each pair row, per split (pairs: to attach mined negatives)."""

    splits: dict[str, Split]
    label_names: list[str]
    intern: dict[str, int]
    queries: dict[str, list[str]]


# (split, its tensors, the query text id of each row, intern) -> None: adds tensors to a pairs
# split as it is built (mined negatives), so their texts are interned in the same order as ever
PairHook = Callable[[str, dict[str, torch.Tensor], list[str], dict[str, int]], None]


def build(kind: str, examples: pa.Table, q_table: RowIndex | None = None,
          d_table: RowIndex | None = None, texts: dict[str, str] | None = None,
          hook: PairHook | None = None) -> Splits:
    """The split tensors of the prepared `examples` table of data `kind` (groups | pairs)."""
    if kind == "groups":
        return _groups(examples, q_table, texts or {})
    return _pairs(examples, q_table, d_table, texts or {}, hook)


def _groups(examples: pa.Table, table: RowIndex | None, texts: dict[str, str]) -> Splits:
    labels = examples.column("label").to_pylist()
    split_of = examples.column("split").to_pylist()
    text_ids = examples.column("text_id").to_pylist()
    # split `unlabelled` (a texts file's rows, label null) is no split here: distillation adds
    # it to the training rows itself (`simtune.train.distill`)
    classes = {lab: i for i, lab in enumerate(sorted({lab for lab in labels if lab is not None}))}
    out = {}
    for split in SPLIT_NAMES:
        sel = [i for i, s in enumerate(split_of) if s == split]
        ids = [text_ids[i] for i in sel]
        tensors = {"labels": torch.tensor([classes[labels[i]] for i in sel], dtype=torch.long)}
        if table is not None:
            tensors["rows"] = table.index(ids)
        out[split] = Split(tensors, {"texts": [texts[t] for t in ids]} if texts else {})
    return Splits(out, list(classes), {}, {})


def _pairs(examples: pa.Table, q_table: RowIndex | None, d_table: RowIndex | None,
           texts: dict[str, str], hook: PairHook | None) -> Splits:
    ex: dict[str, Any] = examples.to_pydict()
    intern: dict[str, int] = {}
    out, queries = {}, {}
    for split in SPLIT_NAMES:
        sel = [i for i, s in enumerate(ex["split"]) if s == split]
        qs, ds = [ex["query_id"][i] for i in sel], [ex["doc_id"][i] for i in sel]
        tensors = {
            "q_ids": torch.tensor([intern.setdefault(q, len(intern)) for q in qs]),
            "d_ids": torch.tensor([intern.setdefault(d, len(intern)) for d in ds]),
            "scores": torch.tensor([ex["score"][i] for i in sel], dtype=torch.float32)}
        if q_table is not None and d_table is not None:
            tensors["q_rows"], tensors["d_rows"] = q_table.index(qs), d_table.index(ds)
        if hook is not None:
            hook(split, tensors, qs, intern)
        out[split], queries[split] = Split(tensors, {"q_texts": [texts[q] for q in qs],
                                                     "d_texts": [texts[d] for d in ds]}
                                           if texts else {}), qs
    return Splits(out, [], intern, queries)


def load(kind: str, table: pa.Table, q_table: Any = None, d_table: Any = None,
         texts: dict[str, str] | None = None, hook: PairHook | None = None,
         dim: int | None = None) -> Data:
    """`Data` of the prepared examples `table` over the cache tables (a view's `CacheTable`:
    `index`, `ids`, `vectors`, `dim`; None in full mode, where `dim` is the encoder's)."""
    built = build(kind, table, q_table, d_table, texts, hook)
    row_ids = {"query": q_table.ids.to_pylist(), "doc": d_table.ids.to_pylist()} if (
        q_table is not None and d_table is not None) else {}
    return Data(kind, q_table.dim if q_table is not None else int(dim or 0),
                q_table.vectors if q_table is not None else None,
                d_table.vectors if d_table is not None else None, built.splits,
                len(built.label_names), row_ids, built.label_names, {})


def first_positions(inverse: torch.Tensor, n: int) -> torch.Tensor:
    """For each of `n` unique values, the first row where it occurs: (len(inverse),) -> (n,)."""
    rows = torch.arange(len(inverse))
    return torch.full((n,), len(inverse), dtype=torch.long).scatter_reduce_(
        0, inverse, rows, reduce="amin")


@dataclass
class Data:
    """The examples of every split over the cache views they index: what training, validation and
    evaluate work on (`q_vectors`/`d_vectors` (rows, D) the resident tables, head mode)."""

    kind: str
    dim: int
    q_vectors: torch.Tensor | None  # resident cache tables (head mode)
    d_vectors: torch.Tensor | None
    splits: dict[str, Split]
    num_classes: int
    row_ids: dict[str, list[str]]  # "query"/"doc" -> text id of each cache row (head mode)
    label_names: list[str]  # groups: the label of each class index (sorted); pairs: empty
    tables: dict[str, Any]  # caches for `train.represent.build`: query, doc (+ states, layer)
    # the rows training fits on when not the train split's alone (distillation: the train
    # split plus the unlabelled texts); validation's corpus stays the train split
    fit: Split | None = None

    @property
    def training(self) -> Split:
        """The split training fits on: `fit` when set, else the train split."""
        return self.fit if self.fit is not None else self.splits["train"]


def batch_for(n: int, batch_size: int, min_steps: int, min_batch: int) -> tuple[int, str]:
    """(the batch size an epoch of `n` examples trains with, why): `batch_size`, shrunk to
    n // `min_steps` so an epoch gets `min_steps` optimizer steps or more (a large batch over
    a few hundred examples is one step per epoch: the head barely moves before early stopping
    ends the run), not below `min_batch` (nor above `batch_size`); `min_steps` 0: as set."""
    if min_steps == 0 or n // min_steps >= batch_size:
        return batch_size, ""
    batch = min(batch_size, max(min_batch, n // min_steps))
    if batch == batch_size:
        return batch, ""
    return batch, (f"{n} training examples, train.min_steps {min_steps} steps per epoch "
                   f"(not below train.min_batch {min_batch})")
