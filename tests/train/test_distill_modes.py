"""Distillation in top_layers and full modes (the student's encoder layers learn the teacher's
vectors), GradCache equal to the plain step there, and DDP: the distillation loss on 2
processes (rows all-gathered, counts all-reduced) gives the gradient of 1 process over both
halves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from simtune.train.distill import DistillLoss, projection
from simtune.train.losses import GroupLoss
from tests.train.distill_helpers import distill_raw, fill
from tests.train_helpers import (
    dropout_free,
    relative_errors,
    step_gradients,
    trained_by_one_and_two_processes,
)


def _encoder_project(root: Path, bert: Path, mode: str, loss: str) -> Path:
    """A distill project in `mode` (top_layers: the top 1 of 2 layers), one epoch, batch 8."""
    raw = distill_raw(root, dropout_free(bert, root / "bert"), loss=loss, label_weight=0.5)
    raw["train"]["mode"] = mode
    raw["train"]["schedule"][mode].update(max_epochs=1, batch_size=8)
    raw["train"]["schedule"]["top_layers"]["layers"] = 1
    results = fill(root, raw)
    assert {r.view for r in results} >= {"tiny", "teacher"}
    return root / "params.yaml"


@pytest.mark.parametrize("mode", ["top_layers", "full"])
@pytest.mark.parametrize("loss", ["cosine", "kl"])
def test_gradcache_steps_as_without_in_the_encoder_modes(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch, mode: str, loss: str
        ) -> None:
    params_file = _encoder_project(tmp_path, tiny_bert, mode, loss)
    steps = step_gradients(tmp_path, params_file, monkeypatch)
    assert len(steps["plain"]) == len(steps["gc"]) == 3  # 20 training texts, batch 8
    for got, want in zip(steps["gc"], steps["plain"], strict=True):
        worst = relative_errors(got, want)
        # the encoder's layers learn from the teacher (not only the head)
        assert any(n.startswith(("rep.encoder", "rep.top")) for n, _ in worst)
        assert worst[0][1] <= 1e-4, worst[:3]


# --- DDP: the loss alone on 2 gloo processes ----------------------------------------------------

def _setup() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    student = torch.nn.Linear(6, 4)
    x, teacher = torch.randn(8, 6), torch.randn(8, 5)
    return student, x, teacher, torch.tensor([0, 1, 0, 1, 2, 2, 0, 1])


def _loss(name: str, weight: float) -> DistillLoss:
    _, _, teacher, _ = _setup()
    proj = projection(teacher, 4) if name != "kl" else None
    return DistillLoss(name, 0.1, proj, GroupLoss("supcon", "cosine", 0.1, 0.2, "batch_hard",
                                                  1.0), weight)


# mse and cosine on halves of 3 and 5 rows: the global count decides the mean (a per-process
# mean would weigh the 3 rows more); kl and the labels' supcon all-gather columns: equal halves
CASES = [("mse", 3, 0.0), ("cosine", 3, 0.0), ("kl", 4, 0.0), ("kl", 4, 0.5), ("mse", 4, 0.5)]


def _rank(rank: int, port: str, out: str) -> None:
    """One of 2 processes, every case of `CASES` in turn (one process group: spawning is the
    cost): rows :first or first: of the batch; the parameters' gradients all-reduced and
    averaged, as DDP does."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    got = {}
    for name, first, weight in CASES:
        student, x, teacher, labels = _setup()
        part = slice(0, first) if rank == 0 else slice(first, 8)
        loss = _loss(name, weight)(student(x[part]), teacher[part], labels[part])
        loss.backward()
        for q in student.parameters():
            torch.distributed.all_reduce(q.grad)
            q.grad /= 2
        losses = [torch.zeros(()) for _ in range(2)]
        torch.distributed.all_gather(losses, loss.detach())
        got[(name, first, weight)] = {"loss": torch.stack(losses).mean(),
                                      "grads": [q.grad for q in student.parameters()]}
    if rank == 0:
        torch.save(got, out)
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every case's loss and gradients from one spawn of 2 gloo processes."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = tmp_path_factory.mktemp("ddp") / "two.pt"
    mp.spawn(_rank, args=(port, str(out)), nprocs=2, join=True)
    return torch.load(out)


@pytest.mark.parametrize(("name", "first", "weight"), CASES)
def test_two_processes_give_the_gradient_of_one(two_processes: dict, name: str, first: int,
                                                weight: float) -> None:
    two = two_processes[(name, first, weight)]
    student, x, teacher, labels = _setup()
    loss = _loss(name, weight)(student(x), teacher, labels)
    loss.backward()
    # each process divides by the global count / 2: their mean is the batch's loss
    assert float(two["loss"]) == pytest.approx(float(loss.detach()), rel=1e-5)
    for got, q in zip(two["grads"], student.parameters(), strict=True):
        assert q.grad.norm() > 0
        torch.testing.assert_close(got, q.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.integration
def test_ddp_two_processes_train_as_one(tmp_path: Path, tiny_bert: Path) -> None:
    """The train stage, full mode, kl + labels: batch 8 x 2 processes with GradCache (chunks
    of 3) == 1 process, batch 16, no GradCache: the same head and encoder weights."""
    import yaml

    params_file = _encoder_project(tmp_path, tiny_bert, "full", "kl")
    raw = yaml.safe_load(params_file.read_text())
    raw["train"]["schedule"]["full"]["batch_size"] = 16
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    trained_by_one_and_two_processes(tmp_path, params_file)
    for part in ("model.safetensors", "encoder/model.safetensors"):
        one = load_file(str(tmp_path / "headone" / part))
        two = load_file(str(tmp_path / "headtwo" / part))
        for k in one:
            assert torch.allclose(one[k], two[k], atol=1e-5), (k, (one[k] - two[k]).abs().max())
    base = load_file(str(tmp_path / "bert" / "model.safetensors"))
    enc = load_file(str(tmp_path / "headone" / "encoder" / "model.safetensors"))
    assert sum(not torch.equal(enc[k], base[k]) for k in base if k in enc) > 10
    assert json.loads((tmp_path / "trainone.json").read_text())["epochs"] == 1
