"""Item 15 of issue 19: a train killed mid-way (`kill -9`) resumes from its last epoch's
checkpoint and ends as the uninterrupted run with the same seed; a checkpoint from other
settings is never resumed."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from simtune import params as P
from simtune.cache import stage as cache
from simtune.cache.views import layer_for
from simtune.evaluate import stage as evaluate
from simtune.train import checkpoint, epoch_log
from simtune.train import stage as train
from simtune.train.data import load_data
from tests.conftest import ROOT
from tests.train_helpers import project, set_schedule, stage_args


def _top_project(root: Path, model: Path, n: int, **encoder: Any) -> Path:
    """Top-layers mode with dropout on (the top layers' and the head's: the RNG matters) and
    every epoch but the last validating only the monitored metric (val_every 2)."""
    raw, params_file = project(root, model, n=n, mode="top_layers")
    raw["train"]["head"]["dropout"] = 0.1
    set_schedule(raw, "top_layers", **{"layers": 1, "lr": 0.001, "head_lr": 0.01,
                                       "batch_size": 8, "val_every": 2, **encoder})
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.validate(raw)
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    return params_file


def _train(root: Path, params_file: Path, tag: str, ckpt: Path | None) -> dict[str, Any]:
    return train.run(P.load(params_file), root / "prepared", root / "cache", root / f"head{tag}",
                     root / f"train{tag}.json", root / f"live{tag}", checkpoint_dir=ckpt)


def _curves(live: Path) -> dict[str, list[tuple[int, float]]]:
    """dvclive's per-epoch points (step, value) of every metric, without the timestamps."""
    out = {}
    for f in sorted((live / "plots" / "metrics").rglob("*.tsv")):
        with f.open() as fh:
            out[str(f.relative_to(live))] = [(int(r["step"]), float(r[f.stem]))
                                            for r in csv.DictReader(fh, delimiter="\t")]
    return out


def _test_metrics(root: Path, params_file: Path, tag: str) -> dict[str, Any]:
    return evaluate.run(P.load(params_file), root / "prepared", root / "cache", root / f"head{tag}",
                        root / f"metrics{tag}.json", root / f"plot{tag}.json",
                        root / f"detail{tag}.json")


def _epoch_of(path: Path) -> int:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


