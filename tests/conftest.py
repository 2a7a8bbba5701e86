"""Shared fixtures: the repository's own params.yaml as a base, and helpers to vary it."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def repo_params() -> dict[str, Any]:
    """A fresh copy of the repository's params.yaml as a plain dict."""
    return copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text()))


def write_params(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def pytest_configure(config: pytest.Config) -> None:
    """Outside any test's own store (below), still never the user's: a throwaway one."""
    import tempfile

    os.environ["SIMTUNE_STORE"] = tempfile.mkdtemp(prefix="simtune-test-store-")


@pytest.fixture(autouse=True)
def _own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty shared vector store (never the user's ~/.cache)."""
    path = tmp_path / "simtune-store"
    monkeypatch.setenv("SIMTUNE_STORE", str(path))
    return path


@pytest.fixture
def params_raw() -> dict[str, Any]:
    return repo_params()


WORDS = [
    "the", "a", "an", "of", "to", "in", "on", "for", "with", "what", "who", "where", "when",
    "how", "why", "is", "are", "was", "were", "do", "does", "did", "city", "river", "country",
    "name", "people", "first", "largest", "capital", "film", "book", "song", "war", "year",
    "number", "color", "animal", "food", "sport", "team", "game", "star", "planet", "water",
    "money", "language", "president", "company", "mountain", "ocean", "island", "king", "queen",
    "music", "art", "science", "law",
]


def save_tiny_bert(path: Path, seed: int = 0, hidden: int = 32) -> Path:
    """A randomly initialised 2-layer BERT and a WordPiece tokenizer saved as a local model dir."""
    import torch
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789?.,'")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters,
             *(f"##{c}" for c in letters)]
    tokenizer = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)},
                                               do_lower_case=True)
    tokenizer.save_pretrained(path)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=hidden,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=2 * hidden, max_position_embeddings=128)
    torch.manual_seed(seed)
    transformers.BertModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def pipeline_baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding `project`: the small real-DVC project of tests/test_pipeline.py after
    its first `dvc repro` (uncommitted), and `store`: the vectors that repro stored. Built once
    per session (once for all pytest-xdist workers); each test takes its own copy of both
    (`tests.test_pipeline._baseline_copy`) rather than running the same repro again."""
    from tests.dvc_project import built_once
    from tests.test_pipeline import build_baseline

    return built_once(tmp_path_factory, "pipeline-baseline", build_baseline)


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site as `mkdocs build --strict` makes it, built once per session for
    every test that reads its pages (a build takes ~30 s)."""
    from tests.test_docs import build

    out = tmp_path_factory.mktemp("site")
    proc = build(ROOT / "mkdocs.yml", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out
