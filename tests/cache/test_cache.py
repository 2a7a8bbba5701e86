"""The cache stage: exact vectors, incremental fills, rebuilds, corruption, resume, 2 ranks."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from simtune.cache import stage as cache
from simtune.cache import store, vectors
from simtune.encoders import FrozenEncoder, describe, fingerprint, pool
from simtune.errors import UserError
from simtune.prepare.prepared import text_id
from simtune.prepare.prepared import write as write_prepared
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
from tests.conftest import ROOT, repo_params, write_params


def _fill(prepared: Path, out: Path, p) -> list[cache.FillResult]:
    return cache.fill(prepared, out, p.encoders, p.cache)


def _entry(manifest: vectors.Manifest) -> vectors.Manifest:
    """The shared-store entry behind a view's manifest."""
    return vectors.read_manifest(store.fingerprint_dir(store.root(""), manifest.fingerprint))


def _as_dict(table: vectors.CacheTable) -> dict[str, torch.Tensor]:
    return dict(zip(table.ids.to_pylist(), table.vectors.float(), strict=True))


def _manual(model_dir: Path, texts: list[str], pooling: str, normalize: bool) -> torch.Tensor:
    """Independent reference: one text at a time (no padding), plain transformers + torch."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    out = []
    with torch.no_grad():
        for t in texts:
            enc = tok(t, return_tensors="pt", truncation=True, max_length=32)
            h = model(**enc).last_hidden_state[0]
            v = {"mean": h.mean(0), "cls": h[0], "max": h.max(0).values}[pooling]
            out.append(torch.nn.functional.normalize(v, dim=0) if normalize else v)
    return torch.stack(out)


@pytest.mark.parametrize(("pooling", "normalize", "dtype", "tol"), [
    ("mean", True, "float32", 1e-5), ("cls", False, "float32", 1e-5),
    ("max", True, "float32", 1e-5), ("mean", True, "float16", 2e-3)])
def test_filled_vectors_equal_direct_encoder_output(tmp_path: Path, tiny_bert: Path,
                                                    pooling: str, normalize: bool, dtype: str,
                                                    tol: float) -> None:
    texts = sentences(40)
    prepared = make_prepared(tmp_path, texts)
    p = params(tiny_bert, {"pooling": pooling, "normalize": normalize, "dtype": dtype})
    _fill(prepared, tmp_path / "cache", p)
    table = vectors.load(tmp_path / "cache" / "tiny")
    assert table.vectors.dtype == getattr(torch, dtype)
    got = table.vectors[table.index([text_id(t) for t in texts])].float()
    want = _manual(tiny_bert, texts, pooling, normalize)
    assert torch.allclose(got, want, atol=tol, rtol=0), (got - want).abs().max()


def test_pool_by_hand() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]]])  # last token is padding
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, -1.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 2.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]


def test_vectors_are_a_zero_copy_view_of_the_mapped_shard(tmp_path: Path, tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(20))
    _fill(prepared, tmp_path / "cache", params(tiny_bert))
    table = vectors.load(tmp_path / "cache" / "tiny")
    assert len(table.manifest.shards) == 1
    shard = str(_shard(tmp_path / "cache" / "tiny"))
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if fields[-1] == shard:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((lo, hi))
    ptr = table.vectors.data_ptr()
    end = ptr + table.vectors.numel() * table.vectors.element_size()
    assert any(lo <= ptr and end <= hi for lo, hi in ranges), "vectors are not the mapped file"


def test_refill_embeds_nothing_and_loads_no_model(tmp_path: Path, tiny_bert: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert)
    with count_forward() as first:
        [r] = _fill(prepared, tmp_path / "cache", p)
    assert (r.needed, r.cached, r.embedded, first["rows"]) == (30, 0, 30, 30)
    before = _as_dict(vectors.load(tmp_path / "cache" / "tiny"))

    def no_loading(*args, **kwargs):
        raise AssertionError("the encoder must not be loaded")

    monkeypatch.setattr(cache, "load_encoder", no_loading)  # what fill loads vectors with
    with count_forward() as second:
        [r] = cache.fill(prepared, tmp_path / "cache", p.encoders, p.cache)
    assert (r.cached, r.embedded, r.model_loaded, second["calls"]) == (30, 0, False, 0)
    after = _as_dict(vectors.load(tmp_path / "cache" / "tiny"))
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_ten_new_texts_embed_exactly_ten(tmp_path: Path, tiny_bert: Path) -> None:
    p = params(tiny_bert)
    _fill(make_prepared(tmp_path / "a", sentences(50)), tmp_path / "cache", p)
    grown = make_prepared(tmp_path / "b", sentences(60))
    with count_forward() as counts:
        [r] = _fill(grown, tmp_path / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (50, 10, 10)
    table = vectors.load(tmp_path / "cache" / "tiny")
    assert len(table) == 60 and len(table.manifest.shards) == 1  # the view: one part
    assert len(_entry(table.manifest).shards) == 2  # the store: the first fill's + the 10 new
    want = _manual(tiny_bert, sentences(60), "mean", True)
    got = table.vectors[table.index([text_id(t) for t in sentences(60)])]
    assert torch.allclose(got, want, atol=1e-5)


def test_pooling_change_rebuilds_and_says_why(tmp_path: Path, tiny_bert: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    prepared = make_prepared(tmp_path, sentences(25))
    _fill(prepared, tmp_path / "cache", params(tiny_bert))
    old_files = {s.file for s in vectors.read_manifest(tmp_path / "cache" / "tiny").shards}
    caplog.set_level(logging.INFO, logger="simtune")
    with count_forward() as counts:
        [r] = _fill(prepared, tmp_path / "cache", params(tiny_bert, {"pooling": "cls"}))
    assert (r.cached, r.embedded, counts["rows"]) == (0, 25, 25)
    assert "encoder changed (pooling: 'mean' -> 'cls')" in caplog.text
    assert "vectors under the previous settings stay in the store" in caplog.text
    assert old_files == {"part-00000.arrow"}
    table = vectors.load(tmp_path / "cache" / "tiny")
    assert torch.allclose(table.vectors[table.index([text_id(sentences(25)[3])])][0],
                          _manual(tiny_bert, [sentences(25)[3]], "cls", True)[0], atol=1e-5)


def test_weights_change_rebuilds(tmp_path: Path, tiny_bert: Path,
                                 caplog: pytest.LogCaptureFixture) -> None:
    from tests.conftest import save_tiny_bert

    model = save_tiny_bert(tmp_path / "model", seed=1)
    prepared = make_prepared(tmp_path, sentences(10))
    _fill(prepared, tmp_path / "cache", params(model))
    save_tiny_bert(model, seed=2)  # same config, other weights
    caplog.set_level(logging.INFO, logger="simtune")
    [r] = _fill(prepared, tmp_path / "cache", params(model))
    assert r.embedded == 10
    assert "model files changed: model.safetensors" in caplog.text


def test_duplicate_texts_are_embedded_once(tmp_path: Path, tiny_bert: Path) -> None:
    # pairs where a query is also a document: one shared encoder embeds that text once
    raw = repo_params()
    rows = [{"q": s, "d": sentences(20, 100)[i]} for i, s in enumerate(sentences(20))]
    rows += [{"q": sentences(20, 100)[0], "d": sentences(20)[5]}]  # both texts already seen
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw["prepare"].update(source="file")
    raw["prepare"]["file"].update(path=str(data), kind="pairs")
    raw["prepare"]["file"]["columns"].update(query="q", positive="d")
    from simtune import params as P
    from simtune.prepare import stage as prepare

    write_prepared(prepare.build(P.validate(raw).prepare), tmp_path / "prepared",
                  tmp_path / "r.json")
    with count_forward() as counts:
        [r] = _fill(tmp_path / "prepared", tmp_path / "cache", params(tiny_bert))
    assert (r.needed, r.embedded, counts["rows"]) == (40, 40, 40)


def test_two_encoders_for_pairs(tmp_path: Path, tiny_bert: Path) -> None:
    p = two_encoder_pairs(tmp_path, tiny_bert)
    results = {r.encoder: r for r in _fill(tmp_path / "prepared", tmp_path / "cache", p)}
    assert (results["tiny"].embedded, results["docs"].embedded) == (12, 12)
    assert vectors.load(tmp_path / "cache" / "docs").dim == 16
    assert set(vectors.load(tmp_path / "cache" / "tiny").ids.to_pylist()) == {
        text_id(s) for s in sentences(12)}


# --- damaged caches ----------------------------------------------------------------------------


@pytest.fixture
def filled(tmp_path: Path, tiny_bert: Path) -> Path:
    prepared = make_prepared(tmp_path, sentences(30))
    _fill(prepared, tmp_path / "cache", params(tiny_bert, shard_rows=10))
    return tmp_path / "cache" / "tiny"


def _shard(directory: Path, i: int = 0) -> Path:
    return directory / vectors.read_manifest(directory).shards[i].file


def test_truncated_shard_is_an_error_naming_the_file(filled: Path) -> None:
    shard = _shard(filled, 1)
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(UserError, match=rf"{shard}: cache shard is \d+ bytes, the manifest says"):
        vectors.load(filled)


def test_flipped_byte_is_caught_by_checksums(filled: Path) -> None:
    shard = _shard(filled)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"{shard}: checksum mismatch"):
        vectors.load(filled, checksums=True)
    assert vectors.verify(filled) == [f"{shard}: checksum mismatch (corrupted shard)"]


def test_manifest_row_mismatch(filled: Path) -> None:
    manifest = json.loads((filled / "manifest.json").read_text())
    manifest["shards"][0]["rows"] += 1
    manifest["rows"] += 1  # consistent within the manifest: only the shard itself disagrees
    (filled / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"rows, the manifest says 11"):
        vectors.load(filled)


def test_fingerprint_other_than_current_settings(filled: Path, tiny_bert: Path) -> None:
    spec = params(tiny_bert, {"max_length": 16}).encoders.models["tiny"]
    current = fingerprint(describe("tiny", spec))
    with pytest.raises(UserError, match="does not match the current encoder settings"):
        vectors.load(filled, fingerprint=current)


def test_missing_ids_are_named(filled: Path) -> None:
    table = vectors.load(filled)
    with pytest.raises(UserError, match=r"1 text ids are not in the cache \(first: nope\)"):
        table.index([table.ids[0].as_py(), "nope"])


def test_place_on_cpu_and_refuse_gpu_without_cuda(filled: Path) -> None:
    table = vectors.load(filled)
    assert vectors.place(table, "auto").vectors.device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="'gpu' requested but CUDA is not available"):
            vectors.place(table, "gpu")


# --- verify ------------------------------------------------------------------------------------


def _project(tmp_path: Path, model: Path, n: int = 30) -> Path:
    make_prepared(tmp_path, sentences(n))
    raw = repo_params()
    raw["encoders"] = encoder_params(model)
    raw["cache"] = cache_params(shard_rows=10)
    return write_params(tmp_path / "params.yaml", raw)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_verify_passes_then_fails_after_a_byte_flip(tmp_path: Path, tiny_bert: Path) -> None:
    params_file = _project(tmp_path, tiny_bert)
    opts = ["--params", str(params_file), "--prepared", str(tmp_path / "prepared"),
            "--out", str(tmp_path / "cache")]
    assert _cli("cache", *opts)[0] == 0
    code, output = _cli("cache", "verify", *opts, "--sample", "8")
    assert code == 0, output
    assert "tiny: ok: 30 rows, 8 re-embedded" in output
    shard = _shard(tmp_path / "cache" / "tiny", 2)
    data = bytearray(shard.read_bytes())
    data[-200] ^= 0x01
    shard.write_bytes(bytes(data))
    code, output = _cli("cache", "verify", *opts)
    assert code == 1
    assert f"{shard}: checksum mismatch (corrupted shard)" in output


def test_verify_detects_vectors_that_do_not_match_the_encoder(tmp_path: Path) -> None:
    from tests.conftest import save_tiny_bert

    model = save_tiny_bert(tmp_path / "model", seed=1)
    params_file = _project(tmp_path, model)
    opts = ["--params", str(params_file), "--prepared", str(tmp_path / "prepared"),
            "--out", str(tmp_path / "cache")]
    assert _cli("cache", *opts)[0] == 0
    save_tiny_bert(model, seed=2)
    code, output = _cli("cache", "verify", *opts)
    assert code == 1 and "filled with other encoder settings" in output


# --- bad input ---------------------------------------------------------------------------------


def _stage_error(tmp_path: Path, raw_edit) -> str:
    make_prepared(tmp_path, sentences(10))
    raw = repo_params()
    raw["encoders"] = encoder_params(tmp_path / "nowhere")
    raw["cache"] = cache_params()
    raw_edit(raw)
    params_file = write_params(tmp_path / "params.yaml", raw)
    code, output = _cli("cache", "--params", str(params_file), "--prepared",
                        str(tmp_path / "prepared"), "--out", str(tmp_path / "cache"))
    assert code == 1
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


def test_a_loss_the_data_cannot_take_is_refused_before_the_fill(tmp_path: Path,
                                                                tiny_bert: Path) -> None:
    """Pairs data with `train.loss.name: supcon`: the cache stage refuses it in one line
    before any encoder runs (not the train stage after the fill); the default `auto` fills."""
    p = two_encoder_pairs(tmp_path, tiny_bert)
    raw = p.model_dump(mode="json")
    raw["train"]["loss"]["name"] = "supcon"
    params_file = write_params(tmp_path / "params.yaml", raw)
    opts = ["--params", str(params_file), "--prepared", str(tmp_path / "prepared"),
            "--out", str(tmp_path / "cache")]
    with count_forward() as counts:
        code, output = _cli("cache", *opts)
    assert code == 1 and output.strip().splitlines() == [
        f"error: train.loss.name: 'supcon' needs groups data, the prepared data "
        f"({tmp_path / 'prepared'}) is pairs (use auto or one of mnrl, contrastive)"]
    assert counts["calls"] == 0 and not (tmp_path / "cache").exists()
    raw["train"]["loss"]["name"] = "auto"
    write_params(params_file, raw)
    code, output = _cli("cache", *opts)
    assert code == 0, output
    assert sorted(x.name for x in (tmp_path / "cache").iterdir()) == ["docs", "tiny"]


def test_missing_model_path(tmp_path: Path) -> None:
    line = _stage_error(tmp_path, lambda raw: None)
    nowhere = tmp_path / "nowhere"
    assert line == f"error: encoders.models.tiny.model: {nowhere}: no such model directory"


def test_directory_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "notmodel").mkdir()

    def edit(raw):
        raw["encoders"]["models"]["tiny"]["model"] = str(tmp_path / "notmodel")

    assert "not a Hugging Face model directory (no config.json)" in _stage_error(tmp_path, edit)


def test_encoder_name_not_defined(tmp_path: Path) -> None:
    def edit(raw):
        raw["encoders"]["query"] = "bert"

    assert _stage_error(tmp_path, edit) == (
        "error: params.yaml: encoders: query: encoder 'bert' is not defined in encoders.models "
        "(defined: tiny)").replace("params.yaml", str(tmp_path / "params.yaml"))


def test_empty_prepared_data(tmp_path: Path, tiny_bert: Path) -> None:
    make_prepared(tmp_path, sentences(10))
    empty = tmp_path / "prepared"
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(empty / "texts.parquet").slice(0, 0), empty / "texts.parquet")
    p = params(tiny_bert)
    with pytest.raises(UserError, match="prepared data has no texts"):
        _fill(empty, tmp_path / "cache", p)


def test_disk_full_keeps_earlier_shards(tmp_path: Path, tiny_bert: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import pyarrow as pa

    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert, shard_rows=10)
    real_osfile, calls = pa.OSFile, {"n": 0}

    def failing_osfile(path, mode="r"):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_osfile(path, mode)

    with monkeypatch.context() as m, pytest.raises(
            UserError, match=r"cannot write cache shard: No space left on device"):
        m.setattr(vectors.pa, "OSFile", failing_osfile)
        _fill(prepared, tmp_path / "cache", p)
    directory = tmp_path / "cache" / "tiny"
    assert not list(directory.glob(".*.tmp"))
    with count_forward() as counts:
        [r] = _fill(prepared, tmp_path / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (10, 20, 20)


# --- interruption and distribution -------------------------------------------------------------


def _fill_subprocess(tmp_path: Path, params_file: Path, out: Path, kill_after: int | None
                     ) -> subprocess.CompletedProcess[str]:
    """Run the real stage in a subprocess; with `kill_after`, SIGKILL it right after that many
    shards are journaled (a deterministic point mid-fill)."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        from simtune.cache import store
        add = store.Journal.add
        def add_then_die(self, shard):
            add(self, shard)
            if {kill_after!r} is not None and len(self.shards) == {kill_after!r}:
                os.kill(os.getpid(), signal.SIGKILL)
        store.Journal.add = add_then_die
        from stages import app
        app(["cache", "--params", {str(params_file)!r}, "--prepared",
             {str(tmp_path / "prepared")!r}, "--out", {str(out)!r}])
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_killed_fill_resumes_and_equals_an_uninterrupted_one(tmp_path: Path,
                                                            tiny_bert: Path) -> None:
    params_file = _project(tmp_path, tiny_bert, n=60)
    killed = _fill_subprocess(tmp_path, params_file, tmp_path / "killed", kill_after=2)
    assert killed.returncode == -signal.SIGKILL
    directory = tmp_path / "killed" / "tiny"
    encoders, _ = _sections(params_file)
    entry = store.fingerprint_dir(store.root(""), fingerprint(describe(
        "tiny", encoders.models["tiny"])))
    assert json.loads((entry / "journal-r0.json").read_text())["shards"][1]["rows"] == 10
    with pytest.raises(UserError, match="no cache here"):  # no view before a fill completes
        vectors.load(directory)
    with count_forward() as counts:
        [r] = cache.fill(tmp_path / "prepared", tmp_path / "killed",
                         *_sections(params_file))
    assert (r.cached, r.embedded, counts["rows"]) == (20, 40, 40)
    full = _fill_subprocess(tmp_path, params_file, tmp_path / "full", kill_after=None)
    assert full.returncode == 0, full.stderr
    resumed = _as_dict(vectors.load(directory, checksums=True))
    reference = _as_dict(vectors.load(tmp_path / "full" / "tiny"))
    assert resumed.keys() == reference.keys() and len(resumed) == 60
    assert max(float((resumed[k] - reference[k]).abs().max()) for k in resumed) < 1e-5


