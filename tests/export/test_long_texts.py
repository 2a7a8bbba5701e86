"""The long-text recipe of an export with `chunks` (`simtune.export.long_texts`): run over the
export folder with plain sentence-transformers, it gives simtune's vectors; the model card and
docs/export.md carry it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from simtune.export.long_texts import recipe
from simtune.export.stage import export
from simtune.model import load_model
from tests.conftest import ROOT, WORDS
from tests.export.test_export import _head_dir

pytest.importorskip("sentence_transformers")


def _long(i: int, words: int) -> str:
    return " ".join(WORDS[(i * 5 + j * 7) % len(WORDS)] for j in range(words)) + f" {i}."


# the last: no spaces (a URL, Chinese): cut between tokens
TEXTS = ["what is the capital", _long(1, 12), _long(2, 40), _long(3, 90), "abc?" * 20]


@pytest.mark.parametrize(("kind", "normalize_output", "pool", "prompts"), [
    ("mlp", True, "mean", None),
    ("linear", False, "max", {"query": "what ", "document": "doc ", "include_prompt": True}),
    ("identity", False, "first", None),
])
def test_the_recipe_gives_simtunes_vectors(tmp_path: Path, tiny_bert: Path, kind: str,
                                           normalize_output: bool, pool: str,
                                           prompts: dict | None) -> None:
    spec = {"max_length": 12, "normalize": True, "prompts": prompts,
            "chunks": {"max": 4, "overlap": 3, "pool": pool}}
    head_dir = _head_dir(tmp_path, tiny_bert, kind, normalize_output, **spec)
    out = tmp_path / "export"
    export(head_dir, out, encoder=str(tiny_bert))
    enc = json.loads((out / "simtune.json").read_text())["encoder"]
    code = recipe(enc, str(out))
    scope: dict = {}
    exec(compile(code, "recipe", "exec"), scope)  # the lines as a user would paste them
    assert [len(scope["windows"](t)) for t in TEXTS] == [1, 2, 4, 4, 4]  # 4: max reached
    ours = load_model(out, device="cpu")
    for role in ("query", "document"):
        want = ours.encode(TEXTS, role=role)
        got = torch.stack([scope["encode_long"](t, role).cpu() for t in TEXTS])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    assert "## Long texts" in (out / "README.md").read_text()
    assert recipe(enc).rstrip() in (out / "README.md").read_text()


def test_an_export_without_chunks_has_no_recipe(tmp_path: Path, tiny_bert: Path) -> None:
    out = tmp_path / "export"
    export(_head_dir(tmp_path, tiny_bert, "linear"), out, encoder=str(tiny_bert))
    assert "## Long texts" not in (out / "README.md").read_text()


def test_the_docs_carry_the_recipe_with_the_default_values() -> None:
    doc = (ROOT / "docs" / "export.md").read_text()
    section = doc.split("## Long texts with sentence-transformers", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    enc = {"max_length": 128, "normalize": True,
           "chunks": {"max": 8, "overlap": 32, "pool": "mean"}}
    assert block.group(1) == recipe(enc, "models/export")
