"""Issue 35 item 4: evaluate and search refuse a head trained on other encoder settings than
the cache's (a head trained at max_length 64 / pool mean scored with vectors refilled at 48 /
max gave exit 0 and a P@1; search encoded the query with the head's settings and the corpus
with the cache's). One line naming what differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.cache import stage as cache
from simtune.encoders import describe
from stages import app
from tests.train_helpers import project


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path
              ) -> tuple[Path, dict[str, Any]]:
    """A prepared, cached project and a head folder trained (by hand: an identity head) on the
    current settings, its training.json as the train stage writes it."""
    root = tmp_path_factory.mktemp("settings")
    raw, params_file = project(root, tiny_bert, n=40)
    p = P.load(params_file)
    head = root / "head"
    heads.save(heads.build("identity", 32, 1, 0.0), head)
    spec = p.encoders.models["tiny"]
    (head / "training.json").write_text(json.dumps({
        "mode": "head", "kind": "groups", "query_encoder": "tiny", "document_encoder": "tiny",
        "encoder": spec.model_dump(), "normalize_output": True, "matryoshka_dims": [],
        "encoder_description": describe("tiny", spec)}))
    return root, raw


def _refilled(root: Path, raw: dict[str, Any], tmp: Path, **spec: Any) -> tuple[Path, Path]:
    """Params with the tiny encoder's `spec` changed and the cache refilled under them."""
    raw = json.loads(json.dumps(raw))
    raw["encoders"]["models"]["tiny"].update(spec)
    params_file = tmp / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.load(params_file)
    cache.fill(root / "prepared", tmp / "cache", p.encoders, p.cache)
    return params_file, tmp / "cache"


def _evaluate(root: Path, params_file: Path, cache_dir: Path, out: Path) -> Any:
    return CliRunner().invoke(app, [
        "evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
        "--cache", str(cache_dir), "--head", str(root / "head"), "--out", str(out / "m.json"),
        "--metrics", str(out / "h.json"), "--plot", str(out / "r.json"),
        "--detail", str(out / "d.json")])


def _search(root: Path, params_file: Path, cache_dir: Path) -> Any:
    return CliRunner().invoke(app, ["search", "a query", "--params", str(params_file),
                                    "--head", str(root / "head"), "--prepared",
                                    str(root / "prepared"), "--cache", str(cache_dir)])


def test_the_head_of_the_current_settings_is_evaluated_and_searched(
        workspace: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root = workspace[0]
    result = _evaluate(root, root / "params.yaml", root / "cache", tmp_path)
    assert result.exit_code == 0, result.output
    assert _search(root, root / "params.yaml", root / "cache").exit_code == 0


@pytest.mark.parametrize(("spec", "differs"), [
    ({"max_length": 24, "pooling": "max"}, "pooling: 'mean' -> 'max'; max_length: 32 -> 24"),
    ({"chunks": {"max": 4, "overlap": 4, "pool": "mean"}},
     "chunks: None -> {'max': 4, 'overlap': 4, 'pool': 'mean'}"),
    ({"prompts": {"query": "q: ", "document": "q: ", "include_prompt": True}},
     "prompt: None -> 'q: '; include_prompt: None -> True"),
])
def test_probe_a_head_of_other_encoder_settings_is_refused(
        workspace: tuple[Path, dict[str, Any]], tmp_path: Path, spec: dict[str, Any],
        differs: str) -> None:
    root, raw = workspace
    params_file, cache_dir = _refilled(root, raw, tmp_path, **spec)
    want = (f"error: {root / 'head' / 'training.json'}: the head was trained on other encoder "
            f"settings than the cache's ({differs}); rerun train (dvc repro) or set them back")
    result = _evaluate(root, params_file, cache_dir, tmp_path)
    assert (result.exit_code, result.output.strip()) == (1, want)
    assert not (tmp_path / "m.json").exists()
    result = _search(root, params_file, cache_dir)
    assert (result.exit_code, result.output.strip()) == (1, want)


def test_probe_a_head_of_other_model_files_is_refused(
        workspace: tuple[Path, dict[str, Any]], tmp_path: Path, tiny_bert: Path) -> None:
    """Same settings, another model folder's weights under the same path name: the encoder's
    fingerprint recorded at training says so."""
    root, raw = workspace
    other = tmp_path / "model"
    shutil.copytree(tiny_bert, other)
    (other / "extra.json").write_text("{}")  # one more model file: another fingerprint
    params_file, cache_dir = _refilled(root, raw, tmp_path, model=str(other))
    result = _evaluate(root, params_file, cache_dir, tmp_path)
    assert result.exit_code == 1
    assert result.output.strip().startswith(
        f"error: {root / 'head' / 'training.json'}: the head was trained on other encoder "
        "settings than the cache's (model files changed: extra.json); rerun train")
