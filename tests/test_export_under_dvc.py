"""Issue 52 item 1: the pipeline's own export keeps `simtune export`'s promise (docs/export.md):
a file of the user's inside `models/export` is never dropped without a line naming it.

DVC deleted a stage's outputs before its command (`dvc repro`), and `dvc exp run` and `dvc exp
apply` force a checkout of every cached output first, so the user's files went without a word
(exit 0). The out is now `persist` (not deleted) and uncached (never checked out): the export
stage sees the folder and refuses it, as `simtune export --out` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_pipeline import _committed_baseline, _ran

MINE = {"encoder/my_notes.txt": "my notes", "head/extra/keep.txt": "keep me",
        "userfile.txt": "mine"}
REFUSED = ("error: models/export: holds 'encoder/my_notes.txt' (and 2 more), which the export "
           "there did not write (not in its simtune.json's files): not replaced (export to a "
           "new or empty folder, or move it away)")


@pytest.mark.integration
def test_repro_and_exp_run_refuse_a_users_file_in_the_export_naming_it(
        pipeline_baseline: Path, tmp_path: Path) -> None:
    project, *_ = _committed_baseline(pipeline_baseline, tmp_path)
    export = project.path / "models" / "export"
    card = (export / "README.md").read_bytes()
    for rel, text in MINE.items():
        (export / rel).parent.mkdir(parents=True, exist_ok=True)
        (export / rel).write_text(text)
    for command in (("repro",), ("exp", "run")):  # exp run: DVC's forced checkout first
        proc = project.dvc(*command, check=False)
        assert proc.returncode != 0 and REFUSED in proc.stderr, (command, proc.stderr[-2000:])
        assert _ran(proc) == {"export"}, proc.stdout
        assert {rel: (export / rel).read_text() for rel in MINE} == MINE, command
        assert (export / "README.md").read_bytes() == card
    # the folder is the pipeline's, not git's (DVC lists an uncached out in no .gitignore)
    assert "models/export" not in project.git("status", "--porcelain",
                                              "--untracked-files=all").stdout
    # moved away, the export is the one dvc.lock records; forced, the stage replaces its own
    # folder (persist: DVC deleted nothing first) and writes the same files
    for rel in MINE:
        (export / rel).unlink()
    (export / "head" / "extra").rmdir()
    assert _ran(project.dvc("repro")) == set()
    forced = project.dvc("repro", "-f", "-s", "export")
    assert _ran(forced) == {"export"} and (export / "README.md").read_bytes() == card
    assert not [p for p in export.rglob("*") if p.name in {"userfile.txt", "extra"}]
