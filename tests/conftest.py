"""Shared fixtures: the repository's own params.yaml as a base, and helpers to vary it."""

from __future__ import annotations

import copy
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


# The data source the tests own (issue 52, item 9): the bundled TREC set, whatever source the
# user's params.yaml names. The README's quickstart edits `prepare.source` and
# `prepare.file.path` (and commits them), so neither the workspace's file nor git's HEAD holds
# the shipped values of these keys any more; every other key and value comes from params.yaml.
TEST_DATA = {"source": "trec", "trec_labels": "fine"}


def project_params() -> dict[str, Any]:
    """A fresh copy of the repository's params.yaml as a plain dict with the tests' own data
    source (`TEST_DATA`, no file): what the project ships, whatever data the user's copy of the
    file names (the docs' figures were run under it, `tests/test_figures.py`)."""
    raw = copy.deepcopy(yaml.safe_load((ROOT / "params.yaml").read_text()))
    raw["prepare"].update(TEST_DATA)
    raw["prepare"]["file"]["path"] = None  # the user's data file is not the tests'
    return raw


def repo_params() -> dict[str, Any]:
    """A fresh copy of the repository's params.yaml as a plain dict, with `train.mode: head`
    and the tests' own data source (`TEST_DATA`, no file): each test names the mode it tests
    (head unless it says otherwise), so the shipped default (`auto`, which picks the mode
    from the data) is tested where it is meant to be: tests/train/test_auto_mode.py, and the
    pipeline and README tests that run params.yaml itself. The file supplies every key (the
    schema requires each one, so any params.yaml that loads has them all: a key added to the
    schema reaches every test without a second copy of the values)."""
    raw = project_params()
    raw["train"]["mode"] = "head"
    # likewise the encoder modes train at a rate the test names (these tests were written at
    # 2e-4), not `lr: auto`, whose probe is tested in tests/train/test_probe.py and by the
    # tests that run params.yaml itself; and they train the epochs they name, not the step
    # floor's (tests/train/test_run_steps.py)
    for mode in ("top_layers", "full"):
        raw["train"]["schedule"][mode].update(lr=TEST_ENCODER_LR, head_lr=TEST_ENCODER_LR,
                                              min_run_steps=0)
    return raw


TEST_ENCODER_LR = 2e-4


def write_params(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def pytest_configure(config: pytest.Config) -> None:
    """Outside any test's own store (below), still never the user's: a throwaway one. The
    process's thread policy (`simtune.threads`), before any test module imports torch: a
    pytest-xdist worker takes its share of the cores; the controller, which runs no test,
    sets nothing (its workers would inherit its count as the user's)."""
    import tempfile

    from simtune import threads

    os.environ["SIMTUNE_STORE"] = tempfile.mkdtemp(prefix="simtune-test-store-")
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", 0):
        threads.configure()


# The longest tests (their files or node ids), started first: with `pytest -n` (`make test`)
# each worker begins on one of them and the short ones fill in around them, rather than one
# worker finishing alone on a long tail. Longest first, measured with `--durations`.
FIRST = ("tests/test_bench_distill.py", "tests/test_pipeline.py", "tests/test_readme.py",
         "tests/test_bench_layers.py", "tests/test_compare.py", "tests/test_bench_scale.py",
         "tests/test_docs_site.py", "tests/test_docs.py::test_dvc_plots_show",
         "tests/cache/test_cache.py::test_two_process", "tests/train/test_top_layers.py::test_ddp")


def _rank(item: pytest.Item) -> int:
    return next((i for i, p in enumerate(FIRST) if item.nodeid.startswith(p)), len(FIRST))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]
                                  ) -> Generator[None, None, None]:
    """The long tests first (`FIRST`, a stable sort: pytest's order otherwise), and with
    pytest-xdist the tests that share a module-scoped fixture in one group (`--dist
    loadgroup`: one worker builds it once, instead of each worker that gets one of them).
    A wrapper: pytest-xdist's own hook (a worker's, with `--dist loadgroup`) runs inside it
    and appends "@group" to each grouped test's `_nodeid`, which pytest 9.2 no longer reads
    (its ids are structured: pytest-dev/pytest-xdist#1386); after it, `_grouped_ids` puts the
    suffix where pytest 9.2 reads it, so the scheduler sees the groups."""
    items.sort(key=_rank)
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = sorted(name for name, defs in (info.name2fixturedefs.items() if info else ())
                        if defs and defs[-1].scope == "module")
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.path.name}:{'+'.join(shared)}"))
    yield
    _grouped_ids(items)


def _grouped_ids(items: list[pytest.Item]) -> None:
    """Each item whose `_nodeid` pytest-xdist rewrote ("<id>@<group>") gets that id where
    pytest reads it (`_id`, pytest >= 9.2); where pytest reads `_nodeid` itself, or the id
    would not parse back to the same text, nothing changes."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest < 9.2: `_nodeid` is the id
        return
    for item in items:
        given = item.__dict__.get("_nodeid")
        if isinstance(given, str) and "@" in given and given != item.nodeid:
            parsed = NodeId.parse(given)
            if str(parsed) == given:
                item._id = parsed  # type: ignore[attr-defined]


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
