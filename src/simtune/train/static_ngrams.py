"""Word n-grams in a static student's vocabulary (`train.schedule.static.ngrams`, issue 54).

A bag of tokens cannot tell "how many" from "how much" or "who" from "who is"; a token that
*is* "how many" can. The student's tokenizer gains the `ngrams` most frequent word n-grams of
its fit texts (2 to `ngram_words` words; counted once per text, found in at least
`MIN_TEXTS` texts; ties by the n-gram's text), each as a `tokenizers.AddedToken` matched whole
(`single_word`) on the normalised text: where one occurs, its one id replaces its words'
pieces (the longest match first, left to right, no overlaps). Its row starts at the teacher's
own vector of the n-gram as a text, times the sum of its pieces' SIF weights (`init: teacher`
scales each token's row by its weight; an n-gram stands for those pieces in a text's mean).

The added tokens live in the tokenizer's `tokenizer.json`, which sentence-transformers'
`StaticEmbedding` reads as it is (`encode_batch(..., add_special_tokens=False)`, the table
one row per id, added ones included), so the served folder stays plain.

Measured on TREC (bench/static_probe.py, the default export as teacher, label_weight 0.5,
the kept epoch by val MRR@10): 100 bigrams 0.766/0.744/0.734/0.760/0.718/0.714 test P@1 on
seeds 13-18 against 0.725/0.723/0.725/0.719/0.731/0.705 without (mean +0.018, one seed
-0.013); 200 bigrams +0.020 on seeds 13-16; 50 no gain; n-grams up to 3 words lost 0.011.
Validation MRR@10 rose on every seed (~0.80 -> ~0.83). Hence off by default (`ngrams: 0`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import torch

from simtune.static import StaticEncoder

MIN_TEXTS = 2  # an n-gram of one text alone teaches nothing another text shares
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters


def runs(tokenizer: object, text: str) -> list[list[str]]:
    """The runs of words of `text` as `tokenizer` (a `tokenizers.Tokenizer`) normalises it:
    letters only, neighbours one space apart (punctuation, digits or more space between two
    words ends a run), so each n-gram of a run is matched whole by an added token."""
    norm = getattr(tokenizer, "normalizer", None)
    text = norm.normalize_str(text) if norm is not None else text
    out: list[list[str]] = []
    end = -1
    for m in _WORD.finditer(text):
        if out and text[end:m.start()] == " ":
            out[-1].append(m.group())
        else:
            out.append([m.group()])
        end = m.end()
    return out


def choose(tokenizer: object, texts: list[str], count: int, max_words: int) -> list[str]:
    """The `count` word n-grams (2 to `max_words` words) found in the most of `texts` (each
    text counted once; at least `MIN_TEXTS` texts), most frequent first, ties by text."""
    seen: Counter[str] = Counter()
    for text in texts:
        grams = set()
        for run in runs(tokenizer, text):
            for n in range(2, max_words + 1):
                grams.update(" ".join(run[i:i + n]) for i in range(len(run) - n + 1))
        seen.update(grams)
    ranked = sorted((g for g, c in seen.items() if c >= MIN_TEXTS), key=lambda g: (-seen[g], g))
    return ranked[:count]


def extend(start: StaticEncoder, grams: list[str], embed: Callable[[list[str]], torch.Tensor],
           weights: torch.Tensor) -> StaticEncoder:
    """`start` (the teacher's token table) with `grams` added to a copy of its tokenizer, row
    V + i for grams[i]: `embed(grams)` (the teacher's vectors of them as texts) times the sum
    of `weights` (V,) (each token's SIF weight) over the pieces `start` splits it into."""
    from tokenizers import AddedToken, Tokenizer

    if not grams:
        return start
    tokenizer = Tokenizer.from_str(start.tokenizer.to_str())
    size = len(start.weight)
    added = tokenizer.add_tokens([AddedToken(g, single_word=True, normalized=True)
                                  for g in grams])
    ids = [tokenizer.token_to_id(g) for g in grams]
    if added != len(grams) or ids != list(range(size, size + len(grams))):
        raise AssertionError(f"n-gram tokens got ids {ids[:5]}..., not {size}...")
    pieces = [start.tokenizer.encode(g, add_special_tokens=False).ids for g in grams]
    scale = torch.stack([weights[p].sum() for p in pieces]).float()
    rows = embed(grams).float() * scale[:, None]
    return StaticEncoder(tokenizer, torch.cat([start.weight, rows]), start.name)
