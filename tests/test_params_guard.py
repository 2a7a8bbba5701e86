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
    baseline = dict(raw["train"]["schedule"]["head"])
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
    # the baseline's schedule back (no second 300-epoch run): the edited key alone differs
    # from the lock, and the next repro runs train for it
    raw = yaml.safe_load(params.read_text())
    raw["train"]["schedule"]["head"] = baseline
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    rerun = project.dvc("repro")
    assert "Running stage 'train'" in rerun.stdout and "Running stage 'check'" in rerun.stdout


def _dvc_in_background(project: DvcProject, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "dvc", *args], cwd=project.path,
                            env=project.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _lr(tree: dict[str, Any]) -> float:
    return tree["train"]["schedule"]["head"]["lr"]


def _until_training(run: subprocess.Popen[str], at_least: float, started: float) -> str:
    """`run`'s output until its train stage has begun, then waits until `at_least` s after
    `started` (a loaded machine takes longer than that to get there: the second run must start
    while the first is inside its stages, as it does at 12 s on a quiet one)."""
    assert run.stdout is not None
    out = []
    for line in run.stdout:
        out.append(line)
        if "Running stage 'train'" in line:
            break
    time.sleep(max(0.0, started + at_least - time.monotonic()))
    return "".join(out)


OURS_REFUSED = "error: another DVC run is running this workspace's pipeline (pid {pid}: dvc exp run"


def _changed(out: str) -> bool:
    """A stage of the first run stopped in one line naming the second's key among those that
    changed under it (at 3 s the second's reset of params.yaml also undoes the first's own
    `-S` keys, so the line names them too), or naming the whole file (`stages._runlock`'s
    check of the bytes the run's first stage read, which can see the change first)."""
    head = "error: params.yaml's "
    return any(line.startswith(head) and " changed " in line and {
        "train.schedule.head.lr", "(the whole file)"} & set(
            line.removeprefix(head).split(" changed ")[0].split(", "))
        for line in out.splitlines())


# DVC's own refusals of a second run: the experiments lock, or the stage's rwlock on an output
DVC_LOCKED = ("Unable to acquire lock", "is busy, it is being blocked by")


def _dvc_locked(out: str) -> bool:
    return any(line in out for line in DVC_LOCKED)


@pytest.mark.integration
@pytest.mark.parametrize("delay", [3, 12])
def test_a_second_exp_run_started_meanwhile_is_refused_or_stops_the_first_saying_so(
        pipeline_baseline: Path, tmp_path: Path, delay: int) -> None:
    """Issue 52 item 4: `dvc exp run` twice in one workspace, the second `delay` s after the
    first (3 s: while the first starts, when DVC's own lock may refuse it; 12 s: once the
    first is training). DVC writes the second's `-S` into params.yaml before any stage runs, so
    the first either ends on its own values, the second refused, or stops at its next stage
    in one line naming the key; the second is refused while the first runs (by its stage
    naming the first, before the check stage writes dvc.lock's record), or runs on its own
    values once the first has stopped. Never both (before the fix the second ran its stages
    over the first's and both could end 0), never DVC's own error ("'NoneType' object is
    not subscriptable"), and a recorded experiment holds the values it trained on."""
    project, *_ = _committed_baseline(pipeline_baseline, tmp_path)
    started = time.monotonic()
    first = _dvc_in_background(project, "exp", "run", "-n", "first", "-S",
                               "train.schedule.head.lr=0.002", "-S",
                               "train.schedule.head.max_epochs=10", "-S",
                               "train.schedule.head.patience=10")
    if delay == 3:
        time.sleep(3)
        head = ""
    else:
        head = _until_training(first, delay, started)
    second = _dvc_in_background(project, "exp", "run", "-n", "second", "-S",
                                "train.schedule.head.lr=0.05")
    out2 = second.communicate(timeout=900)[0]
    out1 = head + first.communicate(timeout=900)[0]
    if ("NoneType" in out1 and _dvc_locked(out2) and not _changed(out1)
            and "Running stage 'export'" in out1):
        # the one window simtune cannot see (issue 52's note): the second's `-S` landed in
        # params.yaml after the first's last stage had checked it, before DVC committed the
        # experiment; no stage runs there. Seen at load ~5; shown, not hidden
        pytest.xfail("the second run's -S landed between the last stage and DVC's commit")
    assert "NoneType" not in out1 + out2 and "Traceback" not in out1 + out2, out1 + out2
    assert first.returncode != 0 or second.returncode != 0, out1 + out2  # not both
    refused = OURS_REFUSED.format(pid=first.pid)
    if first.returncode == 0:
        assert refused in out2 or _dvc_locked(out2), out2[-3000:]
        ran, lr = "first", 0.002
    else:
        assert _changed(out1) or _dvc_locked(out1), out1[-3000:]
        # the first's line names the second when the second was refused before the first's
        # stage saw the change; a stage that saw the -S first stops naming no run (none was
        # refused yet: seen on CI at load ~4), and never names another
        assert "another DVC run, pid" not in out1 or (
            f"another DVC run, pid {second.pid} (dvc exp run -n second" in out1), out1[-3000:]
        ran, lr = ("second", 0.05) if second.returncode == 0 else (None, None)
    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    recorded = {e["name"]: _lr(e["revs"][0]["data"]["params"]["params.yaml"]["data"])
                for commit in shown for e in commit.get("experiments") or []}
    assert recorded == ({ran: lr} if ran else {}), (recorded, out1[-2000:], out2[-2000:])
    if ran:  # the model in the workspace trained on the recorded value
        train = json.loads((project.path / "reports" / "train.json").read_text())
        assert train["in_force"]["train.schedule.head.lr"] == lr
