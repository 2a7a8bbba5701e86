"""Training data without Lightning: the examples of each split as tensors (cache rows, labels,
pair ids), the loss for the data kind, and retrieval metrics of a split for any embedding function.

Head mode reads only the cache and the examples table, never raw texts or a tokenizer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from simtune import examples
from simtune import params as P
from simtune.cache.views import open_pair
from simtune.encoders import check_teacher, model_config
from simtune.errors import UserError
from simtune.examples import Data
from simtune.negatives import mined
from simtune.params import CacheParams, EncodersParams, TrainParams, resolve_loss
from simtune.prepare.prepared import load as load_prepared
from simtune.train import matryoshka

log = logging.getLogger(__name__)


def check_compatible(kind: str, t: TrainParams, data: str = "the prepared data") -> None:
    """The loss (`params.resolve_loss`) and `m_per_label` must fit the data kind; raised
    before any training starts (`data`: how the error names the prepared data)."""
    resolve_loss(t, kind, data)
    if kind == "pairs" and t.m_per_label:
        raise UserError("train.m_per_label: only for groups data; set it to 0")


def load_data(t: TrainParams, enc: EncodersParams, cache: CacheParams, prepared_dir: Path,
              cache_dir: Path, check_loss: bool = True,
              negatives_dir: Path | None = None) -> Data:
    """Examples of every split as index tensors into the resident cache (head mode), or with
    their texts (full mode); given `negatives_dir` and `train.hard_negatives` > 0, the training
    rows' mined negatives too (`mined.attach`). `t`: the train params (its mode resolved,
    `cache.modes.resolve`: `auto` reads as head); `enc`, `cache`: the `encoders` and `cache`
    sections, which name the views in `cache_dir` to open."""
    prepared = load_prepared(prepared_dir)
    if check_loss:
        check_compatible(prepared.kind, t, f"the prepared data ({prepared_dir})")
        P.check_unlabelled(t, prepared.unlabelled, f"the prepared data ({prepared_dir})")
        if t.hard_negatives:
            mined.check(prepared.kind, t)
            if negatives_dir is None:
                raise UserError("train.hard_negatives: no mined negatives given (the train "
                                "stage's --negatives directory)")
    full = t.mode == "full"
    if full and enc.query != enc.document:
        raise UserError("train.mode full: needs one shared encoder (encoders.query == "
                        "encoders.document)")
    q_table = d_table = None
    tables: dict[str, Any] = {}
    if not full:
        # placed later, by each process on its own device (represent.Representation.place)
        q_table, d_table = open_pair(cache_dir, enc, cache, prepared.kind, placed=False)
        tables = {"query": q_table, "doc": d_table}
    if t.mode == "top_layers":
        tables.update(_states_tables(t, enc, cache, cache_dir, q_table, d_table))
    texts = prepared.text_map() if full else {}
    hook = None
    if negatives_dir is not None and t.hard_negatives and q_table is not None:
        hook = _negatives_hook(negatives_dir, q_table, d_table, t.hard_negatives)
    data = examples.load(prepared.kind, prepared.examples, q_table, d_table, texts, hook,
                         dim=None if q_table is not None else _query_dim(enc))
    data.tables = tables
    if t.objective == "distill":
        assert t.distill.teacher is not None  # params refuses distill without one
        _attach_teacher(t.distill.teacher, enc, cache, cache_dir, prepared.examples, data,
                        texts)
    elif prepared.unlabelled:
        log.info("%d unlabelled texts of %s unused: train.objective similarity trains on "
                 "labels (distill would use them)", prepared.unlabelled, prepared_dir)
    for name in ("train", "val"):
        if len(data.splits[name]) == 0:
            raise UserError(f"{prepared_dir}: the {name} split is empty")
    return data


def _states_tables(t: TrainParams, enc: EncodersParams, cache: CacheParams, cache_dir: Path,
                   q_table: Any, d_table: Any) -> dict[str, Any]:
    """Top-layers mode: the layer cache of the (shared) encoder's query texts (the layer `t`
    trains above, `cache.views.layer_for`), row for row the query vector cache's (both views
    hold the same ids, sorted), so the splits' cache rows index both; and of its document
    texts, the same table unless documents have their own view (another prompt)."""
    from simtune.cache.views import layer_for, open_states_pair

    layer = layer_for(enc, t)
    assert layer is not None
    states, doc_states = open_states_pair(cache_dir, enc, cache, layer, q_table, d_table)
    return {"layer": layer, "states": states, "doc_states": doc_states}


def _attach_teacher(name: str, enc: EncodersParams, cache: CacheParams, cache_dir: Path,
                    examples_table: Any, data: Data, texts: dict[str, str]) -> None:
    """Distillation: the cache table of the teacher `name` (`train.distill.teacher`, one of
    `enc`'s models; `tables["teacher"]`), each split's rows in it
    (`t_rows`, `simtune.train.distill.teacher_rows`), and the unlabelled texts as more
    training rows (`simtune.train.distill.add_unlabelled`; `texts`: full mode's text map)."""
    from simtune.cache.views import open_cache
    from simtune.train.distill import add_unlabelled, teacher_rows

    check_teacher(enc, name)  # views filled before the cache stage checked it
    table = open_cache(cache_dir, name, enc.models[name], cache, placed=False)
    for split, rows in teacher_rows(examples_table, table).items():
        data.splits[split].tensors["t_rows"] = rows
    data.tables["teacher"] = table
    data.fit = add_unlabelled(examples_table, data.splits["train"], data.tables.get("query"),
                              table, texts)


def _query_dim(enc: EncodersParams) -> int:
    """Full mode (no cache to read it from): the query encoder's hidden size."""
    return int(model_config(enc.query, enc.models[enc.query]).hidden_size)


def check_trainable(data: Data, t: TrainParams, world: int) -> None:
    """Refuse, before any training, a set-up that cannot train or can never see a positive."""
    matryoshka.check_dims(t.loss.matryoshka_dims, data.dim)  # heads keep the input dim
    if t.mode == "head" and t.lora.r:  # a warning: `-S train.mode=head` stays one edit
        log.warning("train.lora.r: %d is ignored in head mode (no encoder layer "
                    "trains); LoRA applies in train.mode top_layers or full", t.lora.r)
    n = len(data.training)
    if n < world:  # a larger batch_size is reduced to the training set (sampling)
        raise UserError(f"train: {n} training examples for {world} processes (each process "
                        "needs at least one)")
    if t.head.type == "identity" and t.loss.name != "arcface" and t.mode == "head":
        # in top_layers and full modes the encoder's layers train: no head is a sound choice
        raise UserError("train.head.type: 'identity' has nothing to train in head mode (it is "
                        "the frozen baseline that evaluate compares against); use it with "
                        "train.mode top_layers or full")
    _check_kl_batch(t, n, world)
    labelled = t.objective != "distill" or t.distill.label_weight > 0
    if data.kind == "groups" and t.loss.name != "arcface" and labelled:
        counts = torch.bincount(data.splits["train"].tensors["labels"])
        if int(counts.max()) < 2:
            raise UserError("train: every label has a single training example, so a batch can "
                            "never hold a positive pair")


def _check_kl_batch(t: TrainParams, n: int, world: int) -> None:
    """`train.distill.loss: kl` compares each text's similarities to the batch's other texts
    (all processes'): a batch of 2 leaves one, whose softmax is 1 for the teacher and the
    student alike (a loss of 0 whatever the student), so fewer than 3 is refused."""
    if t.objective != "distill" or t.distill.loss != "kl":
        return
    key = f"train.schedule.{t.mode}.batch_size"
    size = t.run.batch_size
    batch = min(size * world, n)
    if batch < 3:
        procs = f" x {world} processes" if world > 1 else ""
        raise UserError(f"{key}: {size}{procs} gives batches of {batch} texts (of {n}); "
                        "train.distill.loss kl softmaxes each text's similarities over the "
                        "batch's other texts, and over one other it is 1 whatever the student "
                        "(nothing to learn): use batches of 3 or more")


def _negatives_hook(directory: Path, q_table: Any, d_table: Any, n: int) -> examples.PairHook:
    """Attaches each training row's first `n` mined negatives (`mined.attach`) as it is built."""
    negatives = mined.load(directory, q_table, d_table, n)

    def hook(split: str, tensors: dict[str, torch.Tensor], queries: list[str],
             intern: dict[str, int]) -> None:
        if split == "train":
            mined.attach(tensors, queries, negatives, n, intern, d_table, directory)
    return hook
