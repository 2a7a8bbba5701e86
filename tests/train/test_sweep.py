"""`simtune sweep`: the space's checks, pruning on a fake curve, resume after SIGKILL, and the
best trial reproduced by the train stage through its printed `-S` line and `--apply`."""

from __future__ import annotations

import gc
import json
import os
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
from simtune.train import sweep as lib
from simtune.train.epochs import EpochLoop
from simtune.train.validation import Schedule
from stages import app
from tests.conftest import ROOT, repo_params
from tests.train_helpers import project, stage_args

SPACE = {"train.lr": {"low": 0.002, "high": 0.05, "log": True},
         "train.head.type": {"choices": ["linear", "mlp"]},
         "train.batch_size": {"choices": [8, 16]}}


def _sweep_project(root: Path, model: Path, trials: int) -> tuple[dict[str, Any], Path]:
    raw, params_file = project(root, model, n=48)
    # fixed: a schedule other than train's (3 epochs, patience 2), so a line that left the
    # fixed keys out would not reproduce the trial
    raw["sweep"].update(trials=trials, storage=str(root / "reports" / "sweep.db"),
                        study="test", space=SPACE, min_epochs=1,
                        fixed={"train.max_epochs": 4, "train.patience": 3})
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw, params_file


def _args(root: Path, params_file: Path, *extra: str) -> list[str]:
    return ["sweep", "--params", str(params_file), "--prepared", str(root / "prepared"),
            "--cache", str(root / "cache"), *extra]


# --- the space --------------------------------------------------------------------------------

