"""Shared fixtures: the repository's own params.yaml as a base, and helpers to vary it."""

from __future__ import annotations

import copy
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


@pytest.fixture
def params_raw() -> dict[str, Any]:
    return repo_params()
