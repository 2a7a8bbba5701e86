"""What a cache directory's `manifest.json` may say, and what its shards' Arrow schemas must be.

A manifest is read through one checked schema (pydantic, strict, as params are): every field has
its type and range (`dim` a positive int or null while a first fill runs, `dtype` float32 or
float16, `rows` the sum of the shards' rows, each shard's file one of our shard names, its sha256
64 hex digits), and the fingerprint is the hash of the description it carries. Then each shard
is checked against the manifest before any row is used (`check_table`): columns and their
types, the embedding width (or a layer-state shard's hidden size) equal to `dim`, the value type
equal to `dtype`, no nulls. Anything else is a damaged cache: a `UserError` naming the file,
which the fill treats as it treats a bad checksum (dropped, then taken from the other copy or
embedded again).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simtune.errors import UserError

SHARD_NAME = re.compile(r"^(shard-[0-9a-f]{12}-r\d{1,5}|part-\d{5})\.arrow$")
_STRICT = ConfigDict(extra="forbid", strict=True)
Count = Annotated[int, Field(ge=0)]


class ShardSchema(BaseModel):
    model_config = _STRICT
    file: str
    rows: Count
    bytes: Count
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]

    @field_validator("file")
    @classmethod
    def _own_name(cls, name: str) -> str:
        if not SHARD_NAME.match(name):  # no path ever leaves the directory
            raise ValueError(f"shard file {name[:80]!r} is not a shard name of this store")
        return name


class ManifestSchema(BaseModel):
    model_config = _STRICT
    format_version: int
    encoder: Annotated[str, Field(min_length=1)]
    fingerprint: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    description: dict[str, Any]
    dtype: Literal["float32", "float16"]
    dim: Annotated[int, Field(ge=1)] | None  # None: a first fill has written no shard yet
    shards: list[ShardSchema]
    rows: Count

    @model_validator(mode="after")
    def _consistent(self) -> ManifestSchema:
        from simtune.encoders import fingerprint

        total = sum(s.rows for s in self.shards)
        if self.rows != total:
            raise ValueError(f"rows is {self.rows}, its shards hold {total}")
        if len({s.file for s in self.shards}) != len(self.shards):
            raise ValueError("a shard file is listed twice")
        if fingerprint(self.description) != self.fingerprint:
            raise ValueError("the fingerprint is not the hash of the description")
        return self


def validate(raw: Any, path: Path) -> ManifestSchema:
    """`raw` (parsed JSON) as a checked manifest; anything else is a one-line `UserError`."""
    try:
        return ManifestSchema.model_validate(raw)
    except ValidationError as e:
        raise UserError(f"{path}: damaged cache manifest ({_first(e)})") from None


def _first(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    where = ".".join(str(x) for x in err["loc"]) or "manifest"
    return f"{where}: {err['msg']}, got {str(err.get('input'))[:80]!r}"


def check_table(path: Path, schema: pa.Schema, dtype: str, dim: int | None) -> None:
    """A shard's Arrow schema against its manifest: vector shards hold `embedding:
    fixed_size_list<dtype>[dim]`, layer-state shards `states: large_list<dtype>` with
    `simtune.hidden` = dim (`dim` None: any width). A mismatch is a `UserError` naming `path`."""
    value = pa.type_for_alias(dtype)
    names = schema.names
    problem = None
    if names[:2] != ["text_id", "text_hash"] or len(names) != 3 or any(
            schema.field(n).type != pa.string() for n in names[:2]):
        problem = f"columns {names[:4]}, expected text_id, text_hash and a vector column"
    elif names[2] == "embedding":
        t = schema.field("embedding").type
        if not isinstance(t, pa.FixedSizeListType) or t.value_type != value:
            problem = f"embedding column of type {t}, the manifest says {dtype}"
        elif dim is not None and t.list_size != dim:
            problem = f"{t.list_size}-d vectors, the manifest says dim {dim}"
    elif names[2] == "states":
        t = schema.field("states").type
        hidden = (schema.metadata or {}).get(b"simtune.hidden", b"")
        if not isinstance(t, pa.LargeListType) or t.value_type != value:
            problem = f"states column of type {t}, the manifest says {dtype}"
        elif dim is not None and hidden != str(dim).encode():
            problem = f"hidden size {hidden.decode(errors='replace')[:20]}, the manifest says " \
                      f"dim {dim}"
    else:
        problem = f"no embedding or states column (columns {names[:4]})"
    if problem:
        raise UserError(f"{path}: damaged cache shard ({problem})")


def check_nulls(path: Path, table: pa.Table) -> None:
    """No null id, hash, vector or vector element (the readers map the values as they are)."""
    for column in table.columns:
        for chunk in column.chunks:
            lists = isinstance(chunk, pa.ListArray | pa.LargeListArray | pa.FixedSizeListArray)
            if chunk.null_count or (lists and chunk.values.null_count):
                raise UserError(f"{path}: damaged cache shard (null values)")
