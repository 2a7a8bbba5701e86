"""Long texts seen whole: overlapping windows of the encoder's size, and their vectors pooled.

A text whose tokens (its role's prompt and the special tokens included) fit in `max_length` is
one window: the text itself, so its vector is today's, bit for bit, and its store key is its
content hash. A longer one, with `chunks.max` > 1, is cut into windows of at most `max_length`
tokens each (each window gets the prompt and the special tokens again: a prompt counts once per
window), consecutive windows sharing `chunks.overlap` tokens. Windows end and start at word
boundaries where a word is shorter than a window, and a window is the *substring* of the text
its tokens cover: every path (the cache fill, full-mode training, `load_model(...).encode`, the
export recipe in docs/export.md) embeds it as an ordinary text, so the store keys it by its
content hash and a change of chunk settings re-embeds only windows it has not seen. Texts with
more windows than `chunks.max` lose what is past the last one (`Cut` counts it).

The text's vector is `pool_windows` of its windows' vectors: `mean`, `max` (elementwise) or
`first`, L2-normalised again when the encoder normalises; a single window's vector is kept as
it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from simtune.errors import UserError
from simtune.params import EncoderParams

MIN_STEP = 16  # new tokens a window must bring (or half of one): fewer gives near-copies
# text tokens a prompt must leave in a window (or half of a short one): a prompt as long as the
# window leaves none, so every text gets the prompt's own vector (all equal, exit 0); a handful
# make the vector mostly the prompt's. Not a param: no setting wants fewer.
MIN_TEXT_TOKENS = 16


def chunked(spec: EncoderParams) -> bool:
    """Whether `spec` splits long texts into windows (`chunks.max` > 1)."""
    return spec.chunks is not None and spec.chunks.max > 1


@dataclass
class Cut:
    """What a window setting does to a set of texts: `texts`; `over`: texts longer than one
    window; `cut`: texts losing tokens (past their last window); `tokens`: the text tokens of
    the `over` texts (prompt and special tokens excluded); `dropped`: how many of them no
    window holds; `windows`: windows of all texts; `lengths`: every text's token count (prompt
    and special tokens included)."""

    texts: int = 0
    over: int = 0
    cut: int = 0
    tokens: int = 0
    dropped: int = 0
    windows: int = 0
    lengths: list[int] = field(default_factory=list, repr=False)

    @property
    def over_share(self) -> float:
        return self.over / self.texts if self.texts else 0.0

    @property
    def dropped_share(self) -> float:
        """Share of the over-long texts' tokens that no window holds."""
        return self.dropped / self.tokens if self.tokens else 0.0

    def report(self) -> dict[str, Any]:
        ordered = sorted(self.lengths)
        median = ordered[len(ordered) // 2] if ordered else 0
        return {"texts": self.texts, "over_window": self.over,
                "over_window_share": round(self.over_share, 4), "cut": self.cut,
                "dropped_token_share": round(self.dropped_share, 4),
                "windows": self.windows, "median_tokens": median,
                "max_tokens": ordered[-1] if ordered else 0}


class Chunker:
    """Splits `role` texts of encoder `spec` into windows (`windows`); counts what is cut.

    `tokenizer`: the encoder's (a fast tokenizer: word ids and character offsets)."""

    def __init__(self, tokenizer: Any, spec: EncoderParams, prompt: str,
                 name: str = "<name>", role: str = "query", key: str | None = None) -> None:
        """`role`: whose prompt `prompt` is, and `key` the settings' place (default
        `encoders.models.<name>`; a model folder's file), both for messages. `UserError` when
        the prompt leaves fewer than `MIN_TEXT_TOKENS` text tokens (`check_room`) or the
        overlap too few new ones."""
        from tokenizers import Tokenizer

        self.spec, self.prompt = spec, prompt
        self.max, self.overlap = (spec.chunks.max, spec.chunks.overlap) if chunked(spec) else (
            1, 0)
        config = tokenizer.backend_tokenizer.to_str()
        self.backend = Tokenizer.from_str(config)  # a private copy: no truncation, no padding
        self.backend.no_truncation()
        self.backend.no_padding()
        special = tokenizer.num_special_tokens_to_add(pair=False)
        prompt_tokens = len(self.backend.encode(prompt, add_special_tokens=False).ids) if (
            prompt) else 0
        self.body = spec.max_length - special - prompt_tokens  # text tokens one window holds
        key = key or f"encoders.models.{name}"
        if spec.max_length <= special:  # every text would be its special tokens: one vector
            raise UserError(f"{key}.max_length: {spec.max_length} leaves no token for the text "
                            f"({special} special tokens): raise max_length")
        check_room(f"{key}.prompts.{role}", prompt_tokens, special, spec.max_length)
        least = max(1, min(MIN_STEP, self.body // 2))
        if self.max > 1 and self.body - self.overlap < least:
            raise UserError(
                f"{key}.chunks.overlap: {self.overlap} leaves "
                f"{self.body - self.overlap} new tokens per window of {self.body} text tokens "
                f"(max_length {spec.max_length}, prompt {prompt_tokens}, special {special}); "
                f"at least {least} are needed: lower chunks.overlap or raise max_length")

    def windows(self, texts: list[str], cut: Cut | None = None) -> list[list[str]]:
        """Each text's windows (one: the text itself when it fits or chunking is off), in text
        order; `cut` (given) accumulates what is cut."""
        full = [prefixed.ids for prefixed in self.backend.encode_batch(
            [self.prompt + t for t in texts], add_special_tokens=True)]
        out: list[list[str]] = []
        long_ids = [i for i, ids in enumerate(full) if len(ids) > self.spec.max_length]
        if self.max == 1:  # off: the whole text, truncated by the tokenizer as ever
            split = {}
            self._count_truncated([len(full[i]) for i in long_ids], cut)
        else:
            split = dict(zip(long_ids, self._split([texts[i] for i in long_ids], cut),
                             strict=True))
        for i, text in enumerate(texts):
            out.append(split.get(i, [text]))
        if cut is not None:
            cut.texts += len(texts)
            cut.windows += sum(len(w) for w in out)
            cut.lengths.extend(len(ids) for ids in full)
        return out

    def _count_truncated(self, lengths: list[int], cut: Cut | None) -> None:
        """Truncation at max_length of texts of `lengths` tokens (prompt and special tokens
        included): each keeps `body` text tokens."""
        if cut is None:
            return
        for n in lengths:
            cut.over += 1
            cut.cut += 1
            cut.tokens += n - self.spec.max_length + self.body
            cut.dropped += n - self.spec.max_length

    def _split(self, texts: list[str], cut: Cut | None) -> list[list[str]]:
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        out = []
        for text, enc in zip(texts, encodings, strict=True):
            windows, end = self._cut_one(text, enc.offsets)
            out.append(windows)
            if cut is not None:
                cut.over += 1
                cut.tokens += len(enc.ids)
                cut.dropped += len(enc.ids) - end
                cut.cut += end < len(enc.ids)
        return out

    def _fits(self, window: str) -> bool:
        """Whether `window`, tokenised alone with the prompt and special tokens, fits."""
        return len(self.backend.encode(self.prompt + window, add_special_tokens=True).ids) <= (
            self.spec.max_length)

    def _cut_one(self, text: str, offsets: list[tuple[int, int]]) -> tuple[list[str], int]:
        """(windows of one over-long text, tokens covered from the start). Windows of `body`
        tokens, each starting `body - overlap` tokens after the last. A window ends before a
        word it would cut and the next starts at a word's start, moving back at most half a
        window and one overlap: a word starts after whitespace, so a text without spaces (a
        URL, Chinese) is cut between tokens."""
        n, start, windows = len(offsets), 0, []

        def word_start(i: int, low: int) -> int:  # i's word start, or i if it is below low
            j = i
            while j > low and not text[offsets[j][0] - 1:offsets[j][0]].isspace():
                j -= 1
            return j if j == 0 or text[offsets[j][0] - 1:offsets[j][0]].isspace() else i

        while True:
            end = min(n, start + self.body)
            if end < n:
                end = word_start(end, start + self.body // 2)
            # a window starting inside a word is tokenised alone otherwise than in the text
            # (a `##` piece becomes a word start: often one token more): shrink it until it
            # fits, at a word boundary where one is near, so the encoder truncates nothing and
            # `end` counts only tokens a window holds
            while end > start + 1 and not self._fits(text[offsets[start][0]:offsets[end - 1][1]]):
                end = min(end - 1, word_start(end - 1, start + self.body // 2))
            windows.append(text[offsets[start][0]:offsets[end - 1][1]])
            if end >= n or len(windows) == self.max:
                return windows, end
            step = max(start + 1, end - self.overlap)
            start = word_start(step, max(start + 1, step - self.overlap))


def check_room(key: str, prompt_tokens: int, special: int, max_length: int) -> None:
    """`UserError` naming `key` (the prompt's) and both token counts when a prompt of
    `prompt_tokens` leaves a window of `max_length` (`special` tokens added) fewer than
    `MIN_TEXT_TOKENS` text tokens, or than half of a window shorter than twice that."""
    if not prompt_tokens:
        return
    room = max_length - special - prompt_tokens
    least = max(1, min(MIN_TEXT_TOKENS, (max_length - special) // 2))  # 1: a window of 3
    if room < least:
        half = " (half the window)" if least < MIN_TEXT_TOKENS else ""
        raise UserError(f"{key}: the prompt is {prompt_tokens} tokens, leaving {max(room, 0)} of "
                        f"max_length {max_length} for the text ({special} special tokens); at "
                        f"least {least} are needed{half}: shorten the prompt or raise "
                        "max_length")


def pool_windows(vectors: torch.Tensor, counts: torch.Tensor, mode: str, normalize: bool
                 ) -> torch.Tensor:
    """(W, D) window vectors, (n,) windows per text (consecutive rows, sum = W) -> (n, D) text
    vectors: `mean`, `max` or `first` of each text's windows, L2-normalised again when
    `normalize`; a text of one window keeps its vector bit for bit."""
    n = len(counts)
    if n == len(vectors):
        return vectors
    counts = counts.to(vectors.device)
    owner = torch.repeat_interleave(torch.arange(n, device=vectors.device), counts)
    starts = torch.cumsum(counts, 0) - counts
    if mode == "first":
        out = vectors[starts]
    elif mode == "mean":
        out = torch.zeros(n, vectors.shape[1], dtype=vectors.dtype, device=vectors.device)
        out = out.index_add(0, owner, vectors) / counts[:, None].to(vectors.dtype)
    elif mode == "max":
        out = torch.full((n, vectors.shape[1]), float("-inf"), dtype=vectors.dtype,
                         device=vectors.device)
        out = out.scatter_reduce(0, owner[:, None].expand_as(vectors), vectors, "amax")
    else:
        raise ValueError(f"unknown window pooling {mode!r}")
    if normalize:
        out = torch.nn.functional.normalize(out, dim=-1)
    single = counts == 1
    return torch.where(single[:, None], vectors[starts], out)
