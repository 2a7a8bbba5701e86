"""The `train` stage, wired with PyTorch Lightning (imported here only, lazily by the stage).

A batch is a tensor of example indices; a `simtune.represent.Representation` turns them into
vectors (head mode: rows of the resident cache table; top_layers: cached layer states through the
trainable top layers; full: the DataLoader tokenises in workers and the whole encoder learns),
then the head. GradCache switches to manual optimisation.
A non-finite loss, weights or validation vectors stop the run with one line (`UserError`,
raised through Lightning, which re-raises it) before anything is saved.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from simtune import heads, represent
from simtune import params as P
from simtune.atomic import atomic_dir, write_json
from simtune.encoders import trim_padding
from simtune.epochs import EpochLoop
from simtune.errors import UserError
from simtune.gradcache import cuda_devices
from simtune.gradcache import step as gradcache_step
from simtune.params import Params, TrainParams
from simtune.sampling import EpochBatches
from simtune.train_data import (
    Split,
    TrainData,
    build_loss,
    check_trainable,
    load_data,
    retrieval_task,
)
from simtune.validation import Schedule, Validator, frozen

log = logging.getLogger("simtune.train")


def _slice(batch: Any, s: int, e: int) -> Any:
    """Rows s:e of a batch; token dicts are trimmed to the chunk's own longest text."""
    if isinstance(batch, dict):
        part = {k: _slice(v, s, e) for k, v in batch.items()}
        return trim_padding(part) if "attention_mask" in part else part
    return batch[s:e]


