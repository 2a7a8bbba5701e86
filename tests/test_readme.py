"""The README documents every params key of the schema."""

from __future__ import annotations

from pydantic import BaseModel

from simtune import params as P
from tests.conftest import ROOT


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _keys(ann, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def test_readme_documents_every_params_key() -> None:
    readme = (ROOT / "README.md").read_text()
    keys = _keys(P.Params)
    assert len(keys) >= 15
    assert [k for k in keys if f"| `{k}` |" not in readme] == []
