"""A groups project whose student is the tiny BERT (32-d) and whose teacher is another tiny
BERT (48-d, or a given model folder), cached, with `train.objective: distill`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from simtune import params as P
from simtune.cache import stage as cache
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import write as write_prepared
from tests.cache_helpers import sentences
from tests.conftest import save_tiny_bert
from tests.train_helpers import train_raw


def distill_raw(root: Path, student: Path, teacher: Path | None = None, n: int = 40,
                **distill: Any) -> dict[str, Any]:
    """Params of a 4-label groups set of `n` texts: student `tiny`, teacher `teacher` (a new
    48-d tiny BERT when None), objective distill (`distill` keys update train.distill)."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": f"L{i % 4}"}) + "\n"
                            for i, t in enumerate(sentences(n))))
    teacher = teacher or save_tiny_bert(root / "teacher-bert", seed=3, hidden=48)
    raw = train_raw(student, data, objective="distill")
    raw["encoders"]["models"]["teacher"] = {**raw["encoders"]["models"]["tiny"],
                                            "model": str(teacher)}
    raw["train"]["distill"].update({"teacher": "teacher", **distill})
    return raw


def fill(root: Path, raw: dict[str, Any], cache_dir: str = "cache") -> list[cache.FillResult]:
    """Prepare (once) and fill the cache as the cache stage does; writes root/params.yaml."""
    p = P.validate(raw)
    if not (root / "prepared").is_dir():
        write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return cache.fill(root / "prepared", root / cache_dir, p.encoders, p.cache,
                      layer=cache.views.layer_for(p.encoders, p.train),
                      teacher=P.teacher_of(p.train))


def cache_stage_refusal(root: Path, params_file: Path) -> list[str]:
    """The lines the cache stage prints when it refuses `params_file` over `root/prepared`
    (asserting it exits non-zero)."""
    from typer.testing import CliRunner

    from stages import app

    result = CliRunner().invoke(app, ["cache", "--params", str(params_file), "--prepared",
                                      str(root / "prepared"), "--out", str(root / "cache")])
    assert result.exit_code != 0
    return result.output.strip().splitlines()
