"""Is there anything to gain? The frozen encoder's validation metrics, checked before training.

When the frozen encoder already ranks every validation query perfectly (P@1, MRR@10, nDCG@10
and MAP@R all 1.0), no trained model can score better on validation, so validation cannot pick
a better one: the train stage says so in one line and in `reports/train.json`
(`nothing_to_gain`). Checked where it is cheap: head and top_layers mode, whose data holds the
frozen encoder's cached pooled vectors (one exact ranking of the validation queries); in full
mode (no cache: the frozen vectors would need an encoder pass) it is not checked (`None`) and
evaluate's verdict (better / no better / worse than the frozen encoder on test) says how the run
did. With `train.frozen_candidate` on, nothing to gain means no training: the stage validates
epoch 0 and keeps it (`epochs.EpochLoop`'s `frozen_only`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from simtune.examples import Data
from simtune.retrieval.metrics import HEADLINE
from simtune.retrieval.task import RetrievalTask, by_rows

log = logging.getLogger(__name__)


def frozen_metrics(data: Data, task: RetrievalTask) -> dict[str, float] | None:
    """The validation metrics (`task`, every one, MAP@R included) of the frozen encoder's cached
    vectors (the pooled-vector tables, (rows, D)); None when the data holds none (full mode)."""
    if data.q_vectors is None or data.d_vectors is None:
        return None
    tables = {"query": data.q_vectors, "doc": data.d_vectors}

    def vectors(rows: torch.Tensor, role: str) -> torch.Tensor:
        table = tables["doc" if role == "doc" else "query"]
        return table[rows.to(table.device)].float()

    with torch.inference_mode():
        return task.score(by_rows(vectors), (1, 5, 10)).metrics


def check(data: Data, task: RetrievalTask, skips: bool = False) -> dict[str, Any]:
    """`{"nothing_to_gain": bool | None, "frozen_val": {metric: value} | None}` for the
    training report, logging a warning when there is nothing to gain (None: not checked);
    `skips`: the warning says no training runs (`train.frozen_candidate`: the train stage then
    keeps epoch 0, the frozen encoder, without training)."""
    try:
        got = frozen_metrics(data, task)
    except ValueError:  # items without cache rows: not head-mode data
        got = None
    if got is None:
        return {"nothing_to_gain": None, "frozen_val": None}
    frozen_val = {m: got[m] for m in HEADLINE}
    saturated = all(v >= 1.0 for v in frozen_val.values())
    if saturated:
        log.warning("nothing to gain: the frozen encoder already scores 1.0 on every "
                    "validation metric (%s, %d queries), so no trained model can be told "
                    "better on validation%s; a larger or harder validation split could (see "
                    "evaluate's verdict for the test split)", ", ".join(HEADLINE),
                    len(task.queries), ": no training, the frozen encoder is kept (epoch 0)"
                    if skips else "")
    return {"nothing_to_gain": saturated, "frozen_val": frozen_val}
