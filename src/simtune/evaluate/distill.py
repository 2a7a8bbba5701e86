"""Evaluate's part of a distillation (`train.objective: distill`): the teacher on the same test
task as the distilled student (`trained`) and the frozen student (`baseline`), with the same
paired significance test, and each model's encode speed.

`reports/evaluate.json` gets `distill`:

- `teacher`: the teacher's metrics, from its cached vectors (what the student was taught);
- `teacher_minus_trained` and `significance_teacher_over_trained` (paired, per query, as the
  lift's): what the student has not learned;
- `recovered`: per metric, (trained - baseline) / (teacher - baseline), the share of the
  teacher's lift over the frozen student that the distilled student recovered (null when the
  teacher has no lift: it scores at or below the frozen student);
- `speed` (when `evaluate.speed_texts` > 0): texts/s of each model encoding the first test
  texts from raw text (tokenising, the encoder, the head) at `cache.batch_size` on
  `cache.device`, the fastest of `ROUNDS` passes taken in turns after a warm-up batch;
  `trained_over_teacher`: the student's speed-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from simtune.retrieval import metrics, significance
from simtune.retrieval.metrics import HEADLINE

Encode = Callable[[list[str]], torch.Tensor]  # texts -> (n, D)


def report(teacher: dict[str, float], trained: dict[str, float], baseline: dict[str, float],
           teacher_q: dict[str, torch.Tensor], trained_q: dict[str, torch.Tensor],
           resamples: int, seed: int) -> dict[str, Any]:
    """The metrics part of `distill` (module docstring); `*_q`: per-query metrics, the same
    queries in the same order (`metrics.per_query`)."""
    recovered = {}
    for m in teacher:
        gap = teacher[m] - baseline[m]
        recovered[m] = (trained[m] - baseline[m]) / gap if gap > 1e-12 else None
    return {
        "teacher": teacher,
        "teacher_minus_trained": {m: teacher[m] - trained[m] for m in teacher},
        "significance_teacher_over_trained": {
            m: significance.paired(teacher_q[m].numpy(), trained_q[m].numpy(), resamples,
                                   seed) for m in HEADLINE},
        "recovered": recovered,
    }


def per_query(scored: Any, ks: Sequence[int]) -> dict[str, torch.Tensor]:
    """Per-query metrics of a `RetrievalTask.score` result (`metrics.per_query`)."""
    return metrics.per_query(scored.ranked, ks)


ROUNDS = 3  # timed passes per model, alternating models; the fastest counts


def texts_per_s(encode: Encode, texts: list[str]) -> float:
    """Texts per second of one `encode` pass over `texts`."""
    start = time.perf_counter()
    encode(texts)
    return len(texts) / max(time.perf_counter() - start, 1e-9)


def speed(models: dict[str, Encode], texts: list[str], batch_size: int, device: str
          ) -> dict[str, Any]:
    """`speed` of `distill`: texts/s of each of `models` (baseline, trained, teacher): one
    untimed warm-up batch each, then `ROUNDS` timed passes over `texts`, the models taking
    turns (a machine slowed for a while by other work slows each model alike), the fastest
    pass of each reported (the least disturbed by other work)."""
    for encode in models.values():
        encode(texts[:batch_size])
    rates = dict.fromkeys(models, 0.0)
    for _ in range(ROUNDS):
        for name, encode in models.items():
            rates[name] = max(rates[name], texts_per_s(encode, texts))
    return {"texts": len(texts), "batch_size": batch_size, "device": device,
            "rounds": ROUNDS, "texts_per_s": rates,
            "trained_over_teacher": rates["trained"] / rates["teacher"]}
