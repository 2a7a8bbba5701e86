"""Texts compared as the encoder sees them, for every kind (issue 44): case, Unicode form and
zero-width characters aside (`prepared.fold`); texts that are nothing but such characters are
empty; a header naming a column twice is refused; a data set with no label of two texts says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simtune import params as P
from simtune.errors import UserError
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import fold, text_id
from tests.conftest import repo_params
from tests.prepare.test_prepare import _beir_folder, _beir_params
from tests.prepare.test_texts import labelled_set, texts_raw

ZW = "\u200b"  # zero width space
BOM = "\ufeff"


def _groups(path: Path, **split: Any) -> P.PrepareParams:
    raw = repo_params()
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"].update(path=str(path), kind="groups")
    raw["prepare"]["split"].update(split)
    return P.validate(raw).prepare


def _pairs(path: Path) -> P.PrepareParams:
    raw = repo_params()
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"].update(path=str(path), kind="pairs")
    raw["prepare"]["file"]["columns"].update(text=None, label=None, query="q", positive="d")
    return P.validate(raw).prepare


def _csv(path: Path, rows: list[tuple[str, str]], header: str = "text,label") -> Path:
    path.write_text(header + "\n" + "".join(f'"{t}","{lab}"\n' for t, lab in rows),
                    encoding="utf-8")
    return path


def _sixty() -> list[tuple[str, str]]:
    """The tester's project: 60 texts in 3 labels."""
    return [(f"sample {lab} text {i}", lab) for lab in "ABC" for i in range(20)]


def _texts(prepared: Any) -> dict[str, str]:
    t = prepared.texts.to_pydict()
    return dict(zip(t["text_id"], t["text"], strict=True))


# --- item 4: folded groups and pairs ----------------------------------------------------------


def test_fold_is_case_unicode_form_and_zero_width_blind() -> None:
    fullwidth = "\uff43\uff49\uff54\uff59 river\u00a0name"  # and a no-break space
    twins = ["CITY RIVER NAME", "city river name", f"city{ZW} river name", fullwidth,
             f"{BOM}City  River\u200d Name"]
    assert [fold(t) for t in twins] == ["city river name"] * 5
    assert fold(ZW + BOM + "\u200c\u200d\u2060") == ""
    assert fold("city river names") != fold("city river name")


def test_groups_twins_by_case_or_zero_width_are_one_text(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = [*_sixty(), ("CITY RIVER NAME", "A"), ("city river name", "B"),
            (f"city{ZW} river name", "C"),  # one text, three labels: ambiguous, none kept
            ("Hello There", "A"), ("hello there", "A"), (f"{ZW}HELLO THERE", "A")]  # repeats
    with caplog.at_level("INFO", logger="simtune.prepare"):
        prepared = prepare.run(_groups(_csv(tmp_path / "t.csv", rows)), tmp_path / "out",
                               tmp_path / "prepare.json")
    assert ("read 66 rows: 0 dropped (empty text or label), 2 duplicates (2 of them only by "
            "case, Unicode form or zero-width characters), 1 texts dropped (one text, several "
            "labels)") in caplog.text
    r = prepared.report
    assert (r["rows"], r["conflicting_labels"], r["duplicates"], r["duplicates_folded"]) == (
        66, 1, 2, 2)
    texts = _texts(prepared)
    folded = [fold(t) for t in texts.values()]
    assert "city river name" not in folded
    assert folded.count("hello there") == 1
    assert texts[text_id("Hello There")] == "Hello There"  # the first form is the one kept
    assert r["texts"] == len(texts) == 61
    ex = prepared.examples.to_pydict()
    assert dict(zip(ex["text_id"], ex["label"], strict=True))[text_id("Hello There")] == "A"


def test_groups_exact_and_folded_conflicts_count_once_per_text(tmp_path: Path) -> None:
    rows = [*_sixty(), ("Same", "A"), ("same", "A"), ("SAME", "B"), ("other", "A"),
            ("other", "C")]
    r = prepare.build(_groups(_csv(tmp_path / "t.csv", rows))).report
    assert (r["conflicting_labels"], r["texts"]) == (2, 60)


def test_pairs_twins_by_case_or_zero_width_are_one_query_and_one_document(
        tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"q": f"question {i}", "d": f"answer {i}"} for i in range(40)]
    rows += [{"q": "What Is The Capital?", "d": "Paris is"},
             {"q": f"what is the{ZW} capital?", "d": "Rome is"},  # the same query
             {"q": "WHAT IS THE CAPITAL?", "d": "PARIS IS"},     # the same pair again
             {"q": "question 0", "d": f"{BOM}Answer 0"}]          # the same pair again
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepared = prepare.build(_pairs(path))
    r = prepared.report
    assert (r["rows"], r["duplicates"], r["duplicates_folded"]) == (44, 2, 2)
    texts = _texts(prepared)
    q = text_id("What Is The Capital?")
    assert texts[q] == "What Is The Capital?"
    assert [fold(t) for t in texts.values()].count("what is the capital?") == 1
    ex = prepared.examples.to_pydict()
    docs = sorted(texts[d] for qid, d in zip(ex["query_id"], ex["doc_id"], strict=True)
                  if qid == q)
    assert docs == ["Paris is", "Rome is"]  # one query, both positives, in one split
    assert len({s for s, qid in zip(ex["split"], ex["query_id"], strict=True) if qid == q}) == 1
    assert r["texts"] == len(texts) == 83 and r["documents"] == 42