def _sections(params_file: Path):
    from simtune import params as P

    p = P.load(params_file)
    return p.encoders, p.cache


@pytest.mark.integration
def test_two_process_fill_equals_one_process(tmp_path: Path, tiny_bert: Path) -> None:
    params_file = _project(tmp_path, tiny_bert, n=50)
    one = _fill_subprocess(tmp_path, params_file, tmp_path / "one", kill_after=None)
    assert one.returncode == 0, one.stderr
    store_two = tmp_path / "store-two"  # its own store: the first fill's vectors are not there
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SIMTUNE_STORE": str(store_two)}
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", "29517", "-m", "stages", "cache", "--params", str(params_file),
         "--prepared", str(tmp_path / "prepared"), "--out", str(tmp_path / "two")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    view = vectors.read_manifest(tmp_path / "two" / "tiny")
    entry = store.fingerprint_dir(store_two, view.fingerprint)
    manifest = vectors.read_manifest(entry)
    assert {s.file.rsplit("-", 1)[1] for s in manifest.shards} == {"r0.arrow", "r1.arrow"}
    a = _as_dict(vectors.load(tmp_path / "one" / "tiny"))
    b = _as_dict(vectors.load(tmp_path / "two" / "tiny", checksums=True))
    assert a.keys() == b.keys() and len(a) == 50
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert not list(entry.glob("journal-*"))


