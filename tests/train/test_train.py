"""The train stage: batches, curves, early stopping, reload, determinism, GradCache, DDP, errors."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from itertools import chain, groupby
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.retrieval.task import by_split, retrieval_task
from simtune.train import epoch_log
from simtune.train.data import load_data
from simtune.train.sampling import EpochBatches
from stages import app
from tests.conftest import ROOT
from tests.train_helpers import SCHEDULE_KEYS, project, stage_args


def _train(root: Path, params_file: Path, tag: str = "") -> dict[str, Any]:
    result = CliRunner().invoke(app, stage_args(root, params_file, tag))
    assert result.exit_code == 0, result.output
    return json.loads((root / f"train{tag}.json").read_text())


def _weights(root: Path, tag: str = "") -> dict[str, torch.Tensor]:
    return load_file(str(root / f"head{tag}" / "model.safetensors"))


def _edit(params_file: Path, **train: Any) -> None:
    """Set `train` keys in `params_file` (`a__b`: train.a.b; a schedule key, `SCHEDULE_KEYS`,
    in head mode's `train.schedule.head`)."""
    raw = yaml.safe_load(params_file.read_text())
    for key, value in train.items():
        section = raw["train"]["schedule"]["head"] if key in SCHEDULE_KEYS else raw["train"]
        *path, last = key.split("__")
        for part in path:
            section = section[part]
        section[last] = value
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))


@pytest.fixture
def small(tmp_path: Path, tiny_bert: Path) -> tuple[Path, Path]:
    _, params_file = project(tmp_path, tiny_bert)
    # these tests read mrr@10's lines and curves; `auto` on these 20 validation queries would
    # select by map@r (test_monitor_auto_selects_by_map_r_on_a_small_validation_split)
    _edit(params_file, monitor="mrr@10")
    return tmp_path, params_file


def test_monitor_auto_selects_by_map_r_on_a_small_validation_split(small: tuple[Path, Path]
                                                                  ) -> None:
    root, params_file = small
    _edit(params_file, monitor="auto", max_epochs=3, patience=3, val_every=3)
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    report = json.loads((root / "train.json").read_text())
    why = "monitor auto: map@r (20 validation queries < train.auto.map_r_below 64)"
    assert report["monitor"] == "map@r" and report["monitor_reason"] == why
    assert f"INFO simtune.train.stage: {why}" in result.output
    # MAP@R monitored: every epoch ranks whole (val_every 3 would skip epochs 1 and 2), and the
    # kept epoch is the one with the best MAP@R
    curve = [float(line.split("\t")[1]) for line in (
        root / "live" / "plots" / "metrics" / "val" / "map@r.tsv").read_text().splitlines()[1:]]
    assert len(curve) == report["epochs"] + 1
    assert report["best_val"]["val/map@r"] == pytest.approx(max(curve), abs=1e-6)
    assert curve.index(max(curve)) == report["best_epoch"]


def test_train_saves_a_head_that_reloads_to_the_reported_metric(small: tuple[Path, Path]
                                                                ) -> None:
    root, params_file = small
    report = _train(root, params_file)
    assert 0 <= report["best_epoch"] <= report["epochs"] <= 3  # 0: the frozen encoder kept
    sec = report["seconds"]  # the time split adds up
    assert sec["train"] > 0 and sec["validation"] > 0
    assert sec["train"] + sec["validation"] <= sec["total"]
    assert sec["per_epoch_train"] * report["epochs"] == pytest.approx(sec["train"])
    assert sec["per_epoch_validation"] * report["epochs"] == pytest.approx(sec["validation"])
    assert report["samples_per_s"] == pytest.approx(40 * report["epochs"] / sec["train"])
    # val_every 5 > max_epochs 3: every metric at epoch 0 (the frozen encoder) and 3 (the
    # last), and at the kept epoch or a tie when another (the monitored metric only there)
    assert report["full_validations"] >= 2
    assert report["selected"] == ("frozen" if report["best_epoch"] == 0 else "trained")
    assert set(report["best_val"]) == {f"val/{m}" for m in (
        "p@1", "recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10", "map@r", "separation")}
    head = heads.load(root / "head")
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    with torch.inference_mode():
        got = retrieval_task(data, "val", "train").score(by_split(data, lambda sp, role: head(
            data.q_vectors[sp.tensors["rows"]].float())), (1, 5, 10)).metrics
    assert got["mrr@10"] == pytest.approx(report["best_val"]["val/mrr@10"], abs=1e-6)
    assert (root / "live" / "plots" / "metrics").is_dir()