# --- item 5: texts of zero-width characters only are empty --------------------------------------


def test_groups_zero_width_only_text_or_label_is_empty(tmp_path: Path) -> None:
    rows = [*_sixty(), (ZW, "A"), (BOM + "\u200d", "B"), (f" {ZW} ", "C"),
            ("a real text", ZW)]
    prepared = prepare.build(_groups(_csv(tmp_path / "t.csv", rows)))
    assert prepared.report["dropped_empty"] == 4
    assert sorted(_texts(prepared).values()) == sorted(t for t, _ in _sixty())


def test_pairs_zero_width_only_query_or_document_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"q": f"question {i}", "d": f"answer {i}"} for i in range(40)]
    rows += [{"q": ZW, "d": "an answer"}, {"q": "a question", "d": BOM + ZW}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepared = prepare.build(_pairs(path))
    assert prepared.report["dropped_empty"] == 2
    assert prepared.report["texts"] == 80


def test_texts_zero_width_only_text_is_empty(tmp_path: Path) -> None:
    labelled = labelled_set(tmp_path)
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in
                            ["a new unlabelled text", ZW, BOM + "\u2060"]))
    prepared = prepare.build(P.validate(texts_raw(path, labelled)).prepare)
    assert (prepared.unlabelled, prepared.report["dropped_empty"]) == (1, 2)


def test_beir_zero_width_only_document_is_empty(tmp_path: Path) -> None:
    corpus = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(12)]
    corpus[3] = {"_id": "d3", "title": ZW, "text": BOM}
    folder = _beir_folder(tmp_path / "beir", {"test": [(f"q{i}", f"d{i % 12}", 1)
                                                       for i in range(30)]}, corpus=corpus)
    raw = _beir_params(repo_params(), folder)
    prepared = prepare.build(P.validate(raw).prepare)
    r = prepared.report
    assert (r["dropped_empty"], r["documents"], r["qrels_skipped"]) == (1, 11, 3)
    assert "d:d3" not in _texts(prepared)


# --- item 6: a header naming a column twice ----------------------------------------------------


@pytest.mark.parametrize(("name", "sep"), [("t.csv", ","), ("t.tsv", "\t")])
def test_a_repeated_column_in_a_csv_or_tsv_header_is_refused(tmp_path: Path, name: str,
                                                           sep: str) -> None:
    path = tmp_path / name
    path.write_text(sep.join(["text", "label", "label"]) + "\n"
                    + "".join(sep.join([f"text {i}", f"L{i % 3}", "same"]) + "\n"
                              for i in range(30)))
    with pytest.raises(UserError) as e:
        prepare.build(_groups(path))
    assert str(e.value) == (f"{path}: column 'label' is named 2 times in the header (columns "
                            "2 and 3): rename or remove one")


def test_a_repeated_column_that_is_not_read_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("text,label,,\n" + "".join(f"text {i},L{i % 3},,\n" for i in range(30)))
    assert prepare.build(_groups(path)).report["texts"] == 30


def test_a_repeated_key_in_a_jsonl_row_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": f"text {i}", "label": f"L{i % 3}"}) + "\n"
                            for i in range(30)) + '{"text": "x", "label": "A", "label": "B"}\n'
                    '{"text": "y", "label": "A", "note": 1, "note": 2}\n')
    with pytest.raises(UserError) as e:
        prepare.build(_groups(path))
    assert str(e.value) == f"{path}: line 31: key 'label' is given 2 times: keep one"


def test_a_repeated_parquet_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    table = pa.Table.from_arrays([pa.array([f"text {i}" for i in range(30)]),
                                  pa.array([f"L{i % 3}" for i in range(30)]),
                                  pa.array(["same"] * 30)], names=["text", "label", "label"])
    pq.write_table(table, path)
    with pytest.raises(UserError) as e:
        prepare.build(_groups(path))
    assert str(e.value) == (f"{path}: column 'label' is named 2 times in the header (columns "
                            "2 and 3): rename or remove one")


# --- item 13: no label with two texts ---------------------------------------------------------


@pytest.mark.parametrize("by", ["row", "label"])
def test_every_text_its_own_label_says_so(tmp_path: Path, by: str) -> None:
    path = _csv(tmp_path / "t.csv", [(f"text {i}", f"L{i}") for i in range(60)])
    with pytest.raises(UserError) as e:
        prepare.build(_groups(path, by=by))
    assert str(e.value) == (f"{path}: no label has two texts (60 texts, each under a label of "
                            "its own): texts that share a label are the similar ones, so "
                            "groups data needs labels of several texts")


def test_few_labels_of_two_texts_say_how_many(tmp_path: Path) -> None:
    rows = [(f"text {i}", f"L{i}") for i in range(40)]
    rows += [("one more", "L0"), ("and another", "L1")]
    path = _csv(tmp_path / "t.csv", rows)
    with pytest.raises(UserError) as e:
        prepare.build(_groups(path))
    assert str(e.value) == (
        f"{path}: split 'val' would be empty: 2 of 40 labels have 2 or more texts, and each "
        "label's texts are split on their own (a label of few texts has none for fraction "
        "0.1); give the labels more texts or change prepare.split.fractions")
