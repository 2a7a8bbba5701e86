"""`train.mode: auto`, resolved from the prepared data before the cache fills anything.

The top layers gain where the head alone learns nothing (long posts, short noisy topics, few
shots: docs/training.md), and their cost grows with the tokens they run on: the layer cache is
tokens x hidden x 2 bytes, an epoch's forward and backward pass tokens x layers. So `auto` is
`full` on very little data (tokens up to `train.auto.full_max_tokens`: a few dozen short texts
per label, where training every layer gained most and an epoch costs seconds even so),
`top_layers` when the tokens of every text the encoder embeds fit `train.auto.max_tokens` and
the estimated layer cache fits `train.auto.max_layer_gb` and the estimated run on this machine
fits `train.auto.max_minutes` (`simtune.cache.budget`: max_epochs x the tokens x the top
layers' seconds per token, measured once and kept), `head` beyond (or where the top layers
cannot run: two encoders, mined negatives). The same inputs give the same answer, so the
cache and train stages (and the sweep) each resolve it once and agree; the reason goes to the
stage logs, reports/train.json and the model card.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from simtune import params as P
from simtune.cache import budget
from simtune.encoders import model_config, model_dir, prompt_of
from simtune.params import EncodersParams, TrainParams
from simtune.pretrained import load_tokenizer

log = logging.getLogger(__name__)
# (layers) -> (seconds per token of the top layers on this machine, where it came from)
Speed = Callable[[int], tuple[float, str]]
SAMPLE = 2000  # texts whose tokens are counted (the mean is scaled to all): a second at most
AUTO_MODES = ("full", "top_layers", "head")  # what auto picks among


@dataclass(frozen=True)
class Estimate:
    """What the top layers would run on: `texts`, their mean `tokens` (max_length windows,
    a prompt included), the encoder's `hidden` width and the layer cache's `gb`."""

    texts: int
    tokens: float
    hidden: int
    gb: float

    @property
    def total(self) -> int:
        return round(self.texts * self.tokens)


def estimate(encoders: EncodersParams, texts: list[str]) -> Estimate:
    """The tokens the query encoder sees of `texts` (counted on a fixed sample of `SAMPLE`) and
    the layer cache they would take in `states_dtype`."""
    name = encoders.query
    spec = encoders.models[name]
    config = model_config(name, spec)
    tokenizer = load_tokenizer(model_dir(name, spec), f"encoders.models.{name}.model")
    sample = random.Random(0).sample(sorted(texts), min(SAMPLE, len(texts)))
    prompt = prompt_of(spec, "query")
    cap = spec.max_length * spec.chunks.max  # a longer text is cut (or windowed) to this
    counts = [min(len(ids), cap) for ids in tokenizer([prompt + t for t in sample],
                                                      add_special_tokens=True)["input_ids"]]
    mean = sum(counts) / max(len(counts), 1)
    width = 2 if spec.states_dtype == "float16" else 4
    hidden = int(config.hidden_size)
    return Estimate(len(texts), mean, hidden, len(texts) * mean * hidden * width / 1e9)


def choose(t: TrainParams, encoders: EncodersParams, texts: list[str],
           speed: Speed | None = None) -> tuple[str, str]:
    """(mode, reason) of `t.mode` on data of `texts` (every text the encoder embeds): a set
    mode as it is; `auto` by the rule of this module's docstring. `speed(layers)`: (seconds
    per token of the top `layers` layers on this machine, where the figure came from;
    `simtune.cache.budget`), asked only when the top layers fit the other bounds and
    `train.auto.max_minutes` is set; None: the time is not estimated (the reason says so)."""
    if t.mode != "auto":
        return t.mode, f"train.mode: {t.mode}"
    if encoders.document != encoders.query:
        return "head", ("auto: head (two encoders, encoders.query and encoders.document: the "
                        "top layers train one shared encoder)")
    if t.hard_negatives:
        return "head", (f"auto: head (train.hard_negatives {t.hard_negatives}: mined negatives "
                        "train the head only)")
    e = estimate(encoders, texts)
    a = t.auto
    if e.total <= a.full_max_tokens:
        return "full", (f"auto: full ({e.texts:,} texts x {e.tokens:.1f} tokens = {e.total:,} "
                        f"tokens <= train.auto.full_max_tokens {a.full_max_tokens:,}: few enough "
                        "for the whole encoder)")
    layers = t.schedule.top_layers.layers
    total = int(model_config(encoders.query, encoders.models[encoders.query]).num_hidden_layers)
    if layers > total:
        return "head", (f"auto: head (train.schedule.top_layers.layers {layers} > the "
                        f"encoder's {total} layers)")
    fits = e.total <= a.max_tokens and e.gb <= a.max_layer_gb
    over, timed = _timed(t, e.total, speed) if fits else (False, "")
    mode = "top_layers" if fits and not over else "head"
    why = (f"auto: {mode} ({e.texts:,} texts x {e.tokens:.1f} tokens = {e.total:,} tokens "
           f"{'<=' if e.total <= a.max_tokens else '>'} train.auto.max_tokens "
           f"{a.max_tokens:,}; layer cache ~{e.gb:.2f} GB "
           f"{'<=' if e.gb <= a.max_layer_gb else '>'} train.auto.max_layer_gb "
           f"{a.max_layer_gb:g}{timed})")
    return mode, why


def _timed(t: TrainParams, tokens: int, speed: Speed | None) -> tuple[bool, str]:
    """(whether the estimated run passes `train.auto.max_minutes`, the reason's part)."""
    a, top = t.auto, t.schedule.top_layers
    if not a.max_minutes:
        return False, ""
    if speed is None:
        return False, "; run time not estimated"
    per_token, source = speed(top.layers)
    e = budget.estimate(tokens, top.max_epochs, per_token)
    over = e.minutes > a.max_minutes
    return over, (f"; run {e.text()} = ~{e.minutes:.1f} min "
            f"{'>' if over else '<='} train.auto.max_minutes {a.max_minutes:g} on this "
            f"machine ({per_token * 1e3:.3g} ms per token, {source})")


def resolve(t: TrainParams, encoders: EncodersParams, prepared_dir: Path,
            store: str | None = None, note_auto: bool = False, say: bool = True
            ) -> TrainParams:
    """`t` resolved (`params.effective`) for the prepared data at `prepared_dir`: `auto`
    chosen (`choose`) over every prepared text, the mode's schedule in force. `store`:
    `cache.store`, where this machine's top-layers speed is kept (`simtune.cache.budget`);
    every stage of a pipeline passes it, so all resolve the same mode (None: no time bound).
    `note_auto` (the cache and train stages): a set mode that auto would pick too is said in
    one line (an experiment `-S train.mode=<it>` repeats the default run's mode: its log says
    so first). `say` False: auto's choice is not logged (a second resolve of the same
    command, which the first already said)."""
    from simtune.prepare.prepared import load as load_prepared

    if t.mode == "auto":
        texts = load_prepared(prepared_dir).texts.column("text").to_pylist()
        speed = None if store is None else _speed(encoders, t.accelerator, store)
        mode, reason = choose(t, encoders, texts, speed)
        if say:  # a set mode needs no word
            log.info("train.mode %s", reason)
    else:
        mode, reason = choose(t, encoders, [])
        if note_auto and mode in AUTO_MODES:  # a set mode auto picks anyway: said
            texts = load_prepared(prepared_dir).texts.column("text").to_pylist()
            speed = None if store is None else _speed(encoders, t.accelerator, store)
            picked, why = choose(t.model_copy(update={"mode": "auto"}), encoders, texts, speed)
            if picked == mode:
                log.info("train.mode %s: the mode auto picks for this data too (%s): the "
                         "default run's mode, not another", mode, why)
    return P.effective(t, mode, reason)


def _speed(encoders: EncodersParams, accelerator: str, store: str) -> Speed:
    """`choose`'s `speed`: this machine's kept figure (`budget.seconds_per_token`)."""
    from simtune.cache.store import root

    device = budget.device_of(accelerator)
    return lambda layers: budget.seconds_per_token(encoders, layers, device, root(store))
