"""The JSON files of a trained head or an export folder, each read through one checked schema.

A head folder (`models/head`, written by `train`) holds `config.json` (the head: `HeadConfig`)
and `training.json` (how it was trained: `TrainingMeta`); an export folder (`simtune export`)
holds `simtune.json` (`ExportConfig`). Every reader of these files — `heads.load`,
`model.load_model`, export, evaluate — goes through `read`, so a damaged file (not JSON, a list
instead of an object, a wrong type or value, nesting thousands deep) is one `UserError` line
naming the file and the key, never a traceback or a silently wrong model.

Paths written in these files are relative to their folder and must stay inside it (`inside`):
a folder never makes simtune read files from elsewhere, through a path or a symbolic link
(`contained`). An export's sentence-transformers files are checked by `simtune.st_files`.
"""

from __future__ import annotations

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
    # why this mode ran (`train.mode: auto`'s estimate, or the mode set); heads before: None
    mode_reason: str | None = None
    # `lr: auto`: the rate the probe chose and why (`simtune.train.probe`); else none
    lr_reason: str | None = None
    # the step floor (`simtune.train.run_steps`): the passes it added and why; else none
    steps_reason: str | None = None
    # "frozen": no trained epoch beat epoch 0, the untouched encoder (the head saved at
    # identity; in top_layers and full modes no encoder/ is saved: the frozen one serves it)
    selected: Literal["trained", "frozen"] | None = None


class ExportConfig(_File):
    """An export folder's `simtune.json` (see `simtune.model`); versions 1-3."""

    format_version: StrictInt = Field(ge=1)
    encoder_name: str | None = None  # version 1: none
    encoder: SavedEncoder
    head: str
    normalize_output: StrictBool = False
    sentence_transformers: Literal["plain", "trust_remote_code"] | None = None
    # path inside the folder -> sha256 of every file that decides how sentence-transformers
    # computes a vector (`st_files.decisive_files`: the head's two copies, modules.json, the
    # module configs); exports before `files` hashed the head's copies only, older ones nothing
    sha256: dict[str, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] | None = None
    # every path the export wrote (folders end in "/"), sorted: a re-export replaces these and
    # nothing else (`simtune.export.destination`); exports written before it have none
    files: list[str] | None = None
    head_side: Literal["both", "query"] = "both"  # query: documents keep the frozen vectors
    # why this mode ran (`train.mode: auto`'s estimate, or the mode set); heads before: None
    mode_reason: str | None = None
    # a query tower's export: the frozen encoder documents are embedded with (a folder inside)
    document_encoder: str | None = None


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


def written(root: Path, *more: str) -> list[str]:
    """Every path under `root` (relative, posix; folders end in "/") and `more`, sorted: what
    an export's simtune.json records as `files`, all that a later export may replace
    (`simtune.export.destination`)."""
    paths = [p.relative_to(root).as_posix() + ("/" if p.is_dir() else "")
             for p in Path(root).rglob("*")]
    return sorted({*paths, *more})
