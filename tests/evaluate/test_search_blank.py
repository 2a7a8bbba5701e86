"""`simtune search` refuses a query that prepare would drop as empty: nothing but whitespace,
zero-width characters or byte order marks (the encoder would see `[CLS][SEP]` alone)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtune import params as P
from simtune.errors import UserError
from simtune.evaluate.search import search
from stages import app
from tests.conftest import ROOT, repo_params

BLANK = ["\u200b", "\ufeff", " \u200b\u200d\u2060 ", "\u200c\ufeff\t"]
REFUSED = "the query is empty (or only whitespace): give a text to search for"


@pytest.mark.parametrize("query", BLANK)
def test_a_zero_width_query_is_empty(tmp_path: Path, query: str) -> None:
    with pytest.raises(UserError) as e:
        search(P.validate(repo_params()), query, 5, tmp_path, tmp_path, tmp_path)
    assert str(e.value) == REFUSED


def test_the_command_refuses_it_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["search", "\u200b", "--params", str(ROOT / "params.yaml"),
                                      "--head", str(tmp_path / "head"), "--prepared",
                                      str(tmp_path / "prepared"), "--cache", str(tmp_path)])
    assert (result.exit_code, result.stderr.strip()) == (1, f"error: {REFUSED}")
    assert result.stdout == ""