def test_same_params_and_seed_give_identical_weights(small: tuple[Path, Path]) -> None:
    """Identical weights for the same params and seed, where the first run's loss is the
    default `auto` and the second's an explicit `supcon`: on groups data auto is supcon (and
    the train log says so)."""
    root, params_file = small
    assert P.load(params_file).train.loss.name == "auto"
    result = CliRunner().invoke(app, stage_args(root, params_file, "a"))
    assert result.exit_code == 0, result.output
    assert "loss auto: supcon (groups data)" in result.output
    a = json.loads((root / "traina.json").read_text())
    _edit(params_file, loss__name="supcon")
    result = CliRunner().invoke(app, stage_args(root, params_file, "b"))
    assert result.exit_code == 0, result.output
    assert "loss auto" not in result.output  # a named loss is not announced
    b = json.loads((root / "trainb.json").read_text())
    wa, wb = _weights(root, "a"), _weights(root, "b")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["best_val"] == b["best_val"]
    _edit(params_file, seed=99)
    _train(root, params_file, "c")
    wc = _weights(root, "c")
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_early_stopping_stops(small: tuple[Path, Path]) -> None:
    root, params_file = small
    _edit(params_file, lr=1e-12, max_epochs=20, patience=2, val_every=1)  # nothing can improve
    report = _train(root, params_file)
    # epochs 1 to 3 tie the frozen encoder (epoch 0, kept); patience counts from the first
    # trained epoch (epoch 1, the best trained one): 2 more without a better value stop it
    assert report["epochs"] == 3 and report["best_epoch"] == 0
    assert report["selected"] == "frozen" and report["val_lift"]["lift"] == 0
    assert report["full_validations"] == 4 and not report["still_rising"]


def test_early_stopping_counts_epochs_whatever_val_every(small: tuple[Path, Path]) -> None:
    """val_every 3: the monitored metric is still checked every epoch, so patience 2 stops at
    epoch 3 again (epoch 0 kept: nothing trained beats it; patience from epoch 1, the first
    trained); every metric at epoch 0 and at the tied epochs 1 to 3 (a tie is broken by
    MAP@R)."""
    root, params_file = small
    _edit(params_file, lr=1e-12, max_epochs=20, patience=2, val_every=3)
    report = _train(root, params_file)
    assert report["epochs"] == 3 and report["best_epoch"] == 0
    assert report["full_validations"] == 4 and "val/map@r" in report["best_val"]


def test_gradcache_training_equals_plain_training(small: tuple[Path, Path]) -> None:
    root, params_file = small
    _edit(params_file, max_epochs=2, patience=5)
    _train(root, params_file, "plain")
    _edit(params_file, gradcache__chunk_size=3)
    _train(root, params_file, "gc")
    plain, gc = _weights(root, "plain"), _weights(root, "gc")
    for k in plain:
        assert torch.allclose(plain[k], gc[k], atol=1e-5), k


@pytest.mark.parametrize("lora", [False, True])
def test_full_mode_gradcache_gradients_equal_plain(tmp_path: Path, tiny_bert: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   lora: bool) -> None:
    """Full mode through the stage (dropout off, fp32): every step's gradient with GradCache
    (chunks of 3) equals the plain step's; with LoRA (adapters on every linear layer of the
    encoder) the adapters alone get gradients."""
    from tests.train_helpers import dropout_free, relative_errors, step_gradients

    _, params_file = project(tmp_path, dropout_free(tiny_bert, tmp_path / "bert"))
    _edit(params_file, mode="full", schedule__full__max_epochs=1, schedule__full__batch_size=8)
    if lora:
        _edit(params_file, lora={"r": 4, "alpha": 8, "dropout": 0.0,
                                 "target_modules": "all-linear"})
    steps = step_gradients(tmp_path, params_file, monkeypatch)
    assert len(steps["plain"]) == len(steps["gc"]) == 5  # 40 training examples / 8
    for got, want in zip(steps["gc"], steps["plain"], strict=True):
        worst = relative_errors(got, want)
        encoder = [n for n, _ in worst if n.startswith("rep.encoder")]
        assert encoder and all(("lora_" in n) == lora for n in encoder)
        assert worst[0][1] <= 1e-4, worst[:3]


