"""The prepare stage: each source, normalisation, dedup counts, deterministic splits, bad input."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from simtune import params as P
from simtune.errors import UserError
from simtune.prepare import split
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import Prepared, normalize, text_id
from simtune.prepare.prepared import load as load_prepared
from stages import app
from tests.conftest import ROOT, write_params


def _params(raw: dict[str, Any]) -> P.PrepareParams:
    return P.validate(raw).prepare


def _file_params(raw: dict[str, Any], path: Path, kind: str = "groups", **split: Any
                 ) -> dict[str, Any]:
    p = raw["prepare"]
    p["source"] = "file"
    p["file"]["path"] = str(path)
    p["file"]["kind"] = kind
    if kind == "pairs":
        p["file"]["columns"].update(text=None, label=None, query="q", positive="d", score=None)
    p["split"].update(split)
    return raw


def _groups_rows(n_labels: int = 4, per_label: int = 20) -> list[tuple[str, str]]:
    return [(f"text {lab} number {i}", f"L{lab}") for lab in range(n_labels)
            for i in range(per_label)]


def _write(path: Path, rows: list[tuple[str, str]], header: tuple[str, str] = ("text", "label")
           ) -> Path:
    """Write rows as CSV, TSV, JSONL or Parquet by the path's extension."""
    suffix = path.suffix
    if suffix == ".parquet":
        pq.write_table(pa.table({header[0]: [r[0] for r in rows], header[1]: [r[1] for r in rows]}),
                       path)
    elif suffix == ".jsonl":
        objs = [dict(zip(header, r, strict=True)) for r in rows]
        path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    else:
        sep = "\t" if suffix == ".tsv" else ","
        lines = [sep.join(header), *(sep.join(f'"{c}"' if sep == "," else c for c in r)
                                     for r in rows)]
        path.write_text("\n".join(lines) + "\n")
    return path


def _split_map(prepared: Prepared, key: str = "text_id") -> dict[str, str]:
    ex = prepared.examples.to_pydict()
    return dict(zip(ex[key], ex["split"], strict=True))


# --- built-in sources --------------------------------------------------------------------------


