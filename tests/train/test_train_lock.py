"""Issue 19 item 9: two `simtune train` writing the same outputs at once. The second is refused
in one line while the first holds the outputs' locks (`simtune.atomic.locked`); once the first
is done, the same command trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtune.atomic import is_locked, lock_file, locked
from simtune.errors import UserError
from stages import app
from tests.train_helpers import project, stage_args


@pytest.mark.parametrize("held", ["head", "train.json", "live"])
def test_item9_second_train_says_another_train_is_writing(tmp_path: Path, tiny_bert: Path,
                                                          held: str) -> None:
    _, params_file = project(tmp_path, tiny_bert, n=40)
    args = stage_args(tmp_path, params_file)
    output = tmp_path / held
    # the first train holds its outputs (flock is per open file: this process counts as another)
    with locked(lock_file(output), busy="unused"):
        assert is_locked(lock_file(output))
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert result.output.splitlines() == [
            f"error: another train is writing {output}; wait for it to finish (or stop it)"]
        assert not (tmp_path / "head").exists() and not (tmp_path / "train.json").exists()
    assert not is_locked(lock_file(output))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "train.json").read_text())["epochs"] >= 1
    assert sorted(p.name for p in tmp_path.glob(".*.lock")) == [
        ".head.lock", ".live.lock", ".train.json.lock"]
    assert not any(is_locked(p) for p in tmp_path.glob(".*.lock"))  # released at the end


def test_item9_lock_refuses_while_held_and_is_free_after(tmp_path: Path) -> None:
    path = tmp_path / "out" / ".x.lock"
    with locked(path), pytest.raises(UserError, match=r"^busy$"), locked(path, busy="busy"):
        pass
    with locked(path, busy="busy"):  # free again: taken at once
        assert is_locked(path)