class SimilarityModule(pl.LightningModule):
    """A representation (`simtune.represent`: cached vectors, cached layer states + top
    layers, or the live encoder), a head and a similarity loss over `TrainData`."""

    def __init__(self, data: TrainData, p: Params) -> None:
        super().__init__()
        self.data, self.t, self.p = data, p.train, p
        t = self.t
        self.rep = represent.build(t.mode, p, data.tables)
        self.head = heads.build(t.head.type, data.dim, t.head.expansion, t.head.dropout)
        self.loss_fn = build_loss(data.kind, t, data.num_classes, data.dim)
        self.automatic_optimization = t.gradcache.chunk_size == 0
        self._step = 0  # 1-based step within the current epoch, for the divergence message

    def setup(self, stage: str) -> None:
        # each process (DDP rank) puts the cached tables on its own device, once
        cp = self.p.cache
        self.rep.place(self.device, lambda name: cp.mapping.get(name, cp.cache_type))

    # --- representations -------------------------------------------------------------------

    def encode_role(self, part: dict[str, Any], role: str) -> torch.Tensor:
        """Training batch part -> (c, D) head outputs for `role`: text | query | doc | neg
        (neg: (c * n, D), each row's n mined negatives)."""
        return self.head(self.rep(self.data.splits["train"], part, role))

    def roles(self) -> list[str]:
        """What a training row is made of: text; or query, doc (and its mined negatives)."""
        if self.data.kind == "groups":
            return ["text"]
        return ["query", "doc"] + (["neg"] if "neg_ids" in self.data.splits["train"].tensors
                                   else [])

    def encode(self, part: dict[str, Any]) -> torch.Tensor:
        """Training batch part -> representations: groups (c, D); pairs (c, 2 [+ n], D)."""
        if self.data.kind == "groups":
            return self.encode_role(part, "text")
        return self.rows_of([self.encode_role(part, role) for role in self.roles()])

    @staticmethod
    def rows_of(parts: list[torch.Tensor]) -> torch.Tensor:
        """Per role (c, D) or, negatives, (c * n, D) -> (c, 2 [+ n], D)."""
        c = parts[0].shape[0]
        return torch.cat([x.reshape(c, -1, x.shape[-1]) for x in parts], 1)

    def loss_of(self, reps: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        tr, dev = self.data.splits["train"].tensors, self.device
        if self.data.kind == "groups":
            return self.loss_fn(reps, tr["labels"][idx].to(dev))
        negs = (reps[:, 2:], tr["neg_ids"][idx].to(dev)) if "neg_ids" in tr else ()
        return self.loss_fn(reps[:, 0], reps[:, 1], tr["q_ids"][idx].to(dev),
                            tr["d_ids"][idx].to(dev), tr["scores"][idx].to(dev), *negs)

    # --- training ------------------------------------------------------------------------------

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor | None:
        idx = batch["idx"]
        self._step = batch_idx + 1
        if self.automatic_optimization:
            loss = self.loss_of(self.encode(batch), idx)
        else:
            loss = self._gradcache_step(batch, idx)
        finite = bool(torch.isfinite(loss.detach()))  # before backward: no step on a NaN loss
        self._stop_if(not finite, f"the loss is {float(loss.detach())}" if not finite else
                      "the loss is not finite in another process")
        self.log("train/loss", loss, on_step=False, on_epoch=True, prog_bar=True,
                 batch_size=len(idx), sync_dist=True)
        return loss if self.automatic_optimization else None

    def _gradcache_step(self, batch: dict[str, Any], idx: torch.Tensor) -> torch.Tensor:
        """GradCache over chunks of `gradcache.chunk_size` texts; for pairs the query chunks, the
        document chunks and the negatives' chunks are separate (one role's activations in memory
        at a time; a negatives chunk holds the negatives of chunk_size / n rows)."""
        opt = self.optimizers()
        opt.zero_grad()  # type: ignore[union-attr]
        c, n, roles = self.t.gradcache.chunk_size, len(idx), self.roles()
        step = {r: max(1, c // self.t.hard_negatives) if r == "neg" else c for r in roles}
        chunks = [(r, _slice(batch, s, s + step[r])) for r in roles for s in range(0, n, step[r])]

        def loss_fn(reps: torch.Tensor) -> torch.Tensor:
            if self.data.kind == "pairs":  # rows: all queries, all documents, all negatives
                reps = self.rows_of([reps[:n], reps[n : 2 * n], reps[2 * n :]][: len(roles)])
            return self.loss_of(reps, idx)

        loss = gradcache_step(lambda chunk: self.encode_role(chunk[1], chunk[0]), chunks,
                              loss_fn, backward=self.manual_backward,
                              devices=cuda_devices(self))
        self._all_reduce_grads()
        opt.step()  # type: ignore[union-attr]
        return loss

    # --- divergence ----------------------------------------------------------------------------

    def _stop_if(self, bad: bool, what: str) -> None:
        """Stop the run with one line when any process saw a non-finite value (all processes
        decide together, so none waits forever in a collective)."""
        if self.trainer.strategy.reduce_boolean_decision(bad, all=False):
            raise UserError(diverged(self.t, self.current_epoch + 1, self._step, what))

    def on_train_start(self) -> None:
        if not self.automatic_optimization and self.trainer.world_size > 1:
            # GradCache reduces gradients itself, once per step (after the last chunk)
            self.trainer.model.require_backward_grad_sync = False  # type: ignore[union-attr]

    def _all_reduce_grads(self) -> None:
        world = self.trainer.world_size
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if world == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        flat /= world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        groups = [{"params": [*self.head.parameters(), *self.loss_fn.parameters()],
                   "lr": self.t.lr}]
        trainable = list(self.rep.parameters())  # top layers or the encoder; none in head mode
        if trainable:
            groups.append({"params": trainable, "lr": self.t.encoder.lr})
        return torch.optim.AdamW(groups, weight_decay=self.t.weight_decay)

    # --- data ----------------------------------------------------------------------------------

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        tr = self.data.splits["train"]
        key = "train.batch_size" if self.t.mode == "head" else "train.encoder.batch_size"
        sampler = EpochBatches(len(tr), self.t.batch_size, self.t.seed,
                               self.trainer.world_size, self.global_rank,
                               tr.tensors.get("labels"), self.t.m_per_label, key)
        return torch.utils.data.DataLoader(
            range(len(tr)), batch_sampler=sampler, collate_fn=_Collate(self.rep, tr),
            num_workers=self.t.num_workers if self.rep.tokenizes else 0,
            pin_memory=self.rep.tokenizes and torch.cuda.is_available())

    def transfer_batch_to_device(self, batch: dict[str, Any], device: torch.device,
                                 dataloader_idx: int) -> dict[str, Any]:
        """Tokens go to the device; the row indices stay on the CPU: they index the split's
        CPU tensors (labels, ids, cached rows), which CUDA indices cannot."""
        rest = super().transfer_batch_to_device(
            {k: v for k, v in batch.items() if k != "idx"}, device, dataloader_idx)
        return {**rest, "idx": batch["idx"]}


class _Collate:
    """Example indices -> batch ({idx}, plus tokenised texts in full mode): runs in DataLoader
    workers, off the training thread. A class, so workers can pickle it."""

    def __init__(self, rep: represent.Representation, split: Split) -> None:
        self.rep, self.split = rep, split

    def __call__(self, idx: list[int]) -> dict[str, Any]:
        return self.rep.collate(self.split, idx)


def diverged(t: TrainParams, epoch: int, step: int, what: str) -> str:
    """The one line for a run that diverged: where, what, and the likely cause (`t`: the
    effective params, see `params.effective`)."""
    if t.mode == "head":
        key, rate = "train.lr", f"the learning rate {t.lr:g}"
    else:
        key = "train.encoder.lr"
        rate = f"the learning rate {t.encoder.lr:g} (head {t.lr:g})"
    return (f"{key}: training diverged at epoch {epoch}, step {step}: {what}; {rate} is "
            "likely too high; nothing saved")


def _accelerator(t: TrainParams) -> str:
    gpu = t.accelerator == "gpu" or (t.accelerator == "auto" and torch.cuda.is_available())
    if gpu and not torch.cuda.is_available():
        raise UserError("train.accelerator: 'gpu' requested but CUDA is not available")
    if not gpu and t.precision == "16-mixed":
        raise UserError("train.precision: '16-mixed' needs a GPU (on CPU Lightning would switch "
                        "to bf16, ~7x slower here); use 32-true")
    available = torch.cuda.device_count() if gpu else (os.cpu_count() or 1)
    if t.devices > available:
        raise UserError(f"train.devices: {t.devices} requested, {available} "
                        f"{'GPUs' if gpu else 'CPU cores'} available")
    if not gpu and t.precision == "bf16-mixed":
        log.warning("bf16-mixed on CPU is much slower than 32-true here")
    return "gpu" if gpu else "cpu"


def _quiet_lightning() -> None:
    """Lightning's tips and deprecation notes are not the user's business."""
    import warnings

    logging.getLogger("pytorch_lightning.utilities.rank_zero").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def run(p: Params, prepared_dir: Path, cache_dir: Path, out: Path, report: Path,
        live_dir: Path, negatives_dir: Path | None = None) -> dict[str, Any]:
    """Train, early-stop on the validation metric, save the best head (and report) atomically;
    `negatives_dir`: the negatives stage's output (read when `train.hard_negatives` > 0)."""
    _quiet_lightning()
    t = P.effective(p.train)
    p = p.model_copy(update={"train": t})
    accelerator = _accelerator(t)
    pl.seed_everything(t.seed, workers=True, verbose=False)
    data = load_data(p, prepared_dir, cache_dir, negatives_dir=negatives_dir)
    check_trainable(data, t, t.devices * t.num_nodes)
    module = SimilarityModule(data, p)
    # the same task as the test evaluation: against the train texts, or leave-one-out
    task = retrieval_task(data, "val", "train" if p.evaluate.corpus == "train" else None)
    validator = Validator(data, task, module.rep.embed_split, module.head, frozen(module.rep))
    loop = EpochLoop(Schedule(t.val_every, t.patience, t.max_epochs), validator, t.monitor,
                     live_dir)
    trainer = pl.Trainer(
        accelerator=accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=t.precision, max_epochs=t.max_epochs, num_sanity_val_steps=0,
        callbacks=[loop], logger=False, enable_checkpointing=False, enable_model_summary=False,
        use_distributed_sampler=False, deterministic="warn" if accelerator == "gpu" else True)
    start = time.perf_counter()
    try:
        trainer.fit(module)
    except RuntimeError as e:  # torch refuses an optimizer scalar beyond float32 (lr: 1e40)
        if "without overflow" not in str(e):
            raise
        raise UserError(diverged(t, trainer.current_epoch + 1, module._step,
                                 "the update overflows float32")) from None
    if trainer.global_rank != 0:
        return {}
    result = report_of(loop, time.perf_counter() - start, len(data.splits["train"]))
    save(module, loop, p, out)
    write_json(report, result)
    sec = result["seconds"]
    log.info("trained %d epochs (best %d: val %s = %.4f), %.2f s/epoch training + %.2f "
             "s/epoch validation (%d of every metric)", result["epochs"], loop.best_epoch,
             t.monitor, loop.schedule.best_value, sec["per_epoch_train"],
             sec["per_epoch_validation"], result["full_validations"])
    return result


def report_of(loop: EpochLoop, total: float, n_train: int) -> dict[str, Any]:
    """`reports/train.json`: epochs, the kept epoch and its validation metrics, the
    validations that computed every metric, and seconds: `total` (trainer.fit), `train` (the
    training epochs), `validation` (every epoch's and the kept epoch's at the end),
    `per_epoch_*` (each / epochs); train + validation <= total (the rest: set-up, curves,
    Lightning between epochs)."""
    epochs = len(loop.train_seconds)
    train_s, val_s = sum(loop.train_seconds), loop.validation_seconds
    return {
        "epochs": epochs, "best_epoch": loop.best_epoch,
        "best_val": loop.history[loop.best_epoch], "full_validations": loop.full_validations,
        "seconds": {"total": total, "train": train_s, "validation": val_s,
                    "per_epoch_train": train_s / max(epochs, 1),
                    "per_epoch_validation": val_s / max(epochs, 1)},
        "samples_per_s": epochs * n_train / max(train_s, 1e-9),
    }


def save(module: SimilarityModule, loop: EpochLoop, p: Params, out: Path) -> None:
    """The best head (safetensors + config.json) and, in full mode, the fine-tuned encoder."""
    best = loop.state
    assert best is not None
    module.head.load_state_dict(best["head"])
    with atomic_dir(out) as tmp:
        heads.save(module.head, tmp)
        if p.train.mode != "head":  # the fine-tuned encoder, an ordinary transformers model
            module.rep.load_state_dict(best["rep"])
            module.rep.save(tmp / "encoder")
        enc, loss = p.encoders, p.train.loss
        # trained on angles (cosine, or arcface, which is cosine whatever the distance): the
        # servable model normalises its output (unit vectors, the same cosine ranking)
        angular = loss.distance == "cosine" or loss.name == "arcface"
        meta = {"mode": p.train.mode, "kind": module.data.kind, "query_encoder": enc.query,
                "document_encoder": enc.document,
                "encoder": enc.models[enc.query].model_dump(), "normalize_output": angular,
                "matryoshka_dims": loss.matryoshka_dims}  # evaluate scores each prefix too
        write_json(tmp / "training.json", meta)
