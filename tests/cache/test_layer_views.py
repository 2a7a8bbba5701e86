"""Layer views reference the store: the states are stored once, read batch by batch from the
immutable store shards exactly as stored, never changed under a reader, never evicted while a
view uses them, refilled (to the same view bytes) where the store lacks them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from simtune.cache import admin, reference, states, store, vectors, views
from simtune.cache import stage as cache
from simtune.errors import UserError
from tests.cache_helpers import count_forward, make_prepared, params, sentences

VIEW = "tiny@layer1"


def _fill(prepared: Path, out: Path, p, layer: int = 1) -> list[cache.FillResult]:
    return cache.fill(prepared, out, p.encoders, p.cache, layer=layer)


def _files(view: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(view.iterdir())}


def _entry(view: Path) -> Path:
    return store.fingerprint_dir(store.root(""), reference.read(view).fingerprint)


def _stored(entry: Path) -> dict[str, np.ndarray]:
    """content hash -> its (T, H) states as stored, read with pyarrow alone (the old way)."""
    manifest = vectors.read_manifest(entry)
    out = {}
    for s in manifest.shards:
        table = pa.ipc.open_file(pa.memory_map(str(entry / s.file))).read_all()
        for h, row in zip(table.column("text_hash").to_pylist(),
                          table.column("states").to_pylist(), strict=True):
            out[h] = np.asarray(row, dtype=manifest.dtype).reshape(-1, manifest.dim)
    return out


@pytest.fixture
def filled(tmp_path: Path, tiny_bert: Path) -> tuple[Path, object]:
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert, {"states_dtype": "float16"}, shard_rows=7)  # several store shards
    _fill(prepared, tmp_path / "cache", p)
    return prepared, p


def test_the_view_holds_no_states_and_batches_equal_the_stored_rows(
        tmp_path: Path, filled: tuple[Path, object]) -> None:
    view = tmp_path / "cache" / VIEW
    assert list(_files(view)) == ["reference.json", "rows.arrow"]
    entry = _entry(view)
    bulk = sum(s.bytes for s in vectors.read_manifest(entry).shards)
    assert sum(map(len, _files(view).values())) < bulk / 3
    table = reference.open_view(view, store.root(""))
    ref = reference.read(view)
    assert table.ids.equals(ref.ids) and len(table.files) == 5  # 30 rows, 7 per shard
    stored = _stored(entry)
    hashes = [h[0] for h in ref.hashes.to_pylist()]
    resident = table.resident("cpu")
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):  # shuffled batches, as training draws them
        rows = torch.randperm(len(table), generator=gen)[:11]
        got, mask = table.batch(rows)
        width = max(len(stored[hashes[r]]) for r in rows.tolist())
        want = torch.zeros(len(rows), width, 32)
        for i, r in enumerate(rows.tolist()):
            want[i, :len(stored[hashes[r]])] = torch.from_numpy(stored[hashes[r]].astype(
                np.float32))
        assert torch.equal(got, want)  # bit for bit, as stored
        assert mask.sum(1).tolist() == [len(stored[hashes[r]]) for r in rows.tolist()]
        again, mask2 = resident.batch(rows)
        assert torch.equal(again, got) and torch.equal(mask2, mask)


def test_a_view_never_changes_under_a_reader(tmp_path: Path, filled: tuple[Path, object],
                                             tiny_bert: Path) -> None:
    prepared, _ = filled
    view = tmp_path / "cache" / VIEW
    table = reference.open_view(view, store.root(""))
    rows = torch.arange(len(table))
    before = table.batch(rows)[0]
    # the view is refilled with other settings and the entry it read is evicted: the open
    # table reads what it read (store shards are never rewritten; open files stay readable)
    _fill(prepared, tmp_path / "cache", params(tiny_bert, {"max_length": 8}, shard_rows=7))
    shutil.rmtree(store.fingerprint_dir(store.root(""), table.manifest.fingerprint))
    assert torch.equal(table.batch(rows)[0], before)


def test_gc_never_drops_an_entry_a_view_references(tmp_path: Path, filled: tuple[Path, object],
                                                   tiny_bert: Path) -> None:
    prepared, p = filled
    view = tmp_path / "cache" / VIEW
    used = reference.read(view).fingerprint
    _fill(prepared, tmp_path / "other", p, layer=0)  # another workspace, another layer
    kept, dropped, _ = admin.gc(p.encoders, p.cache, max_gb=0, layer=0)  # not current: layer 1
    assert used in {e.fingerprint for e in kept} and used not in {e.fingerprint for e in dropped}
    shutil.rmtree(view)  # the view is gone: its ref is stale, the entry goes
    kept, dropped, _ = admin.gc(p.encoders, p.cache, max_gb=0, layer=0)
    assert used in {e.fingerprint for e in dropped}
    assert not list((store.root("") / reference.REFS).glob(f"{used}/*"))


@pytest.mark.parametrize("how", ["entry gone", "another machine"])
def test_a_view_whose_states_are_missing_says_what_to_run_and_refills_to_the_same_bytes(
        tmp_path: Path, filled: tuple[Path, object], monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    # `dvc checkout` of an older run whose entry was evicted, or a teammate's `dvc pull` (the
    # view comes, the states stay on the machine that filled them)
    prepared, p = filled
    out = tmp_path / "cache"
    good = _files(out / VIEW)
    if how == "entry gone":
        shutil.rmtree(_entry(out / VIEW))
    else:
        monkeypatch.setenv("SIMTUNE_STORE", str(tmp_path / "teammate-store"))
    name, spec = "tiny", p.encoders.models["tiny"]
    with pytest.raises(UserError) as e:
        views.open_states(out, name, spec, 1, p.cache)
    assert "\n" not in str(e.value) and "run `dvc repro -f -s cache`" in str(e.value)
    with count_forward() as counts:
        results = _fill(prepared, out, p)
    assert [r.embedded for r in results] == [0, 30]  # a pulled vector view feeds the store
    assert counts["rows"] == 30 and _files(out / VIEW) == good  # DVC sees the same view
    assert len(views.open_states(out, name, spec, 1, p.cache)) == 30


def test_verify_catches_bit_rot_in_a_referenced_store_shard(tmp_path: Path,
                                                            filled: tuple[Path, object]) -> None:
    view = tmp_path / "cache" / VIEW
    assert reference.verify(view, store.root(""), None) == (30, [])
    entry = _entry(view)
    shard = entry / vectors.read_manifest(entry).shards[2].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    _, problems = reference.verify(view, store.root(""), None)
    assert any(f"{shard}: checksum mismatch" in p for p in problems), problems


def test_a_damaged_reference_is_one_line(tmp_path: Path, filled: tuple[Path, object]) -> None:
    view = tmp_path / "cache" / VIEW
    (view / "rows.arrow").write_bytes(b"not arrow")
    with pytest.raises(UserError, match=r"reference.json: damaged layer view .*dvc repro -f"):
        reference.open_view(view, store.root(""))


def test_the_store_entry_reads_as_a_table_too(tmp_path: Path, filled: tuple[Path, object]
                                              ) -> None:
    entry = _entry(tmp_path / "cache" / VIEW)
    table = states.load(entry, checksums=True)
    stored = _stored(entry)
    got = table.read(torch.arange(len(table)))
    assert [h for h in table.ids.to_pylist()] == list(stored)
    assert all(np.array_equal(g, stored[h]) for g, h in zip(got, stored, strict=True))


@pytest.mark.integration
def test_two_process_top_layers_fill_equals_one_process(tmp_path: Path, tiny_bert: Path) -> None:
    import os
    import subprocess
    import sys

    import yaml

    from tests.cache_helpers import cache_params, encoder_params
    from tests.conftest import ROOT, repo_params

    prepared = make_prepared(tmp_path, sentences(40))
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    raw["cache"] = cache_params(shard_rows=10)
    raw["train"]["mode"] = "top_layers"
    raw["train"]["schedule"]["top_layers"]["layers"] = 1
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    store_two = tmp_path / "store-two"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SIMTUNE_STORE": str(store_two),
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", "29519", "-m", "stages", "cache", "--params", str(params_file),
         "--prepared", str(prepared), "--out", str(tmp_path / "two")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    _fill(prepared, tmp_path / "one", params(tiny_bert, shard_rows=10))
    a = reference.open_view(tmp_path / "one" / VIEW, store.root(""))
    b = reference.open_view(tmp_path / "two" / VIEW, store_two)
    assert _files(tmp_path / "one" / VIEW) == _files(tmp_path / "two" / VIEW)
    files = {p.name.rsplit("-", 1)[1] for p in b.files}
    assert files == {"r0.arrow", "r1.arrow"}  # each rank embedded its share, once
    rows = torch.arange(len(a))
    assert torch.allclose(a.batch(rows)[0], b.batch(rows)[0], atol=1e-5)


def _flip_signs(shard: Path, manifest: vectors.Manifest) -> None:
    """Negate every stored state of `shard` in place: rows, hashes, schema and size intact."""
    index = states.ShardIndex(shard.parent, next(s for s in manifest.shards
                                                 if s.file == shard.name), manifest)
    data = np.frombuffer(bytearray(shard.read_bytes()), dtype=np.uint8).copy()
    for start, n in zip(index.start.tolist(), index.length.tolist(), strict=True):
        values = data[start:start + n * manifest.dim * 2].view(np.uint16)
        values ^= 0x8000  # the float16 sign bit
    shard.write_bytes(data.tobytes())


@pytest.mark.parametrize("damage", ["signs flipped", "64 bytes garbled"])
def test_probe_a_corrupt_store_shard_is_refused_when_train_opens_it(
        tmp_path: Path, filled: tuple[Path, object], damage: str) -> None:
    """Issue 35 item 2: a store shard whose states were negated (rows, hashes and schema intact)
    was trained on (loss 16.6, exit 0), one with 64 bytes garbled blamed on the learning rate.
    Opening the view for training checks each shard's sha256: one line naming the file."""
    _, p = filled
    view = tmp_path / "cache" / VIEW
    entry = _entry(view)
    manifest = vectors.read_manifest(entry)
    shard = entry / manifest.shards[1].file
    before = shard.stat().st_size
    if damage == "signs flipped":
        _flip_signs(shard, manifest)
    else:
        data = bytearray(shard.read_bytes())
        data[len(data) // 2:len(data) // 2 + 64] = bytes(range(64))
        shard.write_bytes(bytes(data))
    assert shard.stat().st_size == before
    states.ShardIndex(entry, manifest.shards[1], manifest)  # rows and schema still read fine
    # hashed in the background from the open on: the first read waits for it, and so on
    table = views.open_states(tmp_path / "cache", "tiny", p.encoders.models["tiny"], 1, p.cache)
    for _ in range(2):
        with pytest.raises(UserError) as e:
            table.batch(torch.arange(3))
        assert str(e.value).startswith(f"{shard}: checksum mismatch (corrupted shard)")
        assert "\n" not in str(e.value) and "learning rate" not in str(e.value)
    with pytest.raises(UserError, match="checksum mismatch"):
        table.resident("cpu")
