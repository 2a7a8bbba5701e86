"""Fill backends: who runs the frozen encoder's forward pass when the cache is filled.

`cache.backend: torch` (the default) runs the transformers model eagerly. `onnx` exports the
encoder *with* its pooling and normalisation to one ONNX graph (TorchScript exporter) and runs
it with ONNX Runtime on the CPU: same tokenizer, same batches, vectors equal to torch's up to
float rounding (ONNX Runtime sums in another order: ~2e-7 measured on MiniLM). The export is
made once per encoder fingerprint and kept in the shared store entry (`<entry>/onnx/`), so it
is evicted with the entry's vectors. Before a fill uses it, a check batch is run through both
backends; any difference above `CHECK_TOLERANCE` (or an export that fails) falls back to torch
with a warning: the backend changes speed, never what is stored, so it is not in the
fingerprint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune.encoders import FrozenEncoder, pooled
from simtune.errors import UserError

log = logging.getLogger(__name__)
INSTALL = "pip install 'simtune[onnx]' (onnxruntime and onnx)"
EXPORT_DIR, MODEL_FILE = "onnx", "model.onnx"
CHECK_TOLERANCE = 1e-6  # relative to the largest vector entry; float rounding is ~2e-7
# two lengths, so the check batch has padding (the exported graph must honour the mask)
CHECK_TEXTS = ["what is the name of the largest city in the world, and why is it so big?",
               "a short one"]


def select(encoder: FrozenEncoder, backend: str, entry: Path, layer: int | None
           ) -> FrozenEncoder | OnnxEncoder:
    """The encoder that runs this fill: `encoder` itself for `backend` torch, for layer states
    (ONNX exports only the pooled vector) and on a GPU (ONNX Runtime runs on the CPU here);
    else an `OnnxEncoder` over the export kept in store entry `entry` (made if missing).
    `UserError` when onnxruntime is not installed; torch (with a warning) when the export
    fails or its check batch disagrees with torch."""
    if backend == "torch" or not isinstance(encoder, FrozenEncoder):  # an export: its head
        return encoder
    if layer is not None or encoder.device.type != "cpu":
        log.info("cache.backend onnx: %s run on torch", "layer states" if layer is not None
                 else f"fills on {encoder.device}")
        return encoder
    for package in ("onnxruntime", "onnx"):  # onnx: torch's exporter writes with it
        try:
            __import__(package)
        except ImportError:
            raise UserError(f"cache.backend: 'onnx' needs the {package} package: "
                            f"{INSTALL}") from None
    path = Path(entry) / EXPORT_DIR / MODEL_FILE
    try:
        if not path.is_file():
            export(encoder, path)
        fast = OnnxEncoder(encoder, path)
        diff = fast.check()
    except Exception as e:  # any exporter or runtime failure: torch still gives the vectors
        log.warning("cache.backend onnx: %s: %s; filling with torch",
                    encoder.name, str(e).strip().splitlines()[0] if str(e).strip() else e)
        return encoder
    if diff is None:
        log.warning("cache.backend onnx: %s: the ONNX export differs from torch on a check "
                    "batch; filling with torch", encoder.name)
        return encoder
    log.info("cache %s: ONNX Runtime backend (%s; check batch max |diff| %.1e)",
             encoder.name, path, diff)
    return fast


class _Pooled(torch.nn.Module):
    """The encoder, pooling and normalisation as one module of positional token tensors."""

    def __init__(self, encoder: FrozenEncoder, names: list[str]) -> None:
        super().__init__()
        self.model, self.names, self.spec = encoder.model, names, encoder.spec
        self.skip = encoder.skip  # the role's prompt tokens left out of the pooling (a constant)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        batch = dict(zip(self.names, tensors, strict=True))
        hidden = self.model(**batch).last_hidden_state
        return pooled(hidden, batch["attention_mask"], self.spec, self.skip)


def export(encoder: FrozenEncoder, path: Path) -> None:
    """Export `encoder` (pooling and normalisation included) to ONNX at `path`, atomically:
    written under a temporary name, then renamed (concurrent ranks each write their own).
    Inputs are the tokenizer's tensors by name, batch and length dynamic; output `vectors`."""
    sample = encoder.tokenize(CHECK_TEXTS)
    names = list(sample)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # deprecation and tracer notes: checked below
            torch.onnx.export(
                _Pooled(encoder, names).eval(), tuple(sample[n] for n in names), str(tmp),
                input_names=names, output_names=["vectors"], opset_version=17, dynamo=False,
                dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names},
                              "vectors": {0: "batch"}})
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    log.info("cache %s: exported to ONNX in %.1f s (%s, %.0f MB)", encoder.name,
             time.perf_counter() - t0, path, path.stat().st_size / 1e6)


def session_options(threads: int = 1) -> Any:
    """ONNX Runtime settings for a small shared CPU: `threads` intra-op threads (the fill uses
    1 per batch and runs several batches at once), one inter-op thread, sequential execution,
    full graph optimisation, and no spin-waiting (spinning threads steal the core the
    tokenizer and other processes need)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


class OnnxEncoder:
    """Pooled vectors from an ONNX export of `encoder`, on the CPU: `tokenize`,
    `token_lengths`, `pieces`, `pad`, `name`, `spec`, `dim` and `device` are the torch
    encoder's own. `embed`
    is thread-safe and single-threaded: callers run `streams` (torch's thread count) batches
    at once, which beats splitting each small batch's kernels across threads (~1.2x on 2 busy
    cores, same vectors bit for bit)."""

    def __init__(self, encoder: FrozenEncoder, path: Path) -> None:
        import onnxruntime as ort

        self.torch = encoder
        self.name, self.spec, self.dim, self.device = (encoder.name, encoder.spec,
                                                       encoder.dim, encoder.device)
        self.tokenize, self.token_lengths = encoder.tokenize, encoder.token_lengths
        self.pieces, self.pad = encoder.pieces, encoder.pad
        self.streams = torch.get_num_threads()
        self.session = ort.InferenceSession(str(path), session_options(1),
                                            providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised batch -> (B, dim) float32 vectors (CPU), as `FrozenEncoder.embed`."""
        feed = {n: np.ascontiguousarray(batch[n].numpy(), dtype=np.int64) for n in self.inputs}
        return torch.from_numpy(self.session.run(None, feed)[0])

    def check(self) -> float | None:
        """Max |difference| to the torch encoder on `CHECK_TEXTS`; None above tolerance."""
        batch = self.tokenize(CHECK_TEXTS)
        with torch.inference_mode():
            want = self.torch.embed(batch).cpu()
        got = self.embed(batch)
        diff = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
        return diff if diff <= CHECK_TOLERANCE * max(1.0, float(want.abs().max())) else None
