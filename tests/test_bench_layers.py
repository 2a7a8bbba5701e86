"""`bench/layers.py` runs end to end at a tiny size (`make bench` runs it at real ones): the
peer trains once per learning rate, the one compared against is the best by validation P@1,
and every row carries its test P@1 interval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.layers import lr_text, wilson
from tests.conftest import ROOT

pytestmark = pytest.mark.integration  # the real MiniLM and sentence-transformers' trainer


def test_the_layers_bench_runs_tiny(tmp_path: Path) -> None:
    import datasets  # noqa: F401  (the peer's trainer: `make test` installs it, no skip)
    out = tmp_path / "layers.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
           "HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1", "TMPDIR": str(tmp_path),
           "SIMTUNE_BENCH_INLINE": "1"}  # its rows in the bench's process: the imports once
    proc = subprocess.run([sys.executable, "-m", "bench.layers", "--encoders", "minilm",
                           "--sets", "trec", "--trec", "160", "--rows", "head,top1,st",
                           "--peer-lrs", "5e-5,2e-4", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["complete"]
    rows = {r["row"]: r for r in res["results"]}
    peers = [r for k, r in rows.items() if k.startswith("st")]
    assert sorted(r["lr"] for r in peers) == [5e-5, 2e-4]
    assert all(r["warmup"] == 0.1 for r in peers)
    best = rows["st"]  # chosen on validation, whatever the test says
    assert best["val"]["p@1"] == max(r["val"]["p@1"] for r in peers)
    other = next(r for r in peers if r is not best)
    assert set(rows) == {"head", "top1", "st", f"st@{other['lr']:g}"}
    n_test = res["results"][0]["examples"]["test"]
    assert all(len(r["test_hits"]) == n_test for r in rows.values())
    assert rows["top1"]["test"]["p@1"] == pytest.approx(sum(rows["top1"]["test_hits"]) / n_test)
    assert "95 % CI" in res["table"] and "- peer's P@1 (95 % CI)" in res["table"]
    assert f"lr {lr_text(best['lr'])} (best val of 5e-5, 2e-4)" in res["rows"][0]["peer name"]


def test_learning_rates_as_written() -> None:
    assert [lr_text(x) for x in (5e-5, 1e-4, 2e-4, 3.5e-5)] == ["5e-5", "1e-4", "2e-4", "3.5e-05"]


def test_wilson_interval() -> None:
    lo, hi = wilson([1] * 180 + [0] * 29)  # P@1 0.861 over 209 queries: about +-0.05
    assert lo == pytest.approx(0.808, abs=0.002) and hi == pytest.approx(0.901, abs=0.002)
    assert wilson([]) == (0.0, 0.0)
