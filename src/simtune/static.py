"""A static embedding model: a token table, mean-pooled, L2-normalised (`train.mode: static`).

The folder is sentence-transformers' own layout, so plain `SentenceTransformer(folder)` loads it
(no model2vec, no remote code):

- `modules.json`: `0_StaticEmbedding` (`sentence_transformers...StaticEmbedding`), then
  `1_Normalize`; `config_sentence_transformers.json` (cosine similarity, no prompts).
- `0_StaticEmbedding/model.safetensors` (`embedding.weight`, (V, D) float32) and
  `0_StaticEmbedding/tokenizer.json` (a `tokenizers` tokenizer: no padding, no truncation).
- `simtune.json`: `{"format_version": 3, "kind": "static", "table": "0_StaticEmbedding",
  "normalize_output": true, "teacher", "sha256": {path: sha256}}`: the table's two files are
  hashed and checked on every load, like an export's head copies.

A text's vector is computed exactly as `StaticEmbedding` does: its tokens without special
tokens (`encode_batch(..., add_special_tokens=False)`), the mean of their rows
(`embedding_bag(..., mode="mean")`; a text without tokens: zeros), then `Normalize`
(`F.normalize(dim=1)`), so simtune's vectors and sentence-transformers' agree to float rounding.
The same folder is the train stage's output (`models/head`) and the export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, StrictBool, StrictInt

from simtune import atomic, model_files
from simtune.errors import UserError
from simtune.model_files import _File
from simtune.progress import Progress

TABLE = "0_StaticEmbedding"
NORMALIZE = "1_Normalize"
ST_CLASS = "sentence_transformers.sentence_transformer.modules.StaticEmbedding"
NORMALIZE_CLASS = "sentence_transformers.sentence_transformer.modules.Normalize"
TABLE_FILES = (f"{TABLE}/model.safetensors", f"{TABLE}/tokenizer.json")


class StaticConfig(_File):
    """A static model folder's `simtune.json` (module docstring)."""

    format_version: StrictInt = Field(ge=3)
    kind: Literal["static"]
    table: str
    normalize_output: StrictBool = True
    teacher: str | None = None
    sha256: dict[str, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]]
    # every path the folder holds as written (folders end in "/"): a re-export replaces these
    # and nothing else (`simtune.export.destination`); folders written before it have none
    files: list[str] | None = None


def is_static(directory: Path) -> bool:
    """Whether `directory`'s simtune.json says `kind: static` (a damaged file: False, and the
    ordinary reader names what is wrong with it)."""
    path = Path(directory) / "simtune.json"
    try:
        raw = json.loads(path.read_bytes()) if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("kind") == "static"


class StaticEncoder:
    """texts -> (N, D) float32 mean token rows (unnormalised: `Model` normalises, as the
    folder's `Normalize` module does). Offers what `simtune.model.Model` uses of an encoder:
    `as_role`, `encode`, `device`, `dim`, `name`. A static model has no prompts: both roles
    embed alike."""

    def __init__(self, tokenizer: object, weight: torch.Tensor, name: str = "static") -> None:
        from tokenizers import Tokenizer

        if not isinstance(tokenizer, Tokenizer):
            raise TypeError("a static encoder needs a `tokenizers.Tokenizer`")
        tokenizer.no_padding()
        tokenizer.no_truncation()  # the mean is over every token, as StaticEmbedding takes it
        self.tokenizer, self.weight, self.name = tokenizer, weight.float().contiguous(), name
        self.device, self.dim = torch.device("cpu"), int(weight.shape[1])

    def as_role(self, role: str) -> StaticEncoder:
        return self

    def token_ids(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat token ids (T,), offsets (N,)): StaticEmbedding's own `preprocess`."""
        enc = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        lengths = torch.tensor([0] + [len(e.ids) for e in enc[:-1]], dtype=torch.long)
        ids = torch.tensor([i for e in enc for i in e.ids], dtype=torch.long)
        return ids, torch.cumsum(lengths, 0)

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int = 1024, progress: bool = False
               ) -> torch.Tensor:
        """(N, D) float32 mean rows, in the order of `texts`; `progress`: a bar or log lines."""
        out = torch.empty(len(texts), self.dim)
        step = max(1, batch_size)
        with Progress(len(texts), f"{self.name}: encode", enabled=progress) as bar:
            for i in range(0, len(texts), step):
                ids, offsets = self.token_ids(texts[i : i + step])
                out[i : i + len(offsets)] = F.embedding_bag(ids, self.weight, offsets,
                                                            mode="mean")
                bar.update(len(offsets))
        return out


def write(dest: Path, tokenizer: object, weight: torch.Tensor, teacher: str | None,
          extra: dict[str, bytes] | None = None) -> None:
    """Write the static model folder `dest` atomically (module docstring): the table `weight`
    (V, D) for `tokenizer`, `teacher` named in simtune.json; `extra` (name -> bytes): more
    files at the top (an export's model card)."""
    from safetensors.torch import save_file

    with atomic.atomic_dir(Path(dest)) as tmp:
        (tmp / TABLE).mkdir()
        (tmp / NORMALIZE).mkdir()
        save_file({"embedding.weight": weight.detach().float().cpu().contiguous()},
                  str(tmp / TABLE / "model.safetensors"))
        tokenizer.no_padding()  # type: ignore[attr-defined]
        tokenizer.no_truncation()  # type: ignore[attr-defined]
        tokenizer.save(str(tmp / TABLE / "tokenizer.json"))  # type: ignore[attr-defined]
        modules = [{"idx": 0, "name": "0", "path": TABLE, "type": ST_CLASS},
                   {"idx": 1, "name": "1", "path": NORMALIZE, "type": NORMALIZE_CLASS}]
        atomic.write_json(tmp / "modules.json", modules)
        atomic.write_json(tmp / "config_sentence_transformers.json", {
            "model_type": "SentenceTransformer", "prompts": {"query": "", "document": ""},
            "default_prompt_name": None, "similarity_fn_name": "cosine"})
        for name, data in (extra or {}).items():
            atomic.write_bytes(tmp / name, data)
        from simtune.st_files import sha256_file

        atomic.write_json(tmp / "simtune.json", {
            "format_version": 3, "kind": "static", "table": TABLE, "normalize_output": True,
            "teacher": teacher, "sha256": {f: sha256_file(tmp / f) for f in TABLE_FILES},
            "files": model_files.written(tmp, "simtune.json")})


