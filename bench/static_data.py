"""bench.static's data per set: the prepared examples with their texts, the test and validation
tasks (the evaluate and train stages' own), the student's fit texts and how every row is
scored, with each text embedded in its role (groups' texts and pairs' queries: query;
pairs' documents: document, as the cache fill and the export embed them).

- groups: the test texts rank the train texts (`evaluate.corpus: train`); validation: the val
  texts against the train texts. Fit texts: the train texts (labels) + unlabelled ones.
- pairs: each distinct test query ranks every document of every split (evaluate's task, graded
  gains when any score is not 1); validation: the val queries against the train and val
  documents (`known`: what the static mode validates pairs on, `static_run._validation_task`).
  Fit texts: the train split's distinct queries, then its distinct documents; `pairs` (P, 2)
  the (query, document) indices into them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROLE = {"text": "query", "query": "query", "doc": "document"}  # Items.role -> encode role
FIELD = {"text": "texts", "query": "q_texts", "doc": "d_texts"}  # Items.role -> Split.texts
Encode = Callable[[list[str], str], torch.Tensor]  # (texts, role) -> (N, D)


@dataclass
class SetData:
    """One set as every row sees it (module docstring). `fit`: (text, role) of the student's
    fit texts; `labels` (groups, -1: none) or `pairs` (pairs) over them; `unlabelled`: the
    prepared unlabelled texts (groups); `speed`: the test texts by role, what the texts/s
    columns encode."""

    name: str
    kind: str
    data: Any
    test: Any
    val: Any
    fit: list[tuple[str, str]]
    labels: torch.Tensor | None
    pairs: torch.Tensor | None
    val_fit: list[tuple[str, str]]
    unlabelled: list[str] = field(default_factory=list)
    speed: dict[str, list[str]] = field(default_factory=dict)

    @property
    def speed_count(self) -> int:
        return sum(len(t) for t in self.speed.values())


def texts_of(data: Any, items: Any) -> list[str]:
    """The texts of a task side (`retrieval.task.Items`), in its order."""
    out: list[str] = []
    for name, pos in items.parts:
        texts = data.splits[name].texts[FIELD[items.role]]
        out += texts if pos is None else [texts[i] for i in pos.tolist()]
    return out


def distinct(data: Any, split: str) -> tuple[list[tuple[str, str]], torch.Tensor | None]:
    """A split's texts with their roles, and (pairs) the (P, 2) related (query, document)
    indices into them (score > 0): groups' texts in order; pairs' distinct queries, then
    distinct documents, each in order of first appearance."""
    sp = data.splits[split]
    if data.kind == "groups":
        return [(t, "query") for t in sp.texts["texts"]], None
    t = sp.tensors
    qi: dict[int, int] = {}
    di: dict[int, int] = {}
    queries, docs, pairs = [], [], []
    for pos, (q, d, s) in enumerate(zip(t["q_ids"].tolist(), t["d_ids"].tolist(),
                                        t["scores"].tolist(), strict=True)):
        if q not in qi:
            qi[q] = len(qi)
            queries.append(sp.texts["q_texts"][pos])
        if d not in di:
            di[d] = len(di)
            docs.append(sp.texts["d_texts"][pos])
        if s > 0:
            pairs.append((qi[q], di[d]))
    index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
    index[:, 1] += len(queries)
    return [(x, "query") for x in queries] + [(x, "document") for x in docs], index


def load(name: str, prepared: Path, small: int = 0, speed_texts: int = 0) -> SetData:
    """`SetData` of a prepared folder; `small` > 0 keeps that many examples of each split (the
    smoke test); `speed_texts` > 0: the speed columns' texts are the first that many test
    texts of each role."""
    import pyarrow.compute as pc

    from simtune import examples
    from simtune.prepare import prepared as prep
    from simtune.retrieval.task import retrieval_task

    p = prep.load(prepared)
    ex = p.examples
    if small:
        keep: list[int] = []
        for split in ("train", "val", "test"):
            keep += [i for i, s in enumerate(ex.column("split").to_pylist()) if s == split][:small]
        ex = ex.take(sorted(keep))
    texts = p.text_map()
    data = examples.load(p.kind, ex, texts=texts)
    groups = p.kind == "groups"
    unl = [texts[t] for t in ex.filter(pc.equal(ex.column("split"), prep.UNLABELLED))
           .column("text_id").to_pylist()] if groups else []
    test = retrieval_task(data, "test", "train") if groups else retrieval_task(
        data, "test", "all", "graded")
    val = retrieval_task(data, "val", "train" if groups else "known")  # the static mode's
    fit, pairs = distinct(data, "train")
    val_fit, _ = distinct(data, "val")
    speed: dict[str, list[str]] = {}
    for text, role in distinct(data, "test")[0]:
        if not speed_texts or len(speed.get(role, [])) < speed_texts:
            speed.setdefault(role, []).append(text)
    return SetData(name, p.kind, data, test, val, fit,
                   data.splits["train"].tensors["labels"] if groups else None, pairs,
                   val_fit, unl, speed)


class Memo:
    """`encode` with each (text, role) embedded once (the teacher's train texts are both fit
    targets and the test task's corpus)."""

    def __init__(self, encode: Encode) -> None:
        self.encode, self.seen = encode, {}

    def __call__(self, texts: list[str], role: str) -> torch.Tensor:
        todo = list(dict.fromkeys(t for t in texts if (role, t) not in self.seen))
        if todo:
            for t, v in zip(todo, self.encode(todo, role).float(), strict=True):
                self.seen[(role, t)] = v
        if not texts:
            return torch.empty(0, 1)
        return torch.stack([self.seen[(role, t)] for t in texts])

    def of(self, pairs: list[tuple[str, str]]) -> torch.Tensor:
        """Vectors of (text, role) pairs, in order."""
        out = [None] * len(pairs)
        for role in {r for _, r in pairs}:
            idx = [i for i, (_, r) in enumerate(pairs) if r == role]
            for i, v in zip(idx, self([pairs[i][0] for i in idx], role), strict=True):
                out[i] = v
        return torch.stack(out)  # type: ignore[arg-type]


def score(s: SetData, task: Any, encode: Encode, ks: tuple[int, ...] = (1, 10)
          ) -> dict[str, float]:
    """The metrics of `encode`'s vectors on `task` (top `max(ks)`, no MAP@R)."""
    memo = encode if isinstance(encode, Memo) else Memo(encode)
    return task.score(lambda items: memo(texts_of(s.data, items), ROLE[items.role]), ks,
                      upto_r=False).metrics


def speed(s: SetData, encode: Encode, threads: int, repeats: int = 2,
          min_seconds: float = 1.0) -> float:
    """Texts/s of `encode` over the test texts (each in its role) on `threads` torch threads:
    the best of at least `repeats` passes, repeated until `min_seconds` have passed (a static
    table encodes 256 texts in milliseconds, where one pass is mostly timer and scheduler
    noise); a pass over 10 s counts alone."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best, spent, passes = float("inf"), 0.0, 0
        while passes < repeats or spent < min_seconds:
            t0 = time.perf_counter()
            for role, texts in s.speed.items():
                encode(texts, role)
            took = time.perf_counter() - t0
            best, spent, passes = min(best, took), spent + took, passes + 1
            if took > 10:
                break
    finally:
        torch.set_num_threads(old)
    return s.speed_count / best


def validator(s: SetData, init: Any) -> Any:
    """`simtune.train.static.Validate` over the val task with the student's own tokens."""
    from simtune.train import static as st
    from simtune.train.validation import KS, separation

    task = s.val
    q_tok = st.Tokens.of(init, texts_of(s.data, task.queries))
    c_tok = None if task.corpus is None else st.Tokens.of(init, texts_of(s.data, task.corpus))

    def validate(embed: Any) -> dict[str, float]:
        q = embed(q_tok)
        c = None if c_tok is None else embed(c_tok)
        scored = task.score(lambda items: q if items is task.queries else c, KS)
        return {f"val/{k}": v for k, v in {**scored.metrics,
                                            "separation": separation(task, q, c)}.items()}
    return validate
