"""`bench/distill.py` runs end to end at a tiny size (`make bench` runs it with all-mpnet-base-v2
as the teacher and the peer): a MiniLM teacher fine-tuned and exported, a distilled head on the
TREC texts and again with news titles as unlabelled texts, their encode speeds and the verdicts.
The peer's row (sentence-transformers' MSE recipe) runs too, at one learning rate: `make test`
installs `datasets`, its trainer's need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration  # the real MiniLM, the real stages


def test_the_distill_bench_runs_tiny(tmp_path: Path) -> None:
    out = tmp_path / "distill.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
           "HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1", "TMPDIR": str(tmp_path),
           "SIMTUNE_BENCH_INLINE": "1"}  # its rows in the bench's process: the imports once
    proc = subprocess.run([sys.executable, "-m", "bench.distill", "--teacher", "minilm",
                           "--trec", "150", "--epochs", "1", "--rows", "head,extra,st",
                           "--losses", "mse", "--peer-lrs", "1e-4", "--news", "20",
                           "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["complete"]
    rows = {r["row"]: r for r in got["results"]}
    assert sorted(rows) == ["head-mse", "head-mse-extra", "st", "teacher"]
    assert rows["st"]["baseline"] == rows["head-mse"]["baseline"]  # the same task, the peer
    # every student row is scored against the same frozen MiniLM on the same test task
    assert rows["head-mse"]["baseline"] == rows["head-mse-extra"]["baseline"]
    assert rows["teacher"]["encode_per_s"] > 0 and rows["head-mse"]["encode_per_s"] > 0
    assert [r["measure"].split(" (")[0] for r in got["rows"]] == [
        "distilled MiniLM", "encode texts/s, exported student vs exported teacher",
        "train s to the peer's P@1"]  # the peer's row adds its time-to-quality
    frozen, teacher = rows["head-mse"]["baseline"]["p@1"], rows["teacher"]["test"]["p@1"]
    share = (rows["head-mse"]["test"]["p@1"] - frozen) / (teacher - frozen)
    assert got["rows"][0]["ratio"] == f"{share:.2f} of the lift"
    table = got["table"].splitlines()
    # header, rule, the frozen encoder and one line per result (the peer's included)
    assert table[0].split("|")[1].strip() == "row" and len(table) == 2 + 1 + len(rows)
