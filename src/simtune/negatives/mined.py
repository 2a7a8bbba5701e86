"""Mined negatives as training reads them: the `negatives/` output checked against the cache."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from simtune.atomic import read_meta
from simtune.errors import UserError
from simtune.params import TrainParams, resolve_loss
from simtune.prepare.prepared import read_parquet

if TYPE_CHECKING:  # torch is loaded where training attaches negatives, not for the stage's
    import torch  # FORMAT_VERSION (the negatives stage on groups data runs without torch)

FORMAT_VERSION = 1


def check(kind: str, t: TrainParams) -> None:
    """`train.hard_negatives` > 0 needs pairs data, the mnrl loss and head mode (one line)."""
    if kind != "pairs":
        raise UserError(f"train.hard_negatives: mined negatives are for pairs data, the prepared "
                        f"data is {kind}; set it to 0")
    loss = resolve_loss(t, kind).loss.name
    if loss != "mnrl":
        raise UserError(f"train.hard_negatives: only the mnrl loss uses mined negatives "
                        f"(train.loss.name is {loss}); set it to 0")
    if t.mode != "head":
        raise UserError(f"train.hard_negatives: head mode only (in {t.mode} mode every negative "
                        "would be one more document through the encoder per query: n = 4 "
                        "makes each step ~3x as long); set it to 0 or train.mode: head")



def load(directory: Path, q_table: Any, d_table: Any, n: int) -> dict[str, list[str]]:
    """Query text id -> its first `n` mined negatives' text ids, checked against the cache the
    training reads (`q_table`, `d_table`) and `n` (one line, naming the file, otherwise)."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    meta = read_meta(directory, FORMAT_VERSION, "negatives", "mined negatives")
    if n > meta.get("count", 0) or meta.get("kind") != "pairs":
        raise UserError(f"train.hard_negatives: {n} per query, but {directory} holds "
                        f"{meta.get('count', 0) if meta.get('kind') == 'pairs' else 0} "
                        "(negatives.count); raise negatives.count and run the negatives stage")
    want = {"query": q_table.manifest.fingerprint, "document": d_table.manifest.fingerprint}
    if meta.get("fingerprints") != want:
        raise UserError(f"{meta_path}: mined from other vectors than the cache holds now; run "
                        "the negatives stage")
    table = read_parquet(directory / "negatives.parquet", columns=["query_id", "doc_ids"])
    return {q: d[:n] for q, d in zip(table.column("query_id").to_pylist(),
                                     table.column("doc_ids").to_pylist(), strict=True)}



def attach(tensors: dict[str, torch.Tensor], queries: list[str], mined: dict[str, list[str]],
           n: int, intern: dict[str, int], d_table: Any, directory: Path) -> None:
    """Add `neg_ids` (B, n) (distinct-text ids as `d_ids`, -1: none) and `neg_rows` (B, n)
    (document cache rows, -1: none) for the training rows whose query ids are `queries`."""
    import torch

    missing = [q for q in queries if q not in mined]
    if missing:
        raise UserError(f"{directory}: mined for other training queries ({len(missing)} "
                        "missing); run the negatives stage")
    padded = [(mined[q] + [""] * n)[:n] for q in queries]
    flat = [d for row in padded for d in row if d]
    rows = iter(d_table.index(flat).tolist()) if flat else iter(())
    tensors["neg_ids"] = torch.tensor([[intern.setdefault(d, len(intern)) if d else -1
                                        for d in row] for row in padded],
                                      dtype=torch.long).view(-1, n)
    tensors["neg_rows"] = torch.tensor([[next(rows) if d else -1 for d in row]
                                        for row in padded], dtype=torch.long).view(-1, n)
