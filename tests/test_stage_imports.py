"""Issue 51 item 3: a stage loads only the libraries its work uses, so it starts in seconds.

Each check runs in a fresh interpreter (the pytest process has loaded everything already) and
reads `sys.modules` after the real command or import: no timing, the import set itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, write_params

HEAVY = ("torch", "transformers", "pytorch_lightning", "lightning", "pyarrow", "pandas",
         "torch._dynamo", "sympy")  # the last two: 2-3 s that torch imports only on demand
REPORT = (f"import atexit, json, sys; atexit.register(lambda: print(json.dumps(sorted("
          f"m for m in {HEAVY!r} if m in sys.modules))))\n")


def _loaded(code: str, cwd: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", REPORT + code], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _commands(*runs: list[str]) -> str:
    """The stage commands as `python -m stages` runs them, one after the other."""
    return "from stages import app\n" + "".join(
        f"app({args!r}, standalone_mode=False)\n" for args in runs)


def test_check_loads_no_array_or_model_library(tmp_path: Path,
                                               params_raw: dict[str, Any]) -> None:
    write_params(tmp_path / "params.yaml", params_raw)
    got = _loaded(_commands(["check", "--params", "params.yaml", "--out", "checked.json"]),
                  tmp_path)
    assert got == [] and (tmp_path / "checked.json").is_file()


def test_negatives_on_groups_data_loads_no_torch(tmp_path: Path,
                                                 params_raw: dict[str, Any]) -> None:
    """The default data (groups): an empty table, written without torch (before: torch, ~3 s
    of CPU, loaded for nothing)."""
    (tmp_path / "mine.csv").write_text("text,label\n" + "".join(
        f"text number {i},L{i % 3}\n" for i in range(30)))
    params_raw["prepare"].update(source="file")
    params_raw["prepare"]["file"]["path"] = "mine.csv"
    write_params(tmp_path / "params.yaml", params_raw)
    got = _loaded(_commands(
        ["prepare", "--params", "params.yaml", "--out", "prepared", "--report", "prep.json"],
        ["negatives", "--params", "params.yaml", "--prepared", "prepared", "--cache", "cache",
         "--out", "negatives", "--report", "neg.json"]), tmp_path)
    assert "torch" not in got and "transformers" not in got and "pytorch_lightning" not in got
    assert json.loads((tmp_path / "neg.json").read_text())["queries"] == 0


def test_stage_modules_load_no_lightning_or_model_library() -> None:
    """Every command module, and the library modules of the stages other than train: torch
    where the stage computes, never Lightning (train's alone) nor transformers (loaded with a
    model, inside the call that loads one)."""
    modules = [f"stages.{m}" for m in ("check", "prepare", "cache", "negatives", "train",
                                       "evaluate", "export", "search", "encode", "sweep",
                                       "compare")]
    modules += [f"simtune.{s}.stage" for s in ("prepare", "cache", "negatives", "evaluate",
                                               "export")]
    got = _loaded("import importlib\n" + "".join(f"importlib.import_module({m!r})\n"
                                                 for m in modules), ROOT)
    assert "pytorch_lightning" not in got and "lightning" not in got
    assert "transformers" not in got


def test_cache_and_evaluate_of_a_bert_load_no_transformers(tiny_bert: Path, tmp_path: Path,
                                                           params_raw: dict[str, Any]) -> None:
    """The fill and evaluate of a top-layers run on a BERT (the default's shape) run the
    encoder through `simtune.bert`: transformers' 4-6 s import is train's alone."""
    from tests.cache_helpers import encoder_params

    (tmp_path / "mine.csv").write_text("text,label\n" + "".join(
        f"what is thing number {i} of {['city', 'river', 'song'][i % 3]},L{i % 3}\n"
        for i in range(60)))
    params_raw["prepare"].update(source="file")
    params_raw["prepare"]["file"]["path"] = "mine.csv"
    params_raw["encoders"] = encoder_params(tiny_bert)
    params_raw["train"]["mode"] = "top_layers"
    params_raw["train"]["schedule"]["top_layers"].update(layers=1, max_epochs=1)
    write_params(tmp_path / "params.yaml", params_raw)
    common = ["--params", "params.yaml", "--prepared", "data/prepared", "--cache", "cache"]
    filled = _loaded(_commands(
        ["prepare", "--params", "params.yaml", "--out", "data/prepared", "--report", "p.json"],
        ["cache", "--params", "params.yaml", "--prepared", "data/prepared", "--out", "cache",
         "--report", "c.json"]), tmp_path)
    assert "torch" in filled and "transformers" not in filled
    # the encoder is built on the meta device, where an Embedding's normal_ init and an arange
    # run torch's Python reference ops, which import torch._dynamo and sympy (measured 2-3 s)
    assert "torch._dynamo" not in filled and "sympy" not in filled
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    subprocess.run([sys.executable, "-m", "stages", "negatives", *common, "--out", "neg",
                    "--report", "n.json"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    subprocess.run([sys.executable, "-m", "stages", "train", *common, "--out", "head",
                    "--report", "t.json", "--metrics", "tm.json", "--live", "live",
                    "--negatives", "neg", "--checkpoint", "ck"], cwd=tmp_path, env=env,
                   check=True, capture_output=True)
    assert json.loads((tmp_path / "t.json").read_text())["mode"] == "top_layers"
    scored = _loaded(_commands(["evaluate", *common, "--head", "head", "--out", "e.json",
                                "--metrics", "m.json", "--plot", "r.json", "--detail",
                                "d.json", "--run-trained", "rt.trec", "--run-baseline",
                                "rb.trec"]), tmp_path)
    assert "transformers" not in scored and "torch._dynamo" not in scored
    assert "sympy" not in scored
    assert json.loads((tmp_path / "e.json").read_text())["trained"]
