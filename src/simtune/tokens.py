"""Tokenisation straight through a fast tokenizer's `tokenizers` backend.

`tokenizer(texts, padding=True, truncation=True, max_length=m, return_tensors="pt")` spends
most of its time in transformers' Python conversion of every encoding to nested lists and then
to tensors (~65 us a text: the bottleneck of a GPU fill, measured on an H100 machine). `Tokens`
asks the backend for the same encodings and copies ids, type ids and mask into arrays; it is
used only after checking that its output equals the transformers call on sample texts (one
past `max_length` included), else the transformers call stays.

A fill tokenises each text once: `pieces` gives the unpadded encodings (their lengths sort the
texts), `pad` makes a batch of them with numpy, as the padded call would.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import torch

SAMPLE_TEXTS = ["what is the name of the largest city in the world, and why is it so big?",
                "a short one", "", "x " * 600,
                "\u00dcn\u00efc\u00f6d\u00e9 \u2014 \u2018quotes\u2019, emoji \U0001f642"]

_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}


class Tokens:
    """`texts` -> padded, truncated int64 tensors by model input name, as the transformers
    call would give (right or left padding, to the batch's longest text). Thread-safe: the
    backend copies are configured once and only read afterwards."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        from tokenizers import Tokenizer

        self.names = list(tokenizer.model_input_names)
        if not set(self.names) <= set(_FIELDS):
            raise ValueError(f"model inputs {self.names} not all known")
        # private copies of the backend: transformers' own calls reset the shared one's
        # truncation and padding settings
        config = tokenizer.backend_tokenizer.to_str()
        self.padded, self.plain = Tokenizer.from_str(config), Tokenizer.from_str(config)
        for backend in (self.padded, self.plain):
            backend.enable_truncation(max_length, strategy="longest_first",
                                      direction=tokenizer.truncation_side)
            backend.no_padding()
        self.left = tokenizer.padding_side == "left"
        self.fill = {"ids": tokenizer.pad_token_id, "type_ids": tokenizer.pad_token_type_id,
                     "attention_mask": 0}
        self.padded.enable_padding(direction=tokenizer.padding_side,
                                   pad_id=tokenizer.pad_token_id,
                                   pad_type_id=tokenizer.pad_token_type_id,
                                   pad_token=tokenizer.pad_token)

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        encodings = self.padded.encode_batch(texts, add_special_tokens=True)
        return {name: torch.from_numpy(np.array([getattr(e, _FIELDS[name]) for e in encodings],
                                                dtype=np.int64).reshape(len(texts), -1))
                for name in self.names}

    def lengths(self, texts: list[str]) -> list[int]:
        """Token count of each text after truncation."""
        return [len(e.ids) for e in self.pieces(texts)]

    def pieces(self, texts: list[str]) -> list[Any]:
        """Each text's truncated, unpadded `tokenizers.Encoding` (for `pad`)."""
        return self.plain.encode_batch(texts, add_special_tokens=True)

    def pad(self, pieces: list[Any]) -> dict[str, torch.Tensor]:
        """`pieces` as one batch padded to its longest: equal to `self(texts)` of their texts.
        One flat copy per field and a masked scatter, no Python loop over tokens' rows."""
        n = len(pieces)
        lengths = np.fromiter((len(e.ids) for e in pieces), dtype=np.int64, count=n)
        width = int(lengths.max()) if n else 0
        real = np.arange(width)[None, :] < lengths[:, None]  # (n, width), right padding
        if self.left:
            real = real[:, ::-1]
        out = {}
        for name in self.names:
            field = _FIELDS[name]
            full = np.full((n, width), self.fill[field], dtype=np.int64)
            full[real] = np.fromiter(chain.from_iterable(getattr(e, field) for e in pieces),
                                     dtype=np.int64, count=int(lengths.sum()))
            out[name] = torch.from_numpy(full)
        return out


def fast_path(tokenizer: Any, max_length: int) -> Tokens | None:
    """A `Tokens` for `tokenizer` when it reproduces the transformers call exactly on
    `SAMPLE_TEXTS` (ids, type ids, mask and lengths; padded by the backend and by `pad`), else
    None (a slow tokenizer, or one whose transformers call does more than its backend)."""
    if not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token_id is None:
        return None
    try:
        fast = Tokens(tokenizer, max_length)
    except (ValueError, AttributeError, TypeError):
        return None
    want = tokenizer(SAMPLE_TEXTS, padding=True, truncation=True, max_length=max_length,
                     return_tensors="pt")
    same = True
    for got in (fast(SAMPLE_TEXTS), fast.pad(fast.pieces(SAMPLE_TEXTS))):
        same = same and list(got) == list(want) and all(torch.equal(got[n], want[n])
                                                        for n in got)
    lengths = [len(x) for x in tokenizer(SAMPLE_TEXTS, truncation=True,
                                         max_length=max_length)["input_ids"]]
    return fast if same and fast.lengths(SAMPLE_TEXTS) == lengths else None
