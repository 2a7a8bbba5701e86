"""A servable model: a frozen (or fine-tuned) encoder plus a trained head, loadable anywhere.

Export directory layout (`simtune export`), format version 3:

- `simtune.json` — `{"format_version": 3, "encoder_name", "encoder": {model, pooling, normalize,
  max_length, dtype, prompts}, "head": "head", "normalize_output", "sentence_transformers":
  "plain" | "trust_remote_code"}`; `encoder.model` is `encoder` (the copy inside the export);
  `encoder_name` is the encoder's name in `params.yaml` (with "fine-tuned" in full mode);
  `normalize_output` is true when training compared vectors by angle (cosine distance, or
  arcface), so the output is L2-normalised: unit vectors, the same cosine ranking. `prompts`
  (null: none) are also in `config_sentence_transformers.json`, so `encode_query` /
  `encode_document` of sentence-transformers put the same prompts before the texts. `sha256`
  (path -> sha256) covers every file that decides how sentence-transformers computes a vector
  (the head's two copies, `head/` and the `Dense` modules, `modules.json` and each module's
  config; `simtune.st_files.decisive_files`), checked on every load (exports written before
  `files` hashed the head's copies only, older ones nothing). `files` lists every path the
  export wrote: a re-export replaces those only. Read through `simtune.model_files.ExportConfig`;
  its paths must stay inside the folder.
- `encoder/` — the Hugging Face model files (hard-linked where possible), the bundled `minilm`
  included, plus sentence-transformers' `sentence_bert_config.json` (`max_seq_length`).
- `head/` — `model.safetensors` + `config.json` (see `simtune.heads`): what `load_model` reads.
- sentence-transformers files (`modules.json`, `config_sentence_transformers.json`, the module
  folders; see `simtune.export.st_layout`): every head type is written as sentence-transformers' own
  `Dense` modules, so plain `SentenceTransformer(dir)` loads it (`"sentence_transformers":
  "plain"`); a head type without a `Dense` form would be served by `simtune.st_module.HeadModule`
  and need `trust_remote_code=True`.
- `README.md` — the model card (`simtune.export.model_card`).
- a query-side head (`head_side: query`): `encode_document` skips the head (a `Router`); a
  query tower (top_layers mode) adds `document_encoder` (simtune.json: the folder of the frozen
  encoder the documents are embedded with; `encoder/` is the tower) and the folder itself is
  the `Router` (`simtune.export.query_side`).

Older exports still load with `load_model`: version 2 (no `sentence_transformers` key, the head
as `HeadModule`, no `encoder/` for `minilm`) and version 1 (also no `encoder_name`, not
normalised).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch

from simtune import heads, model_files, st_files, static
from simtune.encoders import BUNDLED, FrozenEncoder, is_export, model_dir, resolve_device
from simtune.errors import UserError, echo
from simtune.model_files import ExportConfig, TrainingMeta
from simtune.params import EncoderParams

log = logging.getLogger(__name__)
FORMAT_VERSION = 3


class Model:
    """texts -> (N, dim) vectors: encoder, pooling, normalisation, the head, then (when
    `normalize_output`) L2 normalisation of the head's output."""

    def __init__(self, encoder: FrozenEncoder, head: heads.Head, normalize_output: bool,
                 side: str = "both", document: FrozenEncoder | None = None) -> None:
        """`side` (`train.head.side`): `query` leaves documents the frozen encoder's vectors:
        `document`'s, the frozen encoder when `encoder` is a fine-tuned query tower (top_layers
        mode), else `encoder` itself."""
        self.encoder, self.head = encoder, head.to(encoder.device).eval()
        self.normalize_output, self.side = normalize_output, side
        self.document = encoder if document is None else document

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int = 64, role: str = "query",
               progress: bool = False) -> torch.Tensor:
        """(N, dim) float32 on CPU, in the order of `texts`; unit rows when `normalize_output`.
        `role`: `query` (groups' texts and pairs' queries; sentence-transformers' `encode` and
        `encode_query` of the export) or `document` (its `encode_document`): which of the
        encoder's prompts goes before each text. `progress`: a bar on a terminal, a log line
        every 10 s elsewhere. A query-side head (`side` query): documents are the frozen
        encoder's vectors exactly (no head, no output normalisation)."""
        if role not in ("query", "document"):
            raise UserError(f"role: '{role}' is not a role (query or document)")
        if role == "document" and self.side == "query":
            return self.document.as_role(role).encode(list(texts), batch_size,
                                                      progress).float().cpu()
        encoder = self.encoder.as_role(role)
        x = encoder.encode(list(texts), batch_size, progress).to(self.encoder.device)
        out = self.head(x).float()
        if self.normalize_output:
            out = torch.nn.functional.normalize(out, dim=-1)
        return out.cpu()

    @torch.inference_mode()
    def encode_corpus(self, texts: list[str], batch_size: int = 64, role: str = "document",
                      progress: bool = False) -> torch.Tensor:
        """(N, dim) vectors of corpus texts (`role`'s prompt): `encode`'s, except that a
        query-side head leaves them the frozen encoder's exactly (groups' texts included)."""
        if self.side == "both":
            return self.encode(texts, batch_size, role, progress)
        return self.document.as_role(role).encode(list(texts), batch_size, progress).float().cpu()


