"""`prepare.file.kind: texts`: a file of unlabelled texts joined to a prepared labelled data
set, whose splits, labels and texts stay as they were; the refusals, one line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from simtune import examples
from simtune import params as P
from simtune.errors import UserError
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import load, normalize, text_id, write
from stages import app
from tests.cache_helpers import make_prepared, sentences
from tests.conftest import repo_params, write_params


def texts_raw(texts_file: Path, labelled: Path | None, column: str = "body") -> dict[str, Any]:
    raw = repo_params()
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"].update(path=str(texts_file), kind="texts", labelled=(
        str(labelled) if labelled is not None else None))
    raw["prepare"]["file"]["columns"].update(text=column, label=None)
    return raw


def labelled_set(root: Path) -> Path:
    """A prepared groups set of 8 texts with one label (4 train, 2 val, 2 test)."""
    return make_prepared(root / "labelled", sentences(8))


def test_the_texts_join_the_labelled_set_as_unlabelled_examples(tmp_path: Path) -> None:
    labelled = labelled_set(tmp_path)
    before = load(labelled)
    new = sentences(3, 100)
    # a repeat (other whitespace), an empty text, a text the labelled set holds
    rows = [*new, "  " + new[0].replace(" ", "   ") + " ", "", sentences(1)[0]]
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in rows))
    prepared = prepare.build(P.validate(texts_raw(path, labelled)).prepare)
    assert prepared.kind == "groups" and prepared.unlabelled == 3
    ex = prepared.examples.to_pydict()
    n = before.examples.num_rows
    # the labelled examples first, as they were; then the new texts, sorted by id, no label
    assert {k: v[:n] for k, v in ex.items()} == before.examples.to_pydict()
    new_ids = sorted(text_id(normalize(t)) for t in new)
    assert ex["text_id"][n:] == new_ids
    assert ex["split"][n:] == ["unlabelled"] * 3 and ex["label"][n:] == [None] * 3
    assert prepared.text_map()[new_ids[0]] in new
    assert prepared.texts.num_rows == before.texts.num_rows + 3
    r = prepared.report
    assert (r["rows"], r["dropped_empty"], r["duplicates"], r["already_labelled"]) == (6, 1, 1, 1)
    assert r["examples"] == {"train": 4, "val": 2, "test": 2, "unlabelled": 3}
    # written and read back: meta.json counts them; the splits ignore them
    write(prepared, tmp_path / "prepared", tmp_path / "prepare.json")
    assert json.loads((tmp_path / "prepared" / "meta.json").read_text())["unlabelled"] == 3
    back = load(tmp_path / "prepared")
    assert back.unlabelled == 3 and load(labelled).unlabelled == 0
    splits = examples.build("groups", back.examples).splits
    assert [len(splits[s]) for s in ("train", "val", "test")] == [4, 2, 2]
    assert pq.read_table(tmp_path / "prepared" / "examples.parquet").num_rows == n + 3


@pytest.mark.parametrize(("edit", "message"), [
    ({"labelled": None}, "params.yaml: prepare: file.labelled: the folder of a prepared groups "
     "data set is needed for kind 'texts' (to validate and evaluate on), and only there"),
    ({"columns": {"text": None}}, "params.yaml: prepare: file.columns.text is required for "
     "kind 'texts'"),
])
def test_params_refusals(tmp_path: Path, edit: dict[str, Any], message: str) -> None:
    raw = texts_raw(tmp_path / "t.jsonl", tmp_path)
    for key, value in edit.items():
        if isinstance(value, dict):
            raw["prepare"]["file"][key].update(value)
        else:
            raw["prepare"]["file"][key] = value
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == message


def test_a_labelled_folder_that_is_not_a_labelled_groups_set_is_one_line(tmp_path: Path
                                                                          ) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"body": "a new text"}) + "\n")
    runner, out = CliRunner(), str(tmp_path / "out")

    def run(labelled: Path) -> str:
        params = write_params(tmp_path / "params.yaml", texts_raw(path, labelled))
        result = runner.invoke(app, ["prepare", "--params", str(params), "--out", out,
                                     "--report", str(tmp_path / "r.json")])
        assert result.exit_code != 0 and not Path(out).exists()
        lines = result.output.strip().splitlines()
        assert len(lines) == 1, result.output
        return lines[0]

    assert run(tmp_path / "nowhere") == (
        f"error: prepare.file.labelled: {tmp_path / 'nowhere'}: no such folder (prepare the "
        "labelled data set there first)")
    assert run(tmp_path) == (f"error: {tmp_path}: no prepared data here (run the prepare "
                             "stage first)")
    joined = tmp_path / "joined"
    labelled = labelled_set(tmp_path)
    write(prepare.build(P.validate(texts_raw(path, labelled)).prepare), joined,
          tmp_path / "j.json")
    assert run(joined) == (f"error: prepare.file.labelled: {joined}: groups data with "
                           "unlabelled texts; a texts file joins a labelled groups data set")
    known = tmp_path / "known.jsonl"
    known.write_text(json.dumps({"body": sentences(1)[0]}) + "\n")
    params = write_params(tmp_path / "params.yaml", texts_raw(known, labelled))
    result = runner.invoke(app, ["prepare", "--params", str(params), "--out", out])
    assert result.output.strip() == (f"error: {known}: no new texts (1 read, 0 empty, 1 "
                                     f"already in {labelled}, 0 repeated)")


def test_probe_texts_joined_into_their_own_labelled_folder_are_refused(tmp_path: Path) -> None:
    """`prepare.file.labelled` naming the stage's own --out folder would replace the labelled
    set with the joined one (the next run then refuses its own output): one line, the labelled
    folder left byte for byte as it was."""
    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"body": "a new text"}) + "\n")
    labelled = labelled_set(tmp_path)
    before = {f.name: f.read_bytes() for f in labelled.iterdir()}
    params = write_params(tmp_path / "params.yaml", texts_raw(path, labelled))
    result = CliRunner().invoke(app, ["prepare", "--params", str(params), "--out",
                                      str(labelled), "--report", str(tmp_path / "r.json")])
    assert result.exit_code != 0
    assert result.output.strip() == (
        f"error: prepare.file.labelled: {labelled} is the stage's output folder (--out): the "
        "joined data would replace the labelled set; prepare the texts into another folder")
    assert {f.name: f.read_bytes() for f in labelled.iterdir()} == before
    assert not (tmp_path / "r.json").exists()


def test_probe_a_half_written_labelled_folder_is_one_line(tmp_path: Path) -> None:
    """A folder with the prepared meta.json but without its tables (copied in part, or
    another tool's) is one line naming the missing file, not a FileNotFoundError traceback."""
    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"body": "a new text"}) + "\n")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "meta.json").write_bytes((labelled_set(tmp_path) / "meta.json").read_bytes())
    params = write_params(tmp_path / "params.yaml", texts_raw(path, broken))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["prepare", "--params", str(params), "--out", str(out),
                                      "--report", str(tmp_path / "r.json")])
    assert result.exit_code != 0 and not out.exists()
    assert result.output.strip() == (f"error: {broken}: no texts.parquet (a partial copy of "
                                     "prepared data?); run the prepare stage again")


