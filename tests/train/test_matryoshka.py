"""Matryoshka: the loss at dims [m] is the plain loss on the first m coordinates (hand values
of tests/train/test_losses.py, with a third coordinate that must be ignored), weights sum,
GradCache keeps the full-batch gradient, and evaluate's per-dim metrics equal metrics of
truncated vectors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.errors import UserError
from simtune.retrieval import metrics
from simtune.train import gradcache, matryoshka
from simtune.train.data import load_data
from simtune.train.losses import GroupLoss, PairLoss
from simtune.train.matryoshka import Matryoshka
from stages import app
from tests.train_helpers import project, stage_args

exp, log = math.exp, math.log
# tests/train/test_losses.py's a=(1,0), b=(.6,.8), c=(0,1), d=(-1,0), each with a third coordinate
# that changes every similarity if it is not cut off
E3 = torch.tensor([[1.0, 0.0, 5.0], [0.6, 0.8, -3.0], [0.0, 1.0, 2.0], [-1.0, 0.0, 1.0]])
LABELS = torch.tensor([0, 0, 1, 1])
SUPCON = (-(0.6 - log(exp(0.6) + 1 + exp(-1))) - (0.6 - log(exp(0.6) + exp(0.8) + exp(-0.6)))
          - (0 - log(1 + exp(0.8) + 1)) - (0 - log(exp(-1) + exp(-0.6) + 1))) / 4


def _group(name: str, **kw: float | str) -> GroupLoss:
    args = {"distance": "cosine", "temperature": 1.0, "margin": 0.5, "mining": "batch_hard",
            "scale": 1.0, **kw}
    return GroupLoss(name, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "want"), [
    ("supcon", SUPCON),
    ("triplet", (0 + 0.7 + 1.3 + 0) / 4),
    ("contrastive", (2 * 0.5 * 0.4**2 + 2 * 0.5 * 1.0 + 2 * 0.5 * 0.3**2) / 12),
])
def test_group_losses_at_dims_2_are_the_2d_hand_values(name: str, want: float) -> None:
    got = Matryoshka(_group(name), [2])(E3, LABELS).item()
    assert got == pytest.approx(want, abs=1e-6)
    assert _group(name)(E3, LABELS).item() != pytest.approx(want, abs=1e-3)  # the 3rd matters


def test_weighted_sum_over_dims() -> None:
    loss = _group("supcon")
    full = loss(E3, LABELS).item()
    got = Matryoshka(loss, [3, 2], [0.5, 2.0])(E3, LABELS).item()
    assert got == pytest.approx(0.5 * full + 2 * SUPCON, abs=1e-6)
    assert Matryoshka(loss, [3, 2])(E3, LABELS).item() == pytest.approx(full + SUPCON, abs=1e-6)


def test_mnrl_at_dims_2_is_the_2d_hand_value() -> None:
    q, d = E3[[0, 2]], E3[[1, 3]]  # queries a, c; documents b, d
    loss = PairLoss("mnrl", "cosine", 1.0, False, 0.5)
    want = (-(0.6 - log(exp(0.6) + exp(-1))) - (0 - log(exp(0.8) + 1))) / 2
    got = Matryoshka(loss, [2])(q, d, torch.tensor([0, 1]), torch.tensor([10, 11]),
                                torch.ones(2)).item()
    assert got == pytest.approx(want, abs=1e-6)


def test_arcface_compares_the_prefix_with_the_centres_prefix() -> None:
    loss = _group("arcface", scale=2.0, num_classes=2, dim=3)
    with torch.no_grad():  # centres (1,0,7), (0,1,-7): their 2-d prefixes are the unit axes
        loss.centers.copy_(torch.tensor([[1.0, 0.0, 7.0], [0.0, 1.0, -7.0]]))
    s, m = 2.0, 0.5

    def ce(logits: list[float], target: int) -> float:
        return -(logits[target] - log(sum(exp(x) for x in logits)))

    want = (ce([s * math.cos(m), 0.0], 0)
            + ce([s * (0.6 * math.cos(m) - 0.8 * math.sin(m)), s * 0.8], 0)
            + ce([0.0, s * math.cos(m)], 1)
            + ce([-s, s * -math.sin(m)], 1)) / 4
    assert Matryoshka(loss, [2])(E3, LABELS).item() == pytest.approx(want, abs=1e-5)


def test_dims_beyond_the_output_and_bad_params(params_raw: dict) -> None:
    with pytest.raises(UserError, match=r"^train.loss.matryoshka_dims: 512 is larger than the "
                       r"head's output dim \(384\)$"):
        matryoshka.check_dims([256, 512], 384)
    params_raw["train"]["loss"]["matryoshka_dims"] = [64, 64]
    with pytest.raises(UserError, match="matryoshka_dims: \\[64, 64\\] lists a dim twice"):
        P.validate(params_raw)
    params_raw["train"]["loss"].update(matryoshka_dims=[64, 32], matryoshka_weights=[1])
    with pytest.raises(UserError, match="matryoshka_weights: 1 weights for 2 dims"):
        P.validate(params_raw)
    params_raw["train"]["loss"]["matryoshka_weights"] = [1, 0.5]
    assert P.validate(params_raw).train.loss.matryoshka_weights == [1.0, 0.5]


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["groups", "pairs"])
@pytest.mark.parametrize("chunk", [1, 5])
def test_gradcache_gives_the_full_batch_gradient(kind: str, chunk: int) -> None:
    torch.manual_seed(0)
    b = 10
    head = heads.build("mlp", 16, 2, 0.3).train()  # dropout on: replayed per chunk
    with torch.no_grad():
        head.net[-1].weight.normal_(0, 0.1)
    x = torch.randn(2 * b, 16)  # groups: the first b rows; pairs: b queries, b documents
    if kind == "groups":
        inner: torch.nn.Module = _group("supcon", temperature=0.1)
        rows, labels = b, torch.tensor([0, 1, 2, 3, 4] * 2)

        def loss_of(reps: torch.Tensor) -> torch.Tensor:
            return loss_fn(reps, labels)
    else:
        inner, rows = PairLoss("mnrl", "cosine", 20.0, True, 0.5), 2 * b
        ids = torch.arange(b)

        def loss_of(reps: torch.Tensor) -> torch.Tensor:
            return loss_fn(reps[:b], reps[b:], ids, ids + 100, torch.ones(b))
    loss_fn = Matryoshka(inner, [16, 8, 4], [1.0, 0.5, 0.25])
    chunks = [x[s : min(s + chunk, rows)] for s in range(0, rows, chunk)]
    torch.manual_seed(1)
    head.zero_grad()
    want_loss = loss_of(torch.cat([head(c) for c in chunks]))
    want_loss.backward()
    want = _grads(head)
    torch.manual_seed(1)
    head.zero_grad()
    got_loss = gradcache.step(head, chunks, loss_of)
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=1e-6)
    got = _grads(head)
    assert got.keys() == want.keys() and want
    for name in want:
        err = (got[name] - want[name]).norm() / want[name].norm().clamp_min(1e-12)
        assert err <= 1e-5, (name, float(err))


def test_evaluate_reports_each_dim_as_metrics_of_truncated_vectors(tmp_path: Path,
                                                                  tiny_bert: Path) -> None:
    """Train with dims [32, 8] (the tiny encoder is 32-d), evaluate, recompute by hand."""
    root = tmp_path
    raw, params_file = project(root, tiny_bert)
    raw["train"]["loss"]["matryoshka_dims"] = [32, 8]
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    args = ["evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
            "--cache", str(root / "cache"), "--head", str(root / "head"),
            "--out", str(root / "metrics.json"),
            "--metrics", str(root / "headline.json"), "--plot", str(root / "recall.json"),
            "--detail", str(root / "detail.json"), "--run-trained", str(root / "t.trec"),
            "--run-baseline", str(root / "b.trec")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    m = json.loads((root / "metrics.json").read_text())
    assert list(m["matryoshka"]) == ["32", "8"]
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache")
    head = heads.load(root / "head")
    test, train = data.splits["test"].tensors, data.splits["train"].tensors
    assert data.q_vectors is not None
    for name, fn in (("trained", head), ("baseline", lambda v: v)):
        with torch.inference_mode():
            q = fn(data.q_vectors[test["rows"]].float())
            c = fn(data.q_vectors[train["rows"]].float())
        for dim in (32, 8):
            qd = torch.nn.functional.normalize(q[:, :dim], dim=-1)
            cd = torch.nn.functional.normalize(c[:, :dim], dim=-1)
            want, _ = metrics.group_scores(qd, test["labels"], cd, train["labels"], (1, 10))
            got = m["matryoshka"][str(dim)][name]
            assert set(got) == {"p@1", "mrr@10", "ndcg@10", "map@r"}
            assert got == pytest.approx({k: want[k] for k in got}, abs=1e-6)
        full = m["matryoshka"]["32"][name]  # 32 = every dim: the headline itself
        assert full == pytest.approx({k: m[name][k] for k in full}, abs=1e-6)
    lift = m["matryoshka"]["8"]["lift"]
    assert lift == pytest.approx({k: m["matryoshka"]["8"]["trained"][k]
                                  - m["matryoshka"]["8"]["baseline"][k] for k in lift})
    assert json.loads((root / "head" / "training.json").read_text())["matryoshka_dims"] == [32, 8]