@pytest.mark.integration
def test_real_minilm_matches_a_plain_transformers_computation(tmp_path: Path) -> None:
    from simtune.encoders import model_dir

    questions = ["What is the capital of France ?", "Which city is the capital of France ?",
                 "How many legs does a spider have ?", "Who wrote Hamlet ?"]
    prepared = make_prepared(tmp_path, questions)
    raw = repo_params()
    raw["cache"] = cache_params()
    from simtune import params as P

    p = P.validate(raw)
    [r] = _fill(prepared, tmp_path / "cache", p)
    assert r.embedded == 4
    table = vectors.load(tmp_path / "cache" / "minilm")
    got = table.vectors[table.index([text_id(q) for q in questions])]
    spec = p.encoders.models["minilm"]
    want = _manual(model_dir("minilm", spec), questions, "mean", True)
    assert torch.allclose(got, want, atol=1e-5)
    sims = got @ got.T
    assert sims[0, 1] > 0.8 and sims[0, 2] < 0.3  # a paraphrase is near, another topic is far
    direct = FrozenEncoder("minilm", spec, torch.device("cpu")).encode(questions, 2)
    assert torch.allclose(direct, want, atol=1e-5)


def test_custom_key_with_changed_text_is_re_embedded(tmp_path: Path, tiny_bert: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from simtune import params as P
    from simtune.prepare import stage as prepare

    def prepared_with(texts: list[str]) -> Path:
        data = tmp_path / "keyed.jsonl"
        data.write_text("".join(json.dumps({"id": f"k{i}", "text": t, "label": "L"}) + "\n"
                                for i, t in enumerate(texts)))
        raw = repo_params()
        raw["prepare"]["source"] = "file"
        raw["prepare"]["file"]["path"] = str(data)
        raw["prepare"]["file"]["columns"]["key"] = "id"
        raw["prepare"]["split"]["fractions"] = {"train": 0.5, "val": 0.25, "test": 0.25}
        write_prepared(prepare.build(P.validate(raw).prepare), tmp_path / "prepared",
                      tmp_path / "r.json")
        return tmp_path / "prepared"

    texts = sentences(20)
    p = params(tiny_bert, shard_rows=8)
    _fill(prepared_with(texts), tmp_path / "cache", p)
    texts[3] = "a brand new text for key three"
    caplog.set_level(logging.INFO, logger="simtune")
    with count_forward() as counts:
        [r] = _fill(prepared_with(texts), tmp_path / "cache", p)
    assert (r.cached, r.embedded, counts["rows"]) == (19, 1, 1)
    table = vectors.load(tmp_path / "cache" / "tiny", checksums=True)
    assert len(table) == 20
    want = _manual(tiny_bert, texts, "mean", True)
    got = table.vectors[table.index([f"k{i}" for i in range(20)])]
    assert torch.allclose(got, want, atol=1e-5)


# --- fill knobs: vectors equal up to float rounding --------------------------------------------


def test_batch_size_and_workers_change_vectors_only_by_float_rounding(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """batch 13 + 1 worker vs 64 + 0: other padding changes the order of float sums, so a
    vector may differ in its last bits, never by more than 1e-6 (the README's claim)."""
    prepared = make_prepared(tmp_path, sentences(150))
    tables = {}
    for batch, workers in ((13, 1), (64, 0)):
        p = params(tiny_bert, batch_size=batch, num_workers=workers, shard_rows=40)
        monkeypatch.setenv("SIMTUNE_STORE", str(tmp_path / f"store{batch}"))  # embed both times
        with count_forward() as counts:
            _fill(prepared, tmp_path / f"cache{batch}", p)
        assert counts["calls"] == -(-150 // batch)  # the knob did change the batches
        tables[batch] = _as_dict(vectors.load(tmp_path / f"cache{batch}" / "tiny"))
    assert tables[13].keys() == tables[64].keys() and len(tables[13]) == 150
    diff = max(float((tables[13][k] - tables[64][k]).abs().max()) for k in tables[13])
    print(f"max abs diff between batch 13 + 1 worker and 64 + 0: {diff:.3g}")
    assert diff <= 1e-6
