"""A small groups data set with 4 labels, cached with the tiny encoder, and train params."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simtune import cache, prepare
from simtune import params as P
from tests.cache_helpers import cache_params, encoder_params, sentences
from tests.conftest import repo_params


def train_raw(model: Path, data: Path, **train: Any) -> dict[str, Any]:
    raw = repo_params()
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"]["path"] = str(data)
    raw["prepare"]["split"]["fractions"] = {"train": 0.5, "val": 0.25, "test": 0.25}
    raw["encoders"] = encoder_params(model)
    raw["cache"] = cache_params()
    raw["train"].update({"batch_size": 8, "max_epochs": 3, "patience": 2, "lr": 0.01, **train})
    raw["train"]["head"]["dropout"] = 0.0
    return raw


def project(root: Path, model: Path, n: int = 80, **train: Any) -> tuple[dict[str, Any], Path]:
    """Write data, prepare it, fill the cache; returns (raw params, params file)."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": f"L{i % 4}"}) + "\n"
                            for i, t in enumerate(sentences(n))))
    raw = train_raw(model, data, **train)
    p = P.validate(raw)
    prepare.write(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache)
    params_file = root / "params.yaml"
    import yaml

    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw, params_file


def stage_args(root: Path, params_file: Path, tag: str = "") -> list[str]:
    return ["train", "--params", str(params_file), "--prepared", str(root / "prepared"),
            "--cache", str(root / "cache"), "--out", str(root / f"head{tag}"),
            "--report", str(root / f"train{tag}.json"), "--live", str(root / f"live{tag}")]
