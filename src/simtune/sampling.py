"""Batches of example indices for training, identical for any number of processes.

Each epoch draws *global* batches of `batch_size * world` examples from a generator seeded with
(seed, epoch); process `rank` takes rows [rank * batch_size, (rank + 1) * batch_size) of each.
So 2 processes x batch B see exactly the rows of 1 process x batch 2B, in the same order, which
makes their gradients equal. Incomplete global batches are dropped (every process must gather
equal-sized tensors). With `m_per_label`, each batch holds m examples of each of its labels.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class EpochBatches(torch.utils.data.Sampler[list[int]]):
    """Yields lists of example indices; Lightning calls `set_epoch` before each epoch."""

    def __init__(self, n: int, batch_size: int, seed: int, world: int = 1, rank: int = 0,
                 labels: torch.Tensor | None = None, m_per_label: int = 0) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.world, self.rank, self.epoch = world, rank, 0
        self.labels, self.m = labels, m_per_label

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // (self.batch_size * self.world)

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = self._m_per_label(g) if self.m else torch.randperm(self.n, generator=g)
        size = self.batch_size * self.world
        for b in range(len(self)):
            batch = order[b * size : (b + 1) * size]
            yield batch[self.rank * self.batch_size : (self.rank + 1) * self.batch_size].tolist()

    def _m_per_label(self, g: torch.Generator) -> torch.Tensor:
        """A permutation made of runs of m examples of one label, labels in random order."""
        assert self.labels is not None
        runs = []
        for lab in torch.unique(self.labels):
            idx = torch.nonzero(self.labels == lab).squeeze(1)
            idx = idx[torch.randperm(len(idx), generator=g)]
            if len(idx) < self.m:  # too few: repeat to fill one run
                idx = idx.repeat(-(-self.m // len(idx)))
            runs += list(idx[: len(idx) - len(idx) % self.m].split(self.m))
        perm = torch.randperm(len(runs), generator=g)
        return torch.cat([runs[i] for i in perm])[: self.n]
