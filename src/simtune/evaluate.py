"""The `evaluate` stage: retrieval metrics of the trained model against the frozen baseline.

Everything runs under `torch.inference_mode()`. Test vectors come from the cache through the
trained head; the baseline is the same computation through the identity head (the frozen
encoder). In full mode the trained vectors come from the fine-tuned encoder saved with the head.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from simtune import heads, metrics
from simtune.atomic import write_json
from simtune.errors import UserError
from simtune.params import Params
from simtune.train_data import TrainData, first_positions, load_data

log = logging.getLogger("simtune.evaluate")
Vectors = Callable[[torch.Tensor, str], torch.Tensor]  # (cache rows, role) -> (n, D)


def _cached(data: TrainData, head: torch.nn.Module) -> Vectors:
    def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
        table = data.d_vectors if role == "doc" else data.q_vectors
        assert table is not None
        return torch.cat([head(table[rows[i : i + 8192].to(table.device)].float())
                          for i in range(0, len(rows), 8192)]) if len(rows) else torch.empty(
                              0, data.dim)
    return vectors


def _task(data: TrainData, corpus: str) -> dict[str, Any]:
    """What to rank: query rows, corpus rows, and how relevance is decided."""
    test = data.splits["test"].tensors
    if data.kind == "groups":
        source = data.splits[corpus].tensors
        return {"q_rows": test["rows"], "q_labels": test["labels"],
                "c_rows": None if corpus == "test" else source["rows"],
                "c_labels": None if corpus == "test" else source["labels"]}
    docs = {}  # every document of every split, once
    for sp in data.splits.values():
        for did, row in zip(sp.tensors["d_ids"].tolist(), sp.tensors["d_rows"].tolist(),
                            strict=True):
            docs.setdefault(did, row)
    doc_index = {did: i for i, did in enumerate(docs)}
    q_u, q_inv = torch.unique(test["q_ids"], return_inverse=True)
    first = first_positions(q_inv, len(q_u))
    positive = test["scores"] > 0
    pairs = torch.stack([q_inv[positive], torch.tensor(
        [doc_index[d] for d in test["d_ids"][positive].tolist()], dtype=torch.long)], 1)
    return {"q_rows": test["q_rows"][first], "c_rows": torch.tensor(list(docs.values())),
            "pairs": pairs}


def score(data: TrainData, task: dict[str, Any], vectors: Vectors, ks: tuple[int, ...]
          ) -> tuple[dict[str, float], int]:
    """Metrics of one model on the task; (metrics, queries without any relevant item)."""
    if data.kind == "groups":
        q = vectors(task["q_rows"], "text")
        c = None if task["c_rows"] is None else vectors(task["c_rows"], "text")
        return metrics.group_scores(q, task["q_labels"], c, task["c_labels"], ks)
    return metrics.pair_scores(vectors(task["q_rows"], "query"), vectors(task["c_rows"], "doc"),
                               task["pairs"], ks)


@torch.inference_mode()
def run(p: Params, prepared_dir: Path, cache_dir: Path, head_dir: Path, out: Path,
        plot: Path) -> dict[str, Any]:
    """Evaluate trained vs baseline on the test split; write metrics and the Recall@k plot."""
    head = heads.load(head_dir)
    head_mode = p.train.model_copy(update={"mode": "head"})
    data = load_data(p.model_copy(update={"train": head_mode}), prepared_dir, cache_dir,
                     check_loss=False)
    if len(data.splits["test"]) == 0:
        raise UserError(f"{prepared_dir}: the test split is empty")
    if head.config["dim"] != data.dim:
        raise UserError(f"{head_dir}: head expects {head.config['dim']}-d vectors, the cache "
                        f"holds {data.dim}-d (encoder changed since training? rerun train)")
    ks = tuple(sorted(set(p.evaluate.ks)))
    task = _task(data, p.evaluate.corpus)
    corpus_size = len(task["c_rows"]) if task.get("c_rows") is not None else len(
        task["q_rows"]) - 1
    if max(ks) > corpus_size:
        log.warning("Recall@k for k > %d (the corpus size) equals Recall@%d", corpus_size,
                    corpus_size)
    trained_vectors = _finite(_trained(data, head, head_dir, p, prepared_dir), head_dir)
    trained, no_rel = score(data, task, trained_vectors, ks)
    baseline, _ = score(data, task, _cached(data, heads.build("identity", data.dim, 1, 0.0)), ks)
    result = {"trained": trained, "baseline": baseline,
              "lift": {k: trained[k] - baseline[k] for k in trained},
              "queries": len(task["q_rows"]), "corpus": corpus_size,
              "queries_without_relevant": no_rel}
    write_json(out, result)
    write_json(plot, [{"k": k, "trained": trained[f"recall@{k}"],
                       "baseline": baseline[f"recall@{k}"]} for k in ks])
    log.info("test: %d queries, corpus %d%s; trained p@1 %.4f mrr@10 %.4f; baseline p@1 %.4f "
             "mrr@10 %.4f", result["queries"], corpus_size,
             f", {no_rel} queries without a relevant item" if no_rel else "",
             trained["p@1"], trained["mrr@10"], baseline["p@1"], baseline["mrr@10"])
    return result


def _finite(vectors: Vectors, head_dir: Path) -> Vectors:
    """`vectors`, refusing inf/NaN ones: they would be ranked into meaningless metrics."""
    def checked(rows: torch.Tensor, role: str) -> torch.Tensor:
        out = vectors(rows, role)
        if not bool(torch.isfinite(out).all()):
            raise UserError(f"{head_dir}: the trained model gives non-finite test vectors "
                            "(training diverged?); rerun train")
        return out
    return checked


def _trained(data: TrainData, head: heads.Head, head_dir: Path, p: Params,
             prepared_dir: Path) -> Vectors:
    if not (head_dir / "encoder").is_dir():
        return _cached(data, head)
    # full mode: the fine-tuned encoder (saved with the head) embeds the test texts
    from simtune.model import load_model
    from simtune.prepare import load as load_prepared

    model = load_model(head_dir, p.cache.device)
    prepared = load_prepared(prepared_dir)
    texts = dict(zip(prepared.texts.column("text_id").to_pylist(),
                     prepared.texts.column("text").to_pylist(), strict=True))

    def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
        ids = data.row_ids["doc" if role == "doc" else "query"]
        return model.encode([texts[ids[r]] for r in rows.tolist()])

    return vectors
