"""A small groups data set with 4 labels, cached with the tiny encoder, and train params."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simtune import params as P
from simtune.cache import stage as cache
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import write as write_prepared
from simtune.train.module import SimilarityModule
from tests.cache_helpers import cache_params, encoder_params, sentences
from tests.conftest import repo_params

SCHEDULE_KEYS = ("lr", "batch_size", "max_epochs", "patience", "val_every")


def train_raw(model: Path, data: Path, **train: Any) -> dict[str, Any]:
    """Params of a small groups project on `model` and the CSV `data`: `train` keys set under
    `train` (a schedule key, `SCHEDULE_KEYS`, under `train.schedule.head`)."""
    raw = repo_params()
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"]["path"] = str(data)
    raw["prepare"]["split"]["fractions"] = {"train": 0.5, "val": 0.25, "test": 0.25}
    raw["encoders"] = encoder_params(model)
    raw["cache"] = cache_params()
    # the head's schedule: lr, batch_size, max_epochs, patience, val_every (keyword arguments)
    schedule = {k: train.pop(k) for k in list(train) if k in SCHEDULE_KEYS}
    raw["train"]["schedule"]["head"].update({"batch_size": 8, "max_epochs": 3, "patience": 2,
                                             "lr": 0.01, **schedule})
    raw["train"].update(train)
    raw["train"]["head"]["dropout"] = 0.0
    return raw


def set_schedule(raw: dict[str, Any], mode: str, lora: dict[str, Any] | None = None,
                 **values: Any) -> dict[str, Any]:
    """`raw` with `values` set in `train.schedule.<mode>` (e.g. `layers=1, lr=0.001` for
    top_layers) and `lora`'s keys in `train.lora`; `train.mode` itself is left as it is.
    Returns `raw` (changed in place)."""
    raw["train"]["schedule"][mode].update(values)
    if lora is not None:
        raw["train"]["lora"].update(lora)
    return raw


def project(root: Path, model: Path, n: int = 80, rows: list[tuple[str, str]] | None = None,
            **train: Any) -> tuple[dict[str, Any], Path]:
    """Write data (`rows` (text, label), else `n` sentences in 4 labels), prepare it, fill the
    cache; returns (raw params, params file)."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data.jsonl"
    rows = rows or [(t, f"L{i % 4}") for i, t in enumerate(sentences(n))]
    data.write_text("".join(json.dumps({"text": t, "label": label}) + "\n"
                            for t, label in rows))
    raw = train_raw(model, data, **train)
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache)
    params_file = root / "params.yaml"
    import yaml

    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw, params_file


def stage_args(root: Path, params_file: Path, tag: str = "") -> list[str]:
    return ["train", "--params", str(params_file), "--prepared", str(root / "prepared"),
            "--cache", str(root / "cache"), "--out", str(root / f"head{tag}"),
            "--report", str(root / f"train{tag}.json"),
            "--metrics", str(root / f"train_metrics{tag}.json"), "--live", str(root / f"live{tag}"),
            "--checkpoint", str(root / f"checkpoints{tag}")]  # not the repository's


def train_top_layers(root: Path, raw: dict[str, Any], params_file: Path) -> P.Params:
    """Write `raw` (a top_layers project's params, `project`) to `params_file`, fill its layer
    cache and run the train stage's command on it (exit 0 asserted); returns the params."""
    import yaml
    from typer.testing import CliRunner

    from simtune.cache.views import layer_for
    from stages import app

    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.validate(raw)
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    result = CliRunner().invoke(app, stage_args(root, params_file))
    assert result.exit_code == 0, result.output
    return p


