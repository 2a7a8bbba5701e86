"""Issue 53 item 1: `simtune search` keeps the corpus's vectors under the trained model in the
shared store (`evaluate.corpus`, `cache.computed`): the first call embeds the corpus and says
so, a second embeds the query alone and ranks exactly as the first and as the uncached way; a
retrained model, a changed corpus, a corrupted or truncated entry and two searches at once."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from simtune import heads, layers
from simtune import params as P
from simtune.cache import computed
from simtune.cache import stage as cache
from simtune.cache.views import layer_for, open_pair
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.evaluate.search import Hit, search
from simtune.evaluate.vectors import top_layers
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from simtune.retrieval.topk import topk
from tests.train_helpers import project, set_schedule, stage_args, train_top_layers

QUERY = "what is the largest city of the country"
K = 10


@pytest.fixture(scope="module")
def top(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> tuple[Path, P.Params]:
    """A top_layers project (1 of tiny BERT's 2 layers trained, a trained epoch kept), its
    layer states in its own store `root/store` (each test copies it into its own)."""
    root = tmp_path_factory.mktemp("search-top")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIMTUNE_STORE", str(root / "store"))
        raw, params_file = project(root, tiny_bert, mode="top_layers")
        set_schedule(raw, "top_layers", layers=1, lr=0.001, head_lr=0.01, batch_size=8,
                     max_epochs=1, patience=1)
        raw["train"]["frozen_candidate"] = False  # a trained epoch: the layers moved
        p = train_top_layers(root, raw, params_file)
    assert (root / "head" / "encoder").is_dir()
    return root, p


@pytest.fixture(scope="module")
def head_mode(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path
              ) -> tuple[Path, P.Params]:
    root = tmp_path_factory.mktemp("search-head")
    _, params_file = project(root, tiny_bert, mode="head")
    from typer.testing import CliRunner

    from stages import app

    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    return root, P.load(params_file)


def _own_copy(top: tuple[Path, P.Params], store: Path) -> tuple[Path, P.Params]:
    """The layer states of `top` in this test's store (its views name them by fingerprint)."""
    root, p = top
    shutil.copytree(root / "store", store, dirs_exist_ok=True)
    return root, p


class Counted:
    """Texts the encoders embed from the text (`FrozenEncoder.encode`) and texts the trained top
    layers run on from cached states (`layers.embed_rows`), call by call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.text: list[int] = []
        self.states: list[int] = []
        encode, embed = FrozenEncoder.encode, layers.embed_rows

        def counted_encode(enc: FrozenEncoder, texts: list[str], *a: Any, **kw: Any) -> Any:
            self.text.append(len(texts))
            return encode(enc, texts, *a, **kw)

        def counted_rows(top: Any, table: Any, rows: torch.Tensor, *a: Any, **kw: Any) -> Any:
            self.states.append(len(rows))
            return embed(top, table, rows, *a, **kw)

        monkeypatch.setattr(FrozenEncoder, "encode", counted_encode)
        monkeypatch.setattr(layers, "embed_rows", counted_rows)

    def take(self) -> tuple[list[int], list[int]]:
        out = (self.text, self.states)
        self.text, self.states = [], []
        return out


def _search(root: Path, p: P.Params, head: Path | None = None, cache_dir: Path | None = None
            ) -> list[Hit]:
    return search(p, QUERY, K, head or root / "head", root / "prepared",
                  cache_dir or root / "cache")


def _hits(root: Path, p: P.Params, head: Path, corpus: torch.Tensor, ids: list[str]
          ) -> list[Hit]:
    """The hits of `corpus` (rows of `ids`) for QUERY embedded by the model: search's ranking."""
    texts = load_prepared(root / "prepared").text_map()
    labels = _labels(root)
    q = load_model(head, "cpu", encoder=p.encoders.models[p.encoders.query].model).encode(
        [QUERY])
    scores, idx = topk(q, corpus, K)
    return [Hit(float(s), texts[ids[i]], labels[ids[i]])
            for s, i in zip(scores[0], idx[0].tolist(), strict=True)]


def _labels(root: Path) -> dict[str, str]:
    ex = load_prepared(root / "prepared").examples
    return dict(zip(ex.column("text_id").to_pylist(), ex.column("label").to_pylist(),
                    strict=True))


def _uncached_top(root: Path, p: P.Params, head: Path) -> list[Hit]:
    """The uncached way: evaluate's trained top layers over every corpus text's cached
    states, then the query from the text."""
    ids = list(load_prepared(root / "prepared").text_map())
    q_table, d_table = open_pair(root / "cache", p.encoders, p.cache, "groups", placed=False)
    with torch.inference_mode():
        corpus = top_layers(heads.load(head).eval(), head, p, root / "prepared",
                            (root / "cache", q_table, d_table))(q_table.index(ids), "query")
    return _hits(root, p, head, corpus.float(), ids)


def _entry(store: Path) -> Path:
    """The one store entry of search's corpus vectors."""
    found = [m.parent for m in store.glob("vectors/*/manifest.json")
             if json.loads(m.read_text())["description"].get("kind") == "search corpus"]
    assert len(found) == 1, found
    return found[0]


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    out = [r.getMessage() for r in caplog.records if r.name == "simtune.evaluate.corpus"]
    caplog.clear()
    return out


def test_top_layers_second_search_embeds_the_query_alone(
        top: tuple[Path, P.Params], _own_store: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The first search runs the trained top layers over the corpus's 80 cached states once
    (and the query from its text), says so, and stores them; the second embeds the query alone
    (no state through the layers) and its hits, ids and scores, are the first's and the
    uncached way's exactly."""
    root, p = _own_copy(top, _own_store)
    n = len(load_prepared(root / "prepared").text_map())
    want = _uncached_top(root, p, root / "head")
    counted = Counted(monkeypatch)
    caplog.set_level(logging.INFO)
    caplog.clear()
    first = _search(root, p)
    assert counted.take() == ([1], [n])
    said = _said(caplog)
    assert len(said) == 1 and said[0].startswith(f"corpus: {n} texts embedded (layer states) in ")
    assert said[0].endswith(f"s, stored for the next search (store hit 0/{n})")
    second = _search(root, p)
    assert counted.take() == ([1], [])
    assert _said(caplog) == [f"corpus vectors: store hit {n}/{n}, 0 embedded (this search "
                             "embeds 1 text: the query)"]
    assert first == second == want
    assert len({h.text for h in first}) == K


def test_a_retrained_model_refills_and_ranks_as_its_uncached_way(
        top: tuple[Path, P.Params], _own_store: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Other head weights (a retrain): another fingerprint, the corpus through the new model
    again, ranked as the new model's uncached way; the old model's entry still serves it."""
    root, p = _own_copy(top, _own_store)
    n = len(load_prepared(root / "prepared").text_map())
    head = tmp_path / "head"
    shutil.copytree(root / "head", head)
    counted = Counted(monkeypatch)
    old = search(p, QUERY, K, head, root / "prepared", root / "cache")
    trained = heads.load(head)
    with torch.no_grad():
        for w in trained.parameters():
            w.mul_(-1.5)  # the retrained head
    (head / "model.safetensors").unlink()
    heads.save(trained, head)
    counted.take()
    new = search(p, QUERY, K, head, root / "prepared", root / "cache")
    assert counted.take() == ([1], [n])
    assert new == _uncached_top(root, p, head) and new != old
    entries = list(_own_store.glob("vectors/*/manifest.json"))
    assert sum(json.loads(m.read_text())["description"].get("kind") == "search corpus"
               for m in entries) == 2


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_entry_is_refilled_never_read(
        top: tuple[Path, P.Params], _own_store: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, damage: str) -> None:
    """A stored shard with its vectors overwritten in place (same size) or cut short, after a
    search that found it intact (the store remembers that check): the next search says which
    file is bad, drops it and embeds the corpus again: the same hits."""
    root, p = _own_copy(top, _own_store)
    n = len(load_prepared(root / "prepared").text_map())
    first = _search(root, p)
    assert _search(root, p) == first  # read back intact: its check remembered
    (shard,) = _entry(_own_store).glob("shard-*.arrow")
    data = bytearray(shard.read_bytes())
    if damage == "flipped":  # the first stored vector negated in place: sizes and schema hold
        table = pa.ipc.open_file(pa.memory_map(str(shard))).read_all()
        vector = np.asarray(table.column("embedding")[0].values, np.float32)
        at = data.find(vector.tobytes())
        assert at > 0
        data[at:at + vector.nbytes] = (-vector).tobytes()
    else:
        data = data[: len(data) // 2]
    stat = shard.stat()
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # bit rot keeps the time
    counted = Counted(monkeypatch)
    caplog.set_level(logging.WARNING)
    again = _search(root, p)
    assert counted.take() == ([1], [n])
    bad = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(shard) in m and "dropping its" in m for m in bad), bad
    assert again == first


def test_a_changed_corpus_embeds_its_new_texts_only(
        top: tuple[Path, P.Params], _own_store: Path, tmp_path: Path, tiny_bert: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The same model over a corpus of 20 more texts: the 80 stored rows are read, the 20 new
    ones alone go through the layers; a row computed before keeps its vector exactly."""
    root, p = _own_copy(top, _own_store)
    _search(root, p)
    grown = tmp_path / "grown"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIMTUNE_STORE", str(_own_store))
        project(grown, tiny_bert, n=100, mode="top_layers")
        cache.fill(grown / "prepared", grown / "cache", p.encoders, p.cache,
                   layer=layer_for(p.encoders, p.train))
    counted = Counted(monkeypatch)
    caplog.set_level(logging.INFO)
    caplog.clear()
    hits = search(p, QUERY, K, root / "head", grown / "prepared", grown / "cache")
    assert counted.take() == ([1], [20])
    assert _said(caplog)[0].endswith("s, stored for the next search (store hit 80/100)")
    got = {h.text: h.score for h in hits}
    old = {h.text: h.score for h in _search(root, p)}  # the 80: read back as stored
    shared = [t for t in old if t in got]
    assert shared and all(got[t] == old[t] for t in shared)
    assert counted.take() == ([1], [])


def test_head_mode_reads_the_cache_through_the_head(
        head_mode: tuple[Path, P.Params], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Head mode: the corpus is the workspace's cached vectors through the head, each call (the
    head costs nothing to store): the query is the only text either call embeds."""
    root, p = head_mode
    ids = list(load_prepared(root / "prepared").text_map())
    q_table, _ = open_pair(root / "cache", p.encoders, p.cache, "groups", placed=False)
    with torch.inference_mode():
        corpus = heads.load(root / "head")(q_table.vectors[q_table.index(ids)].float())
    want = _hits(root, p, root / "head", corpus, ids)
    counted = Counted(monkeypatch)
    caplog.set_level(logging.INFO)
    assert _search(root, p) == _search(root, p) == want
    assert counted.take() == ([1, 1], [])
    assert _said(caplog) == ["corpus: 80 cached vectors through the head, nothing embedded"] * 2


def test_head_mode_without_its_cache_embeds_the_corpus_once(
        head_mode: tuple[Path, P.Params], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """No cache view (another folder): the model embeds the corpus from the text once, stored
    under its files' fingerprint; the second call embeds the query alone, the same hits as the
    model's uncached way (`encode_corpus`)."""
    root, p = head_mode
    ids = list(load_prepared(root / "prepared").text_map())
    texts = load_prepared(root / "prepared").text_map()
    model = load_model(root / "head", "cpu", encoder=p.encoders.models["tiny"].model)
    want = _hits(root, p, root / "head", model.encode_corpus([texts[i] for i in ids],
                                                             role="query"), ids)
    counted = Counted(monkeypatch)
    caplog.set_level(logging.INFO)
    first = _search(root, p, cache_dir=tmp_path)
    assert counted.take() == ([80, 1], [])
    second = _search(root, p, cache_dir=tmp_path)
    assert counted.take() == ([1], [])
    said = [m for m in _said(caplog) if not m.startswith("not using the cache: ")]
    assert said[0].startswith("corpus: 80 texts embedded (text) in ")
    assert said[1:] == ["corpus vectors: store hit 80/80, 0 embedded (this search embeds 1 "
                        "text: the query)"]
    assert first == second == want


def _slow(calls: list[int], vectors: torch.Tensor):  # type: ignore[no-untyped-def]
    def compute(pos: list[int]) -> torch.Tensor:
        calls.append(len(pos))
        time.sleep(0.3)  # the other search arrives meanwhile
        return vectors[pos]
    return compute


def test_two_searches_at_once_compute_the_corpus_once(tmp_path: Path) -> None:
    """Two fills of one entry at once: the second waits on the entry's lock, then finds every
    row stored: computed once, both get the same vectors."""
    keys = [f"{i:032x}" for i in range(50)]
    vectors = torch.randn(50, 8)
    calls: list[int] = []
    out: list[torch.Tensor] = []
    description = {"kind": "test", "n": 1}

    def run() -> None:
        got = computed.stored(tmp_path, "test", description, keys, _slow(calls, vectors),
                              10**9, 16)
        out.append(got.vectors)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [50] and len(out) == 2
    assert torch.equal(out[0], vectors) and torch.equal(out[1], vectors)


def test_repeated_keys_once_and_non_finite_vectors_refused(tmp_path: Path) -> None:
    """A text twice in the corpus is computed and stored once, served at both places; a model
    giving a NaN vector stores nothing (a one-line `UserError`)."""
    keys = ["a" * 32, "b" * 32, "a" * 32]
    calls: list[list[int]] = []

    def compute(pos: list[int]) -> torch.Tensor:
        calls.append(pos)
        return torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])[pos]

    got = computed.stored(tmp_path, "test", {"k": 1}, keys, compute, 10**9, 16)
    assert calls == [[0, 1]] and (got.hits, got.computed) == (0, 2)
    assert got.vectors.tolist() == [[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]
    with pytest.raises(UserError, match="non-finite vectors for 1 of 1 texts; nothing stored"):
        computed.stored(tmp_path, "test", {"k": 2}, ["c" * 32],
                        lambda pos: torch.tensor([[float("nan"), 0.0]]), 10**9, 16)
    again = computed.stored(tmp_path, "test", {"k": 2}, ["c" * 32],
                            lambda pos: torch.tensor([[7.0, 8.0]]), 10**9, 16)
    assert again.computed == 1 and again.vectors.tolist() == [[7.0, 8.0]]
