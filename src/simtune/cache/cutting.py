"""What the encoder's window does to the data, said before a fill: how many texts are longer
than `max_length`, what share of their tokens no window holds, and (with `chunks`) the windows
each text becomes (`simtune.chunks`)."""

from __future__ import annotations

import logging

from simtune.chunks import Chunker, Cut, chunked
from simtune.encoders import encoder_dir, prompt_of
from simtune.params import EncoderParams
from simtune.pretrained import load_tokenizer

log = logging.getLogger(__name__)
WARN_SHARE = 0.2  # texts that lose tokens, above which the fill warns


def split(name: str, spec: EncoderParams, role: str, texts: dict[str, str], label: str
          ) -> tuple[dict[str, list[str]], Cut]:
    """(workspace id -> the windows of its text, one when it fits or chunking is off; what is
    cut), logged as one line, and a warning naming the key to change when more than
    `WARN_SHARE` of the texts still lose tokens."""
    tokenizer = load_tokenizer(encoder_dir(name, spec), f"encoders.models.{name}.model")
    chunker = Chunker(tokenizer, spec, prompt_of(spec, role), name, role)
    cut = Cut()
    ids = list(texts)
    windows = dict(zip(ids, chunker.windows([texts[i] for i in ids], cut), strict=True))
    say(name, spec, label, cut)
    return windows, cut


def check_prompts(targets: list[tuple[str, EncoderParams, str]]) -> None:
    """Refuse, before any fill, a prompt of any (encoder name, spec, role) that leaves too
    little of the window for the text (`simtune.chunks.check_room`, through the `Chunker`)."""
    for name, spec, role in targets:
        if prompt_of(spec, role):
            tokenizer = load_tokenizer(encoder_dir(name, spec), f"encoders.models.{name}.model")
            Chunker(tokenizer, spec, prompt_of(spec, role), name, role)


def say(name: str, spec: EncoderParams, label: str, cut: Cut) -> None:
    """The log line (and the warning) of `cut`."""
    key = f"encoders.models.{name}"
    if chunked(spec):
        log.info("cache %s: %d of %d texts longer than %d tokens -> %d windows (chunks.max %d); "
                 "%d texts still cut, %.1f %% of the long texts' tokens dropped", label, cut.over,
                 cut.texts, spec.max_length, cut.windows, spec.chunks.max, cut.cut,
                 100 * cut.dropped_share)
        hint = f"raise {key}.chunks.max or {key}.max_length"
    else:
        log.info("cache %s: %d of %d texts longer than %d tokens (median %d): %.1f %% of their "
                 "tokens dropped", label, cut.over, cut.texts, spec.max_length,
                 cut.report()["median_tokens"], 100 * cut.dropped_share)
        hint = f"set {key}.chunks.max (windows per text, e.g. 8) or raise {key}.max_length"
    if cut.texts and cut.cut / cut.texts > WARN_SHARE:
        log.warning("cache %s: %.0f %% of the texts are cut at %d tokens, losing %.0f %% of their "
                    "tokens: %s", label, 100 * cut.cut / cut.texts, spec.max_length,
                    100 * cut.dropped_share, hint)