def _trained_as(meta: TrainingMeta) -> tuple[str, bool]:
    """(encoder name for logs and messages, normalize_output) from a head's training.json;
    heads trained before `normalize_output` existed were served unnormalised, and still are."""
    name = meta.query_encoder + (" fine-tuned" if meta.mode == "full" else "")
    return name, meta.normalize_output


def training_meta(directory: Path) -> TrainingMeta:
    """A trained head folder's checked `training.json`; `UserError` when there is none."""
    path = Path(directory) / "training.json"
    if not path.exists():
        raise UserError(f"{directory}: no trained head here (run the train stage)")
    return model_files.read(path, TrainingMeta)


def trained_encoder(directory: Path, meta: TrainingMeta, encoder: str | None) -> str:
    """The `model` of the encoder a trained head folder is served with: its own fine-tuned
    `encoder/` when it has one, else the bundled or local encoder training.json names — which
    lies outside the folder, so it is used only when the caller (its params.yaml) names the
    same `encoder`: the folder's files alone never make simtune read files elsewhere."""
    directory = Path(directory)
    if (directory / "encoder").is_dir():
        return str(model_files.inside(directory, "encoder", f"{directory}/encoder"))
    if meta.mode != "head" and meta.selected != "frozen":
        # its layers trained: the frozen encoder would serve it silently
        raise UserError(f"{directory}: training.json says train.mode {meta.mode}, but the "
                        "fine-tuned encoder/ beside it is missing; train again")
    return frozen_encoder(directory, meta, encoder)


def frozen_encoder(directory: Path, meta: TrainingMeta, encoder: str | None) -> str:
    """The `model` of the frozen encoder a head folder was trained over (training.json's; a
    query tower's documents are its vectors), under `trained_encoder`'s rule."""
    model = meta.encoder.model
    if model in BUNDLED or model == encoder:
        return model
    where = f"{directory / 'training.json'}: encoder.model {echo(model)}"
    if encoder is None:
        raise UserError(f"{where} is outside the head folder: load the export (simtune "
                        "export), or pass that encoder: load_model(dir, encoder=...)")
    raise UserError(f"{where} is outside the head folder and is not the encoder the params "
                    f"name ({echo(encoder)})")


