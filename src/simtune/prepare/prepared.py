"""The prepared data: the format the prepare stage writes and every later stage reads.

Outputs (a directory, written atomically):

- `texts.parquet`    — `text_id` (string), `text` (string): every distinct text once.
- `examples.parquet` — groups: `split`, `text_id`, `label` (split `unlabelled`: a texts file's
                       rows, label null, `prepare.file.kind: texts`);
                       pairs:  `split`, `query_id`, `doc_id`, `score` (float32). A BEIR folder
                       adds one `corpus` row (null query and score) per unjudged document.
- `meta.json`        — `{"kind": "groups" | "pairs", "format_version": 1}` (+ `"unlabelled": n`).
- `labels.json`      — groups: examples of each label in each split (pairs: `{}`).

`text_id` is the blake2b-128 hash of the normalised text, so equal texts share one id across splits
and runs (the cache embeds each once) — or, with `prepare.file.columns.key`, the user's own id; for
a BEIR folder `q:<_id>` / `d:<_id>`, with the original `_id` in the texts' `source_id` column.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from simtune.atomic import atomic_dir, read_meta, write_json
from simtune.errors import UserError

FORMAT_VERSION = 1
UNLABELLED = "unlabelled"  # the split of a texts file's rows (groups data, no label)
CORPUS = "corpus"  # the split of pairs rows that only put a document in the corpus (BEIR)



def normalize(text: str) -> str:
    """Unicode NFC, whitespace runs collapsed to one space, stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())



def fold(text: str) -> str:
    """The comparison key of a text, for every kind of data: Unicode NFKC (fullwidth and
    compatibility forms as their plain letters), format characters (zero-width spaces and
    joiners, byte order marks: category Cf) removed, case-folded, whitespace runs as one space.

    Two texts with one key are one text (an uncased tokenizer gives them the same ids): prepare
    keeps the first and counts the others as repeats. A text whose key is empty (nothing but
    whitespace, zero-width characters or byte order marks) is an empty text: the encoder would
    see `[CLS][SEP]` alone."""
    plain = "".join(c for c in unicodedata.normalize("NFKC", text)
                    if unicodedata.category(c) != "Cf")
    return " ".join(plain.casefold().split())



def text_id(text: str) -> str:
    """Stable content id of an already normalised text: blake2b-128, hex."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()



@dataclass
class Prepared:
    """The prepared data set: `kind`, the texts and examples tables, and the counts report."""

    kind: str
    texts: pa.Table
    examples: pa.Table
    report: dict[str, Any]
    unlabelled: int = 0  # groups: examples of split `unlabelled` (a texts file's, no label)

    def text_map(self, ids: pa.Array | None = None) -> dict[str, str]:
        """text_id -> text of every text (or only of `ids`), in the texts table's order."""
        t = self.texts
        if ids is not None:
            t = t.filter(pc.is_in(t.column("text_id"), value_set=ids))
        return dict(zip(t.column("text_id").to_pylist(), t.column("text").to_pylist(),
                        strict=True))



def write(prepared: Prepared, out: Path, report_path: Path) -> None:
    """Write the tables to `out` and the counts to `report_path`, each atomically."""
    with atomic_dir(Path(out)) as tmp:
        pq.write_table(prepared.texts, tmp / "texts.parquet")
        pq.write_table(prepared.examples, tmp / "examples.parquet")
        meta: dict[str, Any] = {"kind": prepared.kind, "format_version": FORMAT_VERSION}
        if prepared.unlabelled:
            meta["unlabelled"] = prepared.unlabelled
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        # per-label counts are data, not metrics: in the report they would make `dvc exp show`
        # one column per label and split
        report = dict(prepared.report)
        write_json(tmp / "labels.json", report.pop("per_label", {}))
        write_json(report_path, report)



# the columns of examples.parquet each kind needs
_COLUMNS = {"groups": ("split", "text_id", "label"), "pairs": ("split", "query_id", "doc_id")}


def kind(out: Path) -> str:
    """The data kind of a prepared directory (groups | pairs), from its `meta.json` alone; a
    missing or other `kind` is one line naming the file."""
    meta = read_meta(Path(out), FORMAT_VERSION, "prepare", "prepared data")
    value = meta.get("kind")
    if not isinstance(value, str) or value not in _COLUMNS:
        raise UserError(f"{Path(out) / 'meta.json'}: kind {json.dumps(value)}, expected "
                        "\"groups\" or \"pairs\"; run the prepare stage again")
    return str(value)


def unlabelled(out: Path) -> int:
    """How many examples of a prepared directory are unlabelled texts (split `unlabelled`: a
    `prepare.file.kind: texts` file joined to a labelled data set), from its `meta.json`."""
    value = read_meta(Path(out), FORMAT_VERSION, "prepare", "prepared data").get("unlabelled", 0)
    return int(value) if isinstance(value, int) else 0


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """The table of one Parquet file (`columns` of it when given). `pq.read_table` reads
    through pyarrow's dataset layer, whose first use imports pandas: 0.5 s of every stage's
    start-up, for one file."""
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns)


def load(out: Path) -> Prepared:
    """Read a prepared directory back (for the later stages); the report is not re-read. A
    `kind` that the examples' columns do not fit is one line naming the directory."""
    out = Path(out)
    data_kind = kind(out)
    for name in ("texts.parquet", "examples.parquet"):
        if not (out / name).is_file():
            raise UserError(f"{out}: no {name} (a partial copy of prepared data?); run the "
                            "prepare stage again")
    texts = read_parquet(out / "texts.parquet")
    examples = read_parquet(out / "examples.parquet")
    missing = [c for c in _COLUMNS[data_kind] if c not in examples.column_names]
    if missing:
        raise UserError(f"{out}: meta.json says {data_kind} data but examples.parquet lacks "
                        f"{', '.join(missing)}; run the prepare stage again")
    return Prepared(data_kind, texts, examples, {}, unlabelled(out))
