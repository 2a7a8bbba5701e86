"""Issue 19, the store's trust boundaries: manifests checked field by field against their shards
(item 1), bit rot in a store shard kept out of the view and found by `cache verify` (item 3),
`cache gc` touching only store entries (item 4), `cache verify` over every view, the layer
states too (item 10), and the size policy never evicting an entry in use (item 11)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from simtune import params as P
from simtune.cache import policy, reference, store, vectors
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
    two_encoder_pairs,
)
from tests.conftest import repo_params, write_params


def _fill(prepared: Path, out: Path, p: P.Params, layer: int | None = None
          ) -> list[cache.FillResult]:
    return cache.fill(prepared, out, p.encoders, p.cache, layer=layer)


def _entry(view: Path) -> Path:
    return store.fingerprint_dir(store.root(""), vectors.read_manifest(view).fingerprint)


def _edit(manifest: Path, change: Any) -> None:
    raw = json.loads(manifest.read_text())
    change(raw)
    manifest.write_text(json.dumps(raw))


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def _project(tmp_path: Path, model: Path, train: dict[str, Any] | None = None) -> list[str]:
    """A groups project of 30 texts; the options of `cache` and `cache verify` on it."""
    make_prepared(tmp_path, sentences(30))
    raw = repo_params()
    raw["encoders"] = encoder_params(model)
    raw["cache"] = cache_params(shard_rows=10)
    raw["train"].update(train or {})
    raw["train"]["schedule"]["top_layers"]["layers"] = 1
    params_file = write_params(tmp_path / "params.yaml", raw)
    return ["--params", str(params_file), "--prepared", str(tmp_path / "prepared"),
            "--out", str(tmp_path / "cache")]


# --- item 1: every manifest field checked before use -------------------------------------------


def _set(key: str, value: Any) -> Any:
    return lambda raw: raw.__setitem__(key, value)


def _shard_rows(value: Any) -> Any:
    return lambda raw: raw["shards"][0].__setitem__("rows", value)


BAD_VIEW_MANIFESTS = [
    (_set("dim", 16), r"damaged cache shard \(32-d vectors, the manifest says dim 16\)"),
    (_set("dim", -5), r"damaged cache manifest \(dim: Input should be greater than or equal "
                      r"to 1, got '-5'\)"),
    (_set("dim", "abc"), r"damaged cache manifest \(dim: Input should be a valid integer, got "
                         r"'abc'\)"),
    (_set("dim", 32.0), r"damaged cache manifest \(dim: Input should be a valid integer"),
    (_shard_rows("many"), r"damaged cache manifest \(shards.0.rows: Input should be a valid "
                          r"integer, got 'many'\)"),
    (_set("dtype", "float16"), r"damaged cache shard \(embedding column of type "
                               r"fixed_size_list<item: float>\[32\], the manifest says float16\)"),
    (_set("dtype", "int8"), r"damaged cache manifest \(dtype: Input should be 'float32' or "
                            r"'float16'"),
    (_set("rows", 31), r"damaged cache manifest \(rows is 31, its shards hold 30\)"),
    (_set("description", {"pooling": "cls"}), r"the fingerprint is not the hash of the "
                                               r"description"),
    (_set("extra", 1), r"damaged cache manifest \(extra: Extra inputs are not permitted"),
    (lambda raw: raw.pop("dim"), r"damaged cache manifest \(dim: Field required"),
]


@pytest.mark.parametrize(("edit", "message"), BAD_VIEW_MANIFESTS)
def test_item1_manifest_fields_checked_against_the_shards(tmp_path: Path, tiny_bert: Path,
                                                          edit: Any, message: str) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert, shard_rows=10)
    view = tmp_path / "cache" / "tiny"
    _fill(prepared, tmp_path / "cache", p)
    good = {f.name: f.read_bytes() for f in view.iterdir()}
    _edit(view / "manifest.json", edit)
    with pytest.raises(UserError, match=message) as raised:
        vectors.load(view, checksums=True)
    assert "\n" not in str(raised.value)
    problems = vectors.verify(view)  # what `cache verify` lists: one line per damaged file
    assert problems and all(re.search(message, problem) for problem in problems), problems
    # damaged, as for a bad checksum: the fill rewrites the view from the store, embeds nothing
    with count_forward() as counts:
        [r] = _fill(prepared, tmp_path / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (30, 0, 0)
    assert {f.name: f.read_bytes() for f in view.iterdir()} == good


def test_item1_manifest_dim_checked_against_shard(tmp_path: Path, tiny_bert: Path) -> None:
    # the case: the view says 16-d over 32-d shards -> train/evaluate and verify refuse
    # it in one line (no 16-d tensor from a 32-d shard), and the store entry edited the same way
    # is dropped and embedded again, never copied into a 16-d view
    opts = _project(tmp_path, tiny_bert)
    assert _cli("cache", *opts)[0] == 0
    view = tmp_path / "cache" / "tiny"
    reference = vectors.load(view).vectors.clone()
    _edit(view / "manifest.json", _set("dim", 16))
    p = P.load(Path(opts[1]))
    from simtune.cache.views import open_cache

    with pytest.raises(UserError, match=r"part-00000.arrow: damaged cache shard \(32-d"):
        open_cache(tmp_path / "cache", "tiny", p.encoders.models["tiny"], p.cache)
    code, output = _cli("cache", "verify", *opts, "--sample", "4")
    assert code == 1 and "tiny: FAILED" in output
    assert "damaged cache shard (32-d vectors, the manifest says dim 16)" in output
    entry = _entry(view)
    _edit(entry / "manifest.json", _set("dim", 16))
    shutil.rmtree(view)
    with count_forward() as counts:
        [r] = _fill(tmp_path / "prepared", tmp_path / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (0, 30, 30)
    table = vectors.load(view, checksums=True)
    assert table.dim == 32 and vectors.read_manifest(entry).dim == 32
    assert torch.allclose(table.vectors, reference, atol=1e-6)
    assert vectors.verify(entry) == []


@pytest.mark.parametrize("edit", [_set("dim", "abc"), _set("dtype", "float16"),
                                  _shard_rows("many"), _set("dim", 16)])
def test_item1_damaged_store_manifest_is_repaired_from_the_view(tmp_path: Path, tiny_bert: Path,
                                                                edit: Any) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert, shard_rows=10)
    view = tmp_path / "cache" / "tiny"
    _fill(prepared, tmp_path / "cache", p)
    good = vectors.load(view).vectors.clone()
    entry = _entry(view)
    _edit(entry / "manifest.json", edit)
    with count_forward() as counts:
        [r] = _fill(prepared, tmp_path / "cache", p)
    assert (r.embedded, counts["rows"]) == (0, 0)
    assert torch.equal(vectors.load(view, checksums=True).vectors, good)
    fixed = vectors.read_manifest(entry)
    assert (fixed.dim, fixed.dtype, fixed.rows) == (32, "float32", 30)
    assert vectors.verify(entry) == []


def test_item1_layer_states_manifest_dim_checked(tmp_path: Path, tiny_bert: Path) -> None:
    # the states live in the store alone (the view references them): a store entry whose
    # manifest lies is refused, then embedded again, and the view comes out the same bytes
    prepared = make_prepared(tmp_path, sentences(12))
    p = params(tiny_bert)
    _fill(prepared, tmp_path / "cache", p, layer=1)
    view = tmp_path / "cache" / "tiny@layer1"
    good = {f.name: f.read_bytes() for f in view.iterdir()}
    entry = store.fingerprint_dir(store.root(""), reference.read(view).fingerprint)
    _edit(entry / "manifest.json", _set("dim", 16))
    with pytest.raises(UserError, match=r"damaged cache shard \(hidden size 32, the manifest "
                                        r"says dim 16\).*dvc repro -f -s cache"):
        reference.open_view(view, store.root(""))
    with count_forward() as counts:
        _fill(prepared, tmp_path / "cache", p, layer=1)
    assert counts["rows"] == 12 and {f.name: f.read_bytes() for f in view.iterdir()} == good
    assert reference.open_view(view, store.root("")).manifest.dim == 32


# --- item 3: bit rot in a store shard -----------------------------------------------------------


def _rot(shard: Path) -> None:
    """Change 32 bytes of the first vector inside `shard` in place: same size, mtime, inode."""
    import pyarrow as pa

    with pa.memory_map(str(shard)) as f:
        first = pa.ipc.open_file(f).read_all().column("embedding")[0].values
        target = np.asarray(first, dtype=np.float32).tobytes()
    data = shard.read_bytes()
    at = data.index(target)  # 32 bytes: 8 of the 32 floats of that vector
    before = shard.stat()
    with shard.open("r+b") as f:
        f.seek(at)
        f.write(bytes(b ^ 0x5A for b in data[at:at + 32]))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size, before.st_mtime_ns, before.st_ino)


def test_item3_bit_rot_in_a_store_shard_never_reaches_the_view(
        tmp_path: Path, tiny_bert: Path, caplog: pytest.LogCaptureFixture) -> None:
    opts = _project(tmp_path, tiny_bert)
    assert _cli("cache", *opts)[0] == 0
    view = tmp_path / "cache" / "tiny"
    reference = vectors.load(view).vectors.clone()
    view_bytes = {f.name: f.read_bytes() for f in view.iterdir()}
    entry = _entry(view)
    bad = entry / vectors.read_manifest(entry).shards[0].file
    _rot(bad)
    # verify checks the store shards behind the view, by sha256, and says how to repair
    code, output = _cli("cache", "verify", *opts, "--sample", "0")
    assert code == 1 and "tiny: FAILED" in output, output
    assert (f"{bad}: checksum mismatch (corrupted shard); run `simtune cache` to repair it"
            in output)
    # the fill re-hashes what it copies: the rotten shard is dropped, its rows come back from
    # the intact view (nothing embedded), the view keeps its bytes
    caplog.set_level(logging.INFO, logger="simtune")
    logging.getLogger().addHandler(caplog.handler)  # the command's logging set-up removed it
    p = P.load(Path(opts[1]))
    with count_forward() as counts:
        [r] = _fill(tmp_path / "prepared", tmp_path / "cache", p)
    assert (r.embedded, counts["rows"]) == (0, 0)
    assert f"{bad}: checksum mismatch (corrupted shard); dropping its 10 rows" in caplog.text
    assert {f.name: f.read_bytes() for f in view.iterdir()} == view_bytes
    assert _cli("cache", "verify", *opts, "--sample", "0")[0] == 0
    # without the view (DVC removes it before rerunning the stage): embedded again, exact
    bad = entry / vectors.read_manifest(entry).shards[0].file
    _rot(bad)
    shutil.rmtree(view)
    with count_forward() as counts:
        [r] = _fill(tmp_path / "prepared", tmp_path / "cache", p)
    assert (r.embedded, counts["rows"]) == (10, 10)
    assert torch.allclose(vectors.load(view, checksums=True).vectors, reference, atol=1e-6)
    assert vectors.verify(entry) == []


# --- item 4: gc deletes only store entries -----------------------------------------------------


def test_item4_gc_deletes_only_store_entries_and_follows_no_symlink(
        tmp_path: Path, tiny_bert: Path) -> None:
    opts = _project(tmp_path, tiny_bert)
    root = store.root("")
    other = params(tiny_bert, {"max_length": 8})
    _fill(tmp_path / "prepared", tmp_path / "elsewhere", other)  # an old entry: gc drops it
    old = _entry(tmp_path / "elsewhere" / "tiny")
    assert _cli("cache", *opts)[0] == 0
    photos = root / "vectors" / "my_photos"
    photos.mkdir()
    (photos / "a.jpg").write_text("hi")
    # an entry someone keeps elsewhere, linked into the store: never followed, never emptied
    outside = tmp_path / "outside"
    shutil.copytree(old, outside / old.name)
    link = root / "vectors" / "0123456789abcdef0123456789abcdef"
    link.symlink_to(outside / old.name, target_is_directory=True)
    # a view copied into the store: a valid manifest, but not of the fingerprint it is named
    stray = root / "vectors" / "copied_view"
    shutil.copytree(tmp_path / "cache" / "tiny", stray)
    code, output = _cli("cache", "gc", "--params", opts[1], "--max-gb", "0")
    assert code == 0, output
    assert "kept 1 encoder settings" in output and "dropped 1" in output
    assert f"  skip {photos}: not a store entry (no valid manifest of this fingerprint); left " \
           "alone" in output
    assert f"  skip {link}: a symlink, not followed; left alone" in output
    assert f"  skip {stray}: not a store entry" in output
    assert (photos / "a.jpg").read_text() == "hi"
    assert link.is_symlink() and vectors.verify(outside / old.name) == []
    assert stray.is_dir() and not old.exists()
    assert [e.fingerprint for e in policy.entries(root)] == [
        vectors.read_manifest(tmp_path / "cache" / "tiny").fingerprint]
    # the size policy after a fill is the same code: it leaves them too
    _fill(tmp_path / "prepared", tmp_path / "cache", params(tiny_bert, store_max_gb=1e-9))
    assert photos.is_dir() and link.is_symlink() and stray.is_dir()


# --- item 10: verify checks every view, the layer states too ------------------------------------


def test_item10_verify_checks_the_top_layers_state_cache(tmp_path: Path,
                                                         tiny_bert: Path) -> None:
    opts = _project(tmp_path, tiny_bert, {"mode": "top_layers"})
    assert _cli("cache", *opts)[0] == 0
    layer_view = tmp_path / "cache" / "tiny@layer1"
    assert layer_view.is_dir()  # train.schedule.top_layers.layers 1 of 2: the states after 1
    code, output = _cli("cache", "verify", *opts, "--sample", "4")
    assert code == 0, output
    assert "tiny: ok: 30 rows, 4 re-embedded" in output
    # issue 35 item 10: a sample of the layer states is re-embedded too (float16 tolerance)
    assert "tiny@layer1: ok: 30 rows, 4 re-embedded" in output
    # the view holds no states: the store shards it references are the ones checked
    entry = store.fingerprint_dir(store.root(""), reference.read(layer_view).fingerprint)
    shard = entry / vectors.read_manifest(entry).shards[0].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    code, output = _cli("cache", "verify", *opts, "--sample", "0")
    assert code == 1 and "tiny@layer1: FAILED" in output and "tiny: ok" in output
    assert f"{shard}: checksum mismatch (corrupted shard)" in output


# --- item 11: the size policy never evicts an entry in use --------------------------------------


def _fingerprints(out: Path) -> set[str]:
    return {(reference.read(d) or vectors.read_manifest(d)).fingerprint for d in out.iterdir()}


def test_item11_fill_never_evicts_an_entry_in_use_two_encoders(tmp_path: Path,
                                                               tiny_bert: Path) -> None:
    p = two_encoder_pairs(tmp_path, tiny_bert, store_max_gb=1e-9)  # any entry is over it
    prepared = tmp_path / "prepared"
    _fill(prepared, tmp_path / "old", params(tiny_bert, {"max_length": 8}))  # not in use
    _fill(prepared, tmp_path / "cache", p)
    in_use = _fingerprints(tmp_path / "cache")
    assert len(in_use) == 2
    assert {e.fingerprint for e in policy.entries(store.root(""))} == in_use  # old one dropped
    with count_forward() as counts:  # every run: nothing evicted, nothing embedded again
        _fill(prepared, tmp_path / "cache", p)
    assert counts["rows"] == 0
    assert {e.fingerprint for e in policy.entries(store.root(""))} == in_use


def test_item11_fill_never_evicts_an_entry_in_use_top_layers(tmp_path: Path,
                                                             tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(12))
    p = params(tiny_bert, store_max_gb=1e-9)
    _fill(prepared, tmp_path / "old", params(tiny_bert, {"max_length": 8}))  # not in use
    _fill(prepared, tmp_path / "cache", p, layer=1)  # vectors + layer states
    in_use = _fingerprints(tmp_path / "cache")
    assert len(in_use) == 2
    assert {e.fingerprint for e in policy.entries(store.root(""))} == in_use
    with count_forward() as counts:
        _fill(prepared, tmp_path / "cache", p, layer=1)
    assert counts["rows"] == 0
    assert {e.fingerprint for e in policy.entries(store.root(""))} == in_use