@pytest.mark.integration
@pytest.mark.parametrize("chunk", [0, 3])
def test_ddp_two_cpu_processes_equal_one_with_double_batch(small: tuple[Path, Path],
                                                          chunk: int) -> None:
    """gloo DDP, batch 8 x 2 processes (with GradCache: chunks of 3, one all-reduce per step)
    == 1 process, batch 16, no GradCache; the per-epoch log lines come from one process."""
    root, params_file = small
    _edit(params_file, max_epochs=2, patience=5, batch_size=16)
    _train(root, params_file, "one")
    _edit(params_file, batch_size=8, devices=2, strategy="ddp", accelerator="cpu",
          gradcache__chunk_size=chunk)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "stages", *stage_args(root, params_file, "two")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one log line per epoch, from the first process only (both write to this stderr)
    assert [line[:2] for line in epoch_lines(proc.stderr)] == [(1, 2), (2, 2)]
    one, two = _weights(root, "one"), _weights(root, "two")
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-5), (k, (one[k] - two[k]).abs().max())


# --- batches: every example every epoch, equal for any number of processes -------------------


def _epoch(n: int, batch: int, world: int = 1, epoch: int = 0, **kw: Any) -> list[list[int]]:
    """The global batches of one epoch: each the concatenation of every process's part."""
    samplers = [EpochBatches(n, batch, 13, world, rank, **kw) for rank in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    parts = [list(s) for s in samplers]
    assert all(len(p) == len(s) for p, s in zip(parts, samplers, strict=True))
    for b in range(len(parts[0])):  # processes always hold equal shares
        assert len({len(p[b]) for p in parts}) == 1
    return [list(chain(*(p[b] for p in parts))) for b in range(len(parts[0]))]


def test_every_example_once_per_epoch_last_batch_smaller() -> None:
    for epoch in (0, 1):
        batches = _epoch(1701, 1024, epoch=epoch)
        assert [len(b) for b in batches] == [1024, 677]  # was: 1 batch, 677 dropped
        assert sorted(chain(*batches)) == list(range(1701))
    assert _epoch(1701, 1024, epoch=0) != _epoch(1701, 1024, epoch=1)  # reshuffled


def test_two_processes_see_the_batches_of_one_with_double_batch() -> None:
    for n in (40, 1700):  # n divisible by the processes (else see below)
        for epoch in (0, 3):
            assert _epoch(n, 8, world=2, epoch=epoch) == _epoch(n, 16, epoch=epoch)
    # an odd remainder is topped up from the epoch's first examples: one example twice
    batches = _epoch(41, 8, world=2)
    assert [len(b) for b in batches] == [16, 16, 10]
    flat = list(chain(*batches))
    assert sorted(set(flat)) == list(range(41)) and len(flat) == 42
    assert batches[-1][-1] == batches[0][0]


def test_batch_larger_than_the_training_set_is_reduced(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    with caplog.at_level("WARNING", logger="simtune.train.sampling"):
        batches = _epoch(481, 1024)
    assert [len(b) for b in batches] == [481] and sorted(batches[0]) == list(range(481))
    assert caplog.messages == ["train.schedule.head.batch_size 1024 is more than the 481 "
                               "training examples: using 481 (one batch per epoch)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="simtune.train.sampling"):
        batches = _epoch(481, 1024, world=2)
    assert [len(b) for b in batches] == [482]  # 241 per process, one example topped up
    assert caplog.messages == ["train.schedule.head.batch_size 1024 x 2 processes is more than "
                               "the 481 training examples: using 241 per process (one batch per "
                               "epoch)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="simtune.train.sampling"):  # encoder modes' own key
        EpochBatches(10, 64, 13, key="train.schedule.top_layers.batch_size")
    assert caplog.messages == ["train.schedule.top_layers.batch_size 64 is more than the 10 "
                               "training examples: using 10 (one batch per epoch)"]


def test_passes_make_an_epoch_of_that_many_orders_each_cut_on_its_own() -> None:
    # the step floor's passes: 3 orders of 41 examples, batches of 16 -> 16, 16, 9 per pass
    one = _epoch(41, 16, epoch=2)
    three = _epoch(41, 16, epoch=2, passes=3)
    assert [len(b) for b in three] == [16, 16, 9] * 3
    assert three[:3] == one  # the first pass is the order `passes` 1 draws
    orders = [list(chain(*three[i : i + 3])) for i in (0, 3, 6)]
    assert all(sorted(o) == list(range(41)) for o in orders)  # each pass: every example once
    assert len({tuple(o) for o in orders}) == 3  # three different orders
    # two processes still see the batches of one with double the batch
    assert _epoch(40, 8, world=2, epoch=1, passes=2) == _epoch(40, 16, epoch=1, passes=2)


def test_m_per_label_uses_every_example_in_runs_of_at_least_m() -> None:
    labels = torch.tensor([0] * 7 + [1] * 5 + [2] * 2 + [3] * 4)
    sampler = EpochBatches(len(labels), 6, 13, labels=labels, m_per_label=4)
    order = sampler._m_per_label(torch.Generator().manual_seed(0))
    assert sampler.epoch_size == len(order) == 7 + 5 + 4 + 4  # label 2 repeated to one run of 4
    counts = torch.bincount(order, minlength=len(labels))
    assert counts[labels != 2].tolist() == [1] * 16 and counts[labels == 2].tolist() == [2, 2]
    run_lengths = [len(list(g)) for _, g in groupby(labels[order].tolist())]
    assert min(run_lengths) >= 4
    batches = _epoch(len(labels), 6, labels=labels, m_per_label=4)
    assert [len(b) for b in batches] == [6, 6, 6, 2]


def test_m_per_label_with_passes_draws_a_run_order_per_pass() -> None:
    """The step floor's passes under m_per_label: each pass is one run order of its own (every
    example once, label 2 twice, runs of >= 4), cut into batches on its own; the first pass is
    `passes` 1's, and two processes see the batches of one with double the batch."""
    labels = torch.tensor([0] * 7 + [1] * 5 + [2] * 2 + [3] * 4)
    kw = {"labels": labels, "m_per_label": 4}
    one = _epoch(len(labels), 6, epoch=3, **kw)
    three = _epoch(len(labels), 6, epoch=3, passes=3, **kw)
    assert [len(b) for b in three] == [6, 6, 6, 2] * 3 and three[:4] == one
    orders = [list(chain(*three[i : i + 4])) for i in (0, 4, 8)]
    for order in orders:
        counts = torch.bincount(torch.tensor(order), minlength=len(labels))
        assert counts[labels != 2].tolist() == [1] * 16 and counts[labels == 2].tolist() == [2, 2]
        assert min(len(list(g)) for _, g in groupby(labels[order].tolist())) >= 4
    assert len({tuple(o) for o in orders}) == 3
    assert (_epoch(len(labels), 3, world=2, epoch=3, passes=2, **kw)
            == _epoch(len(labels), 6, epoch=3, passes=2, **kw))


def test_training_curves_have_one_increasing_step_per_epoch(small: tuple[Path, Path]) -> None:
    """dvclive's files: steps 1, 2, ... (the epoch) for the loss and every val metric; with
    val_every 2, MAP@R (which needs the top R) at epochs 2, 4 and the last only."""
    root, params_file = small
    _edit(params_file, max_epochs=4, patience=10, val_every=1)
    report = _train(root, params_file)
    metrics_dir = root / "live" / "plots" / "metrics"

    def rows(name: str) -> list[tuple[int, float]]:
        lines = (metrics_dir / f"{name}.tsv").read_text().splitlines()
        assert lines[0].split("\t") == ["step", name.rsplit("/", 1)[1]]
        return [(int(s), float(v)) for s, v in (line.split("\t") for line in lines[1:])]

    assert [step for step, _ in rows("train/loss")] == [1, 2, 3, 4]
    for name in ("val/mrr@10", "val/p@1", "val/map@r"):  # epoch 0: the frozen encoder
        assert [step for step, _ in rows(name)] == [0, 1, 2, 3, 4], name
    val = dict(rows("val/mrr@10"))
    assert val[report["best_epoch"]] == pytest.approx(report["best_val"]["val/mrr@10"])
    assert max(val.values()) == pytest.approx(report["best_val"]["val/mrr@10"])
    # the kept epoch beside the curves: the plots draw it as a rule (dvc.yaml's `plots`)
    kept = json.loads((root / "live" / "kept_epoch.json").read_text())
    assert kept == [{"step": report["best_epoch"], "kept_epoch": report["best_epoch"]}]

    _edit(params_file, max_epochs=5, patience=10, val_every=2)  # map@r at 2, 4 and 5 only
    report = _train(root, params_file, "2")
    metrics_dir = root / "live2" / "plots" / "metrics"
    assert [step for step, _ in rows("val/mrr@10")] == [0, 1, 2, 3, 4, 5]
    assert {0, 2, 4, 5} <= {step for step, _ in rows("val/map@r")}  # and any tied epoch
    val = dict(rows("val/mrr@10"))
    assert max(val.values()) == pytest.approx(report["best_val"]["val/mrr@10"])


EPOCH_LINE = re.compile(r"INFO simtune\.train\.epoch_log: epoch (\d+)/(\d+): train loss (\S+), "
                        r"val mrr@10 "
                        r"(\d\.\d{4}) \(best (\d\.\d{4}) at epoch (\d+)\), (\d+\.\d\d) s "
                        r"training \+ (\d+\.\d\d) s validation")


def epoch_lines(output: str) -> list[tuple[int, int, float, float, float, int, float, float]]:
    """The per-epoch log lines of a non-terminal run's output, parsed: (k, N, loss, val, best,
    best epoch, training s, validation s); a line that starts as one but does not parse fails."""
    lines = [line for line in output.splitlines() if "simtune.train.epoch_log: epoch " in line
             and ": batch " not in line]  # a long epoch's lines within it (test_epoch_log)
    assert all(EPOCH_LINE.fullmatch(line) for line in lines), lines
    return [(int(k), int(n), float(loss), float(val), float(best), int(j), float(tr), float(va))
            for k, n, loss, val, best, j, tr, va in (EPOCH_LINE.fullmatch(line).groups()
                                                     for line in lines)]


def test_a_non_terminal_run_logs_one_line_per_epoch_numbered_as_the_report(
        small: tuple[Path, Path]) -> None:
    """Item 6 of issue 27: captured output (not a terminal), early stopping at epoch 3 of 6: lines
    1/6, 2/6, 3/6 with the curves' loss and monitored metric of each epoch, the best so far,
    and the epoch's seconds (they add up to the report's training seconds); no progress bar."""
    root, params_file = small
    _edit(params_file, max_epochs=6, patience=1, val_every=1, lr=0.05)
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    report = json.loads((root / "train.json").read_text())
    lines = epoch_lines(result.output)
    assert report["epochs"] < 6  # stopped early: N is max_epochs, the count the report's
    assert [(k, n) for k, n, *_ in lines] == [(k, 6) for k in range(1, report["epochs"] + 1)]
    curves = root / "live" / "plots" / "metrics"

    def curve(name: str) -> list[float]:
        return [float(line.split("\t")[1])
                for line in (curves / f"{name}.tsv").read_text().splitlines()[1:]]

    loss, val = curve("train/loss"), curve("val/mrr@10")  # val[0]: epoch 0, the frozen one
    assert [x[2] for x in lines] == pytest.approx(loss, rel=1e-3)
    assert all(math.isfinite(x) and x > 0 for x in loss)
    assert [x[3] for x in lines] == pytest.approx(val[1:], abs=5e-5)
    for k, *_, best, j, _, _ in lines:  # the best so far, as early stopping sees it
        assert j <= k and best == pytest.approx(max(val[: k + 1]), abs=5e-5)
        assert best == pytest.approx(val[j], abs=5e-5)
    assert lines[-1][5] == report["best_epoch"]
    assert sum(x[6] for x in lines) == pytest.approx(report["seconds"]["train"], abs=0.01 * len(
        lines))
    assert "Epoch " not in result.output  # Lightning's bar: off where no terminal is attached


def test_a_terminal_gets_the_bar_numbered_as_the_report_and_no_lines(
        small: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal, Lightning's bar instead, its last epoch "Epoch 3/6" for a run that
    "trained 3 epochs" (Lightning's own: "Epoch 2/5"), the monitored metric beside the loss."""
    root, params_file = small
    _edit(params_file, max_epochs=6, patience=1, val_every=1, lr=0.05)
    monkeypatch.setattr(epoch_log, "interactive", lambda: True)
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    epochs = json.loads((root / "train.json").read_text())["epochs"]
    assert epochs < 6 and f"trained {epochs} epochs" in result.output
    # on stderr, with the log (stdout stays for data)
    assert re.findall(r"Epoch (\d+)/(\d+)", result.stderr)[-1] == (str(epochs), "6")
    assert "Epoch" not in result.stdout
    assert "val/mrr@10" in result.stderr and not epoch_lines(result.output)


def test_stage_reduces_a_too_large_batch_and_trains(small: tuple[Path, Path]) -> None:
    root, params_file = small
    _edit(params_file, batch_size=64, max_epochs=1, min_steps=0)
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    assert ("train.schedule.head.batch_size 64 is more than the 40 training examples: using 40 "
            "(one batch per epoch)") in result.output
    assert json.loads((root / "train.json").read_text())["epochs"] == 1
    _edit(params_file, min_steps=4, min_batch=8)  # issue 34: 40 // 4 = 10 per batch
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    assert ("train.schedule.head.batch_size 64 -> 10: 40 training examples, train.min_steps 4 "
            "steps per epoch (not below train.min_batch 8), so 4 steps per epoch") in result.output
    assert "is more than the 40 training examples" not in result.output


# --- bad input: one line, before any training --------------------------------------------------


def _error(root: Path, params_file: Path) -> str:
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not (root / "head").exists()
    return lines[0]


@pytest.mark.parametrize(("edit", "message"), [
    ({"loss__name": "mnrl"}, "train.loss.name: 'mnrl' needs pairs data, the prepared data ("),
    ({"gradcache__chunk_size": 9}, "gradcache.chunk_size (9) is larger than the batch size (8)"),
    ({"devices": 512, "accelerator": "cpu"}, "train.devices: 512 requested"),
    ({"precision": "16-mixed", "accelerator": "cpu"}, "'16-mixed' needs a GPU"),
    ({"head__type": "identity"}, "'identity' has nothing to train"),
    ({"m_per_label": 1}, "a batch can never hold a positive"),
])
def test_bad_training_setups(small: tuple[Path, Path], edit: dict[str, Any],
                             message: str) -> None:
    root, params_file = small
    _edit(params_file, **edit)
    assert message in _error(root, params_file)


def test_identity_head_trains_the_layers_in_full_mode(small: tuple[Path, Path]) -> None:
    """No head (identity) is refused in head mode only: with the encoder training, the saved
    model is the fine-tuned encoder alone."""
    root, params_file = small
    # the trained epoch kept (a kept epoch 0 saves no encoder: the frozen one serves it)
    _edit(params_file, mode="full", head__type="identity", schedule__full__max_epochs=1,
          schedule__full__batch_size=8, frozen_candidate=False)
    _train(root, params_file)
    assert (root / "head" / "encoder" / "config.json").is_file()
    assert _weights(root) == {}


def test_cache_missing_or_stale(small: tuple[Path, Path]) -> None:
    root, params_file = small
    raw = yaml.safe_load(params_file.read_text())
    raw["encoders"]["models"]["tiny"]["pooling"] = "cls"  # not what the cache was filled with
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert "does not match the current encoder settings" in _error(root, params_file)
    import shutil

    shutil.rmtree(root / "cache")
    assert "no cache here (run the cache stage)" in _error(root, params_file)


def test_full_mode_trains_the_encoder_and_evaluate_uses_it(small: tuple[Path, Path]) -> None:
    """full mode: texts tokenised by the DataLoader, encoder trainable and saved with the head;
    evaluate embeds the test texts with that fine-tuned encoder (not the frozen cache)."""
    root, params_file = small
    _edit(params_file, mode="full", schedule__full__max_epochs=1, schedule__full__lr=0.001,
          schedule__full__batch_size=8, gradcache__chunk_size=4,
          frozen_candidate=False)  # the trained epoch kept: its encoder is what evaluate uses
    _train(root, params_file)
    encoder_dir = root / "head" / "encoder"
    assert (encoder_dir / "config.json").is_file()
    from simtune.model import load_model

    tuned = load_model(root / "head", "cpu")
    p = P.load(params_file)
    frozen = load_model(root / "head", "cpu")
    frozen.encoder.model = __import__("transformers").AutoModel.from_pretrained(
        p.encoders.models["tiny"].model).eval()
    texts = ["what is the largest city", "who wrote the book"]
    assert not torch.allclose(tuned.encode(texts), frozen.encode(texts), atol=1e-4)
    result = CliRunner().invoke(app, [
        "evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
        "--cache", str(root / "cache"), "--head", str(root / "head"),
        "--out", str(root / "metrics.json"),
        "--metrics", str(root / "headline.json"), "--plot", str(root / "recall.json"),
        "--detail", str(root / "detail.json"), "--run-trained", str(root / "trained.trec"),
        "--run-baseline", str(root / "baseline.trec")])
    assert result.exit_code == 0, result.output
    metrics = json.loads((root / "metrics.json").read_text())
    assert metrics["trained"] != metrics["baseline"]


@pytest.mark.parametrize("train_embeddings", [False, True])
def test_full_mode_freezes_the_embeddings_unless_told(small: tuple[Path, Path],
                                                      train_embeddings: bool) -> None:
    """train.schedule.full.train_embeddings: false leaves every embeddings weight of the saved
    encoder bit-for-bit the original's while the layers move; true moves the token table."""
    root, params_file = small
    _edit(params_file, mode="full", schedule__full__max_epochs=1, schedule__full__lr=0.001,
          schedule__full__batch_size=8, schedule__full__min_run_steps=0,
          schedule__full__train_embeddings=train_embeddings, frozen_candidate=False)
    report = _train(root, params_file)
    assert report["in_force"]["train.schedule.full.train_embeddings"] is train_embeddings
    tuned = load_file(str(root / "head" / "encoder" / "model.safetensors"))
    start = load_file(str(Path(P.load(params_file).encoders.models["tiny"].model)
                          / "model.safetensors"))
    emb = [k for k in tuned if "embeddings." in k]
    assert "embeddings.word_embeddings.weight" in emb and len(emb) >= 4  # + positions, LayerNorm
    moved = {k for k in tuned if not torch.equal(tuned[k], start[k])}
    assert ("embeddings.word_embeddings.weight" in moved) is train_embeddings
    assert bool(moved & set(emb)) is train_embeddings
    assert any(".layer.0." in k for k in moved)  # the layers train either way


# --- divergence: one line, nothing saved -------------------------------------------------------


def _past_the_bound(monkeypatch: pytest.MonkeyPatch, lr: float) -> None:
    """The train stage runs at head lr `lr`, past the bound `check` holds it to (<= 10, issue 52
    item 5): divergence is still caught by train itself, whatever let the value through."""
    real = P.load

    def load(path: str | Path = "params.yaml") -> P.Params:
        p = real(path)
        s = p.train.schedule
        schedule = s.model_copy(update={"head": s.head.model_copy(update={"lr": lr})})
        return p.model_copy(update={"train": p.train.model_copy(update={"schedule": schedule})})

    monkeypatch.setattr(P, "load", load)


def _diverged(root: Path, params_file: Path) -> str:
    """Run the stage expecting divergence; return the error line after checking that nothing
    (head, report) was written and the previous head is untouched."""
    (root / "head").mkdir()
    (root / "head" / "previous").write_text("kept")
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and result.output.count("error: ") == 1, result.output
    assert sorted(p.name for p in (root / "head").iterdir()) == ["previous"]
    assert not (root / "train.json").exists()
    assert not [p for p in root.iterdir()  # no temp dir left (the lock file stays, empty)
                if p.name.startswith(".head") and p.name != ".head.lock"]
    return last


def test_non_finite_loss_stops_training(small: tuple[Path, Path],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """lr 1e8 (AdamW's decay multiplies the weights by 1 - 1e8 * 0.01 each step) overflows to a
    NaN loss within the first epoch: stop there, name the epoch, step and likely cause."""
    root, params_file = small
    _edit(params_file, max_epochs=3)
    _past_the_bound(monkeypatch, 1e8)
    line = _diverged(root, params_file)
    assert re.fullmatch(r"error: train\.schedule\.head\.lr: training diverged at epoch 1, "
                        r"step [2-5]: the loss is (nan|inf); the learning rate 1e\+08 is likely "
                        r"too high; nothing saved", line), line


def test_weights_that_turn_non_finite_on_the_last_step_are_caught(
        small: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """One step per epoch and one epoch: the loss of that step is finite, the weights after it
    give inf/NaN vectors (lr 1e36); they are checked before they are kept as the best."""
    root, params_file = small
    _edit(params_file, max_epochs=1, batch_size=100000, min_steps=0)  # clamped: 1 step
    _past_the_bound(monkeypatch, 1e36)
    line = _diverged(root, params_file)
    assert line == ("error: train.schedule.head.lr: training diverged at epoch 1, step 1: the "
                    "validation vectors are no longer finite; the learning rate 1e+36 is likely "
                    "too high; nothing saved")


def test_an_update_beyond_float32_is_divergence_not_a_traceback(
        small: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """lr 1e40 is a finite float, but AdamW's step (10 x lr at step 1) overflows float32: the
    fused kernel writes non-finite weights, so step 2's loss is nan (the loop over tensors
    refuses the scalar instead: `stage.fit` turns that into the same kind of line)."""
    root, params_file = small
    _edit(params_file, max_epochs=1)
    _past_the_bound(monkeypatch, 1e40)
    line = _diverged(root, params_file)
    assert line == ("error: train.schedule.head.lr: training diverged at epoch 1, step 2: the "
                    "loss is nan; the learning rate 1e+40 is likely too high; nothing saved")


def test_item11_diverged_run_prints_no_warning(small: tuple[Path, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Vectors that turn non-finite are never scored: numpy printed two RuntimeWarnings
    ("invalid value encountered in matmul") before the one line."""
    import warnings

    root, params_file = small
    _edit(params_file, max_epochs=1, batch_size=100000, min_steps=0)
    _past_the_bound(monkeypatch, 1e36)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _diverged(root, params_file)
    assert "the validation vectors are no longer finite" in line
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


def test_item11_diverged_run_leaves_no_checkpoint_or_curves(tmp_path: Path, tiny_bert: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """lr 1e8 on 40 texts diverges in epoch 2, after epoch 1 wrote a checkpoint and curves:
    "nothing saved" holds for them too (a resume of the same settings would diverge again).
    Only dvclive's own files go: a file of the user's in the curves folder stays."""
    from simtune.train import checkpoint

    root = tmp_path
    _, params_file = project(root, tiny_bert, n=40)
    _edit(params_file, max_epochs=3)
    _past_the_bound(monkeypatch, 1e8)
    written: list[Path] = []
    real_write = checkpoint.write_bytes

    def spy(path: Path, data: bytes) -> None:
        real_write(path, data)
        written.append(path)
        assert (root / "live" / "metrics.json").is_file()  # the curves of epoch 1

    monkeypatch.setattr(checkpoint, "write_bytes", spy)
    (root / "live").mkdir()
    (root / "live" / "notes.txt").write_text("mine")
    line = _diverged(root, params_file)
    assert "training diverged at epoch 2" in line
    assert written == [root / "checkpoints" / "last.pt"]
    assert not (root / "checkpoints").exists()
    assert sorted(p.name for p in (root / "live").iterdir()) == ["notes.txt"]
    (root / "live" / "notes.txt").unlink()
    shutil.rmtree(root / "head")
    _diverged(root, params_file)
    assert not (root / "live").exists() and not (root / "checkpoints").exists()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_evaluate_refuses_a_head_with_non_finite_weights(small: tuple[Path, Path], bad: float
                                                         ) -> None:
    """A diverged head (as saved before training checked for it) is refused, naming the file;
    no metrics are written."""
    root, params_file = small
    head = heads.build("mlp", 32, 2, 0.0)
    with torch.no_grad():
        head.net[0].weight[3, 5] = bad
    heads.save(head, root / "head")
    result = CliRunner().invoke(app, [
        "evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
        "--cache", str(root / "cache"), "--head", str(root / "head"),
        "--out", str(root / "metrics.json"),
        "--metrics", str(root / "headline.json"), "--plot", str(root / "recall.json")])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"error: {root / 'head' / 'model.safetensors'}: weight net.0.weight is not finite "
        "(training diverged?); rerun train"]
    assert not (root / "metrics.json").exists() and not (root / "recall.json").exists()


def test_evaluate_refuses_a_head_whose_vectors_are_not_finite(small: tuple[Path, Path]) -> None:
    """Finite but huge weights (1e30) overflow to inf/NaN vectors: refused, not ranked."""
    root, params_file = small
    head = heads.build("mlp", 32, 2, 0.0)
    with torch.no_grad():
        head.net[0].weight.fill_(1e30)
        head.net[3].weight.fill_(1e30)
    heads.save(head, root / "head")
    result = CliRunner().invoke(app, [
        "evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
        "--cache", str(root / "cache"), "--head", str(root / "head"),
        "--out", str(root / "metrics.json"),
        "--metrics", str(root / "headline.json"), "--plot", str(root / "recall.json")])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"error: {root / 'head'}: the trained model gives non-finite test vectors (training "
        "diverged?); rerun train")
    assert not (root / "metrics.json").exists()


def test_freezing_embeddings_an_encoder_has_not_is_one_line_naming_the_key() -> None:
    """An encoder with neither an `embeddings` block nor Hugging Face's input embeddings: a
    user error naming `train.schedule.full.train_embeddings`, not an AttributeError."""
    from simtune.errors import UserError
    from simtune.train.represent import frozen_embeddings

    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(UserError, match=r"^train\.schedule\.full\.train_embeddings: false, "
                                        r"but encoders\.models\.x \(/m\) names no input"):
        frozen_embeddings(plain, "encoders.models.x (/m)")
    table = torch.nn.Embedding(3, 4)
    hf_like = torch.nn.Module()
    hf_like.get_input_embeddings = lambda: table  # what transformers' models offer
    assert frozen_embeddings(hf_like) is table
