"""In a DVC project, `prepare.file.path` must lie under data/raw, the folder dvc.yaml's prepare
stage depends on: a file elsewhere could change and rerun nothing (`dvc status`: up to date).
The check stage (run first) and the prepare stage refuse it in one line, before the file is read;
symlinks and `..` are resolved. Outside a DVC project (no dvc.yaml beside the params file: the
library, a script) any path is read."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stages import app
from tests.conftest import ROOT, repo_params, write_params

RULE = ("must lie under data/raw/ (dvc.yaml's prepare stage depends on that folder alone, so a "
        "file elsewhere could change and rerun nothing): move the file there and point "
        "prepare.file.path at it")


def _project(tmp_path: Path, data: str, dvc: bool = True) -> Path:
    """A project laid out as dvc.yaml expects: its data/raw/good.csv, and outside it
    ../outside.csv and data/stray.csv (neither valid UTF-8: reading either would fail)."""
    proj = tmp_path / "proj"
    (proj / "data" / "raw").mkdir(parents=True)
    if dvc:
        shutil.copy(ROOT / "dvc.yaml", proj / "dvc.yaml")
    (proj / "data" / "raw" / "good.csv").write_text(
        "text,label\n" + "".join(f"text {i},L{i % 3}\n" for i in range(60)))
    for bad in (tmp_path / "outside.csv", proj / "data" / "stray.csv"):
        bad.write_bytes(b"text,label\ncaf\xe9,x\n")
    (proj / "data" / "raw" / "link.csv").symlink_to(tmp_path / "outside.csv")
    (proj / "data" / "raw2").mkdir()
    (proj / "data" / "raw2" / "x.csv").write_bytes(b"text,label\ncaf\xe9,x\n")
    raw: dict[str, Any] = repo_params()
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"].update(path=data, kind="groups")
    write_params(proj / "params.yaml", raw)
    return proj


def _run(proj: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(proj)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output.strip()


CHECK = ("check", "--params", "params.yaml", "--out", "reports/params_checked.json")
PREPARE = ("prepare", "--params", "params.yaml", "--out", "data/prepared", "--report",
           "reports/prepare.json")


@pytest.mark.parametrize(("data", "resolved"), [
    ("../outside.csv", None),
    ("data/raw/../stray.csv", None),
    ("data/raw2/x.csv", None),                 # a sibling whose name starts like data/raw
    ("data/raw/link.csv", "../outside.csv"),  # a symlink out of data/raw
])
@pytest.mark.parametrize("command", [CHECK, PREPARE])
def test_a_data_file_outside_data_raw_is_refused_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: str, resolved: str | None,
        command: tuple[str, ...]) -> None:
    proj = _project(tmp_path, data)
    code, output = _run(proj, monkeypatch, *command)
    target = f" (it resolves to {(proj / resolved).resolve()})" if resolved else ""
    assert (code, output) == (1, f"error: prepare.file.path: {data}{target} {RULE}")
    assert not (proj / "reports").exists() and not (proj / "data" / "prepared").exists()


def test_a_symlink_loop_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path, "data/raw/loop.csv")
    (proj / "data" / "raw" / "loop.csv").symlink_to("loop.csv")
    code, output = _run(proj, monkeypatch, *PREPARE)
    assert (code, output) == (1, "error: prepare.file.path: data/raw/loop.csv: cannot resolve "
                                 "it (a symlink loop?)")


@pytest.mark.parametrize("command", [CHECK, PREPARE])
def test_a_data_file_under_data_raw_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            command: tuple[str, ...]) -> None:
    proj = _project(tmp_path, "data/raw/good.csv")
    code, output = _run(proj, monkeypatch, *command)
    assert code == 0, output
    assert (proj / command[-1]).exists()


def test_an_absolute_path_under_data_raw_is_read(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    proj = _project(tmp_path, str(tmp_path / "proj" / "data" / "raw" / "good.csv"))
    assert _run(proj, monkeypatch, *PREPARE)[0] == 0


def test_without_dvc_yaml_any_path_is_read(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # no DVC project: the rule is the pipeline's, a script or the library reads any file
    proj = _project(tmp_path, "../outside.csv", dvc=False)
    code, output = _run(proj, monkeypatch, *PREPARE)
    assert code == 1 and output.endswith("outside.csv: not valid UTF-8 at byte 14 (line 2)")
    assert _run(proj, monkeypatch, *CHECK)[0] == 0