class _Weights:
    """Each in-process run's weights at the end of each epoch it trains: `runs[tag][epoch]`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tag, self.runs = "", {}
        original = checkpoint.Resume.on_train_epoch_end

        def spy(resume: checkpoint.Resume, trainer: Any, module: Any) -> None:
            self.runs.setdefault(self.tag, {})[trainer.current_epoch + 1] = {
                k: v.detach().clone() for k, v in module.state_dict().items()}
            original(resume, trainer, module)

        monkeypatch.setattr(checkpoint.Resume, "on_train_epoch_end", spy)


def test_a_run_killed_in_epoch_3_resumes_and_ends_as_an_uninterrupted_one(
        tmp_path: Path, tiny_bert: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 240 examples (120 training, 15 steps): an epoch lasts long enough to be killed inside
    params_file = _top_project(tmp_path, tiny_bert, 240, max_epochs=4, patience=5)
    ckpt = tmp_path / "checkpointskilled"  # stage_args' checkpoint directory
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
           "OMP_NUM_THREADS": str(torch.get_num_threads()),  # the in-process runs' threads
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stages", *stage_args(tmp_path, params_file, "killed")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _epoch_of(ckpt / checkpoint.FILE) < 2:
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # in epoch 3: its checkpoint is not there yet
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert _epoch_of(ckpt / checkpoint.FILE) == 2
    assert not (tmp_path / "headkilled").exists()

    caplog.set_level(logging.INFO, logger="simtune.train")
    weights = _Weights(monkeypatch)
    weights.tag = "killed"
    resumed = _train(tmp_path, params_file, "killed", ckpt)
    assert f"{ckpt / checkpoint.FILE}: resuming after epoch 2" in caplog.text
    assert not ckpt.exists()  # removed on success
    # the same run uninterrupted (its checkpoints written, then removed; none read)
    weights.tag = "whole"
    whole = _train(tmp_path, params_file, "whole", tmp_path / "ck-whole")
    assert not (tmp_path / "ck-whole").exists()

    # the weights at the end of epochs 3 and 4 (dropout on: each depends on the RNG restored)
    assert sorted(weights.runs["killed"]) == [3, 4]
    assert sorted(weights.runs["whole"]) == [1, 2, 3, 4]
    for epoch in (3, 4):
        got, want = weights.runs["killed"][epoch], weights.runs["whole"][epoch]
        assert got.keys() == want.keys() and any(k.startswith("rep.") for k in want)
        for k in want:
            assert torch.allclose(got[k], want[k], atol=1e-6), (epoch, k)
    assert resumed["epochs"] == whole["epochs"] == 4
    assert resumed["best_epoch"] == whole["best_epoch"]
    assert resumed["full_validations"] == whole["full_validations"]
    assert resumed["steps"] == whole["steps"] > 0  # the killed process's steps counted too
    assert resumed["best_val"] == pytest.approx(whole["best_val"], abs=1e-6)
    for name in ("model.safetensors", "encoder/model.safetensors"):
        got = load_file(str(tmp_path / "headkilled" / name))
        want = load_file(str(tmp_path / "headwhole" / name))
        assert got.keys() == want.keys()
        for k in want:
            assert torch.allclose(got[k], want[k], atol=1e-5), (name, k)
    # the validation history: every epoch's metrics as dvclive drew them (epochs 1-2 rewritten
    # from the checkpoint), and the test metrics of the kept model
    got_curves, want_curves = _curves(tmp_path / "livekilled"), _curves(tmp_path / "livewhole")
    assert got_curves.keys() == want_curves.keys()
    for name, points in want_curves.items():
        assert [s for s, _ in got_curves[name]] == [s for s, _ in points], name
        assert [v for _, v in got_curves[name]] == pytest.approx([v for _, v in points],
                                                                 abs=1e-5), name
    # epoch 0: the frozen encoder (every metric); MAP@R also at any epoch that tied
    assert [s for s, _ in want_curves["plots/metrics/val/mrr@10.tsv"]] == [0, 1, 2, 3, 4]
    assert {0, 2, 4} <= {s for s, _ in want_curves["plots/metrics/val/map@r.tsv"]}
    kept = [json.loads((tmp_path / f"live{tag}" / "kept_epoch.json").read_text())
            for tag in ("killed", "whole")]
    assert kept[0] == kept[1] == [{"step": whole["best_epoch"], "kept_epoch": whole["best_epoch"]}]
    got_test = _test_metrics(tmp_path, params_file, "killed")
    want_test = _test_metrics(tmp_path, params_file, "whole")
    assert json.dumps(got_test, sort_keys=True) == json.dumps(want_test, sort_keys=True) or \
        _close(got_test, want_test)


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, float):
        return got == pytest.approx(want, abs=1e-6)
    return got == want


class _Crash(Exception):
    pass


def _crash_in_epoch_3(root: Path, params_file: Path, ckpt: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process run that dies at the start of epoch 3 (its epoch-2 checkpoint kept)."""
    def crash(resume: checkpoint.Resume, trainer: Any, module: Any) -> None:
        if trainer.current_epoch == 2:
            raise _Crash

    with monkeypatch.context() as m:
        m.setattr(checkpoint.Resume, "on_train_epoch_start", crash, raising=False)
        with pytest.raises(_Crash):
            _train(root, params_file, "crashed", ckpt)
    assert _epoch_of(ckpt / checkpoint.FILE) == 2


def _epoch_lines(messages: list[str]) -> list[str]:
    """The "epoch k/N" of each per-epoch log line (`simtune.train.epoch_log`)."""
    return [m.split(":")[0] for m in messages  # 0: the frozen one, no "/N"
            if re.match(r"epoch [1-9]\d*/\d+:", m)]


def _same_heads(a: Path, b: Path) -> None:
    got, want = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-6), k