def test_trec_fine_real_package_data(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"].update(source="trec", trec_labels="fine")  # whatever params.yaml says
    prepared = prepare.build(_params(params_raw))
    r = prepared.report
    assert prepared.kind == "groups"
    assert r["rows"] == 15452
    # "What is the HIGHEST Roman numeral ?" is a repeat of the lower-case one (`fold`)
    assert r["texts"] == 5379 == prepared.texts.num_rows == prepared.examples.num_rows
    assert (r["duplicates"], r["duplicates_folded"], r["conflicting_labels"]) == (10071, 3, 1)
    assert len(set(prepared.examples.column("label").to_pylist())) == 50
    assert sum(r["examples"].values()) == 5379
    # stratified: every label with >= 10 texts has ~10% in test
    for label, counts in r["per_label"].items():
        n = sum(counts.values())
        if n >= 10:
            assert abs(counts["test"] - 0.1 * n) < 1, label


def test_trec_coarse_has_six_labels(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"].update(source="trec", trec_labels="coarse")
    prepared = prepare.build(_params(params_raw))
    assert sorted(set(prepared.examples.column("label").to_pylist())) == [
        "ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    # the one text with two fine labels has a single coarse label, so it stays
    assert prepared.report["texts"] == 5380 and prepared.report["conflicting_labels"] == 0


def test_news_pairs_real_package_data(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["source"] = "news_pairs"
    prepared = prepare.build(_params(params_raw))
    assert prepared.kind == "pairs"
    r = prepared.report
    assert r["rows"] == 3824
    assert 3600 < sum(r["examples"].values()) <= 3824
    assert set(prepared.examples.column("score").to_pylist()) == {1.0}
    ex = prepared.examples.to_pydict()
    splits_of_query: dict[str, set[str]] = {}
    for q, s in zip(ex["query_id"], ex["split"], strict=True):
        splits_of_query.setdefault(q, set()).add(s)
    assert all(len(s) == 1 for s in splits_of_query.values())
    assert Counter(next(iter(s)) for s in splits_of_query.values()) == Counter(
        {k: v for k, v in r["queries"].items()})


# --- the user's file ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_every_format_gives_the_same_tables(tmp_path: Path, params_raw: dict[str, Any],
                                            suffix: str) -> None:
    rows = _groups_rows()
    reference = prepare.build(_params(_file_params(params_raw, _write(tmp_path / "a.csv", rows))))
    other = prepare.build(_params(_file_params(params_raw, _write(tmp_path / f"b{suffix}", rows))))
    assert other.texts.equals(reference.texts)
    assert other.examples.equals(reference.examples)
    assert reference.report["examples"] == {"train": 64, "val": 8, "test": 8}
    assert reference.report["per_label"]["L0"] == {"train": 16, "val": 2, "test": 2}


def test_explicit_format_overrides_extension(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    path = _write(tmp_path / "data.jsonl", _groups_rows())
    path = path.rename(tmp_path / "data.txt")
    params_raw = _file_params(params_raw, path)
    params_raw["prepare"]["file"]["format"] = "jsonl"
    assert prepare.build(_params(params_raw)).report["texts"] == 80


def test_normalise_dedup_and_counts(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    rows = [
        *_groups_rows(),
        ("  text 0 \t  number 0 ", "L0"),  # duplicate after whitespace normalisation
        ("text 0 number 1", "L0"),          # exact duplicate
        ("  a   new\ntext ", "L3"),          # new, stored normalised
        ("   ", "L1"),                      # empty text
        ("a question", ""),                 # empty label
        ("ambiguous", "L1"), ("ambiguous", "L2"),  # one text, two labels: dropped
    ]
    path = _write(tmp_path / "d.jsonl", rows)
    prepared = prepare.build(_params(_file_params(params_raw, path)))
    r = prepared.report
    assert (r["rows"], r["dropped_empty"], r["duplicates"], r["conflicting_labels"]) == (
        87, 2, 2, 1)
    texts = dict(zip(*prepared.texts.to_pydict().values(), strict=True))
    assert r["texts"] == len(texts) == 81
    assert "ambiguous" not in texts.values()
    assert texts[text_id("a new text")] == "a new text"


def test_text_id_is_stable_content_hash() -> None:
    a = text_id(normalize("  Hello\n  world\t"))
    assert a == text_id("Hello world")
    assert len(a) == 32 and int(a, 16) >= 0
    assert a != text_id("hello world")
    # NFC: a composed and a decomposed 'é' are the same text
    assert text_id(normalize("caf\u00e9")) == text_id(
        normalize("cafe\u0301"))


def test_split_is_deterministic_and_seeded(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    rows = _groups_rows(per_label=50)
    path = _write(tmp_path / "a.csv", rows)
    a = _split_map(prepare.build(_params(_file_params(params_raw, path))))
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    b = _split_map(prepare.build(_params(_file_params(params_raw,
                                                      _write(tmp_path / "b.csv", shuffled)))))
    assert a == b  # input order does not matter
    c = _split_map(prepare.build(_params(_file_params(params_raw, tmp_path / "a.csv", seed=14))))
    assert a.keys() == c.keys() and a != c
    assert Counter(a.values()) == Counter(c.values()) == {"train": 160, "val": 20, "test": 20}


def test_split_by_label_puts_each_label_in_one_split(tmp_path: Path,
                                                    params_raw: dict[str, Any]) -> None:
    path = _write(tmp_path / "a.csv", _groups_rows(n_labels=10, per_label=5))
    prepared = prepare.build(_params(_file_params(params_raw, path, by="label")))
    ex = prepared.examples.to_pydict()
    split_of_label: dict[str, set[str]] = {}
    for lab, s in zip(ex["label"], ex["split"], strict=True):
        split_of_label.setdefault(lab, set()).add(s)
    assert all(len(s) == 1 for s in split_of_label.values())
    assert prepared.report["labels"] == {"train": 8, "val": 1, "test": 1}


def test_pairs_split_by_query_keeps_all_positives_together(tmp_path: Path,
                                                           params_raw: dict[str, Any]) -> None:
    rows = [(f"query {i}", f"doc {i} {j}") for i in range(40) for j in range(3)]
    rows += [("query 0", "doc 0 0")]  # a duplicate pair
    path = _write(tmp_path / "p.csv", rows, header=("q", "d"))
    prepared = prepare.build(_params(_file_params(params_raw, path, kind="pairs")))
    r = prepared.report
    assert r["duplicates"] == 1 and r["texts"] == 160 and r["documents"] == 120
    assert r["queries"] == {"train": 32, "val": 4, "test": 4}
    ex = prepared.examples.to_pydict()
    per_query = Counter(zip(ex["query_id"], ex["split"], strict=True))
    assert len(per_query) == 40 and set(per_query.values()) == {3}


def test_prepare_on_pairs_says_what_an_empty_row_lacks(tmp_path: Path,
                                                        params_raw: dict[str, Any],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 36 item 9: pairs have no label, so the log does not say "(empty text or label)"."""
    rows = [(f"query {i}", f"doc {i}") for i in range(30)] + [("query x", " ")]
    path = _write(tmp_path / "p.csv", rows, header=("q", "d"))
    raw = _file_params(params_raw, path, kind="pairs")
    with caplog.at_level("INFO", logger="simtune.prepare"):
        prepare.run(_params(raw), tmp_path / "out", tmp_path / "r.json")
    assert "read 31 rows: 1 dropped (empty query or positive), 0 duplicates" in caplog.text
    assert "label" not in caplog.text


def test_pairs_score_column(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"q": f"q{i}", "d": f"d{i}", "s": i / 10}) + "\n"
                            for i in range(10)))
    raw = _file_params(params_raw, path, kind="pairs")
    raw["prepare"]["file"]["columns"]["score"] = "s"
    prepared = prepare.build(_params(raw))
    ex = prepared.examples.to_pydict()
    score = {q: s for q, s in zip(ex["query_id"], ex["score"], strict=True)}
    assert score[text_id("q7")] == pytest.approx(0.7)


# --- the stage command and bad input -----------------------------------------------------------


def _run_stage(tmp_path: Path, raw: dict[str, Any]) -> tuple[int, str, Path, Path]:
    params = write_params(tmp_path / "params.yaml", raw)
    out, report = tmp_path / "out" / "prepared", tmp_path / "out" / "prepare.json"
    result = CliRunner().invoke(app, ["prepare", "--params", str(params), "--out", str(out),
                                      "--report", str(report)])
    return result.exit_code, result.output, out, report


def test_stage_writes_tables_and_report(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    path = _write(tmp_path / "a.csv", _groups_rows())
    code, output, out, report = _run_stage(tmp_path, _file_params(params_raw, path))
    assert code == 0, output
    loaded = load_prepared(out)
    assert loaded.kind == "groups" and loaded.texts.num_rows == 80
    assert json.loads(report.read_text())["examples"] == {"train": 64, "val": 8, "test": 8}
    assert sorted(p.name for p in out.parent.iterdir()) == ["prepare.json", "prepared"]


def _bad_cases(tmp_path: Path) -> dict[str, tuple[Path, dict[str, Any], str]]:
    """name -> (data file, params edits, expected message fragment)."""
    good = _groups_rows()
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": \n')
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(b"text,label\nok,x\ncaf\xe9,y\n")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("text,label\na,x\nb,y,z\n")
    empty = _write(tmp_path / "empty.csv", [("  ", "x"), ("", "y")])
    tiny = _write(tmp_path / "tiny.csv", [("one", "x"), ("two", "x")])
    two_labels = _write(tmp_path / "two.csv", [(f"t{i}", f"L{i % 2}") for i in range(20)])
    nolabel = tmp_path / "nolabel.jsonl"
    nolabel.write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n')
    csv_path = _write(tmp_path / "good.csv", good)
    return {
        "missing file": (tmp_path / "nope.csv", {}, "nope.csv: data file not found"),
        "unknown extension": (tmp_path / "data.xlsx", {},
                              "data.xlsx: unknown file extension '.xlsx'"),
        "missing column": (csv_path, {"columns": {"label": "category"}},
                           "good.csv: missing column 'category' (the header has 2 columns: "
                           "'text', 'label')"),
        "missing column parquet": (_write(tmp_path / "g.parquet", good),
                                   {"columns": {"text": "body"}},
                                   "g.parquet: missing column 'body' (the header has 2 "
                                   "columns: 'text', 'label')"),
        "missing key jsonl": (nolabel, {}, "nolabel.jsonl: line 2: missing key 'label'"),
        "no usable rows": (empty, {}, "empty.csv: no usable rows (2 read, 2 with an empty field)"),
        "malformed jsonl": (bad_json, {}, "bad.jsonl: line 2: invalid JSON"),
        "non utf-8": (latin1, {}, "latin1.csv: not valid UTF-8 at byte 19 (line 3)"),
        "ragged csv": (ragged, {}, "ragged.csv: line 3: expected 2 fields, got 3"),
        "fractions": (csv_path, {"fractions": {"train": 0.9, "val": 0.1, "test": 0.1}},
                      "prepare.split.fractions: fractions must sum to 1 (they sum to 1.1)"),
        "empty split": (tiny, {}, "tiny.csv: split 'val' would be empty"),
        "too few labels": (two_labels, {"by": "label"},
                           "split by label needs at least 3 labels, the data has 2"),
        "unknown params key": (csv_path, {"shuffle": True},
                               "unknown key 'shuffle' in section 'prepare.split'"),
        "mistyped params key": (csv_path, {"seed": 1.5},
                                "prepare.split.seed: expected an integer, got 1.5"),
    }


BAD_CASES = ["missing file", "unknown extension", "missing column", "missing column parquet",
             "missing key jsonl", "no usable rows", "malformed jsonl", "non utf-8", "ragged csv",
             "fractions", "empty split", "too few labels", "unknown params key",
             "mistyped params key"]


def test_bad_case_list_is_complete(tmp_path: Path) -> None:
    assert sorted(_bad_cases(tmp_path)) == sorted(BAD_CASES)


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_one_line_nonzero_no_output(tmp_path: Path, params_raw: dict[str, Any],
                                              case: str) -> None:
    path, edits, expected = _bad_cases(tmp_path)[case]
    raw = _file_params(params_raw, path)
    for key, value in edits.items():
        if key == "columns":
            raw["prepare"]["file"]["columns"].update(value)
        else:
            raw["prepare"]["split"][key] = value
    code, output, out, _ = _run_stage(tmp_path, raw)
    assert code == 1
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert expected in lines[0]
    assert not out.parent.exists()  # nothing half-written


def test_failed_run_keeps_previous_output(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    path = _write(tmp_path / "a.csv", _groups_rows())
    assert _run_stage(tmp_path, _file_params(params_raw, path))[0] == 0
    before = (tmp_path / "out" / "prepared" / "examples.parquet").read_bytes()
    path.write_text("text,label\n")
    code, output, out, _ = _run_stage(tmp_path, _file_params(params_raw, path))
    assert code == 1 and "no usable rows" in output
    assert (out / "examples.parquet").read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["prepare.json", "prepared"]


def test_real_process_prints_no_traceback(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    raw = _file_params(params_raw, tmp_path / "missing.csv")
    params = write_params(tmp_path / "params.yaml", raw)
    proc = subprocess.run([sys.executable, "-m", "stages", "prepare", "--params", str(params),
                           "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: {tmp_path / 'missing.csv'}: data file not found"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_load_rejects_a_directory_without_prepared_data(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no prepared data here"):
        load_prepared(tmp_path)


@pytest.mark.parametrize(("meta", "message"), [
    ('{"format_version": 1}', '{meta}: kind null, expected "groups" or "pairs"; run the '
     "prepare stage again"),
    ('{"kind": "Groups", "format_version": 1}', '{meta}: kind "Groups", expected "groups" '
     'or "pairs"; run the prepare stage again'),
    ('{"kind": ["groups"], "format_version": 1}', '{meta}: kind ["groups"], expected '
     '"groups" or "pairs"; run the prepare stage again'),
    ('{"kind": "groups", ', "{meta}: unreadable (Expecting property name enclosed in double "
     "quotes: line 1 column 20 (char 19)); run the prepare stage again"),
    ("[1]", "{meta}: not a JSON object; run the prepare stage again"),
    ('{"kind": "pairs", "format_version": 1}', "{out}: meta.json says pairs data but "
     "examples.parquet lacks query_id, doc_id; run the prepare stage again"),
])
def test_probe_edited_meta_kind_is_one_line(tmp_path: Path, params_raw: dict[str, Any],
                                            meta: str, message: str) -> None:
    """A meta.json without a usable `kind` (or one the tables do not fit) is one line naming
    the file, from `load` and from the cache stage before it fills anything; it used to be a
    KeyError traceback, or (`null`, `Groups`) groups data searched as if it had no labels."""
    path = _write(tmp_path / "a.csv", _groups_rows())
    code, output, out, _ = _run_stage(tmp_path, _file_params(params_raw, path))
    assert code == 0, output
    (out / "meta.json").write_text(meta)
    expected = message.format(meta=out / "meta.json", out=out)
    with pytest.raises(UserError) as e:
        load_prepared(out)
    assert str(e.value) == expected
    if message.startswith("{out}"):  # meta.json alone is sound: the cache stage reads on
        return
    params_file = write_params(tmp_path / "params.yaml", params_raw)
    result = CliRunner().invoke(app, ["cache", "--params", str(params_file), "--prepared",
                                      str(out), "--out", str(tmp_path / "cache")])
    assert (result.exit_code, result.output.strip()) == (1, f"error: {expected}")
    assert not (tmp_path / "cache").exists()


def test_custom_key_column_becomes_the_text_id(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    path = tmp_path / "k.jsonl"
    rows = [{"id": f"doc-{i}", "text": t, "label": lab} for i, (t, lab) in
            enumerate(_groups_rows(per_label=10))]
    rows.append({"id": "doc-99", "text": "text 0 number 0", "label": "L0"})  # same text, new key
    rows.append({"id": "doc-0", "text": "text 0 number 0", "label": "L0"})   # exact duplicate
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = _file_params(params_raw, path)
    raw["prepare"]["file"]["columns"]["key"] = "id"
    prepared = prepare.build(_params(raw))
    ids = set(prepared.texts.column("text_id").to_pylist())
    assert ids == {f"doc-{i}" for i in range(40)} | {"doc-99"}
    assert prepared.report["duplicates"] == 1


def test_custom_key_naming_two_texts_is_an_error(tmp_path: Path,
                                                 params_raw: dict[str, Any]) -> None:
    path = tmp_path / "k.jsonl"
    path.write_text('{"id": "a", "text": "one", "label": "x"}\n'
                    '{"id": "a", "text": "two", "label": "x"}\n')
    raw = _file_params(params_raw, path)
    raw["prepare"]["file"]["columns"]["key"] = "id"
    with pytest.raises(UserError, match=r"k.jsonl: line 2: key 'a' already names another text "
                                        r"\(line 1\)"):
        prepare.build(_params(raw))


def test_per_label_counts_go_to_the_data_not_the_metrics(tmp_path: Path,
                                                         params_raw: dict[str, Any]) -> None:
    # per-label counts in the DVC metrics made `dvc exp show` 150 columns wider on TREC
    path = _write(tmp_path / "a.csv", _groups_rows(n_labels=3, per_label=10))
    params_raw["prepare"]["source"] = "file"
    params_raw["prepare"]["file"]["path"] = str(path)
    built = prepare.run(_params(params_raw), tmp_path / "prepared", tmp_path / "prepare.json")
    report = json.loads((tmp_path / "prepare.json").read_text())
    labels = json.loads((tmp_path / "prepared" / "labels.json").read_text())
    assert "per_label" not in report and report["texts"] == 30
    assert labels == built.report["per_label"] and sorted(labels) == ["L0", "L1", "L2"]
    assert all(sum(c.values()) == 10 for c in labels.values())


# --- echoed values stay short; long fields load ------------------------------------------------


def _one_line(tmp_path: Path, raw: dict[str, Any]) -> str:
    code, output, out, _ = _run_stage(tmp_path, raw)
    lines = output.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), output[:500]
    assert not out.parent.exists()
    return lines[0]


def test_a_huge_value_is_echoed_cut_to_80_characters(tmp_path: Path,
                                                     params_raw: dict[str, Any]) -> None:
    """A JSONL label that is a 200,000-element list: the line shows its first 80 characters."""
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"text": "a", "label": "x"}) + "\n"
                    + json.dumps({"text": "b", "label": [7] * 200_000}) + "\n")
    line = _one_line(tmp_path, _file_params(params_raw, path))
    shown = repr([7] * 30)[:80] + "…"
    assert line == f"error: {path}: line 2: column 'label': expected text, got {shown}"


def test_a_huge_score_and_header_are_echoed_short(tmp_path: Path,
                                                  params_raw: dict[str, Any]) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text("q,d,s\nquery,doc," + "9x" * 100_000 + "\n")
    raw = _file_params(params_raw, path, kind="pairs")
    raw["prepare"]["file"]["columns"]["score"] = "s"
    line = _one_line(tmp_path, raw)
    assert line == (f"error: {path}: line 2: column 's': expected a number, got "
                    f"{repr('9x' * 100)[:80]}…")
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"column{i}" for i in range(50_000)) + "\n"
                    + ",".join("v" for _ in range(50_000)) + "\n")
    raw = _file_params(params_raw, wide)
    raw["prepare"]["file"]["columns"].update(text="text", label="label", query=None,
                                             positive=None, score=None)
    line = _one_line(tmp_path, raw)
    assert line == f"error: {wide}: missing column 'text' (the header has 50000 columns)"
    raw["prepare"]["file"]["columns"]["text"] = "column7_"  # a typo: the closest is named
    line = _one_line(tmp_path, raw)
    assert line == (f"error: {wide}: missing column 'column7_' (the header has 50000 columns; "
                    "the closest is 'column7')")


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_field_over_the_csv_module_limit_loads(tmp_path: Path, params_raw: dict[str, Any],
                                                 suffix: str) -> None:
    """A 200,000-character field (Python's csv module stops at 131,072 by default) loads from
    CSV and TSV exactly as the same rows from JSONL."""
    rows = _groups_rows()
    rows[5] = ("long " + "word " * 40_000, rows[5][1])
    assert len(rows[5][0]) > 200_000
    table = _write(tmp_path / f"long{suffix}", rows)
    jsonl = _write(tmp_path / "long.jsonl", rows)
    got = prepare.build(_params(_file_params(params_raw, table)))
    want = prepare.build(_params(_file_params(params_raw, jsonl)))
    assert got.texts.equals(want.texts) and got.examples.equals(want.examples)
    assert max(len(t) for t in got.texts.column("text").to_pylist()) == 200_004


def test_a_huge_custom_key_is_echoed_short(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    path = tmp_path / "k.jsonl"
    key = "k" * 300_000
    path.write_text(json.dumps({"id": key, "text": "one", "label": "x"}) + "\n"
                    + json.dumps({"id": key, "text": "two", "label": "x"}) + "\n")
    raw = _file_params(params_raw, path)
    raw["prepare"]["file"]["columns"]["key"] = "id"
    with pytest.raises(UserError) as e:
        prepare.build(_params(raw))
    assert str(e.value) == (f"{path}: line 2: key {repr(key)[:80]}… already names another text "
                            "(line 1)")


# --- a BEIR / MTEB folder ----------------------------------------------------------------------


def _beir_folder(root: Path, qrels: dict[str, list[tuple[str, str, Any]]],
                 corpus: list[dict[str, Any]] | None = None,
                 queries: list[dict[str, Any]] | None = None) -> Path:
    """corpus.jsonl, queries.jsonl and qrels/<name>.tsv (`query-id corpus-id score`)."""
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    corpus = corpus if corpus is not None else [
        {"_id": f"d{i}", "title": "Title" if i % 2 else "", "text": f"doc  {i}"}
        for i in range(12)]
    queries = queries if queries is not None else [{"_id": f"q{i}", "text": f"query {i}"}
                                                    for i in range(30)]
    for name, rows in (("corpus", corpus), ("queries", queries)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, lines in qrels.items():
        (root / "qrels" / f"{name}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in lines))
    return root


def _beir_params(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"].update(path=str(folder), format="beir", kind="pairs")
    return raw


def test_beir_folder_becomes_pairs(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    folder = _beir_folder(tmp_path / "beir", {
        "train": [("q1", "d1", 1), ("q1", "d2", 0), ("q2", "d3", 1), ("q3", "d1", 1)],
        "dev": [("q4", "d4", 1)],
        "test": [("q5", "d5", 2), ("q5", "d6", 1), ("q5", "d7", 0), ("q6", "d6", 1),
                 ("q6", "d6", 1)]})
    prepared = prepare.build(_params(_beir_params(params_raw, folder)))
    assert prepared.kind == "pairs"
    ex = prepared.examples.to_pydict()
    rows = list(zip(ex["split"], ex["query_id"], ex["doc_id"], ex["score"], strict=True))
    assert rows == [
        ("train", "q:q1", "d:d1", 1.0), ("train", "q:q2", "d:d3", 1.0),
        ("train", "q:q3", "d:d1", 1.0),  # q1's score-0 qrel is never a training positive
        ("val", "q:q4", "d:d4", 1.0),    # dev.tsv is the validation split
        ("test", "q:q5", "d:d5", 2.0), ("test", "q:q5", "d:d6", 1.0),  # graded: kept
        ("test", "q:q5", "d:d7", 0.0), ("test", "q:q6", "d:d6", 1.0),
        # every document without an example stays in the corpus (d2 only had a score-0 qrel)
        *(("corpus", None, f"d:d{i}", None) for i in (0, 10, 11, 2, 8, 9))]
    texts = prepared.texts.to_pydict()
    by_id = dict(zip(texts["text_id"], zip(texts["text"], texts["source_id"], strict=True),
                     strict=True))
    assert by_id["d:d1"] == ("Title doc 1", "d1")  # title + " " + text, normalised
    assert by_id["d:d2"] == ("doc 2", "d2") and by_id["q:q5"] == ("query 5", "q5")
    assert sorted(by_id) == sorted([f"d:d{i}" for i in range(12)]
                                   + [f"q:q{i}" for i in range(1, 7)])  # q0, q7...: no qrels
    r = prepared.report
    assert r["examples"] == {"train": 3, "val": 1, "test": 4}
    assert r["queries"] == {"train": 3, "val": 1, "test": 2}
    assert (r["rows"], r["duplicates"], r["documents"], r["unjudged_documents"],
            r["nonrelevant_train_qrels"], r["qrels_skipped"], r["texts"]) == (
        10, 1, 12, 6, 1, 0, 18)


def test_beir_missing_qrels_files_are_cut_from_the_first_present(
        tmp_path: Path, params_raw: dict[str, Any]) -> None:
    """Only test.tsv (most BEIR sets): its queries are split by the fractions, seeded. With
    train.tsv and test.tsv: test stays as published, val is cut from train (0.1 / 0.9)."""
    only_test = _beir_folder(tmp_path / "a", {"test": [(f"q{i}", f"d{i % 12}", 1)
                                                       for i in range(20)]})
    got = prepare.build(_params(_beir_params(params_raw, only_test)))
    assert got.report["queries"] == {"train": 16, "val": 2, "test": 2}
    want = split.assign([f"q:q{i}" for i in range(20)], {"train": 0.8, "val": 0.1, "test": 0.1},
                        13, nonempty=True)
    assert _split_map(got, "query_id") | {None: "corpus"} == want | {None: "corpus"}
    two = _beir_folder(tmp_path / "b", {"train": [(f"q{i}", "d1", 1) for i in range(18)],
                                        "test": [(f"q{i}", "d2", 1) for i in range(18, 25)]})
    got = prepare.build(_params(_beir_params(params_raw, two)))
    assert got.report["queries"] == {"train": 16, "val": 2, "test": 7}
    split_of = _split_map(got, "query_id")
    assert {q for q, s in split_of.items() if s == "test"} == {f"q:q{i}" for i in range(18, 25)}


def test_beir_unknown_ids_are_skipped_counted_and_logged(
        tmp_path: Path, params_raw: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    corpus = [{"_id": f"d{i}", "text": f"doc {i}"} for i in range(10)] + [
        {"_id": "empty", "title": " ", "text": "  "}]
    folder = _beir_folder(tmp_path / "beir", {"test": [
        *((f"q{i}", f"d{i % 10}", 1) for i in range(20)), ("q1", "nope", 1), ("q99", "d1", 1),
        ("q2", "empty", 1)]}, corpus=corpus)
    with caplog.at_level("WARNING"):
        got = prepare.build(_params(_beir_params(params_raw, folder)))
    assert (got.report["qrels_skipped"], got.report["dropped_empty"]) == (3, 1)
    path = folder / "qrels" / "test.tsv"
    assert (f"3 qrels skipped (unknown or empty query or document); the first: {path}: line 22: "
            "corpus-id 'nope' not in corpus.jsonl") in caplog.text


def _beir_bad_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (folder, expected one-line message)."""
    good = {"test": [(f"q{i}", f"d{i % 12}", 1) for i in range(20)]}
    cases = {}

    def case(name: str, message: str, **kw: Any) -> Path:
        folder = _beir_folder(tmp_path / name.replace(" ", "_"), kw.pop("qrels", good), **kw)
        cases[name] = (folder, message.format(folder=folder))
        return folder

    f = case("no corpus", "{folder}/corpus.jsonl: file not found")
    (f / "corpus.jsonl").unlink()
    f = case("bad json", "{folder}/queries.jsonl: line 2: invalid JSON")
    (f / "queries.jsonl").write_text('{"_id": "q0", "text": "a"}\n{"_id": "q1", \n')
    case("no _id", "{folder}/corpus.jsonl: line 2: missing key '_id'",
         corpus=[{"_id": "d0", "text": "a"}, {"text": "b"}])
    case("repeated _id", "{folder}/corpus.jsonl: line 3: '_id' 'd0' repeats line 1",
         corpus=[{"_id": "d0", "text": "a"}, {"_id": "d1", "text": "b"},
                 {"_id": "d0", "text": "c"}])
    case("text not a string", "{folder}/queries.jsonl: line 1: column 'text': expected text, "
         "got [1, 2]", queries=[{"_id": "q0", "text": [1, 2]}])
    case("bad score", "{folder}/qrels/test.tsv: line 3: column 'score': expected a number, "
         "got 'high'", qrels={"test": [("q0", "d0", 1), ("q1", "d1", "high")]})
    case("ragged qrels", "{folder}/qrels/test.tsv: line 2: expected 3 fields, got 4",
         qrels={"test": [("q0", "d0", "1\tx")]})
    f = case("no header", "{folder}/qrels/test.tsv: missing column 'query-id'")
    (f / "qrels" / "test.tsv").write_text("q0\td0\t1\n")
    case("query in two splits", "{folder}/qrels/test.tsv: line 2: query-id 'q1' is also in "
         "qrels/train.tsv line 2 (a query belongs to one split)",
         qrels={"train": [("q1", "d1", 1)], "test": [("q1", "d2", 1)]})
    case("two scores", "{folder}/qrels/test.tsv: line 3: score 2 for a pair judged 1 at "
         "qrels/test.tsv line 2", qrels={"test": [("q1", "d1", 1), ("q1", "d1", 2)]})
    case("unknown split file", "{folder}/qrels/validation.tsv: unknown qrels split "
         "'validation' (expected train, dev or test)", qrels={"validation": good["test"]})
    f = case("no qrels", "{folder}/qrels: no qrels files")
    (f / "qrels" / "test.tsv").unlink()
    case("empty split", "{folder}: split 'val' would be empty (no usable qrels in "
         "qrels/dev.tsv)", qrels={"train": [("q1", "d1", 1)], "dev": [],
                                  "test": [("q3", "d3", 1)]})
    return cases


BEIR_BAD_CASES = ["no corpus", "bad json", "no _id", "repeated _id", "text not a string",
                  "bad score", "ragged qrels", "no header", "query in two splits", "two scores",
                  "unknown split file", "no qrels", "empty split"]


def test_beir_bad_case_list_is_complete(tmp_path: Path) -> None:
    assert sorted(_beir_bad_cases(tmp_path)) == sorted(BEIR_BAD_CASES)


@pytest.mark.parametrize("case", BEIR_BAD_CASES)
def test_beir_bad_input_one_line_nonzero_no_output(tmp_path: Path, params_raw: dict[str, Any],
                                                   case: str) -> None:
    folder, expected = _beir_bad_cases(tmp_path)[case]
    line = _one_line(tmp_path, _beir_params(params_raw, folder))
    assert line.startswith(f"error: {expected}"), line


def test_beir_params_and_a_folder_without_format(tmp_path: Path,
                                                 params_raw: dict[str, Any]) -> None:
    folder = _beir_folder(tmp_path / "beir", {"test": [("q1", "d1", 1)]})
    raw = _beir_params(params_raw, folder)
    raw["prepare"]["file"]["kind"] = "groups"
    assert _one_line(tmp_path, raw) == (f"error: {tmp_path / 'params.yaml'}: prepare: file.format "
                                        "beir is pairs data: set file.kind: pairs")
    raw["prepare"]["file"].update(kind="pairs", format="auto")
    raw["prepare"]["file"]["columns"].update(query="q", positive="d")
    assert _one_line(tmp_path, raw) == (f"error: {folder}: a directory; for a BEIR folder set "
                                        "prepare.file.format: beir")


def test_text_map_is_every_text_or_the_given_ids() -> None:
    texts = pa.table({"text_id": ["b", "a", "c"], "text": ["bee", "ay", "sea"]})
    prepared = Prepared("groups", texts, pa.table({"x": [1]}), {})
    assert list(prepared.text_map().items()) == [("b", "bee"), ("a", "ay"), ("c", "sea")]
    assert prepared.text_map(pa.array(["c", "b", "zz"])) == {"b": "bee", "c": "sea"}


def test_a_missing_label_column_lists_the_header_not_a_guess(tmp_path: Path,
                                                            params_raw: dict[str, Any]) -> None:
    """Issue 36 item 7: a missing label column named `text` as "the closest"; a header of
    column names is listed instead, so the user sees which to set."""
    path = tmp_path / "tickets.csv"
    path.write_text("text,category,Ticket ID\nprinter jammed,hardware,1\n")
    line = _one_line(tmp_path, _file_params(params_raw, path))
    assert line == (f"error: {path}: missing column 'label' (the header has 3 columns: "
                    "'text', 'category', 'Ticket ID')")
    path.write_text("text,labl\nprinter jammed,hardware\n")
    line = _one_line(tmp_path, _file_params(params_raw, path))
    assert line.endswith("missing column 'label' (the header has 2 columns: 'text', 'labl')")
    assert "closest" not in line


# --- issue 19: what a data file may echo, which files are read, which keys pass --------------

SECRET = "root:$6$SALTSALT$SECRETHASHSECRETHASH:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n"


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet", "beir"])
def test_item5_symlink_to_secret_not_echoed(tmp_path: Path, params_raw: dict[str, Any],
                                            suffix: str) -> None:
    """A data file (or BEIR qrels file) that is a symlink to a secret: the one line names the
    missing column and the header's size, never the secret's first line."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    if suffix == "beir":
        folder = _beir_folder(tmp_path / "beir", {"test": [("q1", "d1", 1)]})
        path = folder / "qrels" / "test.tsv"
        path.unlink()
        path.symlink_to(secret)
        raw, want = _beir_params(params_raw, folder), "missing column 'query-id'"
    else:
        path = tmp_path / f"x{suffix}"
        path.symlink_to(secret)
        raw = _file_params(params_raw, path)
        want = {".csv": "missing column 'text'", ".tsv": "missing column 'text'",
                ".jsonl": "line 1: invalid JSON", ".parquet": "cannot read Parquet"}[suffix]
    line = _one_line(tmp_path, raw)
    assert line.startswith(f"error: {path}: {want}"), line
    rest = line[len(f"error: {path}"):]  # the temporary path itself may hold "root"
    assert "SECRET" not in rest and "root" not in rest and "20228" not in rest, line
    if suffix in (".csv", ".tsv", "beir"):
        assert line.endswith("(the header has 1 column)"), line


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("where", ["file", "qrels", "corpus"])
def test_item5_fifo_or_device_is_not_a_regular_file(tmp_path: Path, params_raw: dict[str, Any],
                                                    kind: str, where: str) -> None:
    """A FIFO (reading would block) or /dev/zero (reading never ends) is "not a regular
    file", not "not found", and is never opened."""
    import os

    folder = _beir_folder(tmp_path / "beir", {"test": [("q1", "d1", 1)]})
    path = {"file": tmp_path / "x.csv", "qrels": folder / "qrels" / "test.tsv",
            "corpus": folder / "corpus.jsonl"}[where]
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    raw = _file_params(params_raw, path) if where == "file" else _beir_params(params_raw, folder)
    line = _one_line(tmp_path, raw)
    assert line == f"error: {path}: not a regular file (a FIFO, a device or a folder)"


@pytest.mark.parametrize("key", ["a b", "a\tb", "x\u00a0y"])
def test_item14_key_with_whitespace_refused(tmp_path: Path, params_raw: dict[str, Any],
                                            key: str) -> None:
    """Evaluate writes ids to whitespace-separated TREC run files: a key holding whitespace is
    refused in prepare, naming the file and row (leading/trailing blanks are trimmed, as
    before)."""
    path = tmp_path / "k.jsonl"
    rows = [{"id": f" k{i} ", "text": f"text {i}", "label": f"L{i % 4}"} for i in range(40)]
    rows[6]["id"] = key
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = _file_params(params_raw, path)
    raw["prepare"]["file"]["columns"]["key"] = "id"
    line = _one_line(tmp_path, raw)
    assert line == (f"error: {path}: line 7: key {key!r} holds whitespace (ids are written to "
                    "whitespace-separated run files)")
    rows[6]["id"] = " k6 "
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = prepare.build(_params(raw)).texts.column("text_id").to_pylist()
    assert sorted(ids) == sorted(f"k{i}" for i in range(40))


def _labels_of(prepared: Prepared) -> set[str]:
    return set(prepared.examples.column("label").to_pylist())


def test_item9_nan_label_dropped(tmp_path: Path, params_raw: dict[str, Any],
                                 caplog: pytest.LogCaptureFixture) -> None:
    """43 unrelated texts labelled `nan` (an export's empty cell) are no class: dropped,
    counted in the report and logged with the count, like empty labels."""
    rows = [*_groups_rows(), *((f"unrelated text {i}", "nan") for i in range(40)),
            ("unrelated x", "NaN"), ("unrelated y", " null "), ("unrelated z", "None"),
            ("empty label", "")]
    raw = _file_params(params_raw, _write(tmp_path / "d.csv", rows))
    with caplog.at_level("INFO", logger="simtune.prepare"):
        prepared = prepare.run(_params(raw), tmp_path / "out", tmp_path / "r.json")
    r = prepared.report
    assert _labels_of(prepared) == {"L0", "L1", "L2", "L3"}
    assert (r["texts"], r["dropped_empty"]) == (80, 44)
    assert r["missing_labels"] == {"NaN": 1, "None": 1, "nan": 40, "null": 1}
    assert "43 of the dropped rows have a label that reads as missing ('NaN' 1, 'None' 1, " \
           "'nan' 40, 'null' 1; prepare.file.missing_labels)" in caplog.text
    assert json.loads((tmp_path / "r.json").read_text())["missing_labels"]["nan"] == 40


def test_item9_json_null_and_nan_labels_dropped(tmp_path: Path,
                                                params_raw: dict[str, Any]) -> None:
    """JSON's `null` and `NaN` (a pandas export's gap) are no label either, whatever the list
    says: before, `NaN` stopped the stage with "expected text"."""
    path = tmp_path / "d.jsonl"
    lines = [json.dumps({"text": t, "label": lab}) for t, lab in _groups_rows()]
    lines += ['{"text": "gap one", "label": NaN}', '{"text": "gap two", "label": null}']
    path.write_text("\n".join(lines) + "\n")
    raw = _file_params(params_raw, path)
    raw["prepare"]["file"]["missing_labels"] = []
    prepared = prepare.build(_params(raw))
    assert (prepared.report["texts"], prepared.report["dropped_empty"]) == (80, 2)
    assert prepared.report["missing_labels"] == {}


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_item9_real_label_kept_when_told(tmp_path: Path, params_raw: dict[str, Any],
                                         suffix: str) -> None:
    """Told that `NA` and `null` are real labels (removed from the list), every reader keeps
    them as written: no reader turns them into a gap on its own (as pandas' read_csv would)."""
    rows = [*_groups_rows(n_labels=2), *((f"north america {i}", "NA") for i in range(20)),
            *((f"nothing {i}", "null") for i in range(20)), ("a gap", "nan")]
    raw = _file_params(params_raw, _write(tmp_path / f"d{suffix}", rows))
    raw["prepare"]["file"]["missing_labels"] = ["nan"]
    prepared = prepare.build(_params(raw))
    assert _labels_of(prepared) == {"L0", "L1", "NA", "null"}
    assert prepared.report["per_label"]["NA"] == {"train": 16, "val": 2, "test": 2}
    assert prepared.report["missing_labels"] == {"nan": 1}
    raw["prepare"]["file"]["missing_labels"] = ["nan", "NA", "null"]
    assert _labels_of(prepare.build(_params(raw))) == {"L0", "L1"}


def test_probe_every_label_missing_is_one_line(tmp_path: Path,
                                               params_raw: dict[str, Any]) -> None:
    """A file whose every label reads as missing stops the stage with one line that says so
    (its fields are not empty: "10 with an empty field" alone sent the user looking for
    blanks), exit 1, and nothing written."""
    rows = [(f"text {i}", "nan" if i % 2 else " NA ") for i in range(10)]
    raw = _file_params(params_raw, _write(tmp_path / "d.csv", rows))
    code, output, out, report = _run_stage(tmp_path, raw)
    assert code == 1
    assert output.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'd.csv'}: no usable rows (10 read, 10 with an empty field, 10 of "
        "them a label that reads as missing: prepare.file.missing_labels)")
    assert not out.exists() and not report.exists()
    # missing_labels emptied: the same 10 rows are usable (2 labels), only too few to split
    raw["prepare"]["file"]["missing_labels"] = [" ", ""]
    with pytest.raises(UserError, match=r"d\.csv: split 'test' would be empty: 2 of 2 labels "
                       r"have 2 or more texts, and each label's texts are split on their own"):
        prepare.build(_params(raw))


def test_probe_missing_labels_entry_with_spaces(tmp_path: Path,
                                                params_raw: dict[str, Any]) -> None:
    """An entry written with spaces (`" nan "`) matches the label `nan` and `  nan` (both
    normalised); an empty entry is no value (it does not make every row's label missing)."""
    rows = [*_groups_rows(), ("gap a", "nan"), ("gap b", "  nan"), ("real", "NA")]
    raw = _file_params(params_raw, _write(tmp_path / "d.csv", rows))
    raw["prepare"]["file"]["missing_labels"] = [" nan ", ""]
    prepared = prepare.build(_params(raw))
    assert prepared.report["missing_labels"] == {"nan": 2}
    assert _labels_of(prepared) == {"L0", "L1", "L2", "L3", "NA"}
