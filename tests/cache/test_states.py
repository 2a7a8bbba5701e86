"""The layer cache: each text's token states after layer k, exact, incremental, shared, bounded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from simtune.cache import reference, states, store, vectors
from simtune.cache import stage as cache
from simtune.errors import UserError
from simtune.prepare.prepared import text_id
from tests.cache_helpers import count_forward, make_prepared, params, sentences


def _direct(model_dir: Path, texts: list[str], layer: int) -> list[torch.Tensor]:
    """Independent reference: one text at a time (no padding), plain transformers."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return [model(**tok(t, return_tensors="pt", truncation=True, max_length=32),
                      output_hidden_states=True).hidden_states[layer][0] for t in texts]


def _open(view: Path, root: Path | None = None) -> states.StatesTable:
    """A layer view's states, read from the store entry it references."""
    return reference.open_view(view, root or store.root(""))


def _fill(prepared: Path, out: Path, p, layer: int) -> list[cache.FillResult]:
    return cache.fill(prepared, out, p.encoders, p.cache, layer=layer)


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-5), ("float16", 3e-3)])
def test_states_equal_a_direct_computation(tmp_path: Path, tiny_bert: Path, dtype: str,
                                           tol: float) -> None:
    texts = sentences(25)
    prepared = make_prepared(tmp_path, texts)
    results = _fill(prepared, tmp_path / "cache", params(tiny_bert, {"dtype": dtype},
                                                         shard_rows=10), layer=1)
    assert [(r.encoder, r.embedded) for r in results] == [("tiny", 25), ("tiny", 25)]
    table = _open(tmp_path / "cache" / "tiny@layer1")
    want = _direct(tiny_bert, texts, 1)
    rows = table.index([text_id(t) for t in texts])
    assert table.lengths(rows).tolist() == [len(w) for w in want]
    padded, mask = table.batch(rows)
    assert padded.shape == (25, max(len(w) for w in want), 32)
    for i, w in enumerate(want):
        n = len(w)
        assert torch.allclose(padded[i, :n], w, atol=tol * max(1.0, float(w.abs().max())))
        assert mask[i].tolist() == [1] * n + [0] * (padded.shape[1] - n)
        assert bool((padded[i, n:] == 0).all())


def test_layer_states_refill_nothing_and_are_keyed_by_layer(tmp_path: Path,
                                                            tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(20))
    p = params(tiny_bert)
    _fill(prepared, tmp_path / "cache", p, layer=1)
    with count_forward() as counts, _counting_shard_opens() as opened:
        again = _fill(prepared, tmp_path / "cache", p, layer=1)
    assert [r.embedded for r in again] == [0, 0] and counts["calls"] == 0
    # the hit reads each entry's shards a few times (what is cached, the view), not once per
    # text: it read them 20 x 2 times before the lookup was hoisted (70 s a TREC cache stage)
    shards = sum(len(vectors.read_manifest(d).shards) for d in _entries())
    assert 0 < opened["n"] <= 4 * shards, (opened, shards)
    other = _fill(prepared, tmp_path / "cache", p, layer=0)  # another layer: its own entry
    assert [r.embedded for r in other] == [0, 20]
    first = _open(tmp_path / "cache" / "tiny@layer0")
    assert torch.allclose(first.batch(torch.tensor([0]))[0][0],
                          _direct(tiny_bert, [_text_of(tmp_path, first, 0)], 0)[0], atol=1e-5)


@contextlib.contextmanager
def _counting_shard_opens() -> Iterator[dict[str, int]]:
    """Counts `vectors.open_shard` calls (every read of a shard goes through it)."""
    from simtune.cache import vectors

    seen, real = {"n": 0}, vectors.open_shard

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen["n"] += 1
        return real(*args, **kwargs)

    with mock.patch.object(vectors, "open_shard", counted):
        yield seen


def _entries() -> list[Path]:
    """The store's entries (the test's own store: `$SIMTUNE_STORE`)."""
    return sorted(d for d in (store.root("") / "vectors").iterdir() if d.is_dir())


