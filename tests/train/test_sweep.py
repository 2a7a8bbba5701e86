"""`simtune sweep`: the space's checks, pruning on a fake curve, resume after SIGKILL, and the
best trial reproduced by the train stage through its printed `-S` line and `--apply`."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from simtune import params as P
from simtune.errors import UserError
from simtune.train import space
from simtune.train import study as study_lib
from simtune.train import sweep as lib
from simtune.train import sweep_report as report
from simtune.train.epochs import EpochLoop
from simtune.train.validation import Schedule
from stages import app
from tests.conftest import ROOT, repo_params
from tests.train_helpers import project, stage_args

SPACE = {"train.schedule.head.lr": {"low": 0.002, "high": 0.05, "log": True},
         "train.head.type": {"choices": ["linear", "mlp"]},
         "train.schedule.head.batch_size": {"choices": [8, 16]}}


def _sweep_project(root: Path, model: Path, trials: int) -> tuple[dict[str, Any], Path]:
    raw, params_file = project(root, model, n=48)
    # fixed: a schedule other than train's (3 epochs, patience 2), so a line that left the
    # fixed keys out would not reproduce the trial
    raw["sweep"].update(trials=trials, storage=str(root / "reports" / "sweep.db"),
                        study="test", space=SPACE, min_epochs=1,
                        fixed={"train.schedule.head.max_epochs": 4,
                               "train.schedule.head.patience": 3})
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw, params_file


def _args(root: Path, params_file: Path, *extra: str) -> list[str]:
    return ["sweep", "--params", str(params_file), "--prepared", str(root / "prepared"),
            "--cache", str(root / "cache"), *extra]


# --- the space --------------------------------------------------------------------------------

@pytest.mark.parametrize(("entry", "message"), [
    ({"train.lrr": {"low": 0.1, "high": 1.0}},
     "params.yaml: sweep: space.train.lrr: not a key of the train section (a sweep varies "
     "train.* keys, e.g. train.schedule.head.lr)"),
    ({"model.lr": {"low": 0.1, "high": 1.0}},
     "params.yaml: sweep: space.model.lr: not a key of the train section (a sweep varies "
     "train.* keys, e.g. train.schedule.head.lr)"),
    ({"train.head": {"choices": ["mlp"]}},
     "params.yaml: sweep: space.train.head: a section or a list, not one value"),
    ({"train.mode": {"choices": ["head", "full"]}},
     "params.yaml: sweep: space.train.mode: cannot be swept (the loaded representation "
     "depends on it; it may be fixed: sweep.fixed)"),
    ({"train.schedule.head.lr": {"low": 0.1, "high": 0.01}},
     "params.yaml: sweep.space.train.schedule.head.lr: low 0.1 must be below high 0.01"),
    ({"train.schedule.head.lr": {"low": 0.0, "high": 0.01, "log": True}},
     "params.yaml: sweep.space.train.schedule.head.lr: log scale needs low > 0, got low 0.0"),
    ({"train.schedule.head.lr": {"low": 0.001, "high": 0.01, "choices": [0.1]}},
     "params.yaml: sweep.space.train.schedule.head.lr: give either choices or low/high (log), "
     "not both"),
    ({"train.schedule.head.lr": {"lo": 0.001, "high": 0.01}},
     "params.yaml: unknown key 'lo' in section 'sweep.space.train.schedule.head.lr' (allowed: "
     "low, high, log, choices)"),
    ({"train.head.dropout": {"low": 0.5, "high": 1.0}},
     "params.yaml: sweep.space.train.head.dropout: the value 1.0 is refused by the train "
     "schema (train.head.dropout: Input should be less than 1)"),
    ({"train.head.type": {"choices": ["linear", "cnn"]}},
     "params.yaml: sweep.space.train.head.type: the value 'cnn' is refused by the train "
     "schema (train.head.type: Input should be 'identity', 'linear', 'skip_connection', "
     "'gated' or 'mlp')"),
    ({"train.schedule.head.batch_size": {"low": 8.5, "high": 64}},
     "params.yaml: sweep.space.train.schedule.head.batch_size: the value 8.5 is refused by the "
     "train schema (train.schedule.head.batch_size: Input should be a valid integer)"),
    ({"fixed": {"train.max_epoch": 40}},
     "params.yaml: sweep: fixed.train.max_epoch: not a key of the train section (a sweep "
     "varies train.* keys, e.g. train.schedule.head.lr)"),
    ({"fixed": {"train.hard_negatives": 2}},
     "params.yaml: sweep: fixed.train.hard_negatives: cannot be swept (the loaded training "
     "rows depend on it)"),
    ({"fixed": {"train.schedule.head.lr": 0.01}},
     "params.yaml: sweep: fixed.train.schedule.head.lr: also in sweep.space (a key is either "
     "searched or fixed)"),
    ({"fixed": {"train.schedule.head.patience": -1}},
     "params.yaml: sweep.fixed.train.schedule.head.patience: the value -1 is refused by the "
     "train schema (train.schedule.head.patience: Input should be greater than or equal to 0)"),
    # the fixed values hold while the space is checked (params.yaml's batch 1024 fits chunks
    # of 512; a swept 256 does not)
    ({"fixed": {"train.gradcache.chunk_size": 512},
      "train.schedule.head.batch_size": {"choices": [256, 1024]}},
     "params.yaml: sweep.space.train.schedule.head.batch_size: the value 256 is refused by the "
     "train schema (train: gradcache.chunk_size (512) is larger than the batch size (256))"),
])
def test_a_bad_space_gives_one_line_naming_the_key(entry: dict[str, Any], message: str
                                                  ) -> None:
    raw = repo_params()
    raw["sweep"]["fixed"] = entry.pop("fixed", {})
    raw["sweep"]["space"] = entry or raw["sweep"]["space"]
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == message


def test_a_key_the_mode_ignores_is_refused_when_the_sweep_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # sweep.storage: reports/sweep.db, never created here
    raw = repo_params()
    raw["sweep"]["space"] = {"train.schedule.top_layers.lr": {"low": 0.001, "high": 0.01}}
    p = P.validate(raw)  # params.yaml stays valid for the pipeline's stages
    with pytest.raises(UserError) as e:
        lib.run(p, tmp_path / "prepared", tmp_path / "cache")
    assert str(e.value) == ("sweep.space.train.schedule.top_layers.lr: has no effect in "
                            "train.mode head (its schedule is train.schedule.head; set "
                            "sweep.fixed train.mode: top_layers to sweep that mode)")
    raw["train"]["mode"] = "top_layers"
    del raw["sweep"]["fixed"]["train.mode"]  # the mode the pipeline trains
    raw["sweep"]["space"] = {"train.schedule.head.lr": {"low": 0.001, "high": 0.01}}
    with pytest.raises(UserError) as e:
        lib.run(P.validate(raw), tmp_path / "prepared", tmp_path / "cache")
    assert str(e.value) == ("sweep.space.train.schedule.head.lr: has no effect in train.mode "
                            "top_layers (its schedule is train.schedule.top_layers; set "
                            "sweep.fixed train.mode: head to sweep that mode)")
    assert not (tmp_path / "reports").exists()


def test_the_cli_prints_the_space_error_as_one_line(tmp_path: Path) -> None:
    raw = repo_params()
    raw["sweep"]["space"] = {"train.schedule.head.lr": {"low": 0.1, "high": 0.01}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["sweep", "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code == 1
    assert result.output == ("error: " + str(tmp_path / "params.yaml") + ": sweep.space."
                             "train.schedule.head.lr: low 0.1 must be below high 0.01\n")


def test_suggest_picks_ints_for_int_keys_and_the_overrides_line_round_trips() -> None:
    entries = {k: P.SpaceEntry.model_validate(v) for k, v in {
        "train.schedule.head.max_epochs": {"low": 2, "high": 9},
        "train.schedule.head.lr": {"low": 0.001, "high": 0.1, "log": True},
        "train.head.type": {"choices": ["linear", "mlp"]}}.items()}
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    values = space.suggest(trial, entries)
    epochs, lr = values["train.schedule.head.max_epochs"], values["train.schedule.head.lr"]
    assert type(epochs) is int and 2 <= epochs <= 9
    assert type(lr) is float and 0.001 <= lr <= 0.1
    exact = {"train.schedule.head.lr": 1.2345678901234568e-05, "train.head.type": "mlp",
             "train.schedule.head.batch_size": 512, "train.loss.symmetric": True}
    line = space.overrides(exact)
    assert line == ("dvc exp run -S train.schedule.head.lr=1.2345678901234568e-05 "
                    "-S train.head.type=mlp -S train.schedule.head.batch_size=512 "
                    "-S train.loss.symmetric=true")
    assert space.parse_overrides(line) == exact


def test_write_yaml_changes_only_the_values_and_keeps_comments(tmp_path: Path) -> None:
    f = tmp_path / "params.yaml"
    f.write_text((ROOT / "params.yaml").read_text())
    space.write_yaml(f, {"train.schedule.head.lr": 1.5e-05, "train.head.type": "linear"})
    before, after = (ROOT / "params.yaml").read_text().splitlines(), f.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [
        ("    type: mlp             # identity | linear | skip_connection | gated | mlp",
         "    type: linear          # identity | linear | skip_connection | gated | mlp"),
        ("      lr: 0.005", "      lr: 1.5e-05")]
    assert P.load(f).train.schedule.head.lr == 1.5e-05


# --- pruning ----------------------------------------------------------------------------------

def _fake_epochs(loop: lib.PruningLoop, curve: list[float]) -> tuple[int, list[float]]:
    """Drive the loop's per-epoch hook through `curve` (validation values per epoch) as
    Lightning would; -> (epochs run before training stopped, values reported to the trial)."""
    trainer = SimpleNamespace(current_epoch=0, should_stop=False)
    for epoch, _ in enumerate(curve, 1):
        trainer.current_epoch = epoch - 1
        loop.on_train_epoch_end(trainer, None)  # type: ignore[arg-type]
        if trainer.should_stop:
            break
    return epoch, list(loop.trial.storage.get_trial(loop.trial._trial_id)
                       .intermediate_values.values())


def test_the_median_pruner_stops_a_trial_below_the_median(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    curves = {0: [0.5, 0.6, 0.7, 0.8], 1: [0.6, 0.7, 0.8, 0.9], 2: [0.4, 0.3, 0.9, 0.95]}

    def validate(self: EpochLoop, trainer: Any, module: Any) -> None:  # the fake curve
        epoch = trainer.current_epoch + 1
        self.schedule.record(epoch, curves[self.trial.number][epoch - 1])

    monkeypatch.setattr(EpochLoop, "on_train_epoch_end", validate)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(
        n_startup_trials=2, n_warmup_steps=2))
    runs = {}
    for number in curves:
        trial = study.ask()
        loop = lib.PruningLoop(trial, Schedule(1, 10, 4), None, "mrr@10", None)
        runs[number] = (*_fake_epochs(loop, curves[number]), loop.pruned_at)
        if loop.pruned_at:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, loop.schedule.best_value)
    # trials 0 and 1 are the pruner's start-up; trial 2 runs the warm-up (epoch 1 is not judged;
    # min_epochs 2 is the first judged step), then at epoch 2 its best 0.4 is below the median of
    # the others' values at step 2 (0.6, 0.7: 0.65), so it stops there: its 0.9 at epoch 3 is
    # never seen. The reported values are the best so far (the kept epoch's value).
    assert runs == {0: (4, [0.5, 0.6, 0.7, 0.8], 0), 1: (4, [0.6, 0.7, 0.8, 0.9], 0),
                    2: (2, [0.4, 0.4], 2)}


# --- a real sweep -----------------------------------------------------------------------------

def test_the_best_trial_through_its_line_and_apply_reproduces_its_value(
        tmp_path: Path, tiny_bert: Path) -> None:
    raw, params_file = _sweep_project(tmp_path, tiny_bert, trials=3)
    result = CliRunner().invoke(app, _args(tmp_path, params_file))
    assert result.exit_code == 0, result.output
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'reports' / 'sweep.db'}")
    study = optuna.load_study(study_name="test", storage=storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    line = result.stdout.strip().splitlines()[-1]
    assert line == space.overrides({"train.schedule.head.max_epochs": 4,
                                    "train.schedule.head.patience": 3,
                                    **study.best_trial.params}, temp=True)  # fixed keys first
    # the -S line applied to params.yaml as DVC does, then the train stage
    for key, value in space.parse_overrides(line).items():
        *parents, leaf = key.split(".")
        section = raw
        for part in parents:
            section = section[part]
        section[leaf] = value
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    train = CliRunner().invoke(app, stage_args(tmp_path, tmp_path / "s.yaml", "_s"))
    assert train.exit_code == 0, train.output
    report = json.loads((tmp_path / "train_s.json").read_text())
    # exactly (same seed), on the monitor `auto` resolved to in the trials and the stage alike
    assert report["best_val"][f"val/{report['monitor']}"] == study.best_value
    # --apply (the study is complete: no trial runs) writes the same values into the file
    applied = CliRunner().invoke(app, _args(tmp_path, params_file, "--apply"))
    assert applied.exit_code == 0, applied.output
    assert P.load(params_file) == P.load(tmp_path / "s.yaml")
    assert len(study.get_trials()) == 3


def test_a_top_layers_trial_trains_as_the_train_stage(tmp_path: Path, tiny_bert: Path
                                                      ) -> None:
    from simtune.cache import stage as cache
    from simtune.cache.views import layer_for

    raw, params_file = project(tmp_path, tiny_bert, n=48, mode="top_layers")
    raw["train"]["schedule"]["top_layers"].update({"layers": 1, "batch_size": 8,
                                                   "max_epochs": 2, "patience": 2})
    raw["sweep"].update(trials=2, storage=str(tmp_path / "sweep.db"), study="top", space={
        "train.schedule.top_layers.lr": {"low": 0.0005, "high": 0.005, "log": True},
        "train.schedule.top_layers.head_lr": {"low": 0.001, "high": 0.05, "log": True}}, fixed={})
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.validate(raw)
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    study = lib.run(p, tmp_path / "prepared", tmp_path / "cache")
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2
    best = study.best_trial.params
    space.write_yaml(params_file, best)
    assert P.load(params_file).train.schedule.top_layers.lr == best["train.schedule.top_layers.lr"]
    train = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert train.exit_code == 0, train.output
    report = json.loads((tmp_path / "train.json").read_text())
    # the monitor auto resolved to, the same in the trial and the stage
    assert report["best_val"][f"val/{report['monitor']}"] == study.best_value


def test_trials_leave_no_module_behind(tmp_path: Path, tiny_bert: Path) -> None:
    from simtune.train.module import SimilarityModule

    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=2)
    loaded = lib.load(P.load(params_file), tmp_path / "prepared", tmp_path / "cache")
    for lr in (0.01, 0.02):
        lib.train_trial(loaded, {"train.schedule.head.lr": lr})
    gc.collect()
    assert [o for o in gc.get_objects() if type(o) is SimilarityModule] == []


def test_a_killed_sweep_resumes_the_same_study(tmp_path: Path, tiny_bert: Path) -> None:
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=5)
    db = tmp_path / "reports" / "sweep.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, "-m", "stages", *_args(tmp_path, params_file)]

    def finished() -> int:
        if not db.exists():
            return 0
        with sqlite3.connect(db) as con:
            try:
                return con.execute("SELECT count(*) FROM trials WHERE state IN "
                                   "('COMPLETE', 'PRUNED')").fetchone()[0]
            except sqlite3.OperationalError:  # the tables are not created yet
                return 0

    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while finished() < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()  # type: ignore[union-attr]
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    killed = optuna.load_study(study_name="test", storage=storage)
    n_before, done = len(killed.trials), sum(t.state in lib.FINISHED for t in killed.trials)
    assert 2 <= done < 5
    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    summaries = optuna.study.get_all_study_summaries(storage)
    assert [s.study_name for s in summaries] == ["test"]  # the same study, not a new one
    trials = optuna.load_study(study_name="test", storage=storage).trials
    assert [t.number for t in trials] == list(range(len(trials)))
    assert sum(t.state in lib.FINISHED for t in trials) == 5
    # the trial the kill interrupted (if any) is failed; the rerun's trials come after it
    running = [t for t in killed.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert [trials[t.number].state for t in running] == \
        [optuna.trial.TrialState.FAIL] * len(running)
    assert all(t.state in lib.FINISHED for t in trials[n_before:])
    assert f"study 'test': {done} finished trials, running {5 - done} more" in rerun.stderr


# --- issue 28: a study bound to its data, locked, resumed without repeats ---------------------

@pytest.fixture
def fake_training(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Trials that refuse what the train stage refuses but do not train: the value is a
    function of the params (each call's values are recorded)."""
    calls: list[dict[str, Any]] = []

    def fake(loaded: lib.Loaded, values: dict[str, Any], trial: Any = None
             ) -> tuple[float, int, int]:
        lib._checked(loaded, values)
        calls.append(values)
        return 0.5 + values.get("train.schedule.head.lr", 0.0), 2, 0

    monkeypatch.setattr(lib, "train_trial", fake)
    return calls


