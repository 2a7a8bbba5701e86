"""The fill's batches: length-sorted texts cut into batches, tokenised off the main thread.

Texts are sorted by token length so each batch pads little; rank r of w takes every w-th text,
so all ranks get the same mix of lengths. Tokenisation runs in DataLoader worker processes when
`cache.num_workers > 0`, else in one background thread a few batches ahead of the encoder.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import torch

Batch = tuple[list[int], dict[str, torch.Tensor]]  # positions in the rank's texts, tokens


class Tokenizes(Protocol):
    """What batching needs of an encoder."""

    device: torch.device

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]: ...

    def token_lengths(self, texts: list[str]) -> list[int]: ...


def rank_order(encoder: Tokenizes, keys: list[str], texts: dict[str, str], rank: int = 0,
               world: int = 1) -> list[str]:
    """The `keys` (of `texts`) rank `rank` of `world` embeds, shortest first (ties by key)."""
    lengths: list[int] = []
    for i in range(0, len(keys), 8192):
        lengths += encoder.token_lengths([texts[k] for k in keys[i : i + 8192]])
    order = sorted(range(len(keys)), key=lambda i: (lengths[i], keys[i]))
    return [keys[i] for i in order[rank::world]]


class Batches(torch.utils.data.Dataset):
    """Item i = (positions, tokenised batch i) of consecutive `batch_size` texts."""

    def __init__(self, texts: list[str], batch_size: int, encoder: Tokenizes) -> None:
        self.texts, self.tokenize = texts, encoder.tokenize
        self.batches = [list(range(i, min(i + batch_size, len(texts))))
                        for i in range(0, len(texts), batch_size)]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        idx = self.batches[i]
        return idx, self.tokenize([self.texts[j] for j in idx])


def tokenised(texts: list[str], batch_size: int, encoder: Tokenizes, num_workers: int
              ) -> Iterable[Batch]:
    """The batches of `texts` in order, tokenised by `num_workers` DataLoader processes, or
    (0) by a background thread while the encoder runs."""
    dataset = Batches(texts, batch_size, encoder)
    if not num_workers:
        return prefetched(dataset[i] for i in range(len(dataset)))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers are the parallelism
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers,
                                       pin_memory=encoder.device.type == "cuda")


def prefetched(items: Iterable[Any], depth: int = 2) -> Iterator[Any]:
    """`items` in order, each computed by a background thread up to `depth` ahead (the fast
    tokenizer and the forward pass both release the GIL, so they overlap). An exception there
    is raised here; leaving the loop early stops the thread."""
    q: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    stop, end = threading.Event(), object()

    def put(item: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for x in items:
                if not put((True, x)):
                    return
            put((True, end))
        except BaseException as e:  # handed to the consumer, raised there
            put((False, e))

    thread = threading.Thread(target=work, name="simtune-tokenize", daemon=True)
    thread.start()
    try:
        while True:
            ok, x = q.get()
            if not ok:
                raise x
            if x is end:
                return
            yield x
    finally:
        stop.set()
        thread.join()


def ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: int) -> Iterator[Any]:
    """`fn(x)` for each of `items`, in order, run by `workers` threads at once (for an `fn`
    that releases the GIL: whole batches in parallel, no synchronisation inside one); at most
    `workers + 1` items in flight. An exception in `fn` is raised here; leaving early waits for
    the ones in flight only. `workers` <= 1: plain `map`."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="simtune-embed") as pool:
        pending: deque[Future[Any]] = deque()
        try:
            for x in items:
                pending.append(pool.submit(fn, x))
                if len(pending) > workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
