"""A resumable checkpoint after every epoch: a train killed mid-way (`kill -9`, a lost spot
instance, a crash) resumes from the end of its last finished epoch and ends as the uninterrupted
run would (same weights within float tolerance, kept epoch, validation history and curves).

One file, `<directory>/last.pt` (the train stage's `--checkpoint`, `checkpoints/train/`), replaced
atomically after each epoch (`simtune.atomic`: temp file, then rename), holding everything the
rest of the run depends on: the module's weights (representation, head, loss), the optimizer and
precision-plugin (AMP grad scaler) states, the epoch loop's history, kept weights, kept epoch and
seconds (`EpochLoop.state_dict`), each process's RNG states (torch CPU and CUDA, numpy, python)
and the epoch number, which Lightning's fit loop resumes from (its samplers draw each epoch's order
from (seed, epoch), see `sampling`). The dvclive curves are rewritten from the history.

Resumed only when its fingerprint matches: the train params and everything else the run reads
(`encoders`, `cache`, `evaluate.corpus`), the prepared data's bytes, the cache fingerprints (or,
in full mode, the encoder's files) and, when used, the mined negatives; otherwise it is ignored
("checkpoint from other settings: starting afresh") and overwritten after the first epoch.

The epoch that ends training (early stop or `max_epochs`) writes none (a kill after it runs that
epoch again, to the same result); a successful run deletes the file (and the directory when
empty). Lightning's own `ModelCheckpoint` + `ckpt_path` is not used: its restart replays the
saved epoch's end hooks (our validation), it keeps no RNG state and its writes are not atomic.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from simtune.atomic import write_bytes
from simtune.encoders import describe
from simtune.encoders import fingerprint as encoder_fingerprint
from simtune.params import CacheParams, EncodersParams, TrainParams
from simtune.train.epochs import EpochLoop

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # 2: the loop state holds train_cpu_seconds; 3: epoch 0, selection keys
FILE = "last.pt"


def fingerprint(t: TrainParams, enc: EncodersParams, cache: CacheParams, corpus: str,
                prepared_dir: Path, tables: dict[str, Any], negatives_dir: Path | None) -> str:
    """Hash of what a run's result depends on besides the code: the params it reads (`t`: the
    train params as the run resolved them, `stage.in_force`; the `encoders` and `cache`
    sections; `corpus`: `evaluate.corpus`), the bytes of the prepared data (and of the mined
    negatives when `train.hard_negatives` > 0), and the cache tables' fingerprints (`tables`:
    `Data.tables`; full mode reads none: the encoder's)."""
    h = hashlib.blake2b(digest_size=16)
    settings = {"format_version": FORMAT_VERSION, "train": t.model_dump(mode="json"),
                "encoders": enc.model_dump(mode="json"),
                "cache": cache.model_dump(mode="json"), "corpus": corpus}
    h.update(json.dumps(settings, sort_keys=True).encode())
    hash_files(h, prepared_dir)
    if t.hard_negatives and negatives_dir is not None:
        hash_files(h, negatives_dir)
    h.update(json.dumps(cache_fingerprints(enc, tables), sort_keys=True).encode())
    return h.hexdigest()


def hash_files(h: Any, directory: Path) -> None:
    """Feed `h` (a hashlib hash) every file of `directory`, in sorted order: its relative path
    and the blake2b of its bytes (so a renamed, added, removed or edited file changes it)."""
    directory = Path(directory)
    for f in sorted(x for x in directory.rglob("*") if x.is_file()):
        h.update(f"\0{f.relative_to(directory)}\0".encode())
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "blake2b").digest())


def cache_fingerprints(enc: EncodersParams, tables: dict[str, Any]) -> dict[str, str]:
    """The fingerprint of each cache table a run reads (`tables`: `Data.tables`, by role); full
    mode reads none: {"encoder": the live query encoder's (of `enc`) fingerprint, from its
    files}."""
    cached = {k: t.manifest.fingerprint for k, t in sorted(tables.items())
              if hasattr(t, "manifest")}
    if "query" not in cached:  # full mode (a distillation teacher's table aside)
        name = enc.query
        cached["encoder"] = encoder_fingerprint(describe(name, enc.models[name]))
    return cached