def _study(root: Path, name: str = "test", db: str = "reports/sweep.db") -> optuna.Study:
    from urllib.parse import quote

    storage = optuna.storages.RDBStorage(f"sqlite:///{quote(str(root / db))}")
    return optuna.load_study(study_name=name, storage=storage)


def _with(params_file: Path, **changes: Any) -> P.Params:
    """params_file with dotted keys changed (written back), as loaded."""
    raw = yaml.safe_load(params_file.read_text())
    for key, value in changes.items():
        *parents, leaf = key.split("__")
        section = raw
        for part in parents:
            section = section[part]
        section[leaf] = value
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    return P.load(params_file)


def test_item1_study_identity_covers_data(tmp_path: Path, tiny_bert: Path,
                                          fake_training: list[dict[str, Any]]) -> None:
    from simtune.cache import stage as cache
    from simtune.prepare import stage as prepare
    from simtune.prepare.prepared import write as write_prepared

    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=2)
    dirs = (tmp_path / "prepared", tmp_path / "cache")
    lib.run(P.load(params_file), *dirs)
    where = f"sweep.study: study 'test' in {tmp_path / 'reports' / 'sweep.db'} was made for"
    hint = "; set sweep.study (or --study) to a new name"

    def reprepare(p: P.Params) -> None:
        write_prepared(prepare.build(p.prepare), dirs[0], tmp_path / "prepare.json")

    # another split of the same texts: the cache is the same, the prepared data is not
    p = _with(params_file, prepare__split__seed=14)
    reprepare(p)
    with pytest.raises(UserError) as e:
        lib.run(p, *dirs)
    assert str(e.value) == (f"{where} other prepared data (changed since: prepare.split.seed "
                            f"13 -> 14){hint}")
    # back to the study's data (a rebuild is exact): it resumes
    p = _with(params_file, prepare__split__seed=13)
    reprepare(p)
    assert len(lib.run(p.model_copy(update={"sweep": p.sweep.model_copy(
        update={"trials": 3})}), *dirs).trials) == 3
    # another encoder setting: other vectors
    p = _with(params_file, encoders__models__tiny__pooling="cls")
    cache.fill(dirs[0], dirs[1], p.encoders, p.cache)
    with pytest.raises(UserError) as e:
        lib.run(p, *dirs)
    assert str(e.value) == (f"{where} another cache (changed since: "
                            f"encoders.models.tiny.pooling mean -> cls){hint}")
    assert len(_study(tmp_path).trials) == 3 and len(fake_training) == 3
    # the mined negatives (read with train.hard_negatives > 0) are compared the same way
    old = {"version": 1, "space": {}, "params": {}, "prepared": "a", "cache": {}, "negatives": "n",
           "settings": {"negatives.count": 8}}
    assert study_lib.differences(old, {**old, "negatives": "m"}) == [
        "other mined negatives (its files changed)"]
    assert study_lib.differences(old, {**old, "negatives": "m",
                                       "settings": {"negatives.count": 4}}) == [
        "other mined negatives (changed since: negatives.count 8 -> 4)"]


