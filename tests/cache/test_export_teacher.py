"""`train.distill.teacher: export` (issue 53 item 2): the cache stage takes this project's
`models/export` into its own output, keeps it while models/export holds a static student, and
says in one line why there is no teacher to take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simtune.cache.teacher import snapshot
from simtune.errors import UserError


def _export(folder: Path, weights: str, kind: str | None = None) -> Path:
    """A folder as the export stage writes one (its simtune.json and files; `kind: static`
    for a static student's)."""
    (folder / "encoder").mkdir(parents=True, exist_ok=True)
    (folder / "encoder" / "model.safetensors").write_text(weights)
    (folder / "simtune.json").write_text(json.dumps({"format_version": 3,
                                                     **({"kind": kind} if kind else {})}))
    return folder


def _files(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_the_export_is_taken_once_kept_past_a_static_student_and_retaken_when_new(
        tmp_path: Path) -> None:
    export, dest = tmp_path / "models" / "export", tmp_path / "cache" / "export.model"
    _export(export, "top-2 weights")
    assert snapshot(export, dest) is True
    assert _files(dest) == _files(export)
    assert snapshot(export, dest) is False  # the same files: nothing copied again
    # the static run's export stage writes the student there: the teacher stays the copy
    student = _files(dest)
    _export(export, "a token table", kind="static")
    assert snapshot(export, dest) is False and _files(dest) == student
    # a later run in another mode exports a new model: the next static run takes it
    _export(tmp_path / "new", "head weights")
    export.rename(tmp_path / "old")
    (tmp_path / "new").rename(export)
    assert snapshot(export, dest) is True and _files(dest) == _files(export)


@pytest.mark.parametrize(("kind", "what"), [
    (None, "does not exist"),
    ("static", "holds a static student (an earlier static run's export)"),
])
def test_no_teacher_to_take_is_one_line_naming_the_key(tmp_path: Path, kind: str | None,
                                                       what: str) -> None:
    export = tmp_path / "models" / "export"
    if kind:
        _export(export, "a token table", kind=kind)
    with pytest.raises(UserError) as e:
        snapshot(export, tmp_path / "cache" / "export.model")
    assert str(e.value) == (
        f"train.distill.teacher: export: {export} {what}, and no teacher was taken from it "
        f"before: run the pipeline in another train.mode first (dvc repro), so that {export} "
        "is the model to teach from")
    assert not (tmp_path / "cache").exists()
