"""Matryoshka representation learning (Kusupati et al. 2022): one vector whose prefixes are
embeddings too, so a user can keep the first 64 of 384 dims and lose little.

Training: the loss is L = sum over m of c_m * loss(z[..., :m]) for each listed dim m, the
paper's objective (it sets every c_m = 1; `train.loss.matryoshka_weights` sets others). Every
embedding tensor the loss gets (a floating tensor of 2 or more dims: groups' (B, D), pairs' (B, D)
queries and documents, hard negatives (B, n, D)) is cut to its first m coordinates; labels, ids
and scores pass unchanged. The wrapped loss does what it does with any vector (cosine normalises
the prefix; dot and euclidean use it as it is); arcface compares the prefix with the same prefix
of its class centres (the paper's weight-tied MRL-E). Since the loss is a function of the whole
batch's vectors, GradCache gives the full-batch gradient unchanged.

Evaluation: each model's test vectors cut to m dims and re-normalised (cosine), then ranked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from simtune.errors import UserError

Vectors = Callable[[torch.Tensor, str], torch.Tensor]  # (rows, role) -> (n, D)


def prefix(x: Any, dim: int) -> Any:
    """`x[..., :dim]` for an embedding tensor (floating, 2 or more dims); anything else as is."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 2:
        return x[..., :dim]
    return x


class Matryoshka(nn.Module):
    """sum_m w_m * loss(args cut to m dims); the wrapped loss (and its parameters) inside."""

    def __init__(self, loss: nn.Module, dims: Sequence[int], weights: Sequence[float] = ()
                 ) -> None:
        super().__init__()
        self.loss, self.dims = loss, tuple(dims)
        self.weights = tuple(weights) or (1.0,) * len(self.dims)

    def forward(self, *args: Any) -> torch.Tensor:
        return torch.stack([w * self.loss(*(prefix(a, m) for a in args))
                            for m, w in zip(self.dims, self.weights, strict=True)]).sum()


def wrap(loss: nn.Module, dims: Sequence[int], weights: Sequence[float]) -> nn.Module:
    """`loss` itself when `dims` is empty, else its Matryoshka sum."""
    return Matryoshka(loss, dims, weights) if dims else loss


def check_dims(dims: Sequence[int], out_dim: int) -> None:
    """Every dim must fit in the head's `out_dim`-d output (one line otherwise)."""
    too_large = [m for m in dims if m > out_dim]
    if too_large:
        raise UserError(f"train.loss.matryoshka_dims: {too_large[0]} is larger than the head's "
                        f"output dim ({out_dim})")


