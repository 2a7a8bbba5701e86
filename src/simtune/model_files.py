"""The JSON files of a trained head or an export folder, each read through one checked schema.

A head folder (`models/head`, written by `train`) holds `config.json` (the head: `HeadConfig`)
and `training.json` (how it was trained: `TrainingMeta`); an export folder (`simtune export`)
holds `simtune.json` (`ExportConfig`). Every reader of these files — `heads.load`,
`model.load_model`, export, evaluate — goes through `read`, so a damaged file (not JSON, a list
instead of an object, a wrong type or value, nesting thousands deep) is one `UserError` line
naming the file and the key, never a traceback or a silently wrong model.

Paths written in these files are relative to their folder and must stay inside it (`inside`):
a folder never makes simtune read files from elsewhere, through a path or a symbolic link
(`contained`). An export's sentence-transformers files (`modules.json`,
`config_sentence_transformers.json`) are checked too (`check_st_files`): their module paths stay
inside the folder and their prompts are simtune.json's, so `SentenceTransformer(dir)` embeds as
`load_model(dir)` does.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictBool, StrictInt, ValidationError

from simtune.errors import UserError, echo
from simtune.params import ChunkParams, EncoderParams, EncoderPrompts

HEAD_TYPES = ("identity", "linear", "skip_connection", "gated", "mlp")
MAX_BYTES = 1 << 20  # these files are a few hundred bytes; a larger one is not ours
Schema = TypeVar("Schema", bound=BaseModel)


class _File(BaseModel):
    """Strict: a string "2" is not the number 2, NaN is no number; keys a later version adds
    are ignored (a newer train's file still loads)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, allow_inf_nan=False)


class HeadConfig(_File):
    """A head's `config.json` (see `simtune.heads`)."""

    type: Literal[HEAD_TYPES] = Field(description="the head type")  # type: ignore[valid-type]
    dim: StrictInt = Field(gt=0, description="input = output width of the head")
    expansion: StrictInt = Field(ge=1, description="mlp hidden width / dim")
    dropout: float = Field(ge=0, lt=1, description="mlp dropout")
    format_version: StrictInt = Field(default=1, ge=1, description="head file format")


class SavedEncoder(EncoderParams):
    """The encoder settings a head or export folder was written with; folders written before
    `prompts` (or `states_dtype`) existed have none."""

    prompts: EncoderPrompts | None = None
    chunks: ChunkParams | None = None  # folders written before chunking: truncated texts
    states_dtype: Literal["float32", "float16"] = "float32"


class TrainingMeta(_File):
    """A head folder's `training.json` (written by the train stage)."""

    mode: Literal["head", "top_layers", "full"]
    kind: Literal["groups", "pairs"] | None = None
    query_encoder: str
    document_encoder: str | None = None
    encoder: SavedEncoder
    normalize_output: StrictBool = False
    matryoshka_dims: list[StrictInt] = []
    # the query view's settings as the cache describes them (`encoders.describe`: model files
    # hashed), checked by evaluate and search against the cache's; heads before: None
    encoder_description: dict[str, Any] | None = None
    head_side: Literal["both", "query"] = "both"  # query: documents keep the frozen vectors


class ExportConfig(_File):
    """An export folder's `simtune.json` (see `simtune.model`); versions 1-3."""

    format_version: StrictInt = Field(ge=1)
    encoder_name: str | None = None  # version 1: none
    encoder: SavedEncoder
    head: str
    normalize_output: StrictBool = False
    sentence_transformers: Literal["plain", "trust_remote_code"] | None = None
    # path inside the folder -> sha256 of every file of the head's two copies (`head_copies`);
    # exports written before it have none (nothing to check)
    sha256: dict[str, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] | None = None
    head_side: Literal["both", "query"] = "both"  # query: documents keep the frozen vectors


class STModule(_File):
    """One entry of an export's `modules.json`: a sentence-transformers module and its folder."""

    idx: StrictInt
    name: str
    path: str  # "": the export folder itself (version 2 exports of the bundled minilm)
    type: str


class STModules(RootModel[list[STModule]]):
    """An export's `modules.json`: the modules `SentenceTransformer(dir)` chains, in order."""

    model_config = ConfigDict(strict=True, frozen=True)


class STConfig(_File):
    """An export's `config_sentence_transformers.json`: the prompts sentence-transformers puts
    before texts by name (`encode_query`: `query`, `encode_document`: `document`), and the one
    plain `encode` uses."""

    prompts: dict[str, str] = {}
    default_prompt_name: str | None = None


ST_BERT = "sentence_bert_config.json"


class STBertConfig(_File):
    """The `Transformer` module's `sentence_bert_config.json`: where it truncates a text."""

    max_seq_length: StrictInt = Field(gt=0)


# simtune's pooling -> the `Pooling` config key that turns it on
POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}


