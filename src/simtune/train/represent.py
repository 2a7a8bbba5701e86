"""What turns a batch of example indices into vectors: one small interface, three ways.

| class            | mode         | what it reads                        | what trains            |
|------------------|--------------|--------------------------------------|------------------------|
| `CachedVectors`  | `head`       | pooled vectors of the frozen encoder | nothing (the head)     |
| `CachedStates`   | `top_layers` | token states after layer k = L - K   | the top K layers       |
| `LiveEncoder`    | `full`       | tokenised texts                      | the whole encoder      |

All give (n, D) pooled (and, per the encoder's settings, normalised) vectors *before* the head,
for a training batch part (`forward`) or a whole split (`embed_split`); `collate` prepares a batch
in DataLoader workers (tokenising in full mode); `place` puts cached tables on the device once
(Lightning's `setup()`, so each DDP rank uses its own device); `save` writes the fine-tuned
encoder (top layers merged into an ordinary transformers model). With `train.lora`
(`simtune.train.lora`), LoRA adapters on the layers that train take their place, merged into
plain weights when saved. Lightning-free.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune.cache import vectors
from simtune.chunks import Chunker, chunked, pool_windows
from simtune.encoders import (
    load_pretrained,
    model_dir,
    pooled,
    prompt_of,
    prompt_skip,
    trim_padding,
)
from simtune.params import EncoderParams, LoraParams, Params
from simtune.pretrained import load_tokenizer
from simtune.train import layers, lora

ROWS = {"text": "rows", "query": "q_rows", "doc": "d_rows", "neg": "neg_rows"}
PROMPT_ROLE = {"text": "query", "query": "query", "doc": "document", "neg": "document"}
TEXTS = {"text": "texts", "query": "q_texts", "doc": "d_texts"}
TOKENS = {"text": "tokens", "query": "q_tokens", "doc": "d_tokens"}
WINDOWS = "windows"  # full mode with chunks: (n,) windows per text in a token dict
CHUNK = 1024
# padded tokens one more forward is worth (small GEMMs run slower on CPU; launches on GPU)
GROUP_OVERHEAD = {"cpu": 64, "other": 8192}  # TREC top-2 step, 64 rows: 2.79 s one group,
# 1.61 s at 256, 1.24 s at 64 (fwd+bwd, 2 CPU cores at load 7; bench/layers.py measures epochs)
TOKENS_PER_CHUNK = 4096  # top_layers embed_split: padded tokens per forward (bounds memory;
# TREC val+train at load 6: 32768 -> 4096 tokens took 23.0 -> 14.0 s, sorting alone 37 -> 23 s)


class Representation(torch.nn.Module):
    """Base: example indices of a split -> (n, D) vectors before the head."""

    tokenizes = False  # whether `collate` does real work (worth DataLoader workers)

    def collate(self, split: Any, idx: list[int]) -> dict[str, Any]:
        return {"idx": torch.tensor(idx, dtype=torch.long)}

    def forward(self, split: Any, part: dict[str, Any], role: str) -> torch.Tensor:
        raise NotImplementedError

    def embed_split(self, split: Any, role: str) -> torch.Tensor:
        """(n, D) vectors of every example of `split` for `role`, in chunks."""
        n = len(split)
        parts = [self.forward(split, self.collate(split, list(range(i, min(i + CHUNK, n)))),
                              role) for i in range(0, n, CHUNK)]
        return torch.cat(parts) if parts else torch.empty(0, self.dim)

    def place(self, device: torch.device, cache_type: Callable[[str], str]) -> None:
        """Put cached tables where training reads them (called once per process);
        `cache_type(encoder)` is `cache.cache_type` or the encoder's `cache.mapping` entry."""

    def save(self, directory: Path) -> None:
        """Write the fine-tuned encoder (nothing in head mode)."""

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return self._device

    _device = torch.device("cpu")


class CachedVectors(Representation):
    """Head mode: rows of the resident vector cache tables (query/text and document)."""

    def __init__(self, q_table: vectors.CacheTable, d_table: vectors.CacheTable) -> None:
        super().__init__()
        self.q_table, self.d_table, self.dim = q_table, d_table, q_table.dim

    def forward(self, split: Any, part: dict[str, Any], role: str) -> torch.Tensor:
        table = self.d_table if role in ("doc", "neg") else self.q_table
        # "neg": each row's mined negatives (c, n) flattened, row-major; -1 (none) reads row 0,
        # which the loss masks
        rows = split.tensors[ROWS[role]][part["idx"]].reshape(-1).clamp_min(0)
        rows = rows.to(table.vectors.device)
        return table.vectors[rows].to(self._device, non_blocking=True).float()

    def place(self, device: torch.device, cache_type: Callable[[str], str]) -> None:
        self._device = device
        same = self.d_table is self.q_table
        self.q_table = vectors.place(self.q_table, cache_type(_encoder_of(self.q_table)))
        self.d_table = self.q_table if same else vectors.place(
            self.d_table, cache_type(_encoder_of(self.d_table)))


def _encoder_of(table: Any) -> str:
    """The encoder name of a loaded view (`minilm@document@layer4` -> `minilm`)."""
    return str(table.manifest.encoder).split("@")[0]


