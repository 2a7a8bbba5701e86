"""TREC run files of evaluate's rankings, so trec_eval or ranx users can re-score them.

One line per result, `qid Q0 docid rank score tag` (rank from 1, score the cosine printed with 9
significant digits: the float32 value round-trips), queries in the test split's order. Ids are the
original ones where the data has them (a BEIR `_id`, from the texts' `source_id` column), else the
text ids. trec_eval re-sorts by score and breaks exact ties by docid, where simtune breaks them by
corpus index: only exactly tied scores can come out in another order.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch

from simtune.atomic import write_bytes
from simtune.errors import UserError, echo
from simtune.prepare.prepared import read_parquet


def source_ids(prepared_dir: Path) -> dict[str, str]:
    """text id -> original id (BEIR data: the `_id`); empty when the data has none."""
    path = Path(prepared_dir) / "texts.parquet"
    if "source_id" not in pq.read_schema(path).names:
        return {}
    t = read_parquet(path, columns=["text_id", "source_id"])
    return dict(zip(t.column("text_id").to_pylist(), t.column("source_id").to_pylist(),
                    strict=True))


def check_ids(ids: list[str], what: str) -> None:
    """A run file is split on whitespace: an id holding some cannot be written."""
    for i in ids:
        if not i or any(c.isspace() for c in i):
            raise UserError(f"{what} id {echo(i)} is empty or holds whitespace: a TREC run file "
                            "cannot hold it")


def render(q_ids: list[str], d_ids: list[str], top: tuple[torch.Tensor, torch.Tensor],
           tag: str) -> bytes:
    """The run file's bytes: `top` is (scores, corpus indices), each (len(q_ids), depth)."""
    scores, idx = top
    lines = [f"{qid} Q0 {d_ids[j]} {r} {s:.9g} {tag}\n"
             for qid, row_s, row_i in zip(q_ids, scores.tolist(), idx.tolist(), strict=True)
             for r, (s, j) in enumerate(zip(row_s, row_i, strict=True), start=1)]
    return "".join(lines).encode()


def write_run(path: Path, q_ids: list[str], d_ids: list[str],
              top: tuple[torch.Tensor, torch.Tensor], tag: str) -> None:
    """Write the run file atomically (see `render`)."""
    write_bytes(path, render(q_ids, d_ids, top, tag))
