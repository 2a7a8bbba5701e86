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


def test_probe_a_moved_project_keeps_its_layer_states_until_prune_missing(
        tmp_path: Path, tiny_bert: Path) -> None:
    """Item 8: refs hold the view's absolute path; after a project folder was renamed, `cache
    gc` from another workspace dropped its layer states. A ref whose view's folder is missing
    keeps its entry, gc lists it, `--prune-missing` drops it; the moved view still opens (and
    renews its ref)."""
    from typer.testing import CliRunner

    from simtune import params as P
    from stages import app
    from tests.conftest import write_params

    p = params(tiny_bert)
    old = tmp_path / "project"
    _fill(make_prepared(old, sentences(20)), old / "cache", p, layer=1)
    used = reference.read(old / "cache" / "tiny@layer1").fingerprint
    moved = tmp_path / "renamed"
    old.rename(moved)
    other = tmp_path / "other"  # another workspace, another layer
    _fill(make_prepared(other, sentences(12, 40)), other / "cache", p, layer=0)
    raw = P.Params.model_validate(p.model_dump()).model_dump()
    raw["train"].update(mode="top_layers")
    raw["train"]["schedule"]["top_layers"]["layers"] = 2  # layer 0 of the 2-layer tiny BERT
    params_file = write_params(other / "params.yaml", raw)
    result = CliRunner().invoke(app, ["cache", "gc", "--params", str(params_file),
                                      "--max-gb", "0"])
    assert result.exit_code == 0, result.output
    assert (f"  skip {old / 'cache' / 'tiny@layer1'}: a layer view's folder that is missing (a "
            f"project moved, renamed or deleted): its ref keeps store entry {used} (`cache gc "
            "--prune-missing` drops it); left alone") in result.output.splitlines()
    assert f"drop {used}" not in result.output
    # the moved project reads its states (and its ref now names where it is)
    table = reference.open_view(moved / "cache" / "tiny@layer1", store.root(""))
    assert len(table.batch(torch.arange(3))[0]) == 3
    assert reference.missing(store.root("")) == [(old / "cache" / "tiny@layer1", used)]
    result = CliRunner().invoke(app, ["cache", "gc", "--params", str(params_file),
                                      "--max-gb", "0", "--prune-missing"])
    assert result.exit_code == 0, result.output
    assert reference.missing(store.root("")) == []
    assert f"drop {used}" not in result.output  # the moved view's own ref keeps it
    shutil.rmtree(moved)
    result = CliRunner().invoke(app, ["cache", "gc", "--params", str(params_file),
                                      "--max-gb", "0", "--prune-missing"])
    assert f"drop {used}" in result.output


def test_probe_verify_re_embeds_a_sample_of_layer_states(tmp_path: Path, tiny_bert: Path
                                                         ) -> None:
    """Item 10: `cache verify` said "0 re-embedded" for layer views. It re-embeds a sample of
    layer states too and compares them within the storage dtype's tolerance; states that are
    not the encoder's (checksums consistent) are a problem."""
    import numpy as np

    from simtune.cache import vectors
    from simtune.cache.formats import Format

    prepared = make_prepared(tmp_path, sentences(20))
    p = params(tiny_bert, {"states_dtype": "float16"})
    out = tmp_path / "cache"
    _fill(prepared, out, p, layer=1)

    def check() -> admin.VerifyResult:
        results = admin.verify(prepared, out, p.encoders, p.cache, 8, 0, torch.device("cpu"),
                               layer=1)
        return {r.encoder: r for r in results}["tiny@layer1"]

    r = check()
    assert (r.problems, r.sampled) == ([], 8) and 0 < r.max_abs_diff < 5e-3
    entry = store.fingerprint_dir(store.root(""), reference.read(out / "tiny@layer1").fingerprint)
    manifest = vectors.read_manifest(entry)
    fmt = Format(1)
    for i, s in enumerate(manifest.shards):  # other states, written and listed as intact
        rows = [-x for x in fmt.shard_rows(entry, s, manifest)]
        ids = vectors.open_shard(entry, s, manifest).column("text_id").to_pylist()
        manifest.shards[i] = fmt.write(entry, 0, ids, ids, [np.asarray(x) for x in rows],
                                       manifest, name=s.file)
    vectors.write_manifest(entry, manifest)
    r = check()
    assert len(r.problems) == 1 and r.problems[0].startswith(
        f"{out / 'tiny@layer1'}: re-embedded layer states differ by ")


def test_probe_a_fresh_workspace_says_no_change_and_the_report_names_its_units(
        tmp_path: Path, tiny_bert: Path, caplog) -> None:
    """Item 14: a fresh workspace's first fill warned "encoder changed (...)" with another
    workspace's settings; reports/cache.json counted windows in `cached`/`embedded` and texts
    in `texts` without saying so."""
    import json
    import logging

    long = [" ".join(sentences(6, 200 + i)) for i in range(4)]  # several windows of 16
    prepared = make_prepared(tmp_path / "a", sentences(8) + long)
    _fill(prepared, tmp_path / "a" / "cache", params(tiny_bert), layer=None)
    p = params(tiny_bert, {"max_length": 16, "chunks": {"max": 8, "overlap": 4,
                                                        "pool": "mean"}})
    fresh = make_prepared(tmp_path / "b", sentences(8) + long)
    with caplog.at_level(logging.INFO):
        results = _fill(fresh, tmp_path / "b" / "cache", p, layer=None)
    assert not [m for m in caplog.messages if "encoder changed" in m], caplog.messages
    cache.write_report(tmp_path / "cache.json", results)
    report = json.loads((tmp_path / "cache.json").read_text())["tiny"]
    from simtune.cache import cutting
    from simtune.prepare.prepared import load as load_prepared

    cut, _ = cutting.split("tiny", p.encoders.models["tiny"], "query",
                           load_prepared(fresh).text_map(), "tiny")
    distinct = len({w for ws in cut.values() for w in ws})  # equal windows: embedded once
    assert report["window"]["windows"] == sum(map(len, cut.values())) > distinct > 12
    assert {k: report[k] for k in ("texts", "texts_cached", "windows_embedded")} == {
        "texts": 12, "texts_cached": 0, "windows_embedded": distinct}
    caplog.clear()
    with caplog.at_level(logging.INFO):  # the same workspace, other settings: said
        _fill(prepared, tmp_path / "a" / "cache", p, layer=None)
    assert any("encoder changed (max_length: 32 -> 16; chunks: None -> " in m
               for m in caplog.messages), caplog.messages
