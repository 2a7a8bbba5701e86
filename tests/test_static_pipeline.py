"""`train.mode: static` through the pipeline's stages (issue 45), on tiny random BERTs: the
cache stage fills the teacher's vectors as for a distillation, train fits the student from
them (the unlabelled texts too) into models/head, evaluate scores it beside the frozen encoder
and the teacher with encode speeds, export writes a folder plain sentence-transformers loads
with simtune's vectors to 1e-6, and `simtune search` ranks with the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from simtune import params as P
from simtune import static
from simtune.cache.views import open_cache
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from stages import app
from tests.conftest import write_params
from tests.train.distill_helpers import fill
from tests.train.test_distill_texts import NEW, texts_project

# the keys every mode's reports/train.json holds (compare, export and evaluate read them)
REPORT_KEYS = {"epochs", "best_epoch", "selected", "best_val", "frozen_val", "seconds", "mode",
               "mode_reason", "in_force"}


def static_raw(root: Path, bert: Path, **schedule: Any) -> dict[str, Any]:
    """The distill texts project (a 48-d teacher BERT, NEW unlabelled texts) in static mode."""
    raw = texts_project(root, bert)
    raw["train"].update(objective="similarity", mode="static")
    raw["train"]["schedule"]["static"].update({"lr": 0.05, "batch_size": 8, "max_epochs": 3,
                                               "patience": 3, "pca_dims": 8,
                                               "label_weight": 0.1, **schedule})
    raw["evaluate"]["speed_texts"] = 8
    return raw


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prepared, cached (as the cache stage fills: `teacher_of`), trained, evaluated, exported."""
    from tests.conftest import save_tiny_bert

    root = tmp_path_factory.mktemp("static")
    bert = save_tiny_bert(root / "bert")
    raw = static_raw(root, bert)
    results = fill(root, raw)
    assert {r.view for r in results} == {"tiny", "teacher"}  # the teacher's vectors: cached
    params = root / "params.yaml"
    _invoke("train", "--params", params, "--prepared", root / "prepared", "--cache",
            root / "cache", "--out", root / "head", "--report", root / "train.json",
            "--metrics", root / "train_metrics.json", "--live", root / "live",
            "--checkpoint", root / "checkpoints")
    _invoke("evaluate", "--params", params, "--prepared", root / "prepared", "--cache",
            root / "cache", "--head", root / "head", "--out", root / "evaluate.json",
            "--metrics", root / "metrics.json", "--plot", root / "recall.json", "--detail",
            root / "detail.json", "--run-trained", root / "t.trec", "--run-baseline",
            root / "b.trec")
    _invoke("export", "--head", root / "head", "--out", root / "export", "--params", params,
            "--metrics", root / "evaluate.json", "--data-report", root / "prepare.json")
    return root


def test_train_fits_the_student_from_the_teachers_cache(project: Path) -> None:
    report = json.loads((project / "train.json").read_text())
    assert report.keys() >= REPORT_KEYS
    assert report["mode"] == "static" and report["mode_reason"] == "train.mode: static"
    # the default start: the teacher's own token vectors (pca_dims is distill's alone)
    assert report["in_force"]["train.schedule.static.init"] == "teacher"
    assert "train.schedule.static.pca_dims" not in report["in_force"]
    assert report["texts"] == {"train": 20, "unlabelled": NEW}  # the texts entered the fit
    assert [h["epoch"] for h in report["history"]] == list(range(report["epochs"] + 1))
    assert report["selected"] == ("initial" if report["best_epoch"] == 0 else "trained")
    assert json.loads((project / "train_metrics.json").read_text())["kept_epoch"] == (
        report["best_epoch"])
    assert (project / "live" / "kept_epoch.json").is_file()
    # the served table has the teacher's width (48; the student's encoder is 32-d) and gives
    # vectors near the teacher's cached ones
    assert static.is_static(project / "head")
    p = P.load(project / "params.yaml")
    prepared = load_prepared(project / "prepared")
    ex = prepared.examples.to_pydict()
    ids = [t for t, s in zip(ex["text_id"], ex["split"], strict=True) if s == "train"]
    texts = prepared.text_map()
    got = load_model(project / "head", "cpu").encode([texts[i] for i in ids])
    teacher = open_cache(project / "cache", "teacher", p.encoders.models["teacher"], p.cache)
    want = F.normalize(teacher.vectors[teacher.index(ids)].float(), dim=1)
    assert got.shape == (20, 48)
    assert float(F.cosine_similarity(got, want).median()) > 0.8


def test_the_distilled_start_trains_through_the_stage(project: Path) -> None:
    """`init: distill`: model2vec's table of the query encoder (8-d, `pca_dims`) widened by the
    map to the teacher's 48 dims; the report names its width."""
    import yaml

    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["train"]["schedule"]["static"]["init"] = "distill"
    params = write_params(project / "distill.yaml", raw)
    _invoke("train", "--params", params, "--prepared", project / "prepared", "--cache",
            project / "cache", "--out", project / "head-distill", "--report",
            project / "train-distill.json", "--metrics", project / "m-distill.json")
    report = json.loads((project / "train-distill.json").read_text())
    assert report["in_force"]["train.schedule.static.init"] == "distill"
    assert report["in_force"]["train.schedule.static.pca_dims"] == 8
    table, _ = static.load(project / "head-distill")
    assert table.weight.shape[1] == 48