def load(directory: Path) -> tuple[StaticEncoder, StaticConfig]:
    """The static model folder `directory` (module docstring) as an encoder and its config;
    `UserError` (one line) for a path outside the folder, a missing or changed table file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from simtune.st_files import sha256_file

    directory = Path(directory)
    config_path = directory / "simtune.json"
    config = model_files.read(config_path, StaticConfig)
    table = model_files.inside(directory, config.table, f"{config_path}: table")
    model_files.contained(directory)
    for rel in TABLE_FILES:
        path = directory / rel
        if not path.is_file():
            raise UserError(f"{path}: missing (the static table; export again)")
        if config.sha256.get(rel) != sha256_file(path):
            raise UserError(f"{path}: changed since it was written (its sha256 is not "
                            f"{config_path}'s); export again")
    try:
        weight = load_file(str(table / "model.safetensors"))["embedding.weight"]
        tokenizer = Tokenizer.from_file(str(table / "tokenizer.json"))
    except (SafetensorError, KeyError, Exception) as e:  # tokenizers raises plain Exception
        raise UserError(f"{table}: not a readable static table ({type(e).__name__})") from None
    if weight.ndim != 2 or weight.shape[0] != tokenizer.get_vocab_size():
        raise UserError(f"{table}: the table has {tuple(weight.shape)} rows, the tokenizer "
                        f"{tokenizer.get_vocab_size()} tokens")
    return StaticEncoder(tokenizer, weight, directory.name or "static"), config


def _line_text(texts: Path, number: int, line: bytes) -> str:
    """Line `number` (1-based) of `texts` decoded; not UTF-8: one line naming the line and
    the byte within it (1-based), not the offset in a decoder's chunk."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{texts}: not UTF-8 text (line {number}, byte {e.start + 1} of the "
                        "line)") from None


def encode_file(model: object, texts: Path, out: Path, batch_size: int = 4096,
                progress: bool = True, role: str = "query") -> int:
    """Embed every line of the UTF-8 file `texts` (one text a line) with `model` (anything
    with `encode(texts, batch_size, role, progress) -> (n, D)` and `encode_corpus` (same
    arguments): `load_model`'s `Model`) into the float32 .npy `out`, row i = line i, as
    `role`'s texts (`query`: `encode`; `document`: `encode_corpus`, the document prompt, and
    a query-side head's frozen documents); returns the number of rows. Streams: the lines are
    counted, the .npy header written, then `batch_size` lines at a time are read, embedded and
    appended (plain writes, not a memory map, whose dirty pages would count against the
    process until flushed), so memory stays one batch whatever the file's size; `out` appears
    only when complete (a temp file, then renamed). 1M short texts on a static model: the
    benchmarks page gives the peak (bench/static.py's `--file-lines`).

        from simtune.model import load_model
        from simtune.static import encode_file
        encode_file(load_model("models/export"), Path("docs.txt"), Path("docs.npy"))
    """
    import os

    import numpy as np

    from simtune.atomic import new_temp

    texts, out = Path(texts), Path(out)
    if role not in ("query", "document"):
        raise UserError(f"role: '{role}' is not a role (query or document)")
    embed = model.encode if role == "query" else model.encode_corpus  # type: ignore[attr-defined]
    if not texts.is_file():
        raise UserError(f"{texts}: no such file of texts (one text a line)")
    with texts.open("rb") as f:
        n = sum(1 for _ in f)
    dim = int(embed(["dim"], 1, role).shape[1])
    try:  # new_temp removes the `.NAME.tmp-*.npy` a kill -9 left; this one gets the umask's mode
        fd, tmp = new_temp(out, ".npy")
    except OSError as e:  # the user's path, not the temp file's name they never gave
        reason = (e.strerror or str(e)).removeprefix("cannot write: ")  # new_temp's own words
        raise UserError(f"{out}: cannot write there ({reason})") from None
    try:
        with os.fdopen(fd, "wb", closefd=False) as sink, texts.open("rb") as f, \
                Progress(n, f"encode {texts.name}", enabled=progress) as bar:
            np.lib.format.write_array_header_1_0(sink, {"descr": "<f4", "fortran_order": False,
                                                        "shape": (n, dim)})
            rows, batch = 0, []

            def flush() -> None:
                got = embed(batch, batch_size, role)
                sink.write(np.ascontiguousarray(got.numpy(), dtype="<f4").tobytes())
                bar.update(len(batch))

            for number, line in enumerate(f, 1):
                # lines end at "\n" alone, as they were counted (a lone "\r" is text)
                batch.append(_line_text(texts, number, line.removesuffix(b"\n")
                                        .removesuffix(b"\r")))
                if len(batch) == batch_size:
                    flush()
                    rows, batch = rows + len(batch), []
            if batch:
                flush()
                rows += len(batch)
        if rows != n:  # the file changed between the count and the read
            raise UserError(f"{texts}: changed while it was read ({n} lines, then {rows})")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        os.close(fd)  # the temp's flock, held to the rename
    return n
