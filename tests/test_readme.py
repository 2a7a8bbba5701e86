"""The README documents every params key of the schema."""

from __future__ import annotations

from simtune import params as P
from tests.conftest import ROOT


def test_readme_documents_every_params_key() -> None:
    readme = (ROOT / "README.md").read_text()
    keys = [k for k, _ in P.documented_keys()]
    assert len(keys) >= 25
    assert [k for k in keys if f"| `{k}` |" not in readme] == []