def test_item3_apply_refuses_when_the_params_changed_since_the_study(
        tmp_path: Path, tiny_bert: Path, fake_training: list[dict[str, Any]]) -> None:
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=2)
    assert CliRunner().invoke(app, _args(tmp_path, params_file)).exit_code == 0
    _with(params_file, train__loss__name="triplet", train__weight_decay=0.02)
    before = params_file.read_text()
    result = CliRunner().invoke(app, _args(tmp_path, params_file, "--apply"))
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"error: sweep.study: study 'test' in {tmp_path / 'reports' / 'sweep.db'} was made for "
        "other params (train.loss.name auto -> triplet, train.weight_decay 0.01 -> 0.02); set "
        "sweep.study (or --study) to a new name")
    assert params_file.read_text() == before
    assert "Traceback" not in result.output


def test_item5_a_second_sweep_on_a_running_study_is_refused(
        tmp_path: Path, tiny_bert: Path, fake_training: list[dict[str, Any]]) -> None:
    from simtune.atomic import locked

    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=2)
    assert CliRunner().invoke(app, _args(tmp_path, params_file, "--trials", "1")).exit_code == 0
    db = tmp_path / "reports" / "sweep.db"
    running = _study(tmp_path).ask()  # the first sweep's trial in progress
    # the first sweep holds the study (flock is per open file: this process counts as another)
    with locked(study_lib.lock_path(db, "test")):
        result = CliRunner().invoke(app, _args(tmp_path, params_file))
        assert result.exit_code == 1
        assert result.output.splitlines() == [
            f"error: another sweep is running study 'test' ({db}); wait for it to finish "
            "(or stop it)"]
        assert _study(tmp_path).trials[running.number].state == \
            optuna.trial.TrialState.RUNNING  # untouched
        other = CliRunner().invoke(app, _args(tmp_path, params_file, "--study", "other"))
        assert other.exit_code == 0, other.output  # another study of the file is free
    assert len(fake_training) == 3
    result = CliRunner().invoke(app, _args(tmp_path, params_file))  # released: it resumes
    assert result.exit_code == 0, result.output
    assert _study(tmp_path).trials[running.number].state == optuna.trial.TrialState.FAIL