def test_a_checkpoint_from_other_settings_is_never_resumed(
        tmp_path: Path, tiny_bert: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # head mode (it checkpoints too: a few kB a epoch), dropout on
    raw, params_file = project(tmp_path, tiny_bert, max_epochs=4, patience=5)
    raw["train"]["head"]["dropout"] = 0.1
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    ckpt = tmp_path / "ck"
    _crash_in_epoch_3(tmp_path, params_file, ckpt, monkeypatch)
    # other settings: the epoch-2 checkpoint must not be resumed
    raw["train"]["schedule"]["head"]["lr"] = 0.02
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    caplog.set_level(logging.INFO, logger="simtune.train")
    other = _train(tmp_path, params_file, "other", ckpt)
    assert f"{ckpt / checkpoint.FILE}: checkpoint from other settings: starting afresh" in \
        caplog.text
    assert "resuming" not in caplog.text and not ckpt.exists()
    fresh = _train(tmp_path, params_file, "fresh", None)
    assert other == {**fresh, "seconds": other["seconds"], "samples_per_s":
                     other["samples_per_s"]}
    _same_heads(tmp_path / "headother", tmp_path / "headfresh")
    # with the same settings, head mode resumes and ends as the uninterrupted run; its
    # per-epoch log lines (no terminal) number on from the checkpoint's epoch
    monkeypatch.setattr(epoch_log, "interactive", lambda: False)
    caplog.clear()
    _crash_in_epoch_3(tmp_path, params_file, ckpt, monkeypatch)
    assert _epoch_lines(caplog.messages) == ["epoch 1/4", "epoch 2/4"]
    caplog.clear()
    resumed = _train(tmp_path, params_file, "resumed", ckpt)
    assert f"{ckpt / checkpoint.FILE}: resuming after epoch 2" in caplog.text
    assert _epoch_lines(caplog.messages) == ["epoch 3/4", "epoch 4/4"] and resumed["epochs"] == 4
    assert "other settings" not in caplog.text
    assert resumed["best_val"] == pytest.approx(fresh["best_val"], abs=1e-6)
    assert resumed["best_epoch"] == fresh["best_epoch"]
    # issue 44 item 15: the whole run's seconds (the crashed process's epochs 1-2 too), and
    # that it was resumed; an uninterrupted run says nothing of the kind
    before = resumed["resumed"]["seconds_before"]
    assert resumed["resumed"]["after_epoch"] == 2 and before > 0
    assert resumed["seconds"]["total"] > before
    assert "resumed" not in fresh
    _same_heads(tmp_path / "headresumed", tmp_path / "headfresh")
    assert _curves(tmp_path / "liveresumed").keys() == _curves(tmp_path / "livefresh").keys()


def test_the_fingerprint_covers_the_params_the_data_and_the_cache(tmp_path: Path,
                                                                  tiny_bert: Path) -> None:
    import copy
    import shutil
    from types import SimpleNamespace

    raw, params_file = project(tmp_path, tiny_bert)
    p, prepared = P.load(params_file), tmp_path / "prepared"
    tables = load_data(p.train, p.encoders, p.cache, prepared, tmp_path / "cache").tables

    def fingerprint(p: P.Params, prepared: Path, tables: dict[str, Any],
                    negatives: Path | None, t: P.TrainParams | None = None) -> str:
        """The checkpoint's fingerprint of `p`'s sections (`t`: the train params in their
        place, as the stage resolves them)."""
        return checkpoint.fingerprint(t or p.train, p.encoders, p.cache, p.evaluate.corpus,
                                      prepared, tables, negatives)

    base = fingerprint(p, prepared, tables, None)
    assert fingerprint(P.load(params_file), prepared, tables, None) == base

    def with_params(**changes: Any) -> str:
        other = copy.deepcopy(raw)
        for key, value in changes.items():
            *parents, name = key.split("__")
            node = other
            for part in parents:
                node = node[part]
            node[name] = value
        return fingerprint(P.validate(other), prepared, tables, None)

    assert with_params(train__seed=1) != base
    assert with_params(train__schedule__head__max_epochs=4) != base
    assert with_params(evaluate__corpus="test") != base
    assert with_params(cache__cache_type="cpu" if p.cache.cache_type != "cpu"
                       else "auto") != base
    # the prepared data's bytes: a copy is the same data, one changed byte is not
    shutil.copytree(prepared, tmp_path / "copy")
    assert fingerprint(p, tmp_path / "copy", tables, None) == base
    labels = tmp_path / "copy" / "labels.json"
    labels.write_text(labels.read_text() + " ")
    assert fingerprint(p, tmp_path / "copy", tables, None) != base
    # the cache: another vector table behind the same name
    other = {**tables, "query": SimpleNamespace(manifest=SimpleNamespace(fingerprint="0" * 32))}
    assert fingerprint(p, prepared, other, None) != base
    # mined negatives count only when used
    assert fingerprint(p, prepared, tables, tmp_path / "copy") == base
    # a run fingerprints the loss that runs: `auto` on groups is supcon, the same checkpoint
    assert p.train.loss.name == "auto"
    supcon = P.validate({**raw, "train": {**raw["train"],
                                          "loss": {**raw["train"]["loss"], "name": "supcon"}}})
    auto_run = fingerprint(p, prepared, tables, None,
                           train.in_force(p.train, p.encoders, prepared))
    assert auto_run == fingerprint(supcon, prepared, tables, None,
                                   train.in_force(supcon.train, supcon.encoders, prepared))
    assert auto_run != base  # `auto` itself is not what ran
