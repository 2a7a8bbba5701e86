"""Batches of example indices for training, identical for any number of processes.

Each epoch is one order of example indices drawn from a generator seeded with (seed, epoch),
cut into *global* batches of `batch_size * world`; process `rank` takes the rank-th equal part
of each. So 2 processes x batch B see exactly the rows of 1 process x batch 2B, in the same
order, which makes their gradients equal. Every example is used every epoch: the last global
batch is smaller (the remainder). Processes must gather equal-sized tensors, so when that
remainder does not divide by `world` it is topped up with the first examples of the epoch's order
(fewer than `world` examples are then seen twice; with one process, never).

With `passes` p > 1 (the step floor, `simtune.train.run_steps`), an epoch is p such orders one
after the other, each cut into batches on its own: every example is used p times an epoch, and
the first order is the one `passes` 1 draws.

With `m_per_label`, the order is made of runs of one label each, at least m examples long: a
label with c >= m examples gives c // m runs of near-equal size (all of its examples, once), a
label with fewer than m examples one run of m (its examples repeated).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

log = logging.getLogger(__name__)


def fit_batch_size(epoch_size: int, batch_size: int, world: int, announce: bool = True,
                   key: str = "train.schedule.head.batch_size") -> int:
    """`batch_size`, or the per-process batch that covers the whole epoch in one global batch
    when `batch_size * world` is larger than the epoch (a warning naming the params `key` when
    `announce`)."""
    whole = -(-epoch_size // world)
    if batch_size <= whole or not announce:
        return min(batch_size, whole)
    procs = f" x {world} processes" if world > 1 else ""
    log.warning("%s %d%s is more than the %d training examples: using %d%s "
                "(one batch per epoch)", key, batch_size, procs, epoch_size, whole,
                " per process" if world > 1 else "")
    return whole


class EpochBatches(torch.utils.data.Sampler[list[int]]):
    """Yields lists of example indices; Lightning calls `set_epoch` before each epoch.

    `batch_size` is per process; one larger than the epoch is reduced by `fit_batch_size`."""

    def __init__(self, n: int, batch_size: int, seed: int, world: int = 1, rank: int = 0,
                 labels: torch.Tensor | None = None, m_per_label: int = 0,
                 key: str = "train.schedule.head.batch_size", passes: int = 1) -> None:
        self.n, self.seed, self.world, self.rank, self.epoch = n, seed, world, rank, 0
        self.passes = passes
        self.labels, self.m = labels, m_per_label
        if self.m:
            assert labels is not None and len(labels) == n
            counts = torch.bincount(labels)
            self.epoch_size = int(counts[counts > 0].clamp_min(self.m).sum())
        else:
            self.epoch_size = n
        self.batch_size = fit_batch_size(self.epoch_size, batch_size, world, rank == 0, key)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def per_pass(self) -> int:
        """Batches one pass over the examples makes."""
        return -(-self.epoch_size // (self.batch_size * self.world))

    def __len__(self) -> int:
        return self.per_pass() * self.passes

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        size = self.batch_size * self.world
        for _ in range(self.passes):
            order = self._m_per_label(g) if self.m else torch.randperm(self.n, generator=g)
            for b in range(self.per_pass()):
                batch = order[b * size : (b + 1) * size]
                if len(batch) % self.world:  # the last one: top up to equal parts
                    batch = torch.cat([batch, order[: self.world - len(batch) % self.world]])
                part = len(batch) // self.world
                yield batch[self.rank * part : (self.rank + 1) * part].tolist()

    def _m_per_label(self, g: torch.Generator) -> torch.Tensor:
        """A permutation made of runs of >= m examples of one label, runs in random order."""
        assert self.labels is not None
        runs: list[torch.Tensor] = []
        for lab in torch.unique(self.labels):
            idx = torch.nonzero(self.labels == lab).squeeze(1)
            idx = idx[torch.randperm(len(idx), generator=g)]
            if len(idx) < self.m:  # too few: repeat to fill one run
                idx = idx.repeat(-(-self.m // len(idx)))[: self.m]
            runs += list(torch.tensor_split(idx, len(idx) // self.m))
        perm = torch.randperm(len(runs), generator=g)
        return torch.cat([runs[i] for i in perm])
