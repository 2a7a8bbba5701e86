"""The GPU tests are skipped wherever CI runs (no GPU), so nothing else notices when a module
they import from moves: their imports, those inside the test functions too, must resolve here.
(tests/test_gpu.py once imported `tests.test_train` after the tests moved under tests/train/, and
only the next lent GPU found it.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

GPU_TESTS = Path(__file__).with_name("test_gpu.py")


def _imports() -> list[tuple[str, str]]:
    tree = ast.parse(GPU_TESTS.read_text())
    return [(node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.split(".")[0] in ("tests", "simtune", "bench")
            for alias in node.names]


@pytest.mark.parametrize(("module", "name"), _imports())
def test_every_import_of_the_gpu_tests_resolves(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), (module, name)
