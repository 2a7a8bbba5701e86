"""`simtune.atomic`: an error while writing names the user's file, never the temp name it was
being written under (issue 28 item 10), and a failed write leaves no temp file behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtune.atomic import atomic_dir, write_bytes
from stages import app
from tests.train_helpers import project, stage_args


def _no_temps(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def test_item10_rename_error_names_the_destination(tmp_path: Path) -> None:
    """A folder where the file should go: `os.replace(temp, dest)` fails naming the temp."""
    dest = tmp_path / "apply_ro.yaml"
    (dest / "inside").mkdir(parents=True)
    with pytest.raises(IsADirectoryError) as e:
        write_bytes(dest, b"x: 1\n")
    assert (e.value.filename, e.value.strerror) == (str(dest), "cannot write: Is a directory")
    assert ".tmp-" not in str(e.value)
    _no_temps(tmp_path)


def test_item10_temp_creation_error_names_the_destination(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An unwritable folder (an immutable one, as a tester saw: root passes a plain chmod):
    `mkstemp` fails naming `.apply_ro.yaml.tmp-kcyhpwby`; the error names `apply_ro.yaml`."""
    real_open = os.open

    def refuse(path: str, *args: object, **kwargs: object) -> int:
        if ".tmp-" in os.fspath(path):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refuse)
    dest = tmp_path / "apply_ro.yaml"
    with pytest.raises(PermissionError) as e:
        write_bytes(dest, b"x: 1\n")
    assert str(e.value) == f"[Errno 1] cannot write: Operation not permitted: '{dest}'"


def test_item10_atomic_dir_names_paths_inside_the_destination(tmp_path: Path) -> None:
    """A file the block fails to write inside the temp folder is named inside `dest`; the
    previous output stays."""
    dest = tmp_path / "prepared"
    with atomic_dir(dest) as tmp:
        (tmp / "old.txt").write_text("old")
    with pytest.raises(FileNotFoundError) as e, atomic_dir(dest) as tmp:
        (tmp / "no" / "such.txt").write_text("x")
    assert e.value.filename == str(dest / "no" / "such.txt")
    assert [p.name for p in dest.iterdir()] == ["old.txt"]
    _no_temps(tmp_path)


def test_item10_checkpoint_error_names_last_pt(tmp_path: Path, tiny_bert: Path) -> None:
    """A checkpoint that cannot be written (a folder named `last.pt` in the way): one line
    naming `last.pt`, not `.last.pt.tmp-…`, and no temp file left."""
    _, params_file = project(tmp_path, tiny_bert, n=40)
    last = tmp_path / "checkpoints" / "last.pt"
    (last / "x").mkdir(parents=True)
    result = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("INFO simtune.train.stage: monitor auto: map@r (10 validation queries "
                        "< train.auto.map_r_below 64)")
    assert lines[1] == "INFO simtune.train.stage: loss auto: supcon (groups data)"
    assert lines[2].startswith("INFO simtune.train.epochs: epoch 0 (the frozen encoder")
    # then the run estimate (issue 51) after the first steps, and the one error line
    assert [ln for ln in lines[3:] if not ln.startswith("INFO simtune.train.epoch_log: run "
                                                          "estimate")] == [
        f"error: {last}: cannot write: Is a directory"]
    _no_temps(last.parent)


def test_issue52_item7_stale_temps_go_and_outputs_follow_the_umask(tmp_path: Path) -> None:
    """A kill -9 between a temp's creation and its rename leaves `.NAME.tmp-XXXXXXXX`: the
    next write of that output removes it (a file, or a folder for `atomic_dir`); a name of
    another pattern, another output's temp or a temp a live writer holds (flock) stays.
    Every output gets 0666 / 0777 less the umask, never mkstemp's 0600."""
    import fcntl

    stale_file, stale_dir = tmp_path / ".a.json.tmp-k1x_9abc", tmp_path / ".out.tmp-zz00yy11"
    stale_file.write_text("half")
    (stale_dir / "inner").mkdir(parents=True)
    kept = [tmp_path / ".a.json.tmp-mine", tmp_path / ".b.json.tmp-k1x_9abc",
            tmp_path / "a.json.tmp-k1x_9abc", tmp_path / ".a.json.tmp-held0000"]
    for path in kept:
        path.write_text("not stale")
    old = os.umask(0o027)
    try:
        with kept[-1].open("rb") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            write_bytes(tmp_path / "a.json", b"{}\n")
            with atomic_dir(tmp_path / "out") as tmp:
                (tmp / "f").write_text("x")
    finally:
        os.umask(old)
    assert not stale_file.exists() and not stale_dir.exists()
    assert all(path.read_text() == "not stale" for path in kept)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a.json", "out", *(p.name for p in kept)])
