"""The fill's batches: texts in windows, each tokenised once, sorted and cut into batches, off
the main thread.

Each rank's texts are sorted by character length (no tokenising pass before the first batch;
rank r of w takes every w-th text, so all ranks get the same mix of lengths), then taken a
window of `WINDOW` batches at a time: the window is tokenised once (unpadded), sorted by token
count and cut into batches padded from those tokens (`FrozenEncoder.pad`), so each batch pads
as little as a global token sort would give. Tokenisation runs in DataLoader worker processes
when `cache.num_workers > 0`, else in one background thread a window ahead of the encoder.
Nothing is pinned: a batch's tokens are ~1 MB, a copy of ~0.1 ms to a GPU.
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
WINDOW = 8  # batches tokenised and sorted together


class Tokenizes(Protocol):
    """What batching needs of an encoder."""

    device: torch.device

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]: ...

    def token_lengths(self, texts: list[str]) -> list[int]: ...

    def pieces(self, texts: list[str]) -> list[Any] | None: ...

    def pad(self, pieces: list[Any]) -> dict[str, torch.Tensor]: ...


def rank_order(keys: list[str], texts: dict[str, str], rank: int = 0, world: int = 1
               ) -> list[str]:
    """The `keys` (of `texts`) rank `rank` of `world` embeds, shortest first by characters
    (ties by key): the windows' order (`tokenised` sorts each window by tokens)."""
    order = sorted(keys, key=lambda k: (len(texts[k]), k))
    return order[rank::world]


def sorted_batches(texts: list[str], batch_size: int, encoder: Tokenizes) -> list[Batch]:
    """`texts` (one window) sorted by token count (ties by position) and cut into batches of
    `batch_size`: (positions in `texts`, tokens equal to `encoder.tokenize` of those texts).
    Tokenised once where the encoder has a fast path, else lengths first, then each batch."""
    pieces = encoder.pieces(texts)
    lengths = (encoder.token_lengths(texts) if pieces is None
               else [len(p.ids) for p in pieces])
    order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
    out = []
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        tokens = (encoder.tokenize([texts[i] for i in idx]) if pieces is None
                  else encoder.pad([pieces[i] for i in idx]))
        out.append((idx, tokens))
    return out


class Windows(torch.utils.data.Dataset):
    """Item i = window i's batches (`sorted_batches` of `WINDOW` x `batch_size` consecutive
    texts), positions in all of `texts`."""

    def __init__(self, texts: list[str], batch_size: int, encoder: Tokenizes) -> None:
        self.texts, self.batch_size, self.encoder = texts, batch_size, encoder
        self.size = WINDOW * batch_size

    def __len__(self) -> int:
        return -(-len(self.texts) // self.size)

    def __getitem__(self, i: int) -> list[Batch]:
        lo = i * self.size
        return [([lo + j for j in idx], tokens) for idx, tokens in
                sorted_batches(self.texts[lo : lo + self.size], self.batch_size, self.encoder)]


def tokenised(texts: list[str], batch_size: int, encoder: Tokenizes, num_workers: int
              ) -> Iterable[Batch]:
    """The batches of `texts`, window by window, tokenised by `num_workers` DataLoader
    processes, or (0) by a background thread while the encoder runs. Every text is in exactly
    one batch."""
    windows = Windows(texts, batch_size, encoder)
    if not num_workers:
        return prefetched((b for w in range(len(windows)) for b in windows[w]),
                          depth=WINDOW + 1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers are the parallelism
    loader = torch.utils.data.DataLoader(windows, batch_size=None, num_workers=num_workers)
    return (b for window in loader for b in window)


def lagged(items: Iterable[Any], lag: int) -> Iterator[Any]:
    """`items` in order, each yielded once `lag` more have been taken from `items`: a GPU
    batch's copy back to the host is finished while the next batches run."""
    held: deque[Any] = deque()
    for x in items:
        held.append(x)
        if len(held) > lag:
            yield held.popleft()
    yield from held


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