def rng_states(device: torch.device) -> dict[str, Any]:
    """This process's RNG states, as types `torch.load(weights_only=True)` reads back."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "numpy": (kind, torch.from_numpy(key.copy()), pos, has_gauss, gauss),
            "python": random.getstate()}


def set_rng_states(s: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(s["torch"])
    if s["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(s["cuda"], device)
    kind, key, pos, has_gauss, gauss = s["numpy"]
    np.random.set_state((kind, key.numpy(), pos, has_gauss, gauss))
    random.setstate(s["python"])


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _loads(blob: bytes) -> Any:
    return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)


def _all_gather_bytes(blob: bytes, world: int) -> list[bytes]:
    """Every process's `blob` (bytes, not tensors: `all_gather_object` fails to unpickle
    tensors here)."""
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, blob)
    return out


class Resume(pl.Callback):
    """Writes the checkpoint after each epoch but the last, and restores a matching one.

    Put after `loop` in the trainer's callbacks: at an epoch's end the loop has recorded it.
    Restores in two steps: weights, optimizer, loop state and the epoch in `on_fit_start` (the
    optimizers exist, the loop has not started); the RNG states in `on_train_start`, after the
    fit loop's set-up and before the first resumed epoch draws anything (its DataLoader iterator
    draws a seed then, as the uninterrupted run's does after the checkpoint)."""

    def __init__(self, directory: Path, fingerprint: str, loop: EpochLoop) -> None:
        self.path, self.fingerprint, self.loop = Path(directory) / FILE, fingerprint, loop
        self._remove_temps()
        self.saved = self._load()

    def _load(self) -> dict[str, Any] | None:
        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:  # written atomically, so not a torn write: a foreign file
            log.warning("%s: unreadable checkpoint (%s): starting afresh", self.path, e)
            return None
        if (not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION
                or state.get("fingerprint") != self.fingerprint):
            log.warning("%s: checkpoint from other settings: starting afresh", self.path)
            return None
        log.info("%s: resuming after epoch %d", self.path, state["epoch"])
        return state

    def on_fit_start(self, trainer: pl.Trainer, module: Any) -> None:
        s = self.saved
        if s is None:
            return
        module.load_state_dict(s["module"])
        for optimizer, state in zip(trainer.optimizers, s["optimizers"], strict=True):
            optimizer.load_state_dict(state)
        trainer.precision_plugin.load_state_dict(s["precision"])
        self.loop.load_state_dict(s["loop"])
        # Lightning's epoch counter (`trainer.current_epoch`, the samplers' `set_epoch`)
        progress = trainer.fit_loop.epoch_progress
        for counts in (progress.total, progress.current):
            counts.ready = counts.started = counts.processed = counts.completed = s["epoch"]

    def on_train_start(self, trainer: pl.Trainer, module: Any) -> None:
        if self.saved is not None:
            set_rng_states(self.saved["rng"][trainer.global_rank], module.device)
            self.saved = None  # the weights in it are no longer needed

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Any) -> None:
        epoch = trainer.current_epoch + 1
        if trainer.should_stop or epoch >= (trainer.max_epochs or 0):
            return  # training ends here: no checkpoint (see the module's docstring)
        rng = [rng_states(module.device)]
        if trainer.world_size > 1:  # every process's own stream (dropout masks differ)
            rng = [_loads(b) for b in _all_gather_bytes(_dumps(rng[0]), trainer.world_size)]
        if not trainer.is_global_zero:
            return
        state = {"format_version": FORMAT_VERSION, "fingerprint": self.fingerprint,
                 "epoch": epoch, "module": module.state_dict(),
                 "optimizers": [o.state_dict() for o in trainer.optimizers],
                 "precision": trainer.precision_plugin.state_dict(),
                 "loop": self.loop.state_dict(), "rng": rng}
        write_bytes(self.path, _dumps(state))

    def on_exception(self, trainer: pl.Trainer, module: Any, exception: BaseException) -> None:
        """A diverged run keeps no checkpoint: resumed, the same settings diverge again. Any
        other failure (a crash, Ctrl-C) keeps it to resume from."""
        from simtune.train.module import is_divergence

        if is_divergence(exception) and trainer.is_global_zero:
            self.finish()

    def finish(self) -> None:
        """After the outputs are written: the checkpoint is no longer needed."""
        self.path.unlink(missing_ok=True)
        self._remove_temps()
        if self.path.parent.is_dir() and not any(self.path.parent.iterdir()):
            self.path.parent.rmdir()

    def _remove_temps(self) -> None:
        """Temp files of a write that a kill interrupted (never renamed into place)."""
        if self.path.parent.is_dir():
            for tmp in self.path.parent.glob(f".{FILE}.tmp-*"):
                tmp.unlink(missing_ok=True)