def test_item6_a_resumed_sweep_never_repeats_a_finished_trial(
        tmp_path: Path, tiny_bert: Path, fake_training: list[dict[str, Any]]) -> None:
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=3)
    p = P.load(params_file)
    dirs = (tmp_path / "prepared", tmp_path / "cache")
    lib.run(p, *dirs)
    lib.run(p.model_copy(update={"sweep": p.sweep.model_copy(update={"trials": 6})}), *dirs)
    params = [t.params for t in _study(tmp_path).trials]
    assert len(params) == 6 and all(a != b for i, a in enumerate(params) for b in params[:i])
    # a space of 4 combinations: 4 distinct trials, repeats proposed are skipped, not run
    grid = {"train.head.type": {"choices": ["linear", "mlp"]},
            "train.schedule.head.batch_size": {"choices": [8, 16]}}
    q = _with(params_file, sweep__space=grid, sweep__study="grid", sweep__trials=4)
    fake_training.clear()
    study = lib.run(q, *dirs)
    ran = sorted((v["train.head.type"], v["train.schedule.head.batch_size"]) for v in fake_training)
    assert ran == [("linear", 8), ("linear", 16), ("mlp", 8), ("mlp", 16)]
    skipped = [t for t in study.trials if "duplicate_of" in t.user_attrs]
    assert all(t.params == study.trials[t.user_attrs["duplicate_of"]].params for t in skipped)
    assert report.summary(study, 1, 4).splitlines()[0] == (
        "study 'grid': 4 of 4 finished (4 complete"
        + (f", {len(skipped)} skipped as repeats)" if skipped else ")"))
    with pytest.raises(UserError) as e:
        lib.run(_with(params_file, sweep__trials=5), *dirs)
    assert str(e.value) == ("sweep.trials: 5 trials asked of a space that holds 4 distinct ones; "
                            "lower sweep.trials (or --trials)")