class STPooling(_File):
    """The `Pooling` module's `config.json` (the modes `simtune export` writes)."""

    pooling_mode_cls_token: StrictBool = False
    pooling_mode_mean_tokens: StrictBool = False
    pooling_mode_max_tokens: StrictBool = False
    pooling_mode_mean_sqrt_len_tokens: StrictBool = False
    pooling_mode_lasttoken: StrictBool = False
    include_prompt: StrictBool = True


def read(path: Path, schema: type[Schema]) -> Schema:
    """`path` parsed and checked against `schema`; `UserError` (one line naming the file and
    the first bad key) for a file that is missing, not a regular file, too large, not UTF-8
    JSON, too deeply nested, not an object (a list: for a `RootModel` of one), or not what the
    schema says."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: {'a link to nothing' if path.is_symlink() else 'not found'}")
    if not path.is_file():
        raise UserError(f"{path}: not a regular file")
    if path.stat().st_size > MAX_BYTES:
        raise UserError(f"{path}: {path.stat().st_size} bytes: too large for a "
                        f"{schema.__name__} file")
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deep") from None
    want, what = (list, "array") if issubclass(schema, RootModel) else (dict, "object")
    if not isinstance(raw, want):
        raise UserError(f"{path}: expected a JSON {what}, got {type(raw).__name__}")
    try:
        return schema.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err["loc"]) or "(top level)"
        got = f", got {echo(err['input'])}" if err["type"] != "missing" else ""
        raise UserError(f"{path}: {key}: {err['msg']}{got}") from None


def inside(folder: Path, rel: str, what: str) -> Path:
    """`folder / rel` when it lies inside `folder` (symlinks resolved); `UserError` naming
    `what` (the file and key that hold `rel`) for an absolute path or one that leaves it."""
    folder = Path(folder)
    if os.path.isabs(rel) or not rel:
        raise UserError(f"{what}: {echo(rel)} must be a path inside {folder}")
    path = folder / rel
    base = folder.resolve()
    if not _resolved(path, what).is_relative_to(base):
        raise UserError(f"{what}: {echo(rel)} leads outside {folder}; a model folder only "
                        "loads files from inside itself")
    return path


def _resolved(path: Path, what: str) -> Path:
    """`path` with every link followed; `UserError` naming `what` for a loop of links."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):  # Python 3.11: RuntimeError("Symlink loop from ...")
        raise UserError(f"{what}: a loop of links, or a link that cannot be followed") from None


def contained(folder: Path) -> None:
    """`UserError` naming the link when anything in `folder` (at any depth) is a symbolic link
    that leads outside it: a model folder's files are its own, never another folder's."""
    folder = Path(folder)
    base = folder.resolve()
    for root, dirs, files in os.walk(folder):  # links to folders are listed, not followed
        for name in sorted((*dirs, *files)):  # the same link named on every run
            path = Path(root) / name
            if path.is_symlink() and not _resolved(path, str(path)).is_relative_to(base):
                raise UserError(f"{path}: a link leading outside {folder}; a model folder only "
                                "loads files from inside itself")


def check_st_files(folder: Path, config: ExportConfig) -> None:
    """The sentence-transformers files of export `folder`, when present, agree with its
    simtune.json (`config`), so `SentenceTransformer(folder)` embeds as `load_model(folder)`:
    every `modules.json` path lies inside the folder; `config_sentence_transformers.json` holds
    simtune.json's prompts with `query` the default, as `simtune export` writes them; and
    (format 3) the `Pooling` module pools and the `Transformer` module truncates as
    simtune.json says. `UserError` naming the file otherwise."""
    folder, spec = Path(folder), config.encoder
    modules_path = folder / "modules.json"
    modules = read(modules_path, STModules).root if _present(modules_path) else []
    for i, module in enumerate(modules):
        if module.path:
            inside(folder, module.path, f"{modules_path}: {i}.path")
    prompts = spec.prompts
    _check_st_prompts(folder / "config_sentence_transformers.json", {} if prompts is None else {
        "query": prompts.query, "document": prompts.document})
    if config.format_version < 3:  # older layouts: their files are not checked further
        return
    for module in modules:
        kind = module.type.rsplit(".", 1)[-1]
        if kind == "Pooling":
            _check_st_pooling(folder / module.path / "config.json", spec)
        if kind == "Transformer" and (folder / module.path / ST_BERT).exists():
            length = read(folder / module.path / ST_BERT, STBertConfig).max_seq_length
            if length != spec.max_length:
                raise UserError(f"{folder / module.path / ST_BERT}: max_seq_length {length} is "
                                f"not simtune.json's max_length {spec.max_length}")


def _present(path: Path) -> bool:
    """`path` exists, or is a link to nothing (`read` refuses it): sentence-transformers
    skips a file it cannot open, so a dangling `config_sentence_transformers.json` would
    embed without simtune.json's prompts."""
    return path.exists() or path.is_symlink()


