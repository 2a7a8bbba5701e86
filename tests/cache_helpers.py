"""Helpers for cache tests: prepared data from a list of texts, params for the tiny encoder,
and counting real encoder forward passes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from simtune import params as P
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import write as write_prepared
from tests.conftest import WORDS, repo_params, save_tiny_bert


def sentences(n: int, start: int = 0) -> list[str]:
    """`n` distinct sentences of varied length built from the tiny vocabulary."""
    out = []
    for i in range(start, start + n):
        k = 3 + (i * 7) % 11
        out.append(" ".join(WORDS[(i * 13 + j * 5) % len(WORDS)] for j in range(k)) + f" {i}")
    return out


def make_prepared(root: Path, texts: list[str], raw: dict[str, Any] | None = None) -> Path:
    """Prepare a groups data set of `texts` (one label, half train) into root/prepared."""

    root.mkdir(parents=True, exist_ok=True)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "L"}) + "\n" for t in texts))
    raw = raw or repo_params()
    raw["prepare"].update(source="file")
    raw["prepare"]["file"]["path"] = str(data)
    raw["prepare"]["split"]["fractions"] = {"train": 0.5, "val": 0.25, "test": 0.25}
    prepared = prepare.build(P.validate(raw).prepare)
    write_prepared(prepared, root / "prepared", root / "prepare.json")
    return root / "prepared"


def encoder_params(model: Path, **overrides: Any) -> dict[str, Any]:
    spec = {"model": str(model), "pooling": "mean", "normalize": True, "max_length": 32,
            "dtype": "float32", "states_dtype": "float32", "prompts": None,
            "chunks": {"max": 1, "overlap": 32, "pool": "mean"}, **overrides}
    return {"query": "tiny", "document": "tiny", "models": {"tiny": spec}}


def cache_params(**overrides: Any) -> dict[str, Any]:
    return {"batch_size": 8, "num_workers": 0, "backend": "torch", "device": "cpu",
            "shard_rows": 1000,
            "cache_type": "cpu", "mapping": {},
            "store": "never-used ($SIMTUNE_STORE is set by conftest)", "store_max_gb": 20,
            "max_layer_gb": 8,
            **overrides}


def params(model: Path, enc: dict[str, Any] | None = None, **cache: Any) -> P.Params:
    raw = repo_params()
    raw["encoders"] = encoder_params(model, **(enc or {}))
    raw["cache"] = cache_params(**cache)
    return P.validate(raw)


def two_encoder_pairs(root: Path, tiny_bert: Path, **cache: Any) -> P.Params:
    """12 (query, document) pairs prepared under `root`: queries embedded by `tiny` (the given
    model), documents by `docs` (another tiny BERT, 16-d); `cache` keys update cache_params."""
    other = save_tiny_bert(root / "doc-model", seed=5, hidden=16)
    raw = repo_params()
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps({"q": q, "d": d}) + "\n"
                            for q, d in zip(sentences(12), sentences(12, 50), strict=True)))
    raw["prepare"].update(source="file")
    raw["prepare"]["file"].update(path=str(data), kind="pairs")
    raw["prepare"]["file"]["columns"].update(query="q", positive="d")
    raw["encoders"] = encoder_params(tiny_bert)
    raw["encoders"]["models"]["docs"] = {**raw["encoders"]["models"]["tiny"], "model": str(other)}
    raw["encoders"]["document"] = "docs"
    raw["cache"] = cache_params(**cache)
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "r.json")
    return p


@contextlib.contextmanager
def count_forward() -> Iterator[dict[str, int]]:
    """Count calls and rows of every encoder forward in this process: a transformers
    PreTrainedModel's or a `simtune.bert.BertModel`'s (a fill's frozen BERT)."""
    import transformers

    from simtune.bert import BertModel

    counts = {"calls": 0, "rows": 0}

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        if isinstance(module, transformers.PreTrainedModel | BertModel):
            counts["calls"] += 1
            counts["rows"] += int(output.last_hidden_state.shape[0])

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield counts
    finally:
        handle.remove()