@pytest.mark.parametrize(("entry", "message"), [
    ({"train.lrr": {"low": 0.1, "high": 1.0}},
     "params.yaml: sweep: space.train.lrr: not a key of the train section (a sweep varies "
     "train.* keys, e.g. train.lr)"),
    ({"model.lr": {"low": 0.1, "high": 1.0}},
     "params.yaml: sweep: space.model.lr: not a key of the train section (a sweep varies "
     "train.* keys, e.g. train.lr)"),
    ({"train.head": {"choices": ["mlp"]}},
     "params.yaml: sweep: space.train.head: a section or a list, not one value"),
    ({"train.mode": {"choices": ["head", "full"]}},
     "params.yaml: sweep: space.train.mode: cannot be swept (the loaded representation "
     "depends on it)"),
    ({"train.lr": {"low": 0.1, "high": 0.01}},
     "params.yaml: sweep.space.train.lr: low 0.1 must be below high 0.01"),
    ({"train.lr": {"low": 0.0, "high": 0.01, "log": True}},
     "params.yaml: sweep.space.train.lr: log scale needs low > 0, got low 0.0"),
    ({"train.lr": {"low": 0.001, "high": 0.01, "choices": [0.1]}},
     "params.yaml: sweep.space.train.lr: give either choices or low/high (log), not both"),
    ({"train.lr": {"lo": 0.001, "high": 0.01}},
     "params.yaml: unknown key 'lo' in section 'sweep.space.train.lr' (allowed: low, high, "
     "log, choices)"),
    ({"train.head.dropout": {"low": 0.5, "high": 1.0}},
     "params.yaml: sweep.space.train.head.dropout: the value 1.0 is refused by the train "
     "schema (train.head.dropout: Input should be less than 1)"),
    ({"train.head.type": {"choices": ["linear", "cnn"]}},
     "params.yaml: sweep.space.train.head.type: the value 'cnn' is refused by the train "
     "schema (train.head.type: Input should be 'identity', 'linear', 'skip_connection', "
     "'gated' or 'mlp')"),
    ({"train.batch_size": {"low": 8.5, "high": 64}},
     "params.yaml: sweep.space.train.batch_size: the value 8.5 is refused by the train "
     "schema (train.batch_size: Input should be a valid integer)"),
    ({"fixed": {"train.max_epoch": 40}},
     "params.yaml: sweep: fixed.train.max_epoch: not a key of the train section (a sweep "
     "varies train.* keys, e.g. train.lr)"),
    ({"fixed": {"train.hard_negatives": 2}},
     "params.yaml: sweep: fixed.train.hard_negatives: cannot be swept (the loaded training "
     "rows depend on it)"),
    ({"fixed": {"train.lr": 0.01}},
     "params.yaml: sweep: fixed.train.lr: also in sweep.space (a key is either searched or "
     "fixed)"),
    ({"fixed": {"train.patience": -1}},
     "params.yaml: sweep.fixed.train.patience: the value -1 is refused by the train schema "
     "(train.patience: Input should be greater than or equal to 0)"),
    # the fixed values hold while the space is checked (params.yaml's batch 1024 fits chunks
    # of 512; a swept 256 does not)
    ({"fixed": {"train.gradcache.chunk_size": 512}, "train.batch_size": {"choices": [256, 1024]}},
     "params.yaml: sweep.space.train.batch_size: the value 256 is refused by the train schema "
     "(train: gradcache.chunk_size (512) is larger than the batch size (256))"),
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
    raw["sweep"]["space"] = {"train.encoder.lr": {"low": 0.001, "high": 0.01}}
    p = P.validate(raw)  # params.yaml stays valid for the pipeline's stages
    with pytest.raises(UserError) as e:
        lib.run(p, tmp_path / "prepared", tmp_path / "cache")
    assert str(e.value) == ("sweep.space.train.encoder.lr: has no effect in train.mode head "
                            "(see train.encoder)")
    raw["train"]["mode"] = "top_layers"
    raw["sweep"]["space"] = {"train.lr": {"low": 0.001, "high": 0.01}}
    with pytest.raises(UserError) as e:
        lib.run(P.validate(raw), tmp_path / "prepared", tmp_path / "cache")
    assert str(e.value) == ("sweep.space.train.lr: has no effect in train.mode top_layers "
                            "(see train.encoder)")
    assert not (tmp_path / "reports").exists()


def test_the_cli_prints_the_space_error_as_one_line(tmp_path: Path) -> None:
    raw = repo_params()
    raw["sweep"]["space"] = {"train.lr": {"low": 0.1, "high": 0.01}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["sweep", "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code == 1
    assert result.output == ("error: " + str(tmp_path / "params.yaml") + ": sweep.space."
                             "train.lr: low 0.1 must be below high 0.01\n")


def test_suggest_picks_ints_for_int_keys_and_the_overrides_line_round_trips() -> None:
    entries = {k: P.SpaceEntry.model_validate(v) for k, v in {
        "train.max_epochs": {"low": 2, "high": 9}, "train.lr": {"low": 0.001, "high": 0.1,
                                                                  "log": True},
        "train.head.type": {"choices": ["linear", "mlp"]}}.items()}
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    values = space.suggest(trial, entries)
    assert type(values["train.max_epochs"]) is int and 2 <= values["train.max_epochs"] <= 9
    assert type(values["train.lr"]) is float and 0.001 <= values["train.lr"] <= 0.1
    exact = {"train.lr": 1.2345678901234568e-05, "train.head.type": "mlp",
             "train.batch_size": 512, "train.loss.symmetric": True}
    line = space.overrides(exact)
    assert line == ("dvc exp run -S train.lr=1.2345678901234568e-05 -S train.head.type=mlp "
                    "-S train.batch_size=512 -S train.loss.symmetric=true")
    assert space.parse_overrides(line) == exact


def test_write_yaml_changes_only_the_values_and_keeps_comments(tmp_path: Path) -> None:
    f = tmp_path / "params.yaml"
    f.write_text((ROOT / "params.yaml").read_text())
    space.write_yaml(f, {"train.lr": 1.5e-05, "train.head.type": "linear"})
    before, after = (ROOT / "params.yaml").read_text().splitlines(), f.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [
        ("    type: mlp             # identity | linear | skip_connection | gated | mlp",
         "    type: linear          # identity | linear | skip_connection | gated | mlp"),
        ("  lr: 0.005", "  lr: 1.5e-05")]
    assert P.load(f).train.lr == 1.5e-05


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
    assert line == space.overrides({"train.max_epochs": 4, "train.patience": 3,
                                    **study.best_trial.params})  # the fixed keys first
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
    assert report["best_val"]["val/mrr@10"] == study.best_value  # exactly: same seed
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
    raw["train"]["encoder"].update({"top_layers": 1, "batch_size": 8, "max_epochs": 2,
                                    "patience": 2})
    raw["sweep"].update(trials=2, storage=str(tmp_path / "sweep.db"), study="top", space={
        "train.encoder.lr": {"low": 0.0005, "high": 0.005, "log": True},
        "train.encoder.head_lr": {"low": 0.001, "high": 0.05, "log": True}}, fixed={})
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.validate(raw)
    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    study = lib.run(p, tmp_path / "prepared", tmp_path / "cache")
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2
    best = study.best_trial.params
    space.write_yaml(params_file, best)
    assert P.load(params_file).train.encoder.lr == best["train.encoder.lr"]
    train = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert train.exit_code == 0, train.output
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["best_val"]["val/mrr@10"] == study.best_value


def test_trials_leave_no_module_behind(tmp_path: Path, tiny_bert: Path) -> None:
    from simtune.train.module import SimilarityModule

    _, params_file = _sweep_project(tmp_path, tiny_bert, trials=2)
    loaded = lib.load(P.load(params_file), tmp_path / "prepared", tmp_path / "cache")
    for lr in (0.01, 0.02):
        lib.train_trial(loaded, {"train.lr": lr})
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
