"""The machine-wide shared store: settings side by side, workspaces sharing, a pulled view feeding
the store, repair of corrupt shards, a failed fill losing nothing, locking, size policy."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from simtune.cache import policy, store, vectors
from simtune.cache import stage as cache
from simtune.errors import UserError
from stages import app
from tests.cache_helpers import (
    cache_params,
    count_forward,
    encoder_params,
    make_prepared,
    params,
    sentences,
)
from tests.conftest import ROOT, repo_params, write_params


def _fill(prepared: Path, out: Path, p) -> cache.FillResult:
    [r] = cache.fill(prepared, out, p.encoders, p.cache)
    return r


def _entry(view: Path) -> Path:
    return store.fingerprint_dir(store.root(""), vectors.read_manifest(view).fingerprint)


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_settings_switched_back_and_forth_embed_nothing_the_second_time(
        tmp_path: Path, tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    out = tmp_path / "cache"
    first = _fill(prepared, out, params(tiny_bert, {"max_length": 32}))
    view_32 = (out / "tiny" / "part-00000.arrow").read_bytes()
    other = _fill(prepared, out, params(tiny_bert, {"max_length": 8}))
    with count_forward() as counts:
        back = _fill(prepared, out, params(tiny_bert, {"max_length": 32}))
    assert (first.embedded, other.embedded, back.embedded, counts["rows"]) == (30, 30, 0, 0)
    assert (out / "tiny" / "part-00000.arrow").read_bytes() == view_32  # the same bytes again
    assert len(policy.entries(store.root(""))) == 2


def test_another_workspace_reuses_every_vector(tmp_path: Path, tiny_bert: Path) -> None:
    p = params(tiny_bert)
    _fill(make_prepared(tmp_path / "ws1", sentences(40)), tmp_path / "ws1" / "cache", p)
    with count_forward() as counts:
        r = _fill(make_prepared(tmp_path / "ws2", sentences(45)), tmp_path / "ws2" / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (40, 5, 5)
    a = vectors.load(tmp_path / "ws1" / "cache" / "tiny")
    b = vectors.load(tmp_path / "ws2" / "cache" / "tiny")
    assert torch.equal(b.vectors[b.index(a.ids.to_pylist())], a.vectors)


def test_a_pulled_view_feeds_an_empty_store(tmp_path: Path, tiny_bert: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # a teammate's clone: `dvc pull` brought cache/tiny, their store is empty
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert)
    _fill(prepared, tmp_path / "cache", p)
    before = (tmp_path / "cache" / "tiny" / "part-00000.arrow").read_bytes()
    monkeypatch.setenv("SIMTUNE_STORE", str(tmp_path / "teammate-store"))
    with count_forward() as counts:
        r = _fill(make_prepared(tmp_path / "grown", sentences(33)), tmp_path / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (30, 3, 3)
    assert policy.entries(tmp_path / "teammate-store")[0].rows == 33
    table = vectors.load(tmp_path / "cache" / "tiny", checksums=True)
    assert len(table) == 33 and before != (tmp_path / "cache" / "tiny" /
                                           "part-00000.arrow").read_bytes()


def _corrupt_two_store_shards(view: Path) -> tuple[Path, Path]:
    entry = _entry(view)
    shards = vectors.read_manifest(entry).shards
    flipped, truncated = entry / shards[0].file, entry / shards[1].file
    _flip(flipped, 600)
    truncated.write_bytes(truncated.read_bytes()[:-50])
    return flipped, truncated


def test_a_corrupt_store_shard_is_dropped_and_repaired(
        tmp_path: Path, tiny_bert: Path, caplog: pytest.LogCaptureFixture) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert, shard_rows=10)
    view = tmp_path / "cache" / "tiny"
    _fill(prepared, tmp_path / "cache", p)
    reference = vectors.load(view).vectors.clone()
    caplog.set_level(logging.INFO, logger="simtune")
    # the intact view still holds the lost rows: they go back into the store, nothing embedded
    flipped, truncated = _corrupt_two_store_shards(view)
    with count_forward() as counts:
        r = _fill(prepared, tmp_path / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (30, 0, 0)
    assert f"{flipped}: checksum mismatch (corrupted shard); dropping its 10 rows" in caplog.text
    assert f"{truncated}: checksum mismatch" in caplog.text
    assert "took 4 vectors from" in caplog.text
    # without the view (DVC removed it before rerunning the stage): the rows are embedded again
    _corrupt_two_store_shards(view)
    shutil.rmtree(view)
    with count_forward() as counts:
        r = _fill(prepared, tmp_path / "cache", p)
    assert (r.cached, r.embedded) == (30 - counts["rows"], counts["rows"])
    assert counts["rows"] >= 10
    table = vectors.load(view, checksums=True)
    assert torch.allclose(table.vectors, reference, atol=1e-6)
    assert vectors.verify(_entry(view)) == []


def test_a_corrupt_view_is_rewritten_from_the_store(tmp_path: Path, tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert)
    _fill(prepared, tmp_path / "cache", p)
    part = tmp_path / "cache" / "tiny" / "part-00000.arrow"
    good = part.read_bytes()
    _flip(part, len(good) // 2)
    with count_forward() as counts:
        r = _fill(prepared, tmp_path / "cache", p)
    assert (r.embedded, counts["rows"]) == (0, 0)
    assert part.read_bytes() == good


def test_a_model_that_cannot_load_loses_nothing(tmp_path: Path, tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    _fill(prepared, tmp_path / "cache", params(tiny_bert))
    view = tmp_path / "cache" / "tiny"
    files = {f.name: f.read_bytes() for f in view.iterdir()}
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # no weights
        (broken / name).write_text((tiny_bert / name).read_text())
    with pytest.raises(UserError, match=rf"encoders.models.tiny.model: {broken}: cannot load"):
        _fill(prepared, tmp_path / "cache", params(broken))
    assert {f.name: f.read_bytes() for f in view.iterdir()} == files
    assert len(vectors.load(view, checksums=True)) == 30
    assert sum(e.rows for e in policy.entries(store.root(""))) == 30


def test_a_manifest_naming_a_path_outside_is_damaged(tmp_path: Path, tiny_bert: Path) -> None:
    _fill(make_prepared(tmp_path, sentences(10)), tmp_path / "cache", params(tiny_bert))
    path = tmp_path / "cache" / "tiny" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][0]["file"] = "../../../../etc/passwd"
    path.write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"damaged cache manifest \(shard file '../../../../etc/"
                                        r"passwd' is not a shard name"):
        vectors.load(tmp_path / "cache" / "tiny")


def test_size_policy_and_gc_keep_the_current_settings(tmp_path: Path, tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    _fill(prepared, tmp_path / "cache", params(tiny_bert, {"max_length": 8}))
    # a budget below one entry: the fill at 16 evicts the older entry, never its own
    _fill(prepared, tmp_path / "cache", params(tiny_bert, {"max_length": 16},
                                               store_max_gb=1e-9))
    [left] = policy.entries(store.root(""))
    assert left.fingerprint == vectors.read_manifest(tmp_path / "cache" / "tiny").fingerprint
    # gc from the command line, with other settings now current: drops the 16 entry
    _fill(prepared, tmp_path / "cache", params(tiny_bert, {"max_length": 32}))
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert, max_length=32)
    raw["cache"] = cache_params()
    params_file = write_params(tmp_path / "params.yaml", raw)
    dry = CliRunner().invoke(app, ["cache", "gc", "--params", str(params_file), "--max-gb", "0",
                                   "--dry-run"])
    assert dry.exit_code == 0 and "would drop 1" in dry.output, dry.output
    assert len(policy.entries(store.root(""))) == 2
    result = CliRunner().invoke(app, ["cache", "gc", "--params", str(params_file),
                                      "--max-gb", "0"])
    assert result.exit_code == 0, result.output
    assert "kept 1 encoder settings" in result.output and "dropped 1" in result.output
    [kept] = policy.entries(store.root(""))
    assert kept.fingerprint == vectors.read_manifest(tmp_path / "cache" / "tiny").fingerprint


@pytest.mark.parametrize("same_workspace", [True, False])
def test_two_fills_at_once_neither_corrupt_nor_duplicate(tmp_path: Path, tiny_bert: Path,
                                                         same_workspace: bool) -> None:
    make_prepared(tmp_path, sentences(300))
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    raw["cache"] = cache_params(shard_rows=16, batch_size=4)
    params_file = write_params(tmp_path / "params.yaml", raw)
    outs = [tmp_path / "cache", tmp_path / ("cache" if same_workspace else "cache-2")]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "stages", "cache", "--params", str(params_file), "--prepared",
         str(tmp_path / "prepared"), "--out", str(out)], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for out in outs]
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    said = sorted(line.split("cache tiny: ")[1] for log in logs for line in log.splitlines()
                  if " to embed" in line)
    assert said == ["0 cached, 300 to embed", "300 cached, 0 to embed"], logs
    entry = _entry(outs[0] / "tiny")
    assert vectors.verify(entry) == [] and vectors.read_manifest(entry).rows == 300
    assert sorted(p.name for p in entry.iterdir() if not p.name.startswith("shard-")) == [
        ".lock", ".used", ".verified.json", "manifest.json"]
    for out in set(outs):
        assert len(vectors.load(out / "tiny", checksums=True)) == 300
        assert not [p for p in out.iterdir() if p.name.startswith(".")]