def _check_st_prompts(path: Path, want: dict[str, str]) -> None:
    """`config_sentence_transformers.json` at `path` (when present) holds `want` as its
    prompts, `query` the default when there are any."""
    if not _present(path):
        return
    st = read(path, STConfig)
    if st.prompts != want:
        raise UserError(f"{path}: prompts {echo(st.prompts)} are not simtune.json's "
                        f"{echo(want)}: sentence-transformers would embed with other prompts")
    default = "query" if want else None
    if st.default_prompt_name != default:
        raise UserError(f"{path}: default_prompt_name {echo(st.default_prompt_name)} "
                        f"must be {echo(default)}: plain encode() embeds as a query")


def _check_st_pooling(path: Path, spec: SavedEncoder) -> None:
    """The `Pooling` module's config.json at `path` pools by simtune.json's `pooling` (one
    mode on) and leaves the prompt in or out as its `include_prompt` says."""
    pooling = read(path, STPooling)
    modes = [mode for mode, key in POOLING_KEYS.items() if getattr(pooling, key)]
    if modes != [spec.pooling] or pooling.pooling_mode_mean_sqrt_len_tokens:
        raise UserError(f"{path}: pooling modes {modes or 'none'} are not simtune.json's "
                        f"pooling {echo(spec.pooling)}")
    include = spec.prompts.include_prompt if spec.prompts is not None else True
    if pooling.include_prompt != include:
        raise UserError(f"{path}: include_prompt {pooling.include_prompt} is not simtune.json's "
                        f"{include}")


def head_copies(folder: Path) -> list[str]:
    """Paths (inside export `folder`, sorted) of every file of its head's two copies: `head/`,
    which `load_model` runs, and the `Dense` (and, for a query-side head, `Router`) module folders
    of `modules.json`, which `SentenceTransformer(folder)` runs."""
    folder = Path(folder)
    modules = read(folder / "modules.json", STModules).root if _present(
        folder / "modules.json") else []
    dense = [m.path for m in modules
             if m.type.rsplit(".", 1)[-1] in ("Dense", "Router") and m.path]
    found = set()
    for sub in ("head", *dense):
        root = inside(folder, sub, f"{folder / 'modules.json'}: {sub}")
        found |= {p.relative_to(folder).as_posix() for p in root.rglob("*") if p.is_file()}
    return sorted(found)


def sha256_file(path: Path) -> str:
    """The sha256 of the file at `path`, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_copies(folder: Path, config: ExportConfig) -> None:
    """Every file of the head's two copies in export `folder` (`head_copies`) is the one its
    simtune.json (`config`) records by sha256, and every one it records is there: a copy edited
    after the export (the vectors of `load_model` and of `SentenceTransformer` would part) is
    one `UserError` line naming the file. An export without hashes (older) is not checked."""
    if config.sha256 is None:
        return
    folder = Path(folder)
    config_path = folder / "simtune.json"
    for rel in config.sha256:
        inside(folder, rel, f"{config_path}: sha256")
    for rel in head_copies(folder):
        if rel not in config.sha256:
            raise UserError(f"{folder / rel}: a copy of the head that {config_path} does not "
                            "record (sha256); export again")
    for rel in sorted(config.sha256):
        if not (folder / rel).is_file():
            raise UserError(f"{folder / rel}: missing ({config_path} records it); export again")
    for rel, want in sorted(config.sha256.items()):
        path = folder / rel
        if sha256_file(path) != want:
            raise UserError(f"{path}: changed since the export (its sha256 is not simtune.json's"
                            "): the export's two copies of the head (head/ for simtune, the "
                            "Dense modules for sentence-transformers) may no longer agree; "
                            "export again")


# what simtune runs of a sentence-transformers folder: its transformer, then its own pooling
# and normalisation (the encoder's `pooling` and `normalize`)
ST_RUN = ("Transformer", "Pooling", "Normalize")


def check_st_chain(path: Path, where: str) -> None:
    """A sentence-transformers folder (`modules.json`, no simtune export) whose chain holds a
    module beyond the transformer, pooling and normalisation (a `Dense` projection, ...) gives
    vectors simtune would not compute: refused in one line rather than embedded without it."""
    if not (path / "modules.json").is_file():
        return
    kinds = [m.type.rsplit(".", 1)[-1] for m in read(path / "modules.json", STModules).root]
    other = [k for k in kinds if k not in ST_RUN]
    if other:
        raise UserError(f"{where}: {path} chains {', '.join(other)} after its transformer "
                        "(modules.json), which simtune does not run: its vectors would not be "
                        "the model's (use a folder of Transformer, Pooling and Normalize "
                        "modules, or a simtune export)")
