"""An export's sentence-transformers files, read through checked schemas (`model_files.read`).

`check_st_files`: the module paths of `modules.json` (and of a `Router`'s `router_config.json`)
stay inside the folder, `config_sentence_transformers.json`'s prompts are simtune.json's, and
the `Pooling` and `Transformer` modules pool and truncate as simtune.json says, so
`SentenceTransformer(dir)` embeds as `load_model(dir)` does. `decisive_files` / `check_copies`:
every file that decides how sentence-transformers computes a vector (the head's two copies,
`head/` and the `Dense` modules, `modules.json` and every module's config) is the file the export
recorded by sha256.
`check_st_chain`: a plain sentence-transformers folder as an encoder chains nothing simtune
would not run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import ConfigDict, Field, RootModel, StrictBool, StrictInt

from simtune.errors import UserError, echo
from simtune.model_files import ExportConfig, SavedEncoder, _File, inside, read


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

    prompts: dict[str, str] = Field(default_factory=dict)
    default_prompt_name: str | None = None


class STRouter(_File):
    """A `Router` module's `router_config.json`: module id (its folder inside the router's) ->
    class path, and route -> the module ids it chains."""

    types: dict[str, str]
    structure: dict[str, list[str]]


ST_BERT = "sentence_bert_config.json"
ROUTER_CONFIG = "router_config.json"


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
    flat = _flat(folder, modules)  # a Router's modules too, each path checked inside
    prompts = spec.prompts
    _check_st_prompts(folder / "config_sentence_transformers.json", {} if prompts is None else {
        "query": prompts.query, "document": prompts.document})
    if config.format_version < 3:  # older layouts: their files are not checked further
        return
    for kind, path in flat:
        if kind == "Pooling":
            _check_st_pooling(folder / path / "config.json", spec)
        if kind == "Transformer" and (folder / path / ST_BERT).exists():
            length = read(folder / path / ST_BERT, STBertConfig).max_seq_length
            if length != spec.max_length:
                raise UserError(f"{folder / path / ST_BERT}: max_seq_length {length} is "
                                f"not simtune.json's max_length {spec.max_length}")


def _flat(folder: Path, modules: list[STModule]) -> list[tuple[str, str]]:
    """(class name, path inside `folder`) of every module `modules.json` chains, a `Router`'s
    own modules (its `router_config.json`, each folder checked inside) after the router."""
    out: list[tuple[str, str]] = []
    for module in modules:
        kind = module.type.rsplit(".", 1)[-1]
        out.append((kind, module.path))
        if kind != "Router":
            continue
        config_path = folder / module.path / ROUTER_CONFIG
        for mid, cls in read(config_path, STRouter).types.items():
            rel = f"{module.path}/{mid}" if module.path else mid
            inside(folder, rel, f"{config_path}: {mid}")
            out.append((cls.rsplit(".", 1)[-1], rel))
    return out


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
    which `load_model` runs, and the `Dense` module folders of `modules.json` (a `Router`'s too,
    and its `router_config.json`), which `SentenceTransformer(folder)` runs; never an encoder."""
    folder = Path(folder)
    modules = read(folder / "modules.json", STModules).root if _present(
        folder / "modules.json") else []
    flat = _flat(folder, modules)
    dense = [path for kind, path in flat if kind in ("Dense", "Normalize") and path]
    found = {f"{path}/{ROUTER_CONFIG}" if path else ROUTER_CONFIG
             for kind, path in flat if kind == "Router"}
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


def decisive_files(folder: Path) -> list[str]:
    """Paths (inside export `folder`, sorted) of every file that decides how a vector is
    computed and that simtune and sentence-transformers do not both read: the head's two copies
    (`head_copies`), `modules.json`, `config_sentence_transformers.json` (prompts, and keys
    such as `truncate_dim`), each `Transformer` module's `sentence_bert_config.json` and every
    file of the other module folders (`Pooling`'s config, ...). Not the encoders' own Hugging
    Face files: both read the same ones, so they cannot part the two vectors (and hashing the
    weights would read them whole on every load)."""
    folder = Path(folder)
    found = set(head_copies(folder))
    found |= {name for name in ("modules.json", "config_sentence_transformers.json")
              if _present(folder / name)}
    modules = read(folder / "modules.json", STModules).root if _present(
        folder / "modules.json") else []
    for kind, path in _flat(folder, modules):
        if kind == "Transformer":  # the encoder's folder: only sentence-transformers' file
            rel = f"{path}/{ST_BERT}" if path else ST_BERT
            found |= {rel} if _present(folder / rel) else set()
        elif path and kind != "Router":  # a Router's own file: in `head_copies`
            root = inside(folder, path, f"{folder / 'modules.json'}: {path}")
            found |= {p.relative_to(folder).as_posix() for p in root.rglob("*") if p.is_file()}
    return sorted(found)


def check_copies(folder: Path, config: ExportConfig) -> None:
    """Every file export `folder`'s simtune.json (`config`) records by sha256 is there and
    unchanged, and every file of the head's two copies (`head_copies`) is recorded; an export
    that records the files it wrote (`files`, since issue 44) records every one of
    `decisive_files` too. A file edited after the export (the vectors of `load_model` and of
    `SentenceTransformer` would part) or not recorded is one `UserError` line naming it. An
    export without hashes (older) is not checked."""
    if config.sha256 is None:
        return
    folder = Path(folder)
    config_path = folder / "simtune.json"
    for rel in config.sha256:
        inside(folder, rel, f"{config_path}: sha256")
    head = head_copies(folder)
    for rel in sorted(config.sha256):
        if not (folder / rel).is_file():
            raise UserError(f"{folder / rel}: missing ({config_path} records it); export again")
    for rel, want in sorted(config.sha256.items()):  # before trusting what modules.json says
        path = folder / rel
        if sha256_file(path) == want:
            continue
        if rel in head:
            raise UserError(f"{path}: changed since the export (its sha256 is not simtune.json"
                            "'s): the export's two copies of the head (head/ for simtune, the "
                            "Dense modules for sentence-transformers) may no longer agree; "
                            "export again")
        raise UserError(f"{path}: changed since the export (its sha256 is not simtune.json's): "
                        "sentence-transformers would no longer compute simtune's vectors; "
                        "export again")
    for rel in head:
        if rel not in config.sha256:
            raise UserError(f"{folder / rel}: a copy of the head that {config_path} does not "
                            "record (sha256); export again")
    if config.files is None:  # written before the full record: its head copies only
        return
    for rel in decisive_files(folder):
        if rel not in config.sha256:
            raise UserError(f"{folder / rel}: decides how sentence-transformers computes a "
                            f"vector, but {config_path} does not record it (sha256); export "
                            "again")


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
