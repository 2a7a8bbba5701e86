"""Distillation over unlabelled texts (`prepare.file.kind: texts` joined to a labelled set):
training fits on the train split plus the texts, each against its teacher row; validation
and its corpus stay the labelled set's; labels in the loss are refused before the cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from simtune import params as P
from simtune.cache.views import open_cache
from simtune.errors import UserError
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import load as load_prepared
from simtune.prepare.prepared import write
from simtune.retrieval.task import retrieval_task
from simtune.train import stage as train
from simtune.train.data import load_data
from tests.cache_helpers import sentences
from tests.conftest import write_params
from tests.train.distill_helpers import cache_stage_refusal, distill_raw, fill

NEW = 12  # unlabelled texts


def texts_project(root: Path, bert: Path, **distill: Any) -> dict[str, Any]:
    """The distill project's labelled set prepared into root/labelled, and params whose
    prepare reads NEW other texts joined to it."""
    raw = distill_raw(root, bert, **distill)
    write(prepare.build(P.validate(raw).prepare), root / "labelled", root / "l.json")
    texts = root / "texts.jsonl"
    texts.write_text("".join(json.dumps({"t": t}) + "\n" for t in sentences(NEW, 500)))
    raw["prepare"]["file"].update(path=str(texts), kind="texts", labelled=str(root / "labelled"))
    raw["prepare"]["file"]["columns"].update(text="t", label=None)
    return raw


@pytest.mark.parametrize("mode", ["head", "full"])
def test_training_fits_on_the_train_split_and_the_texts(tmp_path: Path, tiny_bert: Path,
                                                        mode: str) -> None:
    raw = texts_project(tmp_path, tiny_bert)
    raw["train"]["mode"] = mode
    raw["train"]["frozen_candidate"] = False  # patience counts from the first trained epoch
    fill(tmp_path, raw)
    p = P.load(tmp_path / "params.yaml")
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    fit, tr = data.training, data.splits["train"]
    assert (len(tr), len(fit)) == (20, 20 + NEW)
    assert torch.equal(fit.tensors["labels"][20:], torch.full((NEW,), -1))
    assert torch.equal(fit.tensors["labels"][:20], tr.tensors["labels"])
    teacher = open_cache(tmp_path / "cache", "teacher", p.encoders.models["teacher"], p.cache)
    prepared = load_prepared(tmp_path / "prepared")
    ex = prepared.examples.to_pydict()
    new = [t for t, s in zip(ex["text_id"], ex["split"], strict=True) if s == "unlabelled"]
    assert torch.equal(fit.tensors["t_rows"][20:], teacher.index(new))
    if mode == "head":
        student = open_cache(tmp_path / "cache", "tiny", p.encoders.models["tiny"], p.cache)
        assert torch.equal(fit.tensors["rows"][20:], student.index(new))
    else:
        texts = prepared.text_map()
        assert fit.texts["texts"][20:] == [texts[t] for t in new]
        assert tr.texts["texts"] == fit.texts["texts"][:20]
    # validation ranks against the labelled train split alone
    task = retrieval_task(data, "val", "train")
    assert task.corpus_size == 20 and task.c_labels is not None and int(task.c_labels.min()) >= 0
    if mode == "head":
        result = train.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                           tmp_path / "train.json", tmp_path / "live")
        assert result["epochs"] == 3
        assert result["samples_per_s"] > 0


def test_labels_in_the_loss_are_refused_before_the_cache_fills(tmp_path: Path,
                                                               tiny_bert: Path) -> None:
    raw = texts_project(tmp_path, tiny_bert, label_weight=0.5)
    write(prepare.build(P.validate(raw).prepare), tmp_path / "prepared", tmp_path / "r.json")
    params_file = write_params(tmp_path / "params.yaml", raw)
    assert cache_stage_refusal(tmp_path, params_file) == [
        f"error: train.distill.label_weight: 0.5, but the prepared data "
        f"({tmp_path / 'prepared'}) holds {NEW} unlabelled texts (they have no label to add); "
        "set it to 0"]
    assert not (tmp_path / "cache").exists()


def test_a_sweep_trial_with_labels_in_the_loss_is_refused_on_unlabelled_texts(
        tmp_path: Path, tiny_bert: Path) -> None:
    """The sweep loads the data once (label_weight 0 passes); a trial that puts the labels
    in the loss would read the texts' -1 labels as one class: refused like the train stage."""
    from simtune.train import sweep

    raw = texts_project(tmp_path, tiny_bert)
    fill(tmp_path, raw)
    p = P.load(tmp_path / "params.yaml")
    loaded = sweep.load(p, tmp_path / "prepared", tmp_path / "cache")
    assert sweep._checked(loaded, {"train.distill.loss": "kl"}).distill.loss == "kl"
    with pytest.raises(UserError, match=r"^train.distill.label_weight: 0.5, but the prepared "
                       rf"data holds {NEW} unlabelled texts"):
        sweep._checked(loaded, {"train.distill.label_weight": 0.5})
