"""Long texts as windows (`simtune.chunks`): boundaries, one window = today's vector bit for
bit, pooled vectors = a by-hand computation, re-chunking re-embeds only new windows, the cut
report, and the same vectors on every path (fill, `FrozenEncoder.encode`, full mode)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import transformers

from simtune.cache import stage as cache
from simtune.cache import vectors
from simtune.chunks import Chunker, Cut, pool_windows
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.prepare.prepared import load as load_prepared
from tests.cache_helpers import count_forward, make_prepared, params, sentences
from tests.conftest import WORDS

MINILM = "minilm"


def _long(i: int, words: int) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words)) + f" {i}"


def _texts() -> list[str]:
    """Short ones (fit in 16 tokens) and long ones (two to six windows of 16)."""
    return sentences(6) + [_long(i, 20 + 9 * i) for i in range(6)]


def _chunks(mx: int = 8, overlap: int = 4, pool: str = "mean") -> dict:
    return {"max_length": 16, "chunks": {"max": mx, "overlap": overlap, "pool": pool}}


def _tok(path: Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("prompt", ["", "what is "])
def test_windows_hold_every_token_in_order_with_the_overlap(tiny_bert: Path, prompt: str
                                                             ) -> None:
    spec = params(tiny_bert, _chunks(mx=50, overlap=4)).encoders.models["tiny"]
    tok = _tok(tiny_bert)
    chunker = Chunker(tok, spec, prompt)
    text = _long(3, 60)
    cut = Cut()
    [windows] = chunker.windows([text], cut)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(windows) > 3
    seen: list[int] = []
    for w in windows:
        assert w in text and w == w.strip()  # a substring, cut at word boundaries
        assert len(tok(prompt + w)["input_ids"]) <= 16  # the prompt once per window
        wi = tok(w, add_special_tokens=False)["input_ids"]
        if seen:  # starts inside the previous window: >= overlap tokens shared
            shared = next(k for k in range(len(wi), 0, -1) if seen[-k:] == wi[:k])
            assert shared >= 4
            wi = wi[shared:]
        seen += wi
    assert seen == ids  # nothing lost, nothing repeated beyond the overlaps
    assert (cut.texts, cut.over, cut.cut, cut.dropped, cut.windows) == (1, 1, 0, 0, len(windows))


def test_a_text_without_spaces_advances_a_window_less_the_overlap(tiny_bert: Path) -> None:
    spec = params(tiny_bert, _chunks(mx=50, overlap=4)).encoders.models["tiny"]
    tok = _tok(tiny_bert)
    text = "abcdefghij" * 8  # one token a letter, no word boundary
    windows = Chunker(tok, spec, "").windows([text])[0]
    # 14 letters a window, each starting 10 after the last, the last holding the rest
    assert windows == [text[i:i + 14] for i in range(0, 70, 10)] + [text[70:]]


def test_a_text_that_fits_is_one_window_and_max_drops_the_rest(tiny_bert: Path) -> None:
    spec = params(tiny_bert, _chunks(mx=2, overlap=0)).encoders.models["tiny"]
    tok = _tok(tiny_bert)
    short, long = "what is the capital", _long(1, 40)
    cut = Cut()
    windows = Chunker(tok, spec, "").windows([short, long], cut)
    assert windows[0] == [short]
    assert len(windows[1]) == 2
    n = len(tok(long, add_special_tokens=False)["input_ids"])
    # 14 text tokens per window (16 less [CLS] and [SEP]), no overlap: 28 kept
    assert (cut.over, cut.cut, cut.tokens, cut.dropped) == (1, 1, n, n - 28)
    assert cut.report()["over_window_share"] == 0.5


def test_an_overlap_that_leaves_too_little_is_one_line(tiny_bert: Path) -> None:
    spec = params(tiny_bert, {"max_length": 24, "chunks": {"max": 4, "overlap": 12,
                                                          "pool": "mean"}}).encoders.models["tiny"]
    with pytest.raises(UserError, match=r"tiny.chunks.overlap: 12 leaves 10 new tokens .* lower"):
        Chunker(_tok(tiny_bert), spec, "", "tiny")


def test_pool_windows_by_hand() -> None:
    v = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 1.0], [0.0, 2.0], [6.0, 8.0]])
    counts = torch.tensor([1, 3, 1])
    mean = pool_windows(v, counts, "mean", normalize=True)
    assert torch.equal(mean[0], v[0]) and torch.equal(mean[2], v[4])  # one window: as is
    torch.testing.assert_close(mean[1], torch.tensor([1 / 3, 1.0]) / (10 ** 0.5 / 3))
    mx = pool_windows(v, counts, "max", normalize=False)
    assert mx[1].tolist() == [1.0, 2.0]
    first = pool_windows(v, counts, "first", normalize=False)
    assert first[1].tolist() == [1.0, 0.0]


def test_one_window_is_todays_vector_bit_for_bit(tiny_bert: Path, tmp_path: Path) -> None:
    texts = _texts()
    prepared = make_prepared(tmp_path, texts)
    off = params(tiny_bert, {"max_length": 16})
    on = params(tiny_bert, _chunks())
    cache.fill(prepared, tmp_path / "off", off.encoders, off.cache)
    cache.fill(prepared, tmp_path / "on", on.encoders, on.cache)
    a, b = vectors.load(tmp_path / "off" / "tiny"), vectors.load(tmp_path / "on" / "tiny")
    assert a.ids.to_pylist() == b.ids.to_pylist()
    fits = [len(_tok(tiny_bert)(t)["input_ids"]) <= 16 for t in _text_order(prepared, a)]
    assert 0 < sum(fits) < len(fits)
    for row, fit in enumerate(fits):
        assert torch.equal(a.vectors[row], b.vectors[row]) == fit
    # chunking off is today's truncation: every text whole, truncated by the tokenizer
    plain = FrozenEncoder("tiny", off.encoders.models["tiny"], torch.device("cpu"))
    assert plain.chunker.windows(texts) == [[t] for t in texts]
    truncated = plain.embed(plain.tokenize(_text_order(prepared, a)))
    torch.testing.assert_close(a.vectors, truncated, atol=1e-6, rtol=0)
    # the encoder's own encode: the same rule
    enc_off = FrozenEncoder("tiny", off.encoders.models["tiny"], torch.device("cpu"))
    enc_on = FrozenEncoder("tiny", on.encoders.models["tiny"], torch.device("cpu"))
    short = [t for t in texts if len(_tok(tiny_bert)(t)["input_ids"]) <= 16]
    assert torch.equal(enc_off.encode(short, 4), enc_on.encode(short, 4))


def _text_order(prepared: Path, table: vectors.CacheTable) -> list[str]:
    texts = load_prepared(prepared).text_map()
    return [texts[i] for i in table.ids.to_pylist()]


@pytest.mark.parametrize("pool", ["mean", "max", "first"])
def test_the_view_pools_each_windows_vector_by_hand(tiny_bert: Path, tmp_path: Path,
                                                    pool: str) -> None:
    prepared = make_prepared(tmp_path, _texts())
    p = params(tiny_bert, _chunks(pool=pool))
    spec = p.encoders.models["tiny"]
    cache.fill(prepared, tmp_path / "c", p.encoders, p.cache)
    table = vectors.load(tmp_path / "c" / "tiny")
    plain = FrozenEncoder("tiny", params(tiny_bert, {"max_length": 16}).encoders.models["tiny"],
                          torch.device("cpu"))
    windows = Chunker(_tok(tiny_bert), spec, "").windows(_text_order(prepared, table))
    for row, ws in enumerate(windows):
        each = torch.stack([plain.encode([w], 1)[0] for w in ws])  # one at a time, no padding
        want = {"mean": each.mean(0), "max": each.max(0).values, "first": each[0]}[pool]
        want = torch.nn.functional.normalize(want, dim=0) if len(ws) > 1 else each[0]
        torch.testing.assert_close(table.vectors[row], want, atol=2e-6, rtol=0)
    # the encoder's encode (evaluate, search, load_model) gives the view's vectors
    enc = FrozenEncoder("tiny", spec, torch.device("cpu"))
    torch.testing.assert_close(enc.encode(_text_order(prepared, table), 3), table.vectors,
                               atol=2e-6, rtol=0)


def test_rechunking_embeds_only_new_windows(tiny_bert: Path, tmp_path: Path) -> None:
    texts = _texts()
    prepared = make_prepared(tmp_path, texts)
    first, other_pool, other_overlap = (params(tiny_bert, _chunks(overlap=4)),
                                        params(tiny_bert, _chunks(overlap=4, pool="max")),
                                        params(tiny_bert, _chunks(overlap=6)))
    tok = _tok(tiny_bert)
    spec = first.encoders.models["tiny"]

    def windows(p) -> set[str]:
        return {w for ws in Chunker(tok, p.encoders.models["tiny"], "").windows(texts)
                for w in ws}

    with count_forward() as n:
        cache.fill(prepared, tmp_path / "c", first.encoders, first.cache)
    assert n["rows"] == len(windows(first))
    with count_forward() as n:  # another pool: every window is in the store
        [r] = cache.fill(prepared, tmp_path / "c", other_pool.encoders, other_pool.cache)
    assert n["rows"] == 0 and r.cached == len(texts)
    with count_forward() as n:  # another overlap: only windows never seen
        [r] = cache.fill(prepared, tmp_path / "c", other_overlap.encoders, other_overlap.cache)
    new = windows(other_overlap) - windows(first)
    assert 0 < n["rows"] == len(new) < len(windows(other_overlap))
    assert spec.chunks is not None


def test_the_cut_is_logged_reported_and_warned_with_the_key(tiny_bert: Path, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    texts = _texts()
    prepared = make_prepared(tmp_path, texts)
    p = params(tiny_bert, {"max_length": 16})
    with caplog.at_level(logging.INFO):
        results = cache.fill(prepared, tmp_path / "c", p.encoders, p.cache)
    tok = _tok(tiny_bert)
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    over = [n for n in lengths if n > 16]
    assert results[0].cut["over_window"] == len(over) == 6
    want = sum(n - 16 for n in over) / sum(n - 2 for n in over)
    assert results[0].cut["dropped_token_share"] == round(want, 4)
    assert "6 of 12 texts longer than 16 tokens" in caplog.text
    warning = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert any("50 % of the texts are cut at 16 tokens" in w
               and "encoders.models.tiny.chunks.max" in w for w in warning)
    cache.write_report(tmp_path / "cache.json", results)
    report = json.loads((tmp_path / "cache.json").read_text())
    assert report["tiny"]["window"]["cut"] == 6 and report["tiny"]["texts"] == 12


def test_the_bundled_minilm_chunks_a_long_text_at_word_boundaries() -> None:
    from simtune.encoders import model_dir

    spec = params(Path(MINILM), {"max_length": 32,
                                 "chunks": {"max": 8, "overlap": 8, "pool": "mean"}}
                  ).encoders.models["tiny"]
    tok = transformers.AutoTokenizer.from_pretrained(model_dir("minilm", spec))
    text = ("Unbelievably, the footballers' championship-winning season ended in 1998; "
            "commentators called it extraordinary. ") * 6
    [windows] = Chunker(tok, spec, "query: ").windows([text])
    assert len(windows) > 2
    words = set(text.split())
    for w in windows:
        assert w.split()[0] in words or text.startswith(w)  # whole words only
        assert len(tok("query: " + w)["input_ids"]) <= 32


def _random_long_words(seed: int) -> list[str]:
    """Texts of random letter strings of 8-30 letters (each many WordPiece tokens) and texts
    without a space: windows start inside words, where a piece re-tokenised alone differs."""
    import random
    import string

    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(8, 30)))

    return ([" ".join(word() for _ in range(rng.randint(5, 15))) for _ in range(60)]
            + ["".join(word() for _ in range(6)) for _ in range(30)])


@pytest.mark.parametrize(("mx", "prompt"), [(50, ""), (3, ""), (3, "query: ")])
def test_probe_every_window_fits_exactly_and_the_cut_report_counts_what_none_holds(
        mx: int, prompt: str) -> None:
    """Issue 35 item 11: a window re-tokenised alone was max_length + 1 tokens (random long
    words, spaceless texts, max_length 16): the encoder dropped its last token and the cut
    report counted it as kept. Every window fits, and the report's dropped tokens are those
    of each text past its last window's end, counted here from the text's own offsets."""
    from simtune.encoders import model_dir

    spec = params(Path(MINILM), {"max_length": 16, "chunks": {"max": mx, "overlap": 4,
                                                              "pool": "mean"}}
                  ).encoders.models["tiny"]
    tok = transformers.AutoTokenizer.from_pretrained(model_dir("minilm", spec))
    texts = _random_long_words(0)
    cut = Cut()
    windows = Chunker(tok, spec, prompt).windows(texts, cut)
    sizes = [len(tok(prompt + w)["input_ids"]) for ws in windows for w in ws]
    assert max(sizes) <= 16 and len(sizes) == cut.windows
    dropped = cut_texts = 0
    for text, ws in zip(texts, windows, strict=True):
        at = 0
        for w in ws:  # each window a substring, in order
            at = text.index(w, at)
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"]
        past = sum(1 for _, b in offsets if b > at + len(ws[-1]))
        dropped, cut_texts = dropped + past, cut_texts + (past > 0)
    assert (cut.dropped, cut.cut) == (dropped, cut_texts)
    if mx == 50:
        assert cut_texts == 0
    else:
        assert cut_texts > 40
