"""The few lines that encode a long text with plain sentence-transformers the way simtune does.

sentence-transformers truncates a text at the encoder's `max_seq_length`; an encoder with
`chunks` (`simtune.chunks`) sees a long text as windows whose vectors are pooled *before* the
head. `RECIPE` does that over an export folder: simtune's window rule (word-aligned substrings of
at most `max_length` tokens, the prompt once per window), the encoder's modules on each window,
the pool, then the head's modules. The model card of a chunking export carries it with the
export's values (`recipe`), docs/export.md with the default ones; a test runs it against
`simtune.load_model(...).encode`.
"""

from __future__ import annotations

from typing import Any

RECIPE = '''\
import torch
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{path}")
# the export's chunk settings (simtune.json: encoder.max_length, encoder.chunks)
MAX_LENGTH, WINDOWS, OVERLAP, POOL = {max_length}, {windows}, {overlap}, "{pool}"
NORMALIZE = {normalize}  # encoder.normalize
# the encoder's modules (Transformer, Pooling[, Normalize]); the head follows
ENCODER = {encoder}


def windows(text: str, prompt: str = "") -> list[str]:
    """simtune's windows: whole-word substrings of at most MAX_LENGTH tokens,
    prompt included."""
    tok = model.tokenizer
    if len(tok(prompt + text)["input_ids"]) <= MAX_LENGTH:
        return [text]
    body = MAX_LENGTH - tok.num_special_tokens_to_add()
    body -= len(tok(prompt, add_special_tokens=False)["input_ids"])
    spans = tok(text, add_special_tokens=False,
                return_offsets_mapping=True)["offset_mapping"]

    def after_space(j: int) -> bool:
        return text[spans[j][0] - 1 : spans[j][0]].isspace()

    def word_start(i: int, low: int) -> int:
        # i's word start, or i if it is below low
        j = i
        while j > low and not after_space(j):
            j -= 1
        return j if j == 0 or after_space(j) else i

    out, start, n = [], 0, len(spans)
    while True:
        end = min(n, start + body)
        if end < n:
            end = word_start(end, start + body // 2)
        out.append(text[spans[start][0] : spans[end - 1][1]])
        if end >= n or len(out) == WINDOWS:
            return out
        step = max(start + 1, end - OVERLAP)
        start = word_start(step, max(start + 1, step - OVERLAP))


def encode_long(text: str, prompt_name: str = "query") -> torch.Tensor:
    """The text's vector as simtune computes it: windows, encoder, pool,
    head."""
    prompt = model.prompts.get(prompt_name, "")
    encoder = SentenceTransformer(modules=list(model)[:ENCODER],
                                  device=model.device)
    parts = encoder.encode(windows(text, prompt), prompt=prompt,
                           convert_to_tensor=True)
    vector = {{"mean": parts.mean(0), "max": parts.max(0).values,
              "first": parts[0]}}[POOL]
    if len(parts) == 1:
        vector = parts[0]
    elif NORMALIZE:
        vector = torch.nn.functional.normalize(vector, dim=0)
    head = torch.nn.Sequential(*list(model)[ENCODER:])
    with torch.inference_mode():
        out = head({{"sentence_embedding": vector[None]}})
    return out["sentence_embedding"][0]
'''


def recipe(encoder: dict[str, Any], path: str = "path/to/export") -> str:
    """`RECIPE` for an export whose `simtune.json` encoder settings are `encoder` (chunks on)."""
    chunks = encoder["chunks"]
    return RECIPE.format(path=path, max_length=encoder["max_length"], windows=chunks["max"],
                         overlap=chunks["overlap"], pool=chunks["pool"],
                         normalize=bool(encoder["normalize"]),
                         encoder=2 + bool(encoder["normalize"]))