def _freeze(path: Path, frozen: bool = True) -> bool:
    """Make the file or folder `path` unwritable (chattr +i as root, else a read-only mode), or
    writable again (`frozen` False); -> whether writing it now fails (not on every file system)."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i" if frozen else "-i", str(path)],
                              capture_output=True).returncode == 0
    else:
        path.chmod((0o555 if path.is_dir() else 0o444) if frozen else 0o755)
        done = True
    probe = path / "probe" if path.is_dir() else path
    try:
        with probe.open("ab"):
            pass
    except OSError:
        return done
    if path.is_dir():
        probe.unlink()
    return False


@pytest.mark.parametrize(("case", "message"), [
    ("folder", "{path}: a folder, not a study file (name a file, e.g. {path}/sweep.db)"),
    ("garbage", "{path}: not a SQLite file; name another file or delete it"),
    ("truncated", "{path}: a damaged SQLite file (database disk image is malformed); restore "
                  "it or name another file"),
    ("other_db", "{path}: a SQLite database of something else (no Optuna studies in it); name "
                 "another file"),
    ("proc", "{path}: cannot create the study file in /proc (No such file or directory)"),
    ("immutable", "{path}: cannot create the study file in {parent} (Operation not "
                  "permitted)"),
    ("url", "'postgresql://u@h/db': a study is stored in a SQLite file; give its path "
            "(reports/sweep.db) or sqlite:///path"),
])
def test_item7_storage_errors_are_one_line_naming_the_file(tmp_path: Path, case: str,
                                                           message: str) -> None:
    import sqlite3

    path = tmp_path / "s" / "sweep.db"
    path.parent.mkdir()
    if case == "folder":
        path.mkdir()
    elif case == "garbage":
        path.write_bytes(b"\x00\x01 not a database" * 100)
    elif case in ("truncated", "other_db"):
        with sqlite3.connect(path) as con:
            table = "studies" if case == "truncated" else "songs"
            con.execute(f"CREATE TABLE {table} (x TEXT)")
            con.executemany(f"INSERT INTO {table} VALUES (?)", [("x" * 500,)] * 200)
        if case == "truncated":
            path.write_bytes(path.read_bytes()[:20000])
    elif case == "proc":
        path = Path("/proc/x.db")
    elif case == "immutable":
        path = tmp_path / "ro" / "sweep.db"
        path.parent.mkdir()
        if not _freeze(path.parent):
            pytest.skip("no unwritable folder on this file system")

    raw = repo_params()
    raw["sweep"]["storage"] = "postgresql://u@h/db" if case == "url" else str(path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    try:
        result = CliRunner().invoke(app, ["sweep", "--params", str(tmp_path / "params.yaml"),
                                          "--prepared", str(tmp_path), "--cache", str(tmp_path)])
    finally:
        if case == "immutable":
            _freeze(path.parent, frozen=False)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "error: sweep.storage: " + message.format(path=path, parent=path.parent)]


def test_item7_a_storage_name_is_literal_and_a_sqlite_url_is_its_path(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch,
        fake_training: list[dict[str, Any]]) -> None:
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=1)
    monkeypatch.chdir(tmp_path)
    for storage, file in (("reports/what?x=1.db", "reports/what?x=1.db"),
                          ("sqlite:///reports/url.db", "reports/url.db"),
                          (f"sqlite:///{tmp_path}/abs%20db.db", "abs db.db")):
        _with(params_file, sweep__storage=storage)
        result = CliRunner().invoke(app, _args(tmp_path, params_file))
        assert result.exit_code == 0, result.output
        assert len(_study(tmp_path, db=file).trials) == 1
    assert sorted(p.name for p in (tmp_path / "reports").iterdir() if p.suffix == ".db") == [
        "url.db", "what?x=1.db"]
    assert not (tmp_path / "reports" / "what").exists() and not (tmp_path / "sqlite:").exists()
    # a study file that cannot be written (Optuna writes as it opens one): one line
    url = tmp_path / "reports" / "url.db"
    _with(params_file, sweep__storage=str(url))
    if _freeze(url):
        try:
            result = CliRunner().invoke(app, _args(tmp_path, params_file, "--trials", "2"))
        finally:
            _freeze(url, frozen=False)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert result.output.splitlines()[-1] == (
            f"error: sweep.storage: {url}: cannot open the study (attempt to write a readonly "
            "database)")
    with pytest.raises(UserError) as e:
        study_lib.storage_path("sqlite:///reports/x.db?mode=ro")
    assert str(e.value) == ("sweep.storage: 'sqlite:///reports/x.db?mode=ro': give a sqlite:/// "
                            "URL a file path and no query (or give the file's path itself)")


def test_item8_a_choice_that_can_never_train_is_refused_when_the_sweep_starts(
        tmp_path: Path, tiny_bert: Path, fake_training: list[dict[str, Any]]) -> None:
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=3)
    p = _with(params_file, sweep__space={"train.loss.name": {"choices": ["supcon", "mnrl"]},
                                         "train.schedule.head.lr": {"low": 0.001, "high": 0.01}})
    with pytest.raises(UserError) as e:
        lib.run(p, tmp_path / "prepared", tmp_path / "cache")
    assert str(e.value) == (
        "sweep.space.train.loss.name: no trial can train with mnrl on this data "
        "(train.loss.name: 'mnrl' needs pairs data, the prepared data is groups (use auto or "
        "one of supcon, triplet, contrastive, arcface, cosine_mse)); remove it from the space")
    # a choice that fails with some of the other keys' choices only is kept (identity is a
    # head arcface trains; the others need one in head mode)
    q = _with(params_file, sweep__space={"train.loss.name": {"choices": ["supcon", "arcface"]},
                                         "train.head.type": {"choices": ["identity", "mlp"]}})
    lib.check_values(lib.load(q, tmp_path / "prepared", tmp_path / "cache"))
    # a fixed key no trial can train with: the sweep, not a swept key, is refused
    r = _with(params_file, sweep__space=SPACE, sweep__fixed={"train.loss.name": "mnrl"})
    with pytest.raises(UserError, match=r"^sweep: no trial can train on this data: "
                       r"train.loss.name: 'mnrl' needs pairs data"):
        lib.run(r, tmp_path / "prepared", tmp_path / "cache")
    assert not (tmp_path / "reports").exists() and fake_training == []


def test_item8_a_failing_trial_is_one_line_and_the_sweep_exits_non_zero(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch,
        fake_training: list[dict[str, Any]]) -> None:
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=3)
    fake = lib.train_trial

    def second_fails(loaded: lib.Loaded, values: dict[str, Any], trial: Any = None
                     ) -> tuple[float, int, int]:
        if len(fake_training) == 1:
            fake_training.append(values)
            raise UserError("train.schedule.head.lr: training diverged at epoch 1, step 2: the "
                            "loss is nan")
        return fake(loaded, values, trial)

    monkeypatch.setattr(lib, "train_trial", second_fails)
    result = CliRunner().invoke(app, _args(tmp_path, params_file, "--apply"))
    assert result.exit_code == 1
    failed = [line for line in result.output.splitlines() if "failed" in line]
    assert len(failed) == 3 and "Traceback" not in result.output
    assert re.fullmatch(r".*: trial 1: failed: train.schedule.head.lr: training diverged at "
                        r"epoch 1, step 2: the loss is nan, \d+\.\d s", failed[0])
    assert failed[1] == "study 'test': 2 of 3 finished (2 complete, 1 failed)"
    assert failed[2] == ("error: sweep: 1 trial(s) failed in this run (trial 1, see its line "
                         "above); run the sweep again for the missing ones; nothing applied")
    assert P.load(params_file).train.schedule.head.lr == 0.01  # not applied
    again = CliRunner().invoke(app, _args(tmp_path, params_file))  # runs the missing one
    assert again.exit_code == 0, again.output
    assert "study 'test': 3 of 3 finished (3 complete, 1 failed)" in again.stdout


def test_item9_a_swept_key_the_loss_ignores_is_warned_or_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    raw = repo_params()  # auto: supcon on groups data, mnrl on pairs
    raw["sweep"]["space"] = {"train.loss.margin": {"low": 0.1, "high": 0.5}}
    for kind, loss in (("groups", "supcon"), ("pairs", "mnrl")):
        with pytest.raises(UserError) as e:
            space.check_ignored(P.validate(raw), kind)
        assert str(e.value) == (f"sweep.space: train.loss.name {loss} reads none of the swept "
                                "keys (train.loss.margin): every trial would train the same")
    raw["sweep"]["space"]["train.schedule.head.lr"] = {"low": 0.001, "high": 0.01}
    raw["sweep"]["fixed"] = {"train.loss.scale": 30.0}
    with caplog.at_level("WARNING"):
        space.check_ignored(P.validate(raw), "groups")
    assert [r.getMessage() for r in caplog.records] == [
        "sweep.space.train.loss.margin: train.loss.name supcon does not read it (arcface, "
        "contrastive, triplet do): every value of it trains the same",
        "sweep.fixed.train.loss.scale: train.loss.name supcon does not read it (arcface, mnrl "
        "do): every value of it trains the same"]
    caplog.clear()
    raw["sweep"]["space"]["train.loss.name"] = {"choices": ["supcon", "triplet"]}
    raw["sweep"]["fixed"] = {}
    space.check_ignored(P.validate(raw), "groups")  # margin matters in the triplet trials
    assert caplog.records == []


def test_probe_a_key_the_distillation_ignores_is_warned_or_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    """With `train.objective: distill` and the labels out of the loss (`label_weight` 0), the
    default space's `train.loss.temperature` changed nothing: every trial trained the same in
    it; so does `train.distill.temperature` unless the loss is kl, and `train.distill.*` under
    `similarity`. Warned, or refused when every swept key is such a key."""
    raw = repo_params()
    raw["encoders"]["models"]["teacher"] = {**raw["encoders"]["models"]["minilm"],
                                            "model": "mpnet"}
    raw["train"]["objective"] = "distill"
    raw["train"]["distill"].update(teacher="teacher", loss="mse", label_weight=0.0)
    raw["sweep"]["space"] = {"train.loss.temperature": {"low": 0.02, "high": 0.2}}
    raw["sweep"]["fixed"] = {}
    with pytest.raises(UserError) as e:
        space.check_ignored(P.validate(raw), "groups")
    assert str(e.value) == (
        "sweep.space: train.objective distill with train.distill.label_weight 0 reads none of "
        "the swept keys (train.loss.temperature): every trial would train the same")
    raw["sweep"]["space"]["train.schedule.head.lr"] = {"low": 0.001, "high": 0.01}
    raw["sweep"]["fixed"] = {"train.distill.temperature": 0.1}
    with caplog.at_level("WARNING"):
        space.check_ignored(P.validate(raw), "groups")
    assert [r.getMessage() for r in caplog.records] == [
        "sweep.space.train.loss.temperature: train.objective distill with "
        "train.distill.label_weight 0 does not read train.loss (the labels stay out of the "
        "loss): every value of it trains the same",
        "sweep.fixed.train.distill.temperature: train.distill.loss mse does not read it (kl "
        "does): every value of it trains the same"]
    caplog.clear()  # labels in the loss (supcon reads the temperature) and kl among the losses
    raw["sweep"]["fixed"]["train.distill.label_weight"] = 0.5
    raw["sweep"]["space"]["train.distill.loss"] = {"choices": ["mse", "kl"]}
    space.check_ignored(P.validate(raw), "groups")
    assert caplog.records == []
    raw["train"]["objective"] = "similarity"
    raw["sweep"]["fixed"] = {}
    with caplog.at_level("WARNING"):
        space.check_ignored(P.validate(raw), "groups")
    assert [r.getMessage() for r in caplog.records] == [
        "sweep.space.train.distill.loss: train.objective similarity does not read "
        "train.distill: every value of it trains the same"]


def test_probe_auto_beside_the_loss_it_resolves_to_is_refused() -> None:
    """`choices: [auto, supcon]` on groups data ran two identical trials (and reported the
    loss name as the only important param); now one line, before any trial. `auto` beside
    a loss it does not resolve to (triplet on groups, supcon on pairs) still sweeps."""
    raw = repo_params()
    for kind, loss, other in (("groups", "supcon", "triplet"), ("pairs", "mnrl", "contrastive")):
        raw["sweep"]["space"] = {"train.loss.name": {"choices": ["auto", other, loss]}}
        with pytest.raises(UserError) as e:
            space.check_ignored(P.validate(raw), kind)
        assert str(e.value) == (f"sweep.space.train.loss.name: auto is {loss} on {kind} data, "
                                "also a choice: their trials would train the same; remove one")
        raw["sweep"]["space"] = {"train.loss.name": {"choices": ["auto", other]}}
        space.check_ignored(P.validate(raw), kind)


@pytest.mark.parametrize(("kind", "name"), [("groups", "supcon"), ("groups", "triplet"),
                                            ("groups", "contrastive"), ("groups", "arcface"),
                                            ("groups", "cosine_mse"),
                                            ("pairs", "mnrl"), ("pairs", "contrastive")])
def test_item9_the_table_of_loss_keys_is_what_each_loss_reads(kind: str, name: str) -> None:
    import torch

    from simtune.train.losses import USED_BY, build_loss

    other = {"distance": "euclidean", "temperature": 0.2, "margin": 0.9, "mining": "batch_hard",
             "scale": 7.0, "symmetric": True}
    base = P.validate(repo_params()).train
    base = base.model_copy(update={"loss": base.loss.model_copy(update={
        "name": name, "distance": "cosine", "temperature": 0.05, "margin": 0.3,
        "mining": "batch_all", "scale": 20.0, "symmetric": False})})
    gen = torch.Generator().manual_seed(0)
    emb, docs = torch.randn(12, 8, generator=gen), torch.randn(12, 8, generator=gen)
    labels, ids = torch.arange(12) % 3, torch.arange(12)

    def value(t: P.TrainParams) -> float:
        torch.manual_seed(0)  # arcface's centres
        loss = build_loss(kind, t, 3, 8)
        out = loss(emb, labels) if kind == "groups" else loss(emb, docs, ids, ids + 100,
                                                              torch.ones(12))
        return float(out.detach())

    reads = {key for key, changed in other.items() if value(base.model_copy(update={
        "loss": base.loss.model_copy(update={key: changed})})) != value(base)}
    assert reads == {key for key, users in USED_BY.items() if name in users}


@pytest.mark.parametrize(("entry", "message"), [
    ({"train.schedule.head.lr": {"low": "abc", "high": 1}},
     "sweep.space.train.schedule.head.lr.low: expected an integer or a number, got 'abc'"),
    ({"train.schedule.head.lr": {"choices": [0.1, [2]]}},
     "sweep.space.train.schedule.head.lr.choices.1: expected true or false, an integer, a "
     "number or a string, got [2]"),
    ({"fixed": {"train.schedule.head.lr": [0.1]}},
     "sweep.fixed.train.schedule.head.lr: expected true or false, an integer, a number or a "
     "string, got [0.1]"),
])
def test_item10_sweep_space_type_errors_name_the_key_in_plain_words(
        entry: dict[str, Any], message: str) -> None:
    raw = repo_params()
    raw["sweep"]["fixed"] = entry.pop("fixed", {})
    raw["sweep"]["space"] = entry or raw["sweep"]["space"]
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == f"params.yaml: {message}"


# --- issue 29 item 3: --trials and --study for one run -----------------------------------------

def test_issue29_item3_trials_and_study_options_override_the_params_for_one_run(
        tmp_path: Path, tiny_bert: Path, fake_training: list[dict[str, Any]]) -> None:
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=5)
    before = params_file.read_text()
    result = CliRunner().invoke(app, _args(tmp_path, params_file, "--trials", "2",
                                           "--study", "quick"))
    assert result.exit_code == 0, result.output
    assert params_file.read_text() == before
    study = _study(tmp_path, "quick")
    assert sum(t.state in lib.FINISHED for t in study.trials) == 2 and len(fake_training) == 2
    assert [s.study_name for s in optuna.study.get_all_study_summaries(study._storage)] == [
        "quick"]
    out = result.stdout.splitlines()
    assert out[0] == "study 'quick': 2 of 2 finished (2 complete)"
    assert out[-1] == space.overrides(report.best_values(study), temp=True)  # the -S line
    assert out[-1].startswith("dvc exp run --temp -S ")  # as the getting-started page teaches
    applied = CliRunner().invoke(app, _args(tmp_path, params_file, "--trials", "2", "--study",
                                            "quick", "--apply"))
    assert applied.exit_code == 0, applied.output
    assert len(fake_training) == 2  # complete: nothing ran
    assert P.load(params_file).train.schedule.head.lr == study.best_params["train.schedule.head.lr"]
    assert P.load(params_file).sweep.trials == 5 and P.load(params_file).sweep.study == "test"
    empty = CliRunner().invoke(app, _args(tmp_path, params_file, "--study", " "))
    assert empty.exit_code == 1 and empty.output == "error: --study: give the study a name\n"


@pytest.mark.parametrize(("name", "message"), [
    (" ", "give the study a name"),
    ("a\nb", "'a\\nb': no control characters (newlines, tabs) in a study name"),
    ("x\u200by", "'x\\u200by': no control characters (newlines, tabs) in a study name"),
])
def test_probe_blank_or_control_character_study_names_are_refused(
        tmp_path: Path, name: str, message: str) -> None:
    """`sweep.study: " "` was accepted (only `--study " "` was refused) and a name with a
    newline split every line naming the study; both the key and the option are one line now,
    before the data is read or the storage is touched. Other unicode names still do."""
    raw = repo_params()
    raw["sweep"].update(study=name, storage=str(tmp_path / "s.db"))
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    keyed = CliRunner().invoke(app, _args(tmp_path, params_file))
    assert (keyed.exit_code, keyed.output) == (
        1, f"error: {params_file}: sweep: study: {message}\n")
    raw["sweep"]["study"] = "études/été"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert P.load(params_file).sweep.study == "études/été"
    option = CliRunner().invoke(app, _args(tmp_path, params_file, "--study", name))
    assert (option.exit_code, option.output) == (1, f"error: --study: {message}\n")
    assert list(tmp_path.iterdir()) == [params_file]


def test_probe_importances_of_trials_that_cannot_be_told_apart_are_not_shown(
        recwarn: pytest.WarningsRecorder) -> None:
    """Two trials with one value (auto and supcon on groups data train the same) printed
    Optuna's UserWarning and "importance: train.loss.name 1.00"; now no importance line."""
    def study(values: list[float]) -> optuna.Study:
        s = optuna.create_study(direction="maximize")
        for i, v in enumerate(values):
            s.add_trial(optuna.trial.create_trial(
                params={"train.schedule.head.lr": 0.01 * (i + 1),
                        "train.head.type": ["linear", "mlp"][i % 2]},
                distributions={"train.schedule.head.lr":
                               optuna.distributions.FloatDistribution(0.001, 1.0),
                               "train.head.type": optuna.distributions.CategoricalDistribution(
                                   ["linear", "mlp"])}, value=v))
        return s
    same = study([0.5, 0.5, 0.5])
    assert report.importances(same) == {}
    assert "importance:" not in report.summary(same, 5, 3)
    told = report.importances(study([0.1, 0.9, 0.2, 0.8, 0.15, 0.85]))
    assert set(told) == {"train.schedule.head.lr", "train.head.type"}
    assert sum(told.values()) == pytest.approx(1)
    assert [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)] == []