def test_ngrams_join_the_students_tokenizer_through_the_stage(project: Path) -> None:
    """`ngrams: 3` (issue 54): the train stage adds the fit texts' most frequent word
    n-grams to the served tokenizer (rows after the teacher's vocabulary), the report says so,
    and plain sentence-transformers gives the folder's vectors, learned token weights
    (`token_weights: 5`) folded in; `init: distill` refuses n-grams."""
    import yaml
    from sentence_transformers import SentenceTransformer

    from simtune.errors import UserError
    from simtune.train import static_ngrams

    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["train"]["schedule"]["static"].update(ngrams=3, token_weights=5)
    params = write_params(project / "ngrams.yaml", raw)
    _invoke("train", "--params", params, "--prepared", project / "prepared", "--cache",
            project / "cache", "--out", project / "head-ngrams", "--report",
            project / "train-ngrams.json", "--metrics", project / "m-ngrams.json")
    report = json.loads((project / "train-ngrams.json").read_text())
    assert report["in_force"]["train.schedule.static.ngrams"] == 3
    assert report["in_force"]["train.schedule.static.ngram_words"] == 2
    assert report["in_force"]["train.schedule.static.token_weights"] == 5
    plain_head, _ = static.load(project / "head")
    table, _ = static.load(project / "head-ngrams")
    v = plain_head.weight.shape[0]
    texts = list(load_prepared(project / "prepared").text_map().values())
    grams = static_ngrams.choose(plain_head.tokenizer, _fit_texts(project), 3, 2)
    assert len(grams) == 3 and table.weight.shape == (v + 3, 48)
    assert [table.tokenizer.token_to_id(g) for g in grams] == [v, v + 1, v + 2]
    ours = load_model(project / "head-ngrams", "cpu").encode(texts)
    theirs = torch.from_numpy(SentenceTransformer(str(project / "head-ngrams"), device="cpu")
                              .encode(texts, batch_size=16))
    assert float((ours - theirs).abs().max()) < 1e-6
    raw["train"]["schedule"]["static"]["init"] = "distill"
    with pytest.raises(UserError, match="ngrams: 3, but init is distill"):
        P.load(write_params(project / "ngrams-distill.yaml", raw))


def _fit_texts(project: Path) -> list[str]:
    """The static fit's texts: the train split's, then the unlabelled ones."""
    prepared = load_prepared(project / "prepared")
    ex, texts = prepared.examples.to_pydict(), prepared.text_map()
    return [texts[i] for split in ("train", "unlabelled")
            for i, s in zip(ex["text_id"], ex["split"], strict=True) if s == split]


def test_evaluate_scores_the_student_the_frozen_encoder_and_the_teacher(project: Path
                                                                        ) -> None:
    report = json.loads((project / "evaluate.json").read_text())
    d = report["distill"]
    assert set(d["teacher"]) == set(report["trained"]) == set(report["baseline"])
    assert report["trained"] != report["baseline"]
    rates = d["speed"]["texts_per_s"]
    assert set(rates) == {"baseline", "trained", "teacher"} and min(rates.values()) > 0


def test_the_export_loads_in_plain_sentence_transformers_with_equal_vectors(project: Path
                                                                           ) -> None:
    from sentence_transformers import SentenceTransformer

    texts = list(load_prepared(project / "prepared").text_map().values())
    plain = SentenceTransformer(str(project / "export"), device="cpu")
    assert [type(m).__name__ for m in plain] == ["StaticEmbedding", "Normalize"]
    theirs = torch.from_numpy(plain.encode(texts, batch_size=16))
    ours = load_model(project / "export", "cpu").encode(texts)
    assert float((ours - theirs).abs().max()) < 1e-6
    assert float((ours - load_model(project / "head", "cpu").encode(texts)).abs().max()) == 0
    card = (project / "export" / "README.md").read_text()
    report = json.loads((project / "evaluate.json").read_text())
    assert "- teacher: `teacher`" in card
    share = report["distill"]["recovered"]["p@1"]
    assert ("not measured" if share is None else f"{share:.0%}") in card
    # exporting again replaces the earlier static export; a folder of anything else is refused
    _invoke("export", "--head", project / "head", "--out", project / "export", "--params",
            project / "params.yaml", "--metrics", project / "evaluate.json")
    (project / "mine").mkdir()
    (project / "mine" / "notes.txt").write_text("x")
    result = CliRunner().invoke(app, ["export", "--head", str(project / "head"), "--out",
                                      str(project / "mine"), "--params",
                                      str(project / "params.yaml")])
    assert result.exit_code != 0 and "notes.txt" in result.output
    assert (project / "mine" / "notes.txt").read_text() == "x"


@pytest.mark.parametrize("folder", ["head", "export"])
def test_search_ranks_with_the_table(project: Path, folder: str) -> None:
    """A corpus text as the query: itself first at cosine 1 (the table embeds both sides)."""
    prepared = load_prepared(project / "prepared")
    text = next(iter(prepared.text_map().values()))
    out = _invoke("search", text, "--k", "2", "--params", project / "params.yaml", "--head",
                  project / folder, "--prepared", project / "prepared", "--cache",
                  project / "cache")
    hits = [line for line in out.strip().splitlines() if not line.startswith(("INFO", "WARN"))]
    first = hits[0]
    assert first.startswith("1.0000") and first.endswith(text)


def test_static_mode_needs_a_teacher(tmp_path: Path, tiny_bert: Path) -> None:
    raw = static_raw(tmp_path, tiny_bert)
    raw["train"]["distill"]["teacher"] = None
    result = CliRunner().invoke(app, ["cache", "--params", str(write_params(
        tmp_path / "p.yaml", raw)), "--prepared", str(tmp_path / "prepared")])
    assert result.exit_code != 0
    assert "train.mode static needs a teacher" in result.output
    assert "distill.teacher" in result.output and "Traceback" not in result.output
