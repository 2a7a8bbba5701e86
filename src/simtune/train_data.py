"""Training data without Lightning: the examples of each split as tensors (cache rows, labels,
pair ids), the loss for the data kind, and retrieval metrics of a split for any embedding function.

Head mode reads only the cache and the examples table, never raw texts or a tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from simtune import matryoshka, metrics, negatives
from simtune.cache import open_cache
from simtune.errors import UserError
from simtune.losses import GroupLoss, PairLoss
from simtune.params import Params, TrainParams
from simtune.prepare import Prepared
from simtune.prepare import load as load_prepared

GROUP_LOSSES, PAIR_LOSSES = {"supcon", "triplet", "contrastive", "arcface"}, {"mnrl", "contrastive"}


@dataclass
class Split:
    """One split's examples as tensors. Groups: `rows` (cache rows), `labels`. Pairs: `q_rows`,
    `d_rows` (cache rows of query and document), `q_ids`, `d_ids` (distinct-text ids), `scores`;
    `texts`/`q_texts`/`d_texts` only in full mode."""

    tensors: dict[str, torch.Tensor]
    texts: dict[str, list[str]]

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))


@dataclass
class TrainData:
    kind: str
    dim: int
    q_vectors: torch.Tensor | None  # resident cache tables (head mode)
    d_vectors: torch.Tensor | None
    splits: dict[str, Split]
    num_classes: int
    row_ids: dict[str, list[str]]  # "query"/"doc" -> text id of each cache row (head mode)
    label_names: list[str]  # groups: the label of each class index (sorted); pairs: empty
    tables: dict[str, Any]  # loaded caches for `represent.build`: query, doc (+ states, layer)


def check_compatible(kind: str, t: TrainParams) -> None:
    """The loss must fit the data kind; raised before any training starts."""
    allowed = GROUP_LOSSES if kind == "groups" else PAIR_LOSSES
    if t.loss.name not in allowed:
        other = "pairs" if kind == "groups" else "groups"
        raise UserError(f"train.loss.name: '{t.loss.name}' needs {other} data, the prepared "
                        f"data is {kind} (use one of {', '.join(sorted(allowed))})")
    if kind == "pairs" and t.m_per_label:
        raise UserError("train.m_per_label: only for groups data; set it to 0")


def load_data(p: Params, prepared_dir: Path, cache_dir: Path, check_loss: bool = True,
              negatives_dir: Path | None = None) -> TrainData:
    """Examples of every split as index tensors into the resident cache (head mode), or with
    their texts (full mode); given `negatives_dir` and `train.hard_negatives` > 0, the training
    rows' mined negatives too (`negatives.attach`)."""
    prepared = load_prepared(prepared_dir)
    if check_loss:
        check_compatible(prepared.kind, p.train)
        if p.train.hard_negatives:
            negatives.check(prepared.kind, p.train)
            if negatives_dir is None:
                raise UserError("train.hard_negatives: no mined negatives given (the train "
                                "stage's --negatives directory)")
    full = p.train.mode == "full"
    enc = p.encoders
    if full and enc.query != enc.document:
        raise UserError("train.mode full: needs one shared encoder (encoders.query == "
                        "encoders.document)")
    q_table = d_table = None
    tables: dict[str, Any] = {}
    if not full:
        # placed later, by each process on its own device (represent.Representation.place)
        q_table = open_cache(cache_dir, enc.query, enc.models[enc.query], p.cache, placed=False)
        d_table = q_table if enc.document == enc.query else open_cache(
            cache_dir, enc.document, enc.models[enc.document], p.cache, placed=False)
        if q_table.dim != d_table.dim:
            raise UserError(f"encoders: '{enc.query}' gives {q_table.dim}-d and "
                            f"'{enc.document}' {d_table.dim}-d vectors; one head needs one dim")
        tables = {"query": q_table, "doc": d_table}
    if p.train.mode == "top_layers":
        tables.update(_states_tables(p, cache_dir, q_table))
    texts = dict(zip(prepared.texts.column("text_id").to_pylist(),
                     prepared.texts.column("text").to_pylist(), strict=True)) if full else {}
    mined = None
    if negatives_dir is not None and p.train.hard_negatives and q_table is not None:
        mined = (negatives_dir, negatives.load(negatives_dir, q_table, d_table,
                                               p.train.hard_negatives))
    build = _group_splits if prepared.kind == "groups" else _pair_splits
    splits, label_names = build(prepared, q_table, d_table, texts, p.train.hard_negatives, mined)
    for name in ("train", "val"):
        if len(splits[name]) == 0:
            raise UserError(f"{prepared_dir}: the {name} split is empty")
    dim = q_table.dim if q_table is not None else _encoder_dim(p)
    row_ids = {"query": q_table.ids.to_pylist(), "doc": d_table.ids.to_pylist()} if (
        q_table and d_table) else {}
    return TrainData(prepared.kind, dim, q_table.vectors if q_table else None,
                     d_table.vectors if d_table else None, splits, len(label_names), row_ids,
                     label_names, tables)