def _skips(path: Path, spec: EncoderParams) -> dict[str, int]:
    """Prompt tokens left out of the pooling, by prompt role (`encoders.prompt_skip`); the
    tokenizer is loaded only when a prompt is set with include_prompt false."""
    if spec.prompts is None or spec.prompts.include_prompt:
        return {"query": 0, "document": 0}
    tokenizer = load_tokenizer(path, "train.mode top_layers")
    return {role: prompt_skip(tokenizer, spec, role) for role in ("query", "document")}


def length_groups(lengths: torch.Tensor, overhead: int) -> list[torch.Tensor]:
    """Partition of a batch's rows (by their (n,) token `lengths`) into groups that minimise the
    padded tokens computed, sum over groups of (longest x rows), plus `overhead` tokens per
    group (the cost of one more, smaller forward). Exact dynamic programme over the rows sorted
    by length (an optimal group is a run of them). Returns index tensors into the batch."""
    n = len(lengths)
    order = torch.argsort(lengths, descending=True, stable=True)
    if n <= 1:
        return [order]
    sl = lengths[order].to(torch.float64).numpy()
    best = np.zeros(n + 1)  # best[i]: cost of the i longest rows
    cut = np.zeros(n + 1, dtype=np.int64)
    j = np.arange(n)
    for i in range(1, n + 1):  # last group = sorted rows j..i-1, padded to sl[j]
        cost = best[:i] + sl[:i] * (i - j[:i]) + overhead
        cut[i] = int(np.argmin(cost))
        best[i] = cost[cut[i]]
    bounds, i = [], n
    while i > 0:
        bounds.append((int(cut[i]), i))
        i = int(cut[i])
    return [order[a:b] for a, b in reversed(bounds)]


