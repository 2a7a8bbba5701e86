"""Distillation into a query-side head (issue 37): `kl` ranks the frozen vectors of the batch's
rows as the teacher ranks the teacher's; the loss by hand, what is refused, and a run whose
head learns while the documents stay the frozen encoder's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from simtune import params as P
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.model import load_model
from simtune.train import stage as train
from simtune.train.distill import DistillLoss
from tests.cache_helpers import sentences
from tests.train.distill_helpers import distill_raw, fill


def test_the_kl_of_a_query_side_head_compares_its_rows_with_the_frozen_columns() -> None:
    """Head outputs a=(1,0), b=(0,1), c=(.6,.8) against frozen rows A=(0,1), B=(1,0), C=(1,0):
    row a: cos aB 1, aC 1; row b: bA 1, bC 0; row c: cA .8, cB .6. Teacher a=(1,0), b=(0,1),
    c=(-1,0): ab 0, ac -1, bc 0. Each row over the other two, temperature .5."""
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    frozen = torch.tensor([[0.0, 2.0], [1.0, 0.0], [3.0, 0.0]])
    teacher = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])

    def kl(t: tuple[float, float], s: tuple[float, float]) -> float:
        pt = [math.exp(x / 0.5) / sum(math.exp(y / 0.5) for y in t) for x in t]
        ps = [math.exp(x / 0.5) / sum(math.exp(y / 0.5) for y in s) for x in s]
        return sum(p * math.log(p / q) for p, q in zip(pt, ps, strict=True))

    want = (kl((0, -1), (1, 1)) + kl((0, 0), (1, 0)) + kl((-1, 0), (0.8, 0.6))) / 3
    got = DistillLoss("kl", 0.5)(head, teacher, None, frozen).item()
    assert got == pytest.approx(want, abs=1e-6)
    # without the columns the same head is compared with itself: another loss
    assert DistillLoss("kl", 0.5)(head, teacher).item() != pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize(("key", "value", "said"), [
    ("loss", "mse", "distill.loss: mse"), ("label_weight", 0.5, "distill.label_weight: 0.5")])
def test_a_query_side_distillation_refuses_what_does_not_rank_frozen_documents(
        key: str, value: object, said: str, tmp_path: Path, tiny_bert: Path) -> None:
    raw = distill_raw(tmp_path, tiny_bert, teacher=tiny_bert / "teacher", loss="kl")
    raw["train"]["head"]["side"] = "query"
    assert P.validate(raw).train.head.side == "query"
    raw["train"]["distill"][key] = value
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert "\n" not in str(e.value) and f"head.side: query is not with {said}" in str(e.value)


def test_a_query_side_head_distils_and_the_documents_stay_frozen(tmp_path: Path,
                                                                tiny_bert: Path) -> None:
    raw = distill_raw(tmp_path, tiny_bert, n=80, loss="kl")
    raw["train"]["schedule"]["head"].update(max_epochs=6, patience=6, lr=0.01)
    raw["train"]["frozen_candidate"] = False
    raw["train"]["head"].update(side="query", dropout=0.0)
    fill(tmp_path, raw)
    p = P.load(tmp_path / "params.yaml")
    live = tmp_path / "live"
    train.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
              tmp_path / "train.json", live)
    curve = (live / "plots" / "metrics" / "train" / "loss.tsv").read_text().splitlines()[1:]
    losses = [float(line.split("\t")[-1]) for line in curve]
    assert losses[-1] < 0.9 * losses[0], losses
    assert json.loads((tmp_path / "head" / "training.json").read_text())["head_side"] == "query"
    model = load_model(tmp_path / "head", encoder=str(tiny_bert))
    texts = sentences(6)
    frozen = FrozenEncoder("tiny", p.encoders.models["tiny"], torch.device("cpu")).encode(texts, 8)
    assert torch.equal(model.encode(texts, 8, role="document"), frozen)
    assert not torch.allclose(model.encode(texts, 8), frozen, atol=1e-3)
