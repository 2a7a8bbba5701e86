"""Issue 34 item 5: when the frozen encoder already scores 1.0 on validation, train says there
is nothing to gain (a warning and `reports/train.json`'s `nothing_to_gain`); hand-made vectors,
hand-computed metrics."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from simtune import params as P
from simtune.examples import Data, Split
from simtune.retrieval.metrics import HEADLINE
from simtune.retrieval.task import retrieval_task
from simtune.train import headroom
from simtune.train.data import load_data
from simtune.train.stage import validation_task
from stages import app
from tests.conftest import write_params


def _split(labels: list[int], rows: list[int]) -> Split:
    return Split({"labels": torch.tensor(labels), "rows": torch.tensor(rows)}, {})


def _data(v1_label: int) -> Data:
    """Train (1, 0) L0, (.8, .6) L0, (0, 1) L1, (.6, .8) L1; val v0 (1, 0) L0 and v1 (0, 1)
    labelled `v1_label`."""
    table = torch.tensor([[1, 0], [.8, .6], [0, 1], [.6, .8], [1, 0], [0, 1]])
    splits = {"train": _split([0, 0, 1, 1], [0, 1, 2, 3]), "val": _split([0, v1_label], [4, 5])}
    return Data("groups", 2, table, table, splits, 2, {}, ["L0", "L1"], {})


def test_a_frozen_encoder_perfect_on_validation_leaves_nothing_to_gain(
        caplog: pytest.LogCaptureFixture) -> None:
    """v0's cosines to train are 1, .8, 0, .6: its two L0 texts first; v1's 0, .6, 1, .8: its
    two L1 texts first. Every metric 1.0: nothing to gain, said in one warning."""
    data = _data(1)
    with caplog.at_level(logging.WARNING, logger="simtune.train.headroom"):
        got = headroom.check(data, retrieval_task(data, "val", "train"))
    assert got == {"nothing_to_gain": True,
                   "frozen_val": {"p@1": 1.0, "mrr@10": 1.0, "ndcg@10": 1.0, "map@r": 1.0}}
    assert [r.getMessage() for r in caplog.records] == [
        "nothing to gain: the frozen encoder already scores 1.0 on every validation metric "
        "(p@1, mrr@10, ndcg@10, map@r, 2 queries), so no trained model can be told better on "
        "validation; a larger or harder validation split could (see evaluate's verdict for the "
        "test split)"]


def test_a_frozen_encoder_with_room_to_improve_has_something_to_gain(
        caplog: pytest.LogCaptureFixture) -> None:
    """v1 labelled L0: its ranking is L1 (1), L1 (.8), L0 (.6), L0 (0): P@1 0, first relevant at
    rank 3 (MRR 1/3), none of its R = 2 in the top 2 (AP@R 0), nDCG@10 (1/log2 4 + 1/log2 5) /
    (1 + 1/log2 3); v0 scores 1.0 on each. The means of the two queries:"""
    data = _data(0)
    with caplog.at_level(logging.WARNING, logger="simtune.train.headroom"):
        got = headroom.check(data, retrieval_task(data, "val", "train"))
    ndcg = (1 / math.log2(4) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert got["nothing_to_gain"] is False and caplog.records == []
    assert got["frozen_val"] == pytest.approx({"p@1": 0.5, "mrr@10": (1 + 1 / 3) / 2,
                                              "ndcg@10": (1 + ndcg) / 2, "map@r": 0.5})


def test_without_cached_vectors_it_is_not_checked() -> None:
    data = _data(1)
    data.q_vectors = data.d_vectors = None
    assert headroom.check(data, retrieval_task(data, "val", "train")) == {
        "nothing_to_gain": None, "frozen_val": None}


def test_the_train_report_records_it(tmp_path: Path, tiny_bert: Path) -> None:
    """The stage writes the check into reports/train.json: the frozen encoder's validation
    metrics, recomputed here from the cache, and no saturation on these random vectors."""
    from tests.train_helpers import project, stage_args

    _, params_file = project(tmp_path, tiny_bert, n=48, max_epochs=1)
    result = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "train.json").read_text())
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    want = headroom.frozen_metrics(data, validation_task(data, p.train.head.side,
                                                         p.evaluate.corpus))
    assert want is not None and want["p@1"] < 1.0
    assert report["nothing_to_gain"] is False
    # epoch 0 of the loop is the frozen encoder: its validation equals the metrics recomputed here
    assert {m: report["frozen_val"][f"val/{m}"] for m in want} == pytest.approx(want, abs=1e-6)


def test_nothing_to_gain_trains_no_epoch_and_keeps_the_frozen_encoder(
        tmp_path: Path, tiny_bert: Path) -> None:
    """Each label one word four times and a letter: the frozen tiny encoder ranks every
    validation text's own label first (checked here from the cache), so the stage trains no
    epoch, keeps epoch 0 and saves the head at identity; with `frozen_candidate` off it trains."""
    from simtune import heads
    from tests.train_helpers import project, stage_args

    rows = [(f"{word} {word} {word} {word} {c}", word)
            for word in ("city", "river", "song", "planet", "king", "water") for c in "abcdefgh"]
    _, params_file = project(tmp_path, tiny_bert, rows=rows, max_epochs=3)
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    frozen = headroom.frozen_metrics(data, validation_task(data, p.train.head.side,
                                                           p.evaluate.corpus))
    assert frozen is not None and {m: frozen[m] for m in HEADLINE} == dict.fromkeys(HEADLINE, 1.0)
    result = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "train.json").read_text())
    assert (report["epochs"], report["best_epoch"], report["selected"],
            report["nothing_to_gain"]) == (0, 0, "frozen", True)
    assert "better on validation: no training, the frozen encoder is kept (epoch 0)" in (
        result.output)
    head = heads.load(tmp_path / "head")
    identity = head.identity_state()
    assert all(torch.equal(v, identity[k]) for k, v in head.state_dict().items())

    raw = P.read_yaml(params_file)
    raw["train"]["frozen_candidate"] = False
    write_params(params_file, raw)
    result = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["epochs"] >= 1 and report["best_epoch"] >= 1