def test_probe_a_text_of_a_keyed_labelled_set_is_not_joined_again(tmp_path: Path) -> None:
    """A labelled set prepared with `columns.key` has the keys as text ids, so a text it holds
    (a test text among them) compared by its hash id was joined again as an unlabelled
    training text: the test texts' teacher vectors leaked into training. Compared by content."""
    data = tmp_path / "keyed.jsonl"
    texts = sentences(16)
    data.write_text("".join(json.dumps({"text": t, "label": f"L{i % 2}", "id": f"doc{i}"})
                            + "\n" for i, t in enumerate(texts)))
    raw = repo_params()
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"]["path"] = str(data)
    raw["prepare"]["file"]["columns"].update(text="text", label="label", key="id")
    labelled = tmp_path / "labelled"
    write(prepare.build(P.validate(raw).prepare), labelled, tmp_path / "l.json")
    assert load(labelled).texts.column("text_id").to_pylist()[0].startswith("doc")
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"body": t}) + "\n"
                            for t in [texts[0], f"  {texts[15]} ", "a text of its own"]))
    joined = prepare.build(P.validate(texts_raw(path, labelled)).prepare)
    assert joined.unlabelled == 1
    assert (joined.report["already_labelled"], joined.report["texts"]) == (2, 17)
    ex = joined.examples.to_pydict()
    new = [t for t, s in zip(ex["text_id"], ex["split"], strict=True) if s == "unlabelled"]
    assert [joined.text_map()[t] for t in new] == [normalize("a text of its own")]


def test_probe_a_case_or_unicode_variant_of_a_labelled_text_is_not_joined(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 35 item 5: upper-cased and zero-width-prefixed copies of test texts got in as
    unlabelled texts (for an uncased encoder the test queries' very tokens: distillation trained
    on them). A text is compared by its Unicode (NFKC), case-folded, zero-width-free key; what
    is dropped so is counted and logged."""
    import logging

    labelled = labelled_set(tmp_path)
    held = sentences(8)
    variants = [held[6].upper(), "\u200b" + held[7], held[5].replace("a", "\uff41"),  # fullwidth
                "\ufeff" + held[4].title() + "\u200d"]
    new = sentences(2, 100)
    # a case variant of a new text repeats it too
    rows = [*variants, *new, new[0].upper()]
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in rows))
    with caplog.at_level(logging.INFO):
        prepared = prepare.build(P.validate(texts_raw(path, labelled)).prepare)
    assert prepared.unlabelled == 2
    ex = prepared.examples.to_pydict()
    joined = [prepared.text_map()[t] for t, s in zip(ex["text_id"], ex["split"], strict=True)
              if s == "unlabelled"]
    assert sorted(joined) == sorted(new)
    r = prepared.report
    assert (r["already_labelled"], r["duplicates"]) == (4, 1)
    assert (r["already_labelled_folded"], r["duplicates_folded"]) == (4, 1)
    assert any("4 texts already in" in m and "case, Unicode form or zero-width" in m
               for m in caplog.messages), caplog.messages