def test_probe_an_in_memory_sqlite_url_is_refused(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`sqlite:///:memory:` (SQLAlchemy: a database in memory) made a file named `:memory:` in
    the working folder; now one line. The literal name stays a file name, as documented."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        study_lib.storage_path("sqlite:///:memory:")
    assert str(e.value) == ("sweep.storage: 'sqlite:///:memory:': a study lives in a file (it "
                            "resumes and is applied from it); give its path (reports/sweep.db)")
    assert study_lib.storage_path("sqlite:///reports/:memory:.db") == Path("reports/:memory:.db")
    assert list(tmp_path.iterdir()) == []


# --- issue 34 item 6: a tie at the best value ----------------------------------------------------

def test_issue34_item6_a_tie_in_a_sweep_is_reported_and_not_applied(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every trial scores 1.0 (a small validation split that saturates): the closing text says
    the three trials tie and why no importance is shown; `--apply` keeps params.yaml as it was,
    `--apply --apply-tie` writes the first of them."""
    def saturated(loaded: lib.Loaded, values: dict[str, Any], trial: Any = None
                  ) -> tuple[float, int, int]:
        lib._checked(loaded, values)
        return 1.0, 2, 0

    monkeypatch.setattr(lib, "train_trial", saturated)
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=3)
    before = params_file.read_text()
    applied = CliRunner().invoke(app, _args(tmp_path, params_file, "--apply"))
    assert applied.exit_code == 0, applied.output
    out = applied.stdout.splitlines()
    assert ("tie: 3 of 3 complete trials score the best validation value 1.0000 (trials 0, 1, "
            "2); validation cannot tell them apart, so trial 0 is merely the first of them (a "
            "larger validation split, or a metric that does not saturate (train.monitor: map@r)"
            ", can)") in out
    assert ("no importances: every complete trial has the same value, so no parameter can be "
            "said to matter") in out
    assert out[-1] == (f"not applied: 3 trials tie at the best value, so {params_file} keeps its "
                       "values (--apply --apply-tie writes the first of them anyway)")
    assert out[-2].startswith("dvc exp run --temp -S train.schedule.head.max_epochs=4 "
                              "-S train.schedule.head.patience=3 ")
    assert params_file.read_text() == before
    forced = CliRunner().invoke(app, _args(tmp_path, params_file, "--apply", "--apply-tie"))
    assert forced.exit_code == 0, forced.output
    study = _study(tmp_path)
    assert report.tied(study) == [0, 1, 2] and study.best_trial.number == 0
    assert (P.load(params_file).train.schedule.head.lr
            == study.trials[0].params["train.schedule.head.lr"])


def test_issue34_item6_one_best_trial_is_no_tie() -> None:
    s = optuna.create_study(direction="maximize")
    for v in (0.5, 0.9, 0.5):
        s.add_trial(optuna.trial.create_trial(
            params={"train.schedule.head.lr": v}, value=v,
            distributions={"train.schedule.head.lr":
                           optuna.distributions.FloatDistribution(0.001, 1.0)}))
    assert report.tied(s) == [1] and report.tie_lines(s) == []
    s.add_trial(optuna.trial.create_trial(
        params={"train.schedule.head.lr": 0.2}, value=0.9,
        distributions={"train.schedule.head.lr":
                       optuna.distributions.FloatDistribution(0.001, 1.0)}))
    assert report.tied(s) == [1, 3]
    assert report.tie_lines(s)[0].startswith("tie: 2 of 4 complete trials score the best "
                                             "validation value 0.9000 (trials 1, 3)")
    assert len(report.tie_lines(s)) == 1  # the values differ: importances can be computed


# --- issue 44 item 7: --apply into a params file edited while the sweep ran ---------------------

def test_issue44_item7_apply_refuses_a_params_file_edited_while_the_sweep_ran(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user sets `prepare.split.seed: 99` while the trials run under 13: `--apply` refuses
    in one line naming the key and leaves the file byte for byte as the user left it (it wrote
    the values found under seed 13 beside seed 99); a comment-only edit is no change."""
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=2)
    edited: list[str] = []
    seen: list[dict[str, Any]] = []

    def edit_during(loaded: lib.Loaded, values: dict[str, Any], trial: Any = None
                    ) -> tuple[float, int, int]:
        lib._checked(loaded, values)
        if not edited:  # the user's edit, while the first trial runs
            text = params_file.read_text()
            assert "    seed: 13\n" in text
            params_file.write_text(text.replace("    seed: 13\n", "    seed: 99\n", 1))
            edited.append(params_file.read_text())
        seen.append(values)
        return 0.5 + 0.1 * len(seen), 2, 0  # distinct values: no tie

    monkeypatch.setattr(lib, "train_trial", edit_during)
    result = CliRunner().invoke(app, _args(tmp_path, params_file, "--apply"))
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1:] == [
        f"error: {params_file} changed while the sweep ran (prepare.split.seed 13 -> 99): "
        "nothing applied (the trials ran under its earlier values); apply the line above with "
        "dvc exp run, or sweep again"]
    assert params_file.read_text() == edited[0]  # byte for byte the user's file
    assert result.stdout.splitlines()[-1].startswith("dvc exp run --temp -S ")

    # the bytes decide: a value changed names the keys (at most 3); a comment added meanwhile
    # is refused too, saying no value changed (issue 52, item 2: the file stays the user's)
    ran_from = params_file.read_bytes()
    report.check_unchanged(params_file, ran_from, ran_from)
    earlier = yaml.safe_load(ran_from)
    earlier["prepare"]["split"]["seed"] = 7
    earlier["sweep"]["trials"] = 9
    with pytest.raises(UserError) as e:
        report.check_unchanged(params_file, yaml.safe_dump(earlier).encode(), ran_from)
    assert "(prepare.split.seed 7 -> 99, sweep.trials 9 -> 2)" in str(e.value)
    with pytest.raises(UserError) as e:
        report.check_unchanged(params_file, ran_from, b"# my note\n" + ran_from)
    assert f"{params_file} changed while the sweep ran (its comments or layout, no value)" in (
        str(e.value))


