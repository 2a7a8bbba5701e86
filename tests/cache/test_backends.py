"""Fill backends (`cache.backend`): ONNX Runtime gives torch's vectors up to float rounding,
switching backend re-embeds nothing, the export is made once per fingerprint, failures fall back
to torch; and the background tokenising thread keeps order, errors and early exits."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import pytest
import torch

from simtune import params as P
from simtune.cache import backends, batching, policy, store, vectors
from simtune.cache import stage as cache
from simtune.encoders import FrozenEncoder, describe, fingerprint
from simtune.errors import UserError
from simtune.prepare.prepared import text_id
from tests.cache_helpers import count_forward, make_prepared, params, sentences
from tests.conftest import repo_params

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _vectors(out: Path) -> dict[str, torch.Tensor]:
    table = vectors.load(out / "tiny")
    return dict(zip(table.ids.to_pylist(), table.vectors.float(), strict=True))


def _entry(p: P.Params) -> Path:
    fp = fingerprint(describe("tiny", p.encoders.models["tiny"]))
    return store.fingerprint_dir(store.root(p.cache.store), fp)


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", True), ("cls", False),
                                                    ("max", True)])
def test_onnx_vectors_equal_torch_vectors(tmp_path: Path, tiny_bert: Path, monkeypatch,
                                          pooling: str, normalize: bool) -> None:
    texts = sentences(40)
    prepared = make_prepared(tmp_path, texts)
    enc = {"pooling": pooling, "normalize": normalize}
    p_torch, p_onnx = params(tiny_bert, enc), params(tiny_bert, enc, backend="onnx")
    cache.fill(prepared, tmp_path / "torch", p_torch.encoders, p_torch.cache)
    monkeypatch.setenv(store.ENV, str(tmp_path / "other-store"))  # embed again, with ONNX
    with count_forward() as counts:
        r = cache.fill(prepared, tmp_path / "onnx", p_onnx.encoders, p_onnx.cache)
    assert r[0].embedded == 40
    # transformers ran on the check texts only (traced once to export, once to check them),
    # never on the data
    assert (counts["calls"], counts["rows"]) == (2, 2 * len(backends.CHECK_TEXTS))
    assert (_entry(p_onnx) / "onnx" / "model.onnx").is_file()
    want, got = _vectors(tmp_path / "torch"), _vectors(tmp_path / "onnx")
    assert got.keys() == want.keys() and len(got) == 40
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert diff <= 1e-6 * max(1.0, max(float(v.abs().max()) for v in want.values())), diff


def test_switching_backend_reembeds_nothing(tmp_path: Path, tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(30))
    p = params(tiny_bert)
    cache.fill(prepared, tmp_path / "cache", p.encoders, p.cache)
    p_onnx = params(tiny_bert, backend="onnx")
    with count_forward() as counts:
        [r] = cache.fill(prepared, tmp_path / "cache", p_onnx.encoders, p_onnx.cache)
    assert (r.cached, r.embedded, r.model_loaded, counts["calls"]) == (30, 0, False, 0)
    assert not (_entry(p) / "onnx").exists()  # no model loaded, nothing exported


def test_export_made_once_per_fingerprint(tmp_path: Path, tiny_bert: Path, monkeypatch) -> None:
    p = params(tiny_bert, backend="onnx")
    cache.fill(make_prepared(tmp_path / "a", sentences(10)), tmp_path / "a" / "cache",
               p.encoders, p.cache)
    exported = _entry(p) / "onnx" / "model.onnx"
    before = exported.stat().st_mtime_ns

    def no_export(*a: object) -> None:
        raise AssertionError("exported twice")

    monkeypatch.setattr(backends, "export", no_export)
    with count_forward() as counts:
        [r] = cache.fill(make_prepared(tmp_path / "b", sentences(20)), tmp_path / "b" / "cache",
                         p.encoders, p.cache)
    assert (r.cached, r.embedded) == (10, 10)
    assert counts["rows"] == len(backends.CHECK_TEXTS)  # the data itself went through ONNX
    assert exported.stat().st_mtime_ns == before
    assert [e.bytes >= exported.stat().st_size for e in policy.entries(_entry(p).parents[1])
            ] == [True]  # the export counts toward cache.store_max_gb


def test_failed_export_falls_back_to_torch(tmp_path: Path, tiny_bert: Path, monkeypatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    def broken(*a: object) -> None:
        raise RuntimeError("cannot trace this model\nsecond line")

    monkeypatch.setattr(backends, "export", broken)
    p = params(tiny_bert, backend="onnx")
    with caplog.at_level(logging.WARNING, "simtune"), count_forward() as counts:
        [r] = cache.fill(make_prepared(tmp_path, sentences(12)), tmp_path / "cache",
                         p.encoders, p.cache)
    assert (r.embedded, counts["rows"]) == (12, 12)  # torch embedded every text
    assert "cache.backend onnx: tiny: cannot trace this model; filling with torch" in caplog.text


def test_export_that_disagrees_with_torch_is_not_used(tmp_path: Path, tiny_bert: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    spec = params(tiny_bert).encoders.models["tiny"]
    encoder = FrozenEncoder("tiny", spec, torch.device("cpu"))
    other = FrozenEncoder("tiny", spec.model_copy(update={"pooling": "cls"}),
                          torch.device("cpu"))
    backends.export(other, tmp_path / "onnx" / "model.onnx")  # the wrong pooling
    with caplog.at_level(logging.WARNING, "simtune"):
        chosen = backends.select(encoder, "onnx", tmp_path, None)
    assert chosen is encoder
    assert "the ONNX export differs from torch on a check batch" in caplog.text


def test_layer_states_and_torch_backend_stay_on_torch(tmp_path: Path, tiny_bert: Path) -> None:
    encoder = FrozenEncoder("tiny", params(tiny_bert).encoders.models["tiny"],
                            torch.device("cpu"))
    assert backends.select(encoder, "torch", tmp_path, None) is encoder
    assert backends.select(encoder, "onnx", tmp_path, 1) is encoder
    assert not (tmp_path / "onnx").exists()


def test_onnx_encoder_embeds_any_batch_shape(tmp_path: Path, tiny_bert: Path) -> None:
    encoder = FrozenEncoder("tiny", params(tiny_bert).encoders.models["tiny"],
                            torch.device("cpu"))
    fast = backends.select(encoder, "onnx", tmp_path, None)
    assert isinstance(fast, backends.OnnxEncoder)
    for texts in (["one"], sentences(5), sentences(17, start=40)):  # 1 row, padded, unpadded
        batch = encoder.tokenize(texts)
        with torch.inference_mode():
            want = encoder.embed(batch)
        got = fast.embed(batch)
        assert got.shape == (len(texts), encoder.dim) and got.dtype == torch.float32
        assert float((got - want).abs().max()) <= 1e-6


def test_missing_onnxruntime_is_one_line_naming_the_key(tmp_path: Path, tiny_bert: Path,
                                                        monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    p = params(tiny_bert, backend="onnx")
    with pytest.raises(UserError, match=r"^cache.backend: 'onnx' needs the onnxruntime package: "
                                        r"pip install 'simtune\[onnx\]'"):
        cache.fill(make_prepared(tmp_path, sentences(5)), tmp_path / "cache", p.encoders,
                   p.cache)


def test_bad_backend_is_one_line_naming_the_key() -> None:
    raw = repo_params()
    raw["cache"]["backend"] = "tensorrt"
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == ("params.yaml: cache.backend: expected one of 'torch' or 'onnx', "
                            "got 'tensorrt'")


def test_backend_is_not_in_the_fingerprint(tiny_bert: Path) -> None:
    a, b = params(tiny_bert), params(tiny_bert, backend="onnx")
    assert describe("tiny", a.encoders.models["tiny"]) == describe("tiny",
                                                                   b.encoders.models["tiny"])


# --- the tokenising thread ---------------------------------------------------------------------


def test_prefetched_keeps_order_and_raises_errors_in_the_caller() -> None:
    assert list(batching.prefetched(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield 1
        raise ValueError("bad text")

    got = []
    with pytest.raises(ValueError, match="bad text"):
        for x in batching.prefetched(failing()):
            got.append(x)
    assert got == [1]


def test_prefetched_stops_its_thread_when_left_early() -> None:
    produced = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    for x in batching.prefetched(items(), depth=2):
        if x == 3:
            break
    assert not any(t.name == "simtune-tokenize" for t in threading.enumerate())
    assert len(produced) <= 3 + 1 + 2 + 1  # consumed, end marker slack, queue depth, in hand


@pytest.mark.parametrize("fast", [True, False])
def test_batches_follow_length_order(tiny_bert: Path, fast: bool,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = FrozenEncoder("tiny", params(tiny_bert).encoders.models["tiny"],
                            torch.device("cpu"))
    if not fast:  # the transformers call: lengths first, then each batch
        encoder.fast = None
    monkeypatch.setattr(batching, "WINDOW", 2)  # windows of 8 texts at batch 4
    texts = {text_id(t): t for t in sentences(19)}
    keys = sorted(texts)
    mine = batching.rank_order(keys, texts)
    assert sorted(mine) == keys
    assert [len(texts[k]) for k in mine] == sorted(len(t) for t in texts.values())
    assert [batching.rank_order(keys, texts, r, 2) for r in (0, 1)] == [mine[0::2],
                                                                       mine[1::2]]
    listed = [texts[k] for k in mine]
    got = list(batching.tokenised(listed, 4, encoder, num_workers=0))
    assert [len(idx) for idx, _ in got] == [4, 4, 4, 4, 3]
    # each window of 8 (the last of 3) is its own texts, shortest first by tokens
    for w, (lo, hi) in enumerate([(0, 8), (8, 16), (16, 19)]):
        idx = [j for i, _ in got[2 * w : 2 * w + 2] for j in i]
        assert sorted(idx) == list(range(lo, hi))
        lengths = encoder.token_lengths([listed[j] for j in idx])
        assert lengths == sorted(lengths)
    for idx, tokens in got:  # the padded batch is the transformers call's, exactly
        want = encoder.tokenize([listed[j] for j in idx])
        assert list(tokens) == list(want)
        assert all(torch.equal(tokens[k], want[k]) for k in want)


def test_lagged_holds_back_then_yields_all() -> None:
    seen: list[int] = []

    def items():
        for i in range(5):
            seen.append(i)
            yield i

    out = []
    for x in batching.lagged(items(), 1):
        out.append((x, len(seen)))  # item x comes once x + 1 was taken (the last at the end)
    assert out == [(0, 2), (1, 3), (2, 4), (3, 5), (4, 5)]
    assert list(batching.lagged(iter(range(3)), 0)) == [0, 1, 2]


def test_ordered_map_runs_concurrently_in_order_and_raises_errors() -> None:
    import time

    seen: set[str] = set()

    def slow_square(x: int) -> int:
        seen.add(threading.current_thread().name)
        time.sleep(0.02 if x % 2 else 0.001)  # odd items finish later: order must still hold
        return x * x

    assert list(batching.ordered_map(slow_square, range(12), workers=2)) == [
        x * x for x in range(12)]
    assert len(seen) == 2 and all(n.startswith("simtune-embed") for n in seen)
    assert list(batching.ordered_map(slow_square, range(3), workers=1)) == [0, 1, 4]

    def fails_at_3(x: int) -> int:
        if x == 3:
            raise ValueError("bad batch")
        return x

    got = []
    with pytest.raises(ValueError, match="bad batch"):
        for x in batching.ordered_map(fails_at_3, range(10), workers=2):
            got.append(x)
    assert got == [0, 1, 2]