def load_model(directory: str | Path, device: str = "auto", encoder: str | None = None) -> Model:
    """Load an export directory (or a trained `models/head` directory) as a `Model`.

    Files are read through `simtune.model_files` (one line for a damaged one), and only from
    inside `directory`: `simtune.json`'s encoder and head paths, the sentence-transformers
    files' module paths and every symbolic link must stay inside it, and those files' prompts
    must be simtune.json's (`st_files.check_st_files`). A head
    folder trained on a local encoder (no `encoder/` of its own) needs that encoder's `model`
    as `encoder` (what params.yaml names; see `trained_encoder`)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"{directory}: " + ("not a folder (a model is a folder: an export or a "
                                            "trained head)" if directory.exists()
                                            else "no such model folder"))
    if static.is_static(directory):  # a static student (train.mode: static): a token table
        table, saved = static.load(directory)
        return Model(table, torch.nn.Identity(), saved.normalize_output)  # type: ignore[arg-type]
    config_path = directory / "simtune.json"
    if config_path.exists():
        config = model_files.read(config_path, ExportConfig)
        spec = config.encoder
        name = config.encoder_name or spec.model  # version 1: no name, no normalisation
        normalize_output = config.normalize_output
        if spec.model not in BUNDLED:  # versions 1-2 name the bundled minilm, not a copy
            spec = spec.model_copy(update={"model": str(model_files.inside(
                directory, spec.model, f"{config_path}: encoder.model"))})
        head_dir = model_files.inside(directory, config.head, f"{config_path}: head")
        side = config.head_side
        if config.document_encoder is not None and side != "query":
            raise UserError(f"{config_path}: document_encoder is only for head_side query "
                            f"(it says {side}): documents would skip the encoder it names")
        document = None if config.document_encoder is None else spec.model_copy(update={
            "model": str(model_files.inside(directory, config.document_encoder,
                                            f"{config_path}: document_encoder"))})
        key = f"{config_path}: encoder"
        st_files.check_st_files(directory, config)  # after simtune.json's own paths
    elif (directory / "training.json").exists():  # a trained head straight from `train`
        meta = training_meta(directory)
        name, normalize_output = _trained_as(meta)
        spec = meta.encoder.model_copy(
            update={"model": trained_encoder(directory, meta, encoder)})
        head_dir = directory
        side = meta.head_side
        document = None  # a query tower (its own encoder/): documents are the frozen encoder's
        if side == "query" and (directory / "encoder").is_dir():
            document = meta.encoder.model_copy(
                update={"model": frozen_encoder(directory, meta, encoder)})
        key = f"{directory / 'training.json'}: encoder"
    else:
        raise UserError(f"{directory}: not a simtune model (no simtune.json or training.json; "
                        "an export or a trained head folder)")
    model_files.contained(directory)  # after the named paths: their own message first
    head = heads.load(head_dir)  # before the encoder: a damaged head costs no model load
    if config_path.exists():  # an export's head/ and Dense modules: unchanged since export
        st_files.check_copies(directory, model_files.read(config_path, ExportConfig))
    encoder_model = FrozenEncoder(name, spec, resolve_device(device), key=key)
    encoder_model.as_role("document")  # its prompt too: refused now, not at the first encode
    if head.config["dim"] != encoder_model.dim:
        raise UserError(f"{head_dir}: head expects {head.config['dim']}-d vectors, the encoder "
                        f"gives {encoder_model.dim}-d")
    document_model = None
    if document is not None:
        document_model = FrozenEncoder(name.removesuffix(" fine-tuned"), document,
                                       resolve_device(device), key=f"{key} (documents)")
        if document_model.dim != encoder_model.dim:
            raise UserError(f"{key} (documents): {document_model.dim}-d vectors, the query "
                            f"tower gives {encoder_model.dim}-d")
    return Model(encoder_model, head, normalize_output, side, document_model)


class ExportEncoder:
    """A simtune export folder as a frozen encoder of the cache fill (a distillation teacher):
    the export's encoder, pooling and prompts, then its head (and output normalisation). Offers
    what a fill uses of a `FrozenEncoder`: `tokenize`, `token_lengths`, `pieces`, `pad`,
    `embed` (a tokenised batch -> (B, dim) float32 vectors), `as_role`, `encode`."""

    def __init__(self, model: Model, name: str) -> None:
        self.model, self.inner, self.head, self.name = model, model.encoder, model.head, name
        self.normalize_output = model.normalize_output
        self.spec, self.device, self.dim = self.inner.spec, self.inner.device, self.inner.dim
        self.role, self.chunker = self.inner.role, self.inner.chunker
        self.tokenize, self.token_lengths = self.inner.tokenize, self.inner.token_lengths
        self.pieces, self.pad = self.inner.pieces, self.inner.pad

    def as_role(self, role: str) -> ExportEncoder:
        """This export embedding `role` texts (its own prompt for the role); a query-side
        export's documents: its frozen encoder's vectors, as `Model.encode` gives them."""
        other = copy.copy(self)
        frozen = role == "document" and self.model.side == "query"
        other.inner = (self.model.document if frozen else self.model.encoder).as_role(role)
        other.role, other.chunker = role, other.inner.chunker
        other.tokenize, other.token_lengths = other.inner.tokenize, other.inner.token_lengths
        other.pieces, other.pad = other.inner.pieces, other.inner.pad
        return other

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tokenised batch -> (B, dim) float32: the encoder's pooled vectors through the head
        (a query-side export's documents: the frozen encoder's vectors alone)."""
        if self.role == "document" and self.model.side == "query":
            return self.inner.embed(batch).float()
        out = self.head(self.inner.embed(batch)).float()
        return torch.nn.functional.normalize(out, dim=-1) if self.normalize_output else out

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int, progress: bool = False
               ) -> torch.Tensor:
        """(N, dim) float32 on CPU in the order of `texts`, as `Model.encode` gives them."""
        return self.model.encode(texts, batch_size, self.role, progress)


# settings an export fixes (its head was trained on them): params must say the same
_EXPORT_FIXED = ("pooling", "normalize", "prompts")


def load_encoder(name: str, spec: EncoderParams, device: torch.device, role: str = "query",
                 key: str | None = None) -> FrozenEncoder | ExportEncoder:
    """Encoder `name` of `encoders.models` as the cache fill runs it: a `FrozenEncoder`, or,
    when its `model` is a simtune export folder, an `ExportEncoder` (the export's encoder and
    head; `spec`'s max_length and chunks apply, its pooling, normalize and prompts must be the
    export's: one line naming the key otherwise)."""
    key = key or f"encoders.models.{name}"
    path = model_dir(name, spec, key)
    if not is_export(path):
        return FrozenEncoder(name, spec, device, role, key)
    model = load_model(path, str(device))
    saved = model.encoder.spec
    for field in _EXPORT_FIXED:
        if getattr(spec, field) != getattr(saved, field):
            raise UserError(f"{key}.{field}: {getattr(spec, field)!r}, but the export {path} "
                            f"embeds with {getattr(saved, field)!r}; set it so")
    if (saved.max_length, saved.chunks) != (spec.max_length, spec.chunks):  # the window: yours
        window = {"max_length": spec.max_length, "chunks": spec.chunks}
        tower = model.document is not model.encoder  # a query tower's frozen document encoder
        model.encoder = FrozenEncoder(name, saved.model_copy(update=window), device, role,
                                      key=key)
        model.document = (FrozenEncoder(name, model.document.spec.model_copy(update=window),
                                        device, role, key=key) if tower else model.encoder)
    return ExportEncoder(model, name).as_role(role)
