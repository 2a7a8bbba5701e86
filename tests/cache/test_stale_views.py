"""Issue 35 items 8-10: views of earlier settings do not linger (the cache stage removes them,
verify names them, gc prunes empty ref folders); store refs survive a moved project; verify
re-embeds a sample of layer states."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from simtune.cache import admin, reference, store
from simtune.cache import stage as cache
from tests.cache_helpers import make_prepared, params, sentences


def _fill(prepared: Path, out: Path, p, layer: int | None = 1) -> list[cache.FillResult]:
    return cache.fill(prepared, out, p.encoders, p.cache, layer=layer)


def _refs() -> Path:
    return store.root("") / reference.REFS


def test_probe_a_view_of_earlier_settings_is_named_by_verify_and_removed_by_the_next_fill(
        tmp_path: Path, tiny_bert: Path) -> None:
    """Item 9: `cache/tiny@layer1` stayed after the settings moved on (top_layers of another k,
    or head mode), verify called it ok and its ref pinned its store entry forever."""
    prepared = make_prepared(tmp_path, sentences(20))
    p = params(tiny_bert)
    out = tmp_path / "cache"
    _fill(prepared, out, p, layer=1)
    old = reference.read(out / "tiny@layer1").fingerprint
    (out / "notes").mkdir()
    (out / "notes" / "mine.txt").write_text("not a view: left alone")
    # the current settings are head mode's: the layer view is none of theirs
    results = admin.verify(prepared, out, p.encoders, p.cache, 0, 0, torch.device("cpu"))
    stale = {r.encoder: r.problems for r in results}["tiny@layer1"]
    assert stale == [f"{out / 'tiny@layer1'}: not a view of the current settings (left by "
                     "earlier ones); the cache stage removes it"]
    _fill(prepared, out, p, layer=0)  # top_layers of another k
    assert sorted(d.name for d in out.iterdir()) == ["notes", "tiny", "tiny@layer0"]
    assert (out / "notes" / "mine.txt").is_file()
    assert not (_refs() / old).exists()  # its ref gone, and its folder with it
    assert all(not r.problems for r in admin.verify(prepared, out, p.encoders, p.cache, 0, 0,
                                                   torch.device("cpu"), layer=0))
    new = reference.read(out / "tiny@layer0").fingerprint
    shutil.rmtree(out / "tiny@layer0")  # gone by hand: gc prunes its ref and the empty folder
    admin.gc(p.encoders, p.cache, max_gb=1000)
    assert not (_refs() / new).exists()