def _states_tables(p: Params, cache_dir: Path, q_table: Any) -> dict[str, Any]:
    """Top-layers mode: the layer cache of the query encoder, row for row the vector cache's
    (both views hold the same ids, sorted), so the splits' cache rows index both."""
    from simtune.cache import open_states
    from simtune.views import layer_for

    layer = layer_for(p.encoders, p.train)
    assert layer is not None
    name = p.encoders.query
    table = open_states(cache_dir, name, p.encoders.models[name], layer)
    if not table.ids.equals(q_table.ids):
        raise UserError(f"{table.directory}: the layer cache holds other texts than "
                        f"{q_table.directory}; run the cache stage")
    return {"states": table, "layer": layer}


def _encoder_dim(p: Params) -> int:
    import transformers

    from simtune.encoders import model_dir

    name = p.encoders.query
    return int(transformers.AutoConfig.from_pretrained(
        model_dir(name, p.encoders.models[name]), local_files_only=True).hidden_size)


def _group_splits(prepared: Prepared, q_table: Any, _d: Any, texts: dict[str, str], *_: Any
                  ) -> tuple[dict[str, Split], list[str]]:
    ex = prepared.examples
    labels = ex.column("label").to_pylist()
    classes = {lab: i for i, lab in enumerate(sorted(set(labels)))}
    out = {}
    for split in ("train", "val", "test"):
        sel = [i for i, s in enumerate(ex.column("split").to_pylist()) if s == split]
        ids = [ex.column("text_id")[i].as_py() for i in sel]
        tensors = {"labels": torch.tensor([classes[labels[i]] for i in sel], dtype=torch.long)}
        if q_table is not None:
            tensors["rows"] = q_table.index(ids)
        out[split] = Split(tensors, {"texts": [texts[t] for t in ids]} if texts else {})
    return out, list(classes)


def _pair_splits(prepared: Prepared, q_table: Any, d_table: Any, texts: dict[str, str],
                 n_neg: int = 0, mined: tuple[Path, dict[str, list[str]]] | None = None
                 ) -> tuple[dict[str, Split], list[str]]:
    ex = prepared.examples.to_pydict()
    intern: dict[str, int] = {}
    out = {}
    for split in ("train", "val", "test"):
        sel = [i for i, s in enumerate(ex["split"]) if s == split]
        qs, ds = [ex["query_id"][i] for i in sel], [ex["doc_id"][i] for i in sel]
        tensors = {
            "q_ids": torch.tensor([intern.setdefault(q, len(intern)) for q in qs]),
            "d_ids": torch.tensor([intern.setdefault(d, len(intern)) for d in ds]),
            "scores": torch.tensor([ex["score"][i] for i in sel], dtype=torch.float32)}
        if q_table is not None:
            tensors["q_rows"], tensors["d_rows"] = q_table.index(qs), d_table.index(ds)
        if split == "train" and mined is not None:
            negatives.attach(tensors, qs, mined[1], n_neg, intern, d_table, mined[0])
        out[split] = Split(tensors, {"q_texts": [texts[q] for q in qs],
                                     "d_texts": [texts[d] for d in ds]} if texts else {})
    return out, []


def build_loss(kind: str, t: TrainParams, num_classes: int, dim: int) -> torch.nn.Module:
    """The loss of `t.loss` for the data kind (summed over `matryoshka_dims` when listed)."""
    lp = t.loss
    loss: torch.nn.Module
    if kind == "groups":
        loss = GroupLoss(lp.name, lp.distance, lp.temperature, lp.margin, lp.mining, lp.scale,
                         num_classes, dim)
    else:
        loss = PairLoss(lp.name, lp.distance, lp.scale, lp.symmetric, lp.margin)
    return matryoshka.wrap(loss, lp.matryoshka_dims, lp.matryoshka_weights)


