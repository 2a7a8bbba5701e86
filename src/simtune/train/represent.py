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

import torch

from simtune import layers
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
from simtune.errors import UserError
from simtune.params import EncoderParams, EncodersParams, LoraParams
from simtune.train import lora

ROWS = {"text": "rows", "query": "q_rows", "doc": "d_rows", "neg": "neg_rows"}
PROMPT_ROLE = {"text": "query", "query": "query", "doc": "document", "neg": "document"}
TEXTS = {"text": "texts", "query": "q_texts", "doc": "d_texts"}
TOKENS = {"text": "tokens", "query": "q_tokens", "doc": "d_tokens"}
WINDOWS = "windows"  # full mode with chunks: (n,) windows per text in a token dict
CHUNK = 1024


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
        self.skips = layers.prompt_skips(path, spec)

    def _table(self, role: str) -> Any:
        return self.doc_table if PROMPT_ROLE[role] == "document" else self.table

    def forward(self, split: Any, part: dict[str, Any], role: str) -> torch.Tensor:
        """(n, D) of the batch's texts (`layers.states_vectors`: length groups, windows
        pooled)."""
        rows = split.tensors[ROWS[role]][part["idx"]]
        return layers.states_vectors(self.top, self._table(role), rows, self.spec,
                                     self.skips[PROMPT_ROLE[role]], self.device)

    def embed_split(self, split: Any, role: str) -> torch.Tensor:
        """(n, D) vectors of every example of `split`, in its order (`layers.embed_rows`)."""
        if len(split) == 0:
            return torch.empty(0, self.dim)
        return layers.embed_rows(self.top, self._table(role), split.tensors[ROWS[role]],
                                 self.spec, self.skips[PROMPT_ROLE[role]], self.device)

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

    def __init__(self, path: Path, spec: EncoderParams, adapters: LoraParams | None,
                 train_embeddings: bool, name: str = "<name>") -> None:
        """`name`: the encoder's in `encoders.models`, for messages; `train_embeddings`
        (`train.schedule.full.train_embeddings`): false freezes the input embeddings."""
        super().__init__()
        self.spec = spec
        encoder, self.tokenizer = load_pretrained(path, "train.mode full")
        # load_pretrained leaves eval mode: dropout on; LoRA (r > 0): adapters train
        # simtune pools the token states itself: a BERT pooler's weights get no gradient, and
        # DDP refuses a trainable weight that no loss uses
        if isinstance(getattr(encoder, "pooler", None), torch.nn.Module):
            encoder.pooler.requires_grad_(False)
        if not train_embeddings:
            frozen_embeddings(encoder, f"encoders.models.{name} ({path})").requires_grad_(False)
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
        """(n, D) pooled vectors of the batch part's texts. Each text's vector depends only on
        its own tokens, so the rows run as groups of similar length, each padded to its own
        longest (`layers.length_groups`, as the top layers' states do): a batch of short
        questions padded to its longest computed ~2x the tokens it holds."""
        return self._vectors(part[TOKENS[role]], role, None)

    def embed_split(self, split: Any, role: str) -> torch.Tensor:
        """As the base class, each forward bounded to `layers.TOKENS_PER_CHUNK` padded tokens
        (a whole chunk of a split's texts in one group would be one large forward)."""
        n = len(split)
        parts = [self._vectors(self.collate(split, list(range(i, min(i + CHUNK, n))))[TOKENS[role]],
                               role, layers.TOKENS_PER_CHUNK) for i in range(0, n, CHUNK)]
        return torch.cat(parts) if parts else torch.empty(0, self.dim)

    def _vectors(self, tokens: dict[str, torch.Tensor], role: str, max_tokens: int | None
                 ) -> torch.Tensor:
        """(n, D) of a token dict (rows: texts, or windows when it holds `WINDOWS`)."""
        counts = tokens.get(WINDOWS)
        tokens = {k: v for k, v in tokens.items() if k != WINDOWS}
        skip = self.skips[PROMPT_ROLE[role]]

        def run(part: dict[str, torch.Tensor]) -> torch.Tensor:
            part = {k: v.to(self.device, non_blocking=True) for k, v in trim_padding(part).items()}
            hidden = self.encoder(**part).last_hidden_state
            return pooled(hidden, part["attention_mask"], self.spec, skip)

        overhead = layers.GROUP_OVERHEAD.get(self.device.type, layers.GROUP_OVERHEAD["other"])
        lengths = tokens["attention_mask"].sum(1)
        groups = (layers.length_groups(lengths, overhead) if max_tokens is None
                  else layers.capped_groups(lengths, overhead, max_tokens))
        vectors = layers.run_in_groups(groups, lambda g: run({k: v[g] for k, v in tokens.items()}))
        if counts is None:
            return vectors
        return pool_windows(vectors, counts, self.spec.chunks.pool, self.spec.normalize)

    def save(self, directory: Path) -> None:
        lora.merged(self.encoder).save_pretrained(directory)  # plain weights, adapters merged
        self.tokenizer.save_pretrained(directory)


def frozen_embeddings(encoder: torch.nn.Module, where: str = "the encoder") -> torch.nn.Module:
    """The module `train.schedule.full.train_embeddings: false` freezes: a BERT-like encoder's
    `embeddings` block (tokens, positions, token types and their LayerNorm), else the input
    embeddings Hugging Face names (`get_input_embeddings`); `UserError` naming the key and
    `where` (the encoder) when it has neither."""
    block = getattr(encoder, "embeddings", None)
    if isinstance(block, torch.nn.Module):
        return block
    try:
        found = encoder.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        found = None
    if not isinstance(found, torch.nn.Module):
        raise UserError(f"train.schedule.full.train_embeddings: false, but {where} names no "
                        "input embeddings to freeze; set it true")
    return found


def build(mode: str, enc: EncodersParams, tables: dict[str, Any],
          adapters: LoraParams | None, train_embeddings: bool) -> Representation:
    """The representation of `mode` over the loaded cache `tables` (`query`, `doc`, `states`);
    top_layers and full: of `enc`'s query encoder, with `adapters` (`train.lora`) on its
    trained layers; full: its embeddings frozen unless `train_embeddings`."""
    name = enc.query
    spec = enc.models[name]
    if mode == "head":
        return CachedVectors(tables["query"], tables["doc"])
    path = model_dir(name, spec)
    if mode == "top_layers":
        return CachedStates(tables["states"], path, tables["layer"], spec,
                            tables.get("doc_states"), adapters)
    return LiveEncoder(path, spec, adapters, train_embeddings, name)
