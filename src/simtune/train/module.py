"""The LightningModule: the representation, the head and the loss; one training step (GradCache
when chunked) and the validation metric each epoch."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from simtune import heads
from simtune.encoders import trim_padding
from simtune.errors import UserError
from simtune.examples import Data, Split
from simtune.params import CacheParams, EncodersParams, TrainParams
from simtune.train import distill, represent
from simtune.train.gradcache import cuda_devices
from simtune.train.gradcache import step as gradcache_step
from simtune.train.losses import build_loss
from simtune.train.sampling import EpochBatches


def _slice(batch: Any, s: int, e: int) -> Any:
    """Rows s:e of a batch; token dicts are trimmed to the chunk's own longest text. A token
    dict of windows (`represent.WINDOWS`: (n,) windows per text) gives texts s:e's windows."""
    if isinstance(batch, dict) and represent.WINDOWS in batch:
        counts = batch[represent.WINDOWS]
        a = int(counts[:s].sum())
        b = a + int(counts[s:e].sum())
        return trim_padding({k: v[s:e] if k == represent.WINDOWS else v[a:b]
                             for k, v in batch.items()})
    if isinstance(batch, dict):
        part = {k: _slice(v, s, e) for k, v in batch.items()}
        return trim_padding(part) if "attention_mask" in part else part
    return batch[s:e]



class SimilarityModule(pl.LightningModule):
    """A representation (`simtune.train.represent`: cached vectors, cached layer states + top
    layers, or the live encoder), a head and a similarity loss over `Data`.

    `t`: the train params (resolved, the batch size fit to the data: `stage.fit_schedule`);
    `enc`: the encoders (the query encoder's, top_layers and full modes); `cache`: where each
    process places the cached tables (`cache.cache_type`, `cache.mapping`)."""

    def __init__(self, data: Data, t: TrainParams, enc: EncodersParams,
                 cache: CacheParams) -> None:
        super().__init__()
        self.data, self.t, self.cache_params = data, t, cache
        self.rep = represent.build(t.mode, enc, data.tables, t.lora,
                                   t.schedule.full.train_embeddings)
        self.head = heads.build(t.head.type, data.dim, t.head.expansion, t.head.dropout)
        self.loss_fn = self._loss(data, t)
        self.automatic_optimization = t.gradcache.chunk_size == 0
        self._step = 0  # 1-based step within the current epoch, for the divergence message

    @staticmethod
    def _loss(data: Data, t: TrainParams) -> torch.nn.Module:
        """The similarity loss (`train.loss`), or the distillation loss (`simtune.train.distill`)
        with the similarity loss inside when `distill.label_weight` > 0."""
        if t.objective != "distill":
            return build_loss(data.kind, t, data.num_classes, data.dim)
        labels = (build_loss(data.kind, t, data.num_classes, data.dim)
                  if t.distill.label_weight > 0 else None)
        return distill.build(t.distill, data.tables["teacher"].vectors, data.training,
                             data.dim, labels)

    def setup(self, stage: str) -> None:
        # each process (DDP rank) puts the cached tables on its own device, once
        cp = self.cache_params
        self.rep.place(self.device, lambda name: cp.mapping.get(name, cp.cache_type))

    # --- representations -------------------------------------------------------------------

    def encode_role(self, part: dict[str, Any], role: str) -> torch.Tensor:
        """Training batch part -> (c, D) head outputs for `role`: text | query | doc | neg
        (neg: (c * n, D), each row's n mined negatives)."""
        return self.head(self.rep(self.data.training, part, role))

    def roles(self) -> list[str]:
        """What a training row is made of: text; or query, doc (and its mined negatives)."""
        if self.data.kind == "groups":
            return ["text"]
        return ["query", "doc"] + (["neg"] if "neg_ids" in self.data.training.tensors
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
        tr, dev = self.data.training.tensors, self.device
        if self.t.objective == "distill":  # the teacher's cached vectors of the rows
            teacher = self.data.tables["teacher"].vectors[tr["t_rows"][idx]]
            return self.loss_fn(reps, teacher.to(dev).float(), tr["labels"][idx].to(dev))
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
            raise Diverged(diverged(self.t, self.current_epoch + 1, self._step, what))

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
                   "lr": self.t.run.lr}]
        # the top layers or the encoder (their LoRA adapters only when on); none in head mode
        trainable = [q for q in self.rep.parameters() if q.requires_grad]
        if trainable:
            groups.append({"params": trainable, "lr": self.t.run.encoder_lr})
        # one fused kernel per step instead of a loop over tensors (sentence-transformers'
        # trainer does the same by default): it counts once the encoder's weights train
        fused = all(q.is_floating_point() and q.device.type in ("cpu", "cuda")
                    for g in groups for q in g["params"])
        return torch.optim.AdamW(groups, weight_decay=self.t.weight_decay, fused=fused)

    # --- data ----------------------------------------------------------------------------------

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        tr = self.data.training
        key = f"train.schedule.{self.t.mode}.batch_size"
        sampler = EpochBatches(len(tr), self.t.run.batch_size, self.t.seed,
                               self.trainer.world_size, self.global_rank,
                               tr.tensors.get("labels"), self.t.m_per_label, key,
                               self.t.run.passes)
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



class Diverged(UserError):
    """A run whose loss, weights or vectors stopped being finite. Its checkpoint and curves are
    discarded (`is_divergence`): resuming the same settings would diverge again, and a new lr
    starts afresh anyway (the checkpoint's fingerprint covers it)."""


def is_divergence(e: BaseException) -> bool:
    """Whether `e` ends a run that diverged: `Diverged`, or torch refusing an optimizer
    scalar beyond float32 (`lr: 1e40`: "value cannot be converted ... without overflow")."""
    return isinstance(e, Diverged) or (isinstance(e, RuntimeError)
                                       and "without overflow" in str(e))


def diverged(t: TrainParams, epoch: int, step: int, what: str) -> str:
    """The one line for a run that diverged: where, what, and the likely cause (`t`: the
    effective params, see `params.effective`)."""
    key = f"train.schedule.{t.mode}.lr"
    if t.mode == "head":
        rate = f"the learning rate {t.run.lr:g}"
    else:
        rate = f"the learning rate {t.run.encoder_lr:g} (head {t.run.lr:g})"
    return (f"{key}: training diverged at epoch {epoch}, step {step}: {what}; {rate} is "
            "likely too high; nothing saved")
