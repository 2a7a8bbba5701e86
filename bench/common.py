"""Shared bits of the benchmarks: machine description, timing, RSS, writing results."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.report import table  # noqa: F401  (the benchmarks print their tables with it)

HERE = Path(__file__).resolve().parent


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"
    return f"{os.cpu_count()} CPU cores ({cpu}), torch {torch.__version__}{gpu}"


def copy_project(dest: Path) -> None:
    """The checkout's files (tracked and untracked-but-not-ignored) into `dest`, less the
    pipeline's outputs: a fresh copy of the project to run a bench's pipeline in."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=HERE.parent,
                           check=True, capture_output=True, text=True).stdout.split()
    for rel in files:
        src = HERE.parent / rel
        if src.is_file() and not rel.startswith(("models/", "reports/", "cache/", "data/prepared",
                                                 "dvc.lock")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Smallest wall time of `repeats` calls (the least disturbed run) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_anon_mb() -> float:
    """Anonymous resident memory (MB): leaves out file pages, e.g. of a memory-mapped input."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakAnon:
    """Peak of `rss_anon_mb` while the block runs, sampled every `every` s by a thread."""

    def __init__(self, every: float = 0.01) -> None:
        self.every, self.base, self.peak = every, 0.0, 0.0
        self._stop = threading.Event()

    def __enter__(self) -> PeakAnon:
        self.base = self.peak = rss_anon_mb()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, rss_anon_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon_mb())

    @property
    def growth(self) -> float:
        return self.peak - self.base


# a folder for the results files instead of bench/ (the smoke tests: never the measured ones)
OUT_ENV = "SIMTUNE_BENCH_OUT"


def run_under(root: Path = HERE.parent) -> dict[str, Any]:
    """What a bench ran under: the commit (and whether the tree differed from it) and every value
    of params.yaml, flattened to dotted keys. The docs check a quoted bench's `params` against
    today's (tests/test_figures.py, bench.report.settings_changed)."""
    from bench.report import flat
    from simtune import params as P  # the checked reader: a key given twice is refused

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/*.json")
    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(dirty),
            "params": flat(P.read_yaml(root / "params.yaml"))}


def write_results(name: str, payload: dict[str, Any], path: Path | str | None = None) -> Path:
    """Write `payload` to bench/<name>.json (or to `$SIMTUNE_BENCH_OUT`/<name>.json, or to
    `path`: a bench's `--out`), with `run_under`: the commit and the params.yaml values it ran
    under (see `run_under`), so a file merged from `--out` runs still says what it ran under."""
    path = Path(path) if path else Path(os.environ.get(OUT_ENV) or HERE) / f"{name}.json"
    path.write_text(json.dumps({**payload, "run_under": run_under()}, indent=2) + "\n")
    return path
