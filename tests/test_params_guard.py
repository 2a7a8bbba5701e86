"""Issue 44 item 14: a stage run by DVC refuses when its params changed since the check stage
read them (two `dvc exp run` in one workspace: the second writes its `-S` values into
params.yaml before DVC refuses it), before it starts and when it ends."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from simtune.errors import UserError
from stages._common import check_params_unchanged
from tests.dvc_project import DvcProject
from tests.test_pipeline import _baseline_copy, _committed_baseline

HINT = ("(another dvc exp run, or an edit, meanwhile?): refused, so DVC records no values this "
        "stage did not run on; run it again (dvc repro or dvc exp run)")


def _edit(params: Path, section: str, key: str, value: object) -> None:
    raw = yaml.safe_load(params.read_text())
    raw[section][key] = value
    params.write_text(yaml.safe_dump(raw, sort_keys=False))


def test_the_run_hold_refuses_a_second_run_and_names_it_to_the_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stages._runlock` with the DVC processes stood in for: run A takes the workspace; B's
    stage is refused (noted in the record) while A lives; A then finds B's value in
    params.yaml and refuses naming the key and B; once A has ended, B takes the workspace."""
    from stages import _runlock

    (tmp_path / ".dvc").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "check")
    params = tmp_path / "params.yaml"
    params.write_text("train:\n  lr: 0.002  # mine\n  epochs: 3\n")
    a = {"pid": 11, "start": 1.0, "cmd": "dvc exp run -S train.lr=0.002"}
    b = {"pid": 22, "start": 2.0, "cmd": "dvc exp run -S train.lr=0.05"}
    alive = {11, 22}
    monkeypatch.setattr(_runlock, "_alive", lambda owner: owner["pid"] in alive)
    monkeypatch.setattr(_runlock, "_dvc_process", lambda: a)
    _runlock.hold()
    params.write_text("train:\n  lr: 0.002  # a comment edited: the same values\n  epochs: 3\n")
    _runlock.unchanged("while the check stage ran")  # the same values: runs on
    monkeypatch.setattr(_runlock, "_dvc_process", lambda: b)
    params.write_text("train:\n  lr: 0.05\n  epochs: 3\n")  # B's -S, written by DVC
    with pytest.raises(UserError) as refused:
        _runlock.hold()
    assert str(refused.value).startswith(
        "another DVC run is running this workspace's pipeline (pid 11: dvc exp run -S "
        "train.lr=0.002, since ")
    assert "refused before the check stage ran, so DVC records nothing of this run" in str(
        refused.value)
    monkeypatch.setattr(_runlock, "_dvc_process", lambda: a)
    monkeypatch.setenv("DVC_STAGE", "train")
    with pytest.raises(UserError) as stopped:
        _runlock.hold()
    assert str(stopped.value).startswith(
        "params.yaml's train.lr changed since this run's first stage read it (another DVC "
        "run, pid 22 (dvc exp run -S train.lr=0.05) at ")
    assert str(stopped.value).endswith(
        "refused, so DVC records no values this stage did not run on; run it again (dvc repro "
        "or dvc exp run)")
    alive.discard(11)  # A ended (failed): its hold goes with it
    monkeypatch.setattr(_runlock, "_dvc_process", lambda: b)
    _runlock.hold()
    _runlock.unchanged("while the train stage ran")
    monkeypatch.delenv("DVC_STAGE")  # a stage run by hand holds nothing, compares nothing
    params.write_text("train:\n  lr: 0.9\n")
    _runlock.hold()


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


def _dvc_in_background(project: DvcProject, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "dvc", *args], cwd=project.path,
                            env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _lr(tree: dict[str, Any]) -> float:
    return tree["train"]["schedule"]["head"]["lr"]


@pytest.mark.integration
@pytest.mark.parametrize("delay", [3, 12])
def test_a_second_exp_run_started_meanwhile_is_refused_and_the_first_says_so(
        pipeline_baseline: Path, tmp_path: Path, delay: int) -> None:
    """Issue 52 item 4: `dvc exp run` twice in one workspace, the second `delay` s after the
    first (at 3 s DVC itself may refuse it; at 12 s the first is training). The second never
    runs a stage: its check stage refuses, naming the first, so dvc.lock's check record (the
    params guard's) stays the first's. DVC wrote the second's `-S` into params.yaml before
    any stage ran, so the first either ends on its own values everywhere (nothing touched
    them) or stops at its next stage in one line naming the keys and the run that wrote them,
    never on DVC's own error ("'NoneType' object is not subscriptable") nor with the second's
    values in its reports or record (both before the fix)."""
    project, *_ = _committed_baseline(pipeline_baseline, tmp_path)
    first = _dvc_in_background(project, "exp", "run", "-n", "first", "-S",
                               "train.schedule.head.lr=0.002", "-S",
                               "train.schedule.head.max_epochs=10", "-S",
                               "train.schedule.head.patience=10")  # a few s of training
    time.sleep(delay)
    second = _dvc_in_background(project, "exp", "run", "-n", "second", "-S",
                                "train.schedule.head.lr=0.05")
    _, err2 = second.communicate(timeout=600)
    _, err1 = first.communicate(timeout=600)
    assert second.returncode != 0
    ours = f"another DVC run is running this workspace's pipeline (pid {first.pid}: dvc exp run"
    assert ours in err2 or "Unable to acquire lock" in err2, err2[-3000:]
    lock = yaml.safe_load((project.path / "dvc.lock").read_text())["stages"]
    assert _lr(lock["check"]["params"]["params.yaml"]) == 0.002, err2[-3000:]
    assert "NoneType" not in err1, err1[-3000:]
    if first.returncode == 0:
        train = json.loads((project.path / "reports" / "train.json").read_text())
        assert train["in_force"]["train.schedule.head.lr"] == 0.002
        shown = json.loads(project.dvc("exp", "show", "--json").stdout)
        recorded = {e["name"]: _lr(e["revs"][0]["data"]["params"]["params.yaml"]["data"])
                    for commit in shown for e in commit.get("experiments") or []}
        assert recorded == {"first": 0.002}, recorded
    else:
        said = [line for line in err1.splitlines() if line.startswith("error: params.yaml's")]
        assert said and "train.schedule.head.lr" in said[0] and " changed " in said[0], err1
        if ours in err2:  # the second ran simtune's check: the first names it
            assert f"another DVC run, pid {second.pid} (dvc exp run -n second" in said[0]
