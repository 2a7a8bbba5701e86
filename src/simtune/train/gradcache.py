"""GradCache (Gao et al. 2021): a contrastive step over a batch larger than memory, with exactly
the gradient of the whole batch.

1. Pass 1, no grad: representations chunk by chunk; each chunk's RNG state (CPU and CUDA) is
   saved first, so dropout can be replayed.
2. The loss on the detached, concatenated representations; its backward gives d loss / d rep for
   every row (and the gradients of any parameters of the loss itself).
3. Pass 2: each chunk is replayed under its saved RNG state, with grad, and back-propagates
   dot(rep, d loss / d rep): the chain rule, one chunk of activations in memory at a time.

Under fp16 the caller's `backward` scales the loss once; pass 2 back-propagates the already
scaled representation gradients with a plain backward, so the scale is applied exactly once.
Under DDP the caller passes `sync(last)`: no gradient all-reduce except on the last chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch


class RandState:
    """The CPU RNG state and the RNG states of `cuda_devices`, captured now."""

    def __init__(self, cuda_devices: Sequence[int]) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = [(d, torch.cuda.get_rng_state(d)) for d in cuda_devices]

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run the block under the captured states; the current states are restored after."""
        with torch.random.fork_rng(devices=[d for d, _ in self.cuda]):
            torch.set_rng_state(self.cpu)
            for device, state in self.cuda:
                torch.cuda.set_rng_state(state, device)
            yield


def cuda_devices(module: torch.nn.Module) -> list[int]:
    """CUDA device indices of `module`'s parameters (whose RNGs dropout draws from)."""
    return sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})


def step(encode: Callable[[Any], torch.Tensor], chunks: Sequence[Any],
         loss_fn: Callable[[torch.Tensor], torch.Tensor],
         backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
         sync: Callable[[bool], contextlib.AbstractContextManager[Any]] = (
             lambda last: contextlib.nullcontext()),
         devices: Sequence[int] = ()) -> torch.Tensor:
    """One GradCache step; leaves the full-batch gradient in `.grad` and returns the loss.

    encode(chunk) -> (c, ...) representations of one chunk (its rows, any trailing shape);
    loss_fn(reps) -> scalar loss of the whole batch's representations (sum of c = B rows);
    backward(loss): e.g. Lightning's `manual_backward` (scales under fp16);
    sync(is_last_chunk): context for each replayed backward (DDP `no_sync` unless last).
    """
    states, reps = [], []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RandState(devices))
            reps.append(encode(chunk))
    full = torch.cat(reps).detach().requires_grad_(True)
    loss = loss_fn(full)
    backward(loss)
    assert full.grad is not None, "the loss does not depend on the representations"
    grads = full.grad.split([r.shape[0] for r in reps])
    for i, (chunk, grad) in enumerate(zip(chunks, grads, strict=True)):
        with states[i].replay(), sync(i == len(chunks) - 1):
            torch.autograd.backward(encode(chunk), grad_tensors=grad)
    return loss.detach()