def _text_of(tmp_path: Path, table: states.StatesTable, row: int) -> str:
    from simtune.prepare.prepared import load

    prepared = load(tmp_path / "prepared")
    texts = dict(zip(prepared.texts.column("text_id").to_pylist(),
                     prepared.texts.column("text").to_pylist(), strict=True))
    return texts[table.ids[row].as_py()]


def test_a_layer_cache_over_the_limit_is_refused_before_embedding(tmp_path: Path,
                                                                  tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(20))
    with count_forward() as counts, pytest.raises(
            UserError, match=r"cache.max_layer_gb: the layer cache of 'tiny' would take ~0.0 GB"):
        _fill(prepared, tmp_path / "cache", params(tiny_bert, max_layer_gb=1e-9), layer=1)
    assert counts["calls"] == 0  # nothing embedded: one pass fills vectors and states


def test_one_encoder_pass_fills_vectors_and_states_equal_to_two_passes(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simtune.cache import vectors
    from simtune.cache.formats import Format

    texts = sentences(25)
    prepared = make_prepared(tmp_path, texts)
    p = params(tiny_bert)
    with count_forward() as counts:
        _fill(prepared, tmp_path / "one", p, layer=1)
    assert counts["calls"] == -(-25 // 8)  # one forward per batch gives vectors and states
    # the two passes of before, into a store of their own
    monkeypatch.setenv("SIMTUNE_STORE", str(tmp_path / "store2"))
    spec, texts_of = p.encoders.models["tiny"], {text_id(t): t for t in texts}
    dist = cache.Dist()
    with count_forward() as counts:
        cache.fill_encoder("tiny", spec, texts_of, tmp_path / "two" / "tiny", p.cache, dist)
        cache.fill_encoder("tiny", spec, texts_of, tmp_path / "two" / "tiny@layer1", p.cache,
                           dist, fmt=Format(1))
    assert counts["calls"] == 2 * -(-25 // 8)
    one, two = (vectors.load(tmp_path / d / "tiny") for d in ("one", "two"))
    assert one.ids.equals(two.ids) and torch.equal(one.vectors, two.vectors)  # bit-equal
    s1 = _open(tmp_path / "one" / "tiny@layer1", tmp_path / "simtune-store")
    s2 = _open(tmp_path / "two" / "tiny@layer1")
    rows = s1.index(two.ids.to_pylist())
    assert torch.equal(s1.batch(rows)[0], s2.batch(s2.index(two.ids.to_pylist()))[0])


def test_states_dtype_halves_the_bytes_and_is_in_the_fingerprint(tmp_path: Path,
                                                                  tiny_bert: Path) -> None:
    prepared = make_prepared(tmp_path, sentences(20))
    _fill(prepared, tmp_path / "cache", params(tiny_bert), layer=1)
    wide = _open(tmp_path / "cache" / "tiny@layer1").manifest
    results = _fill(prepared, tmp_path / "cache", params(tiny_bert, {"states_dtype": "float16"}),
                    layer=1)
    assert [r.embedded for r in results] == [0, 20]  # vectors kept, states re-embedded
    half = _open(tmp_path / "cache" / "tiny@layer1").manifest
    assert (wide.dtype, half.dtype) == ("float32", "float16")
    assert wide.description["dtype"] == "float32" and half.description["dtype"] == "float16"
    assert wide.fingerprint != half.fingerprint


def test_a_layer_cache_over_the_free_disk_is_refused(tmp_path: Path, tiny_bert: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from simtune.cache import views

    monkeypatch.setattr(views, "_free_bytes", lambda path: 1000)
    prepared = make_prepared(tmp_path, sentences(20))
    with count_forward() as counts, pytest.raises(UserError, match=r"has 0.0 GB free for it"):
        _fill(prepared, tmp_path / "cache", params(tiny_bert, max_layer_gb=None), layer=1)
    assert counts["calls"] == 0