def dropout_free(model: Path, out: Path) -> Path:
    """A copy of the model directory `model` with every dropout off (a deterministic forward:
    GradCache's chunked forward and the plain batch forward then see the same function)."""
    import shutil

    shutil.copytree(model, out)
    config = json.loads((out / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(config))
    return out


def step_gradients(root: Path, params_file: Path, monkeypatch: Any
                   ) -> dict[str, list[dict[str, Any]]]:
    """Train (in-process) with and without GradCache (chunks of 3) and return each run's
    gradients at every optimizer step as the optimizer sees them (unscaled under fp16)."""
    import torch
    import yaml

    from simtune.train import stage as train

    steps: dict[str, list[dict[str, Any]]] = {"plain": [], "gc": []}

    def record(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        steps[tag].append({n: p.grad.float().clone() for n, p in module.named_parameters()
                           if p.grad is not None})

    monkeypatch.setattr(SimilarityModule, "on_before_optimizer_step", record)
    for tag, chunk in (("plain", 0), ("gc", 3)):  # `record` reads `tag`
        raw = yaml.safe_load(params_file.read_text())
        raw["train"]["gradcache"]["chunk_size"] = chunk
        params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
        train.run(P.load(params_file), root / "prepared", root / "cache", root / tag,
                  root / f"{tag}.json", None)
    return steps


def relative_errors(got: dict[str, Any], want: dict[str, Any]) -> list[tuple[str, float]]:
    """Per parameter |got - want| / |want|, worst first; |want| at least 1e-3 of the largest
    parameter's gradient norm (an attention key bias has an exactly zero gradient: softmax
    ignores a per-query constant, so its computed gradient is rounding noise)."""
    assert got.keys() == want.keys() and want
    floor = 1e-3 * max(float(w.norm()) for w in want.values())
    errs = {n: float((got[n] - w).norm()) / max(float(w.norm()), floor)
            for n, w in want.items()}
    return sorted(errs.items(), key=lambda e: -e[1])


def train_in_two_processes(root: Path, params_file: Path, raw: dict[str, Any], tag: str = "two"
                           ) -> Any:
    """Run the train stage of `raw` (written to `params_file`) as 2 gloo DDP processes, batch 8
    each, GradCache chunks of 3, in a real process (what DVC runs); returns the finished process."""
    import os
    import subprocess
    import sys

    import yaml

    from tests.conftest import ROOT

    raw["train"]["schedule"][raw["train"]["mode"]]["batch_size"] = 8
    raw["train"].update(devices=2, strategy="ddp", accelerator="cpu")
    raw["train"]["gradcache"]["chunk_size"] = 3
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    return subprocess.run([sys.executable, "-m", "stages", *stage_args(root, params_file, tag)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def trained_by_one_and_two_processes(root: Path, params_file: Path) -> tuple[Path, Path]:
    """The train stage of `params_file` in this process (`root/headone`, its batch size as
    written), then as 2 DDP processes of half the batch with GradCache (`root/headtwo`,
    `train_in_two_processes`); both must finish. Returns the two head folders."""
    import yaml
    from typer.testing import CliRunner

    from stages import app

    raw = yaml.safe_load(params_file.read_text())
    # the trained weights are compared (a kept epoch 0 would leave both at the start)
    raw["train"]["frozen_candidate"] = False
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(app, stage_args(root, params_file, "one"))
    assert result.exit_code == 0, result.output
    proc = train_in_two_processes(root, params_file, raw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "headone", root / "headtwo"


def trained_evaluated_exported(root: Path, params_file: Path) -> dict[str, Any]:
    """The train and evaluate stages (`root`'s prepared data and cache, `params_file`), then the
    export of the head (`root/export`); returns root, the params, the examples over the cache
    (`data`), the train and test texts in split order and evaluate's report."""
    import yaml
    from typer.testing import CliRunner

    from simtune.cache.views import open_pair
    from simtune.examples import load as load_examples
    from simtune.export.model_card import CardInputs
    from simtune.export.stage import export
    from simtune.prepare.prepared import load as load_prepared
    from stages import app

    runner = CliRunner()
    out = runner.invoke(app, stage_args(root, params_file))
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, [
        "evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
        "--cache", str(root / "cache"), "--head", str(root / "head"),
        "--out", str(root / "metrics.json"), "--metrics", str(root / "headline.json"),
        "--plot", str(root / "recall.json"), "--detail", str(root / "detail.json")])
    assert out.exit_code == 0, out.output
    p = P.validate(yaml.safe_load(params_file.read_text()))
    export(root / "head", root / "export", CardInputs(params=p))
    prepared = load_prepared(root / "prepared")
    q_table, d_table = open_pair(root / "cache", p.encoders, p.cache, prepared.kind,
                                 placed=False)
    data = load_examples(prepared.kind, prepared.examples, q_table, d_table)
    texts = prepared.text_map()
    split_texts = {s: [texts[data.row_ids["query"][r]] for r in
                       data.splits[s].tensors["rows"].tolist()] for s in ("train", "test")}
    return {"root": root, "p": p, "data": data, "texts": split_texts,
            "report": json.loads((root / "metrics.json").read_text())}