def check_trainable(data: TrainData, t: TrainParams, world: int) -> None:
    """Refuse, before any training, a set-up that cannot train or can never see a positive."""
    matryoshka.check_dims(t.loss.matryoshka_dims, data.dim)  # heads keep the input dim
    n = len(data.splits["train"])
    if n < world:  # a larger batch_size is reduced to the training set (sampling)
        raise UserError(f"train: {n} training examples for {world} processes (each process "
                        "needs at least one)")
    if t.head.type == "identity" and t.loss.name != "arcface" and t.mode == "head":
        # in top_layers and full modes the encoder's layers train: no head is a sound choice
        raise UserError("train.head.type: 'identity' has nothing to train in head mode (it is "
                        "the frozen baseline that evaluate compares against); use it with "
                        "train.mode top_layers or full")
    if data.kind == "groups" and t.loss.name != "arcface":
        counts = torch.bincount(data.splits["train"].tensors["labels"])
        if int(counts.max()) < 2:
            raise UserError("train: every label has a single training example, so a batch can "
                            "never hold a positive pair")


Embed = Callable[[Split, str], torch.Tensor]  # (split, role: text | query | doc) -> (n, D)


def split_metrics(data: TrainData, split: str, embed: Embed, ks: tuple[int, ...] = (1, 5, 10),
                  corpus: str | None = None) -> tuple[dict[str, float], int]:
    """Retrieval metrics of `split` with vectors from `embed` (any head, any encoder).

    Groups: each text queries the texts of the `corpus` split, or with None the other texts of
    its own split (leave-one-out); relevant = same label. Pairs: each distinct query against the
    split's distinct documents, relevant = its documents with score > 0.
    Returns (metrics, queries without a relevant item)."""
    return retrieval_task(data, split, corpus, ks).scores(data, embed)


@dataclass
class RetrievalTask:
    """What `split_metrics` needs besides the vectors, computed once per split: the splits'
    names and, for pairs, each distinct query's and document's first row and the relevant
    (query, document) pairs."""

    split: str
    corpus: str | None
    ks: tuple[int, ...]
    q_first: torch.Tensor | None = None
    d_first: torch.Tensor | None = None
    pairs: torch.Tensor | None = None

    def scores(self, data: TrainData, embed: Embed, upto_r: bool = True
               ) -> tuple[dict[str, float], int]:
        """(metrics, queries without a relevant item) with vectors from `embed`; `upto_r`
        False: ranked down to max(ks, 10) only, without MAP@R (`metrics.group_scores`)."""
        sp = data.splits[self.split]
        if self.pairs is None:
            c = data.splits[self.corpus] if self.corpus else None
            return metrics.group_scores(embed(sp, "text"), sp.tensors["labels"],
                                        embed(c, "text") if c else None,
                                        c.tensors["labels"] if c else None, self.ks,
                                        upto_r=upto_r)
        assert self.q_first is not None and self.d_first is not None
        return metrics.pair_scores(embed(sp, "query")[self.q_first],
                                   embed(sp, "doc")[self.d_first], self.pairs, self.ks,
                                   upto_r=upto_r)


def retrieval_task(data: TrainData, split: str, corpus: str | None = None,
                   ks: tuple[int, ...] = (1, 5, 10)) -> RetrievalTask:
    """The retrieval task of `split` (see `split_metrics`); `corpus` matters for groups only."""
    if data.kind == "groups":
        return RetrievalTask(split, corpus, ks)
    sp = data.splits[split]
    q_u, q_inv = torch.unique(sp.tensors["q_ids"], return_inverse=True)
    d_u, d_inv = torch.unique(sp.tensors["d_ids"], return_inverse=True)
    positive = sp.tensors["scores"] > 0
    pairs = torch.stack([q_inv[positive], d_inv[positive]], 1)
    return RetrievalTask(split, None, ks, first_positions(q_inv, len(q_u)),
                         first_positions(d_inv, len(d_u)), pairs)


def first_positions(inverse: torch.Tensor, n: int) -> torch.Tensor:
    """For each of `n` unique values, the first row where it occurs."""
    rows = torch.arange(len(inverse))
    return torch.full((n,), len(inverse), dtype=torch.long).scatter_reduce_(
        0, inverse, rows, reduce="amin")
