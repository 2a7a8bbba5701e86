"""Issue 44 item 14: a stage run by DVC refuses when its params changed since the check stage
read them (two `dvc exp run` in one workspace: the second writes its `-S` values into
params.yaml before DVC refuses it), before it starts and when it ends."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simtune.errors import UserError
from stages._common import check_params_unchanged
from tests.test_pipeline import _baseline_copy

HINT = ("(another dvc exp run, or an edit, meanwhile?): refused, so DVC records no values this "
        "stage did not run on; run it again (dvc repro or dvc exp run)")


def _edit(params: Path, section: str, key: str, value: object) -> None:
    raw = yaml.safe_load(params.read_text())
    raw[section][key] = value
    params.write_text(yaml.safe_dump(raw, sort_keys=False))


@pytest.mark.integration
def test_a_stage_refuses_params_changed_since_the_check_read_them(
        pipeline_baseline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state a second run's `-S` leaves: dvc.lock holds what the check stage read,
    params.yaml another value. The stages that list the key refuse in one line and write
    nothing; a stage that does not list it, a stage run by hand and the check stage run."""
    project, raw, params, _ = _baseline_copy(pipeline_baseline, tmp_path)
    monkeypatch.chdir(project.path)
    assert raw["evaluate"]["corpus"] == "train"
    _edit(params, "evaluate", "corpus", "test")  # train and evaluate list evaluate.corpus
    for stage, shown in (("train", "evaluate.corpus"), ("evaluate", "evaluate")):
        monkeypatch.setenv("DVC_STAGE", stage)
        with pytest.raises(UserError) as e:
            check_params_unchanged("since the check stage read it")
        assert str(e.value) == (f"params.yaml's {shown} changed since the check stage read it "
                                f"{HINT}")
    for stage in ("prepare", "cache", "negatives", "export", "check"):
        monkeypatch.setenv("DVC_STAGE", stage)
        check_params_unchanged("since the check stage read it")  # no key of theirs changed
    monkeypatch.delenv("DVC_STAGE")
    check_params_unchanged("since the check stage read it")  # run by hand: not compared

    # the command as DVC runs it: one line, exit 1, the last model left as it was
    before = (project.path / "reports" / "train.json").read_bytes()
    cmd = yaml.safe_load((project.path / "dvc.yaml").read_text())["stages"]["train"]["cmd"]
    project.env = {**project.env, "DVC_STAGE": "train"}
    proc = project.run(sys.executable, *cmd.split()[1:], check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: params.yaml's evaluate.corpus changed since the check stage read it {HINT}"]
    assert (project.path / "reports" / "train.json").read_bytes() == before


@pytest.mark.integration
def test_an_edit_while_train_runs_under_dvc_fails_the_stage_and_records_nothing(
        pipeline_baseline: Path, tmp_path: Path) -> None:
    """The race itself, under a real `dvc repro`: params.yaml's evaluate.corpus is edited
    while the train stage runs (as a second `dvc exp run -S` would), after the stage read it.
    The stage refuses when it ends, DVC fails and keeps train's dvc.lock entry (before the
    fix it recorded the new value beside a model trained on the old one); the next `dvc
    repro` runs train on the new value."""
    project, _, params, _ = _baseline_copy(pipeline_baseline, tmp_path)
    # a train key: the check stage reruns, then train (and what follows), not cache. The
    # baseline's one epoch ends within a second of the stage's first log line, and under a
    # loaded CI the edit came after it (evaluate refused instead); 300 epochs that cannot
    # stop early hold the stage open for several seconds after that line
    raw = yaml.safe_load(params.read_text())
    raw["train"]["schedule"]["head"].update(max_epochs=300, patience=300)
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    train_entry = yaml.safe_load((project.path / "dvc.lock").read_text())["stages"]["train"]
    dvc = subprocess.Popen([sys.executable, "-m", "dvc", "repro"], cwd=project.path,
                           env=project.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    assert dvc.stdout is not None
    out: list[str] = []
    deadline = time.monotonic() + 300
    training = False
    for line in dvc.stdout:
        out.append(line)
        training = training or "Running stage 'train'" in line
        if training and "simtune.train" in line:  # the stage has begun: it read its params
            _edit(params, "evaluate", "corpus", "test")  # the second run's -S
            break
        assert time.monotonic() < deadline, "".join(out)
    out.append(dvc.stdout.read())
    text = "".join(out)
    assert dvc.wait(timeout=300) != 0, text
    assert (f"error: params.yaml's evaluate.corpus changed while the train stage ran {HINT}"
            in text), text
    assert yaml.safe_load((project.path / "dvc.lock").read_text())["stages"]["train"] == (
        train_entry)  # DVC recorded nothing of the refused run
    rerun = project.dvc("repro")
    assert "Running stage 'train'" in rerun.stdout and "Running stage 'check'" in rerun.stdout
