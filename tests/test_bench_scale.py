"""`bench/scale.py` runs end to end at a tiny size (`make bench` runs it at real ones): one copy
of the layer states on disk in this layout, three float32 ones in the layout before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration  # the real MiniLM, real DVC


def test_the_scale_bench_runs_tiny(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
           "HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "--sizes", "40x16",
                           "--fill-texts", "16", "--steps", "1", "--old-fill", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    new, old = json.loads(out.read_text())["scale_rows"]
    assert new["layer cache x one 16-bit copy"] <= 1.1
    assert old["layer cache x one 16-bit copy"] == pytest.approx(6.0, rel=0.05)
    assert new["steps/s"] > 0 and new["read peak RSS GB"] > 0 and new["fill vs head"] > 0