class CachedStates(Representation):
    """Top-layers mode: cached token states after layer k through the trainable top layers.
    `table` holds the query (and groups') texts, `doc_table` the documents (the same table
    unless a document prompt of its own gives them their own view): `states.StatesTable`s, each
    batch's rows read from the store's shards as the batch runs (in the shuffled order; memory
    stays one batch), or resident on the GPU (`place`)."""

    def __init__(self, table: Any, path: Path, layer: int, spec: EncoderParams,
                 doc_table: Any = None, adapters: LoraParams | None = None) -> None:
        super().__init__()
        self.table, self.path, self.layer, self.spec = table, path, layer, spec
        self.doc_table = table if doc_table is None else doc_table
        # LoRA (r > 0): adapters on the top layers train instead of their weights
        self.top = lora.adapt(layers.top_model(path, layer), adapters).train()  # dropout on
        self.dim = int(self.top.config.hidden_size)
        self.skips = _skips(path, spec)

    def _table(self, role: str) -> Any:
        return self.doc_table if PROMPT_ROLE[role] == "document" else self.table

    def forward(self, split: Any, part: dict[str, Any], role: str) -> torch.Tensor:
        """(n, D): each text's (window's) vector depends only on its own tokens, so the batch
        runs as groups of similar length (`length_groups`), each padded to its own longest; a
        text of several windows (`simtune.chunks`) is their pooled vector."""
        table = self._table(role)
        rows, counts = table.window_rows(split.tensors[ROWS[role]][part["idx"]])
        groups = length_groups(table.lengths(rows).cpu(),
                               GROUP_OVERHEAD.get(self.device.type, GROUP_OVERHEAD["other"]))
        if len(groups) == 1:
            vectors = self._run(rows, role)
        else:
            outs = [self._run(rows[g], role) for g in groups]
            vectors = torch.empty(len(rows), outs[0].shape[1], dtype=outs[0].dtype,
                                  device=outs[0].device)
            vectors[torch.cat(groups).to(vectors.device)] = torch.cat(outs)
        if counts is None:
            return vectors
        # long texts: each window through the top layers, pooled, then the windows pooled
        return pool_windows(vectors, counts, self.spec.chunks.pool, self.spec.normalize)

    def _run(self, rows: torch.Tensor, role: str) -> torch.Tensor:
        states, mask = self._table(role).batch(rows, self.device)
        hidden = self.top(inputs_embeds=states, attention_mask=mask).last_hidden_state
        return pooled(hidden, mask, self.spec, self.skips[PROMPT_ROLE[role]])

    def embed_split(self, split: Any, role: str) -> torch.Tensor:
        """(n, D) vectors of every example of `split`, in its order. Rows run length-sorted in
        chunks of about TOKENS_PER_CHUNK padded tokens: padding to a random chunk's longest text
        costs ~2x the compute on short texts, and a fixed row count would bound nothing."""
        n = len(split)
        if n == 0:
            return torch.empty(0, self.dim)
        table = self._table(role)
        lengths = table.text_tokens(split.tensors[ROWS[role]])
        order = torch.argsort(lengths.cpu(), descending=True, stable=True)
        out, s = [], 0
        while s < n:  # sorted descending: the chunk's first row is its longest
            e = min(n, s + max(1, TOKENS_PER_CHUNK // max(1, int(lengths[order[s]]))))
            out.append(self.forward(split, {"idx": order[s:e]}, role))
            s = e
        vectors = torch.empty(n, out[0].shape[1], dtype=out[0].dtype, device=out[0].device)
        vectors[order.to(vectors.device)] = torch.cat(out)
        return vectors

    def place(self, device: torch.device, cache_type: Callable[[str], str]) -> None:
        """`cpu`: the tables stay streamed from the store's shards (a batch read at a time);
        `gpu`: each moves to `device` whole; `auto` on a GPU: whole when the tables take under
        half its free memory, else streamed."""
        kind = cache_type(_encoder_of(self.table))
        same = self.doc_table is self.table
        if kind == "auto" and device.type == "cuda":
            size = self.table.nbytes + (0 if same else self.doc_table.nbytes)
            kind = "gpu" if size < 0.5 * torch.cuda.mem_get_info(device)[0] else "cpu"
        if kind == "gpu":
            self.table = self.table.to(device)
            self.doc_table = self.table if same else self.doc_table.to(device)

    def save(self, directory: Path) -> None:
        """The frozen bottom + the trained top layers as one ordinary transformers model."""
        full = layers.merge(self.path, lora.merged(self.top), self.layer)
        full.save_pretrained(directory)
        _, tokenizer = load_pretrained(self.path, "train.mode top_layers")
        tokenizer.save_pretrained(directory)


class LiveEncoder(Representation):
    """Full mode: the whole encoder in the loop; batches are tokenised in DataLoader workers."""

    tokenizes = True

    def __init__(self, path: Path, spec: EncoderParams, adapters: LoraParams | None = None,
                 name: str = "<name>") -> None:
        """`name`: the encoder's in `encoders.models`, for messages."""
        super().__init__()
        self.spec = spec
        encoder, self.tokenizer = load_pretrained(path, "train.mode full")
        # load_pretrained leaves eval mode: dropout on; LoRA (r > 0): adapters train
        # simtune pools the token states itself: a BERT pooler's weights get no gradient, and
        # DDP refuses a trainable weight that no loss uses
        if isinstance(getattr(encoder, "pooler", None), torch.nn.Module):
            encoder.pooler.requires_grad_(False)
        self.encoder = lora.adapt(encoder, adapters).train()
        self.dim = int(self.encoder.config.hidden_size)
        self.prompts = {r: prompt_of(spec, r) for r in ("query", "document")}
        self.skips = {r: prompt_skip(self.tokenizer, spec, r) for r in ("query", "document")}
        self.chunkers = {r: Chunker(self.tokenizer, spec, self.prompts[r], name, role=r)
                         for r in ("query", "document")}

    def collate(self, split: Any, idx: list[int]) -> dict[str, Any]:
        """Each role's texts, its prompt before each, tokenised (prompt tokens count toward
        max_length, as in the cache fill). With `chunks`, each text's windows (`simtune.chunks`)
        are rows, and the token dict's `windows` (n,) says how many each text has."""
        out = super().collate(split, idx)
        for role, name in TEXTS.items():
            if name in split.texts:
                prompt = self.prompts[PROMPT_ROLE[role]]
                texts = [split.texts[name][i] for i in idx]
                windows = (self.chunkers[PROMPT_ROLE[role]].windows(texts)
                           if chunked(self.spec) else [[t] for t in texts])
                texts = [prompt + w for ws in windows for w in ws]
                out[TOKENS[role]] = dict(self.tokenizer(
                    texts, padding=True, truncation=True, max_length=self.spec.max_length,
                    return_tensors="pt"))
                if chunked(self.spec):
                    out[TOKENS[role]][WINDOWS] = torch.tensor([len(ws) for ws in windows])
        return out

    def forward(self, split: Any, part: dict[str, Any], role: str) -> torch.Tensor:
        tokens = trim_padding(part[TOKENS[role]])
        counts = tokens.get(WINDOWS)
        tokens = {k: v.to(self.device, non_blocking=True) for k, v in tokens.items()
                  if k != WINDOWS}
        hidden = self.encoder(**tokens).last_hidden_state
        vectors = pooled(hidden, tokens["attention_mask"], self.spec,
                         self.skips[PROMPT_ROLE[role]])
        if counts is None:
            return vectors
        return pool_windows(vectors, counts, self.spec.chunks.pool, self.spec.normalize)

    def save(self, directory: Path) -> None:
        lora.merged(self.encoder).save_pretrained(directory)  # plain weights, adapters merged
        self.tokenizer.save_pretrained(directory)


def build(mode: str, p: Params, tables: dict[str, Any]) -> Representation:
    """The representation of `mode` over the loaded cache `tables` (`query`, `doc`, `states`)."""
    name = p.encoders.query
    spec = p.encoders.models[name]
    if mode == "head":
        return CachedVectors(tables["query"], tables["doc"])
    path = model_dir(name, spec)
    adapters = p.train.lora
    if mode == "top_layers":
        return CachedStates(tables["states"], path, tables["layer"], spec,
                            tables.get("doc_states"), adapters)
    return LiveEncoder(path, spec, adapters, name)
