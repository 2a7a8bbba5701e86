"""`train.auto.max_minutes`: the top layers' run time on this machine, estimated before any
training (`simtune.cache.modes` resolves `auto` at the cache stage, before the layer cache fills).

An epoch of the top layers costs about its tokens through them: training runs the train split's
tokens forward and backward, validation a forward of the train and val texts (a third of the
cost each), so an epoch is about every text's tokens x the seconds one token takes forward,
backward and through AdamW (`seconds_per_token`). That figure is this machine's: timed once by a
probe of `PROBE_STEPS` steps on random states of the encoder's width (the cost does not depend
on the values; `PROBE_ROWS` x `PROBE_TOKENS` tokens a step, the fastest step after a warm-up;
on a CPU its CPU seconds on one thread over the threads training uses, so a busy minute is not
kept as the machine's speed),
and kept in the store (`speed.json`, keyed by the model, the layers, the device and torch's
version). Every later resolution on this machine (the cache, train and evaluate stages, DVC's
reruns, the sweep) reads the kept figure, so the same data resolves to the same mode: the token
and layer-cache bounds stay the deterministic part, and the time bound is fixed once measured
(deleting `speed.json` measures again). The estimate and where its speed came from go into the
mode's reason (the stage logs, reports/train.json, the model card).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from simtune.atomic import write_json
from simtune.encoders import model_config, model_dir
from simtune.params import EncodersParams

log = logging.getLogger(__name__)
RECORD = "speed.json"  # in the store root
PROBE_ROWS, PROBE_TOKENS, PROBE_STEPS = 16, 32, 3
# an epoch's token costs more than a probe's: padding to each length group's longest, dropout,
# the head and the loss, reading the states, Lightning, and validation (a forward of the train
# and val texts, ~0.3 of the training pass), and two threads do not run twice as fast as one.
# TREC's top 2 layers on 2 quiet cores: 33 s training + 9 s validation an epoch over 73,283
# tokens (issue 51) = 0.57 ms a token; the probe: 0.24 ms (2 threads, CPU time, this machine)
EPOCH_FACTOR = 2.4


@dataclass(frozen=True)
class Estimate:
    """A top-layers run: `epochs` of `epoch_s` seconds each (`minutes`: the whole run)."""

    epochs: int
    epoch_s: float

    @property
    def minutes(self) -> float:
        return self.epochs * self.epoch_s / 60

    def text(self) -> str:
        """`~4 epochs x 42 s`: how a log line says it."""
        return f"~{self.epochs} epochs x {self.epoch_s:.0f} s"


def estimate(tokens: int, epochs: int, seconds_per_token: float) -> Estimate:
    """The run of `epochs` over texts of `tokens` tokens in all (module docstring): an epoch
    is the tokens x the probe's seconds per token x `EPOCH_FACTOR`."""
    return Estimate(epochs, tokens * seconds_per_token * EPOCH_FACTOR)


def _key(path: Path, layers: int, device: str) -> str:
    import torch

    return f"{path.resolve()}|top {layers}|{device}|torch {torch.__version__}"


def seconds_per_token(encoders: EncodersParams, layers: int, device: str,
                      store: Path) -> tuple[float, str]:
    """(seconds per token, where it came from) of the query encoder's top `layers` layers on
    `device` (`cpu`, `cuda`): the store's record, else measured now (`probe`) and recorded."""
    name = encoders.query
    path = model_dir(name, encoders.models[name])
    key, record = _key(path, layers, device), store / RECORD
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    entry = known.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("seconds_per_token"), float):
        return entry["seconds_per_token"], f"measured {entry.get('when', '?')}, {record}"
    total = int(model_config(name, encoders.models[name]).num_hidden_layers)
    value, threads = probe(path, total, layers, device)
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    known[key] = {"seconds_per_token": value, "threads": threads, "when": when}
    store.mkdir(parents=True, exist_ok=True)
    write_json(record, known)
    log.info("top %d layers of %s on %s: %.3g ms per token (a %d-step probe, %d threads), "
             "kept in %s", layers, name, device, value * 1e3, PROBE_STEPS, threads, record)
    return value, f"measured {when}, {record}"


def probe(path: Path, total: int, layers: int, device: str) -> tuple[float, int]:
    """(seconds per token, torch threads) of training steps (forward, backward, AdamW) of the
    top `layers` layers (of `total`) of the encoder at `path` on random (PROBE_ROWS,
    PROBE_TOKENS, H) states: the fastest of PROBE_STEPS after one warm-up step. On a CPU the
    steps run on one thread and count its CPU seconds, divided by the threads training will
    use: the machine's work, not how busy it is this minute (other jobs' load would otherwise
    be kept in the record: at load 23 a wall-clock probe here read 9-16 ms a token, the work
    itself ~1 ms)."""
    import torch

    from simtune.layers import top_model

    top = top_model(path, total - layers, native=True).train().to(device)
    hidden = int(top.config.hidden_size)
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(PROBE_ROWS, PROBE_TOKENS, hidden, generator=gen).to(device)
    mask = torch.ones(PROBE_ROWS, PROBE_TOKENS, dtype=torch.long, device=device)
    opt = torch.optim.AdamW([q for q in top.parameters() if q.requires_grad], lr=1e-6)
    cpu, threads = device == "cpu", torch.get_num_threads()
    clock = time.process_time if cpu else time.perf_counter
    best = float("inf")
    if cpu:
        torch.set_num_threads(1)
    try:
        for step in range(PROBE_STEPS + 1):
            start = clock()
            out = top(inputs_embeds=states, attention_mask=mask).last_hidden_state
            opt.zero_grad()
            out.mean().backward()
            opt.step()
            if not cpu:
                torch.cuda.synchronize()
            if step:  # the first step warms up (allocations, kernel choice)
                best = min(best, clock() - start)
    finally:
        torch.set_num_threads(threads)
    return best / (PROBE_ROWS * PROBE_TOKENS) / (threads if cpu else 1), threads


def device_of(accelerator: str) -> str:
    """Where the train stage would run (`train.accelerator`): cuda when auto finds a GPU."""
    if accelerator == "cpu" or os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