# --- issue 52 item 2: the bytes at the moment --apply writes ------------------------------------

def test_issue52_item2_apply_compares_the_bytes_at_the_write(
        tmp_path: Path, tiny_bert: Path, fake_training: list[dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The user edits `expansion: 2 -> 4` and `dropout: 0.25  # my edit` after the trials, while
    `--apply --apply-tie` is on its way to writing (here: as it looks for a tie, after the
    check that read the file at the start of --apply): the sweep said "wrote the best values"
    into a combination no trial ran and overwrote the user's dropout. Now it refuses in one line
    naming both keys and the file is byte for byte the user's, comment included."""
    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=2)
    text = params_file.read_text()
    assert "    expansion: 2\n" in text and "    dropout: 0.0\n" in text
    edited: list[str] = []
    real_tied, real_summary = report.tied, report.summary
    summarised: list[str] = []

    def summary(*args: Any) -> str:
        summarised.append(real_summary(*args))
        return summarised[-1]

    def tied_then_edit(study: optuna.Study) -> list[int]:
        values = real_tied(study)
        if not summarised or edited:  # the summary's own call: the trials' end, not --apply's
            return values
        mine = (params_file.read_text().replace("    expansion: 2\n", "    expansion: 4\n", 1)
                .replace("    dropout: 0.0\n", "    dropout: 0.25  # my edit\n", 1))
        params_file.write_text(mine)
        edited.append(mine)
        return values

    monkeypatch.setattr(report, "tied", tied_then_edit)
    monkeypatch.setattr(report, "summary", summary)
    result = CliRunner().invoke(app, _args(tmp_path, params_file, "--apply", "--apply-tie"))
    assert len(fake_training) == 2 and edited
    assert result.exit_code == 1, result.output
    assert "wrote the best values" not in result.output
    assert result.stderr.splitlines()[-1:] == [
        f"error: {params_file} changed while the sweep ran (train.head.expansion 2 -> 4, "
        "train.head.dropout 0.0 -> 0.25): nothing applied (the trials ran under its earlier "
        "values); apply the line above with dvc exp run, or sweep again"]
    assert params_file.read_text() == edited[0]  # the user's bytes, their comment intact
