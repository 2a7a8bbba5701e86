"""The real pipeline as a user lives it: `dvc repro`, params edits, new rows, `dvc exp`.

Each test copies the project into a temp git repository (tests/dvc_project.py) and runs the real
DVC; the data is a small CSV in data/raw/ and the encoder a tiny random BERT, so a full
`dvc repro` takes seconds plus Lightning's import.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cache_helpers import encoder_params, sentences
from tests.conftest import ROOT, save_tiny_bert
from tests.dvc_project import DvcProject

pytestmark = pytest.mark.integration
STAGES = ("prepare", "cache", "negatives", "train", "evaluate", "export")


def _ran(proc: Any) -> set[str]:
    return {s for s in STAGES if f"Running stage '{s}'" in proc.stdout}


def test_dvc_repro_prepare_on_trec_then_nothing_to_do(tmp_path: Path) -> None:
    project = DvcProject(tmp_path / "project")
    first = project.dvc("repro", "prepare")
    assert _ran(first) == {"prepare"}
    report = json.loads((project.path / "reports" / "prepare.json").read_text())
    assert report["texts"] == 5379  # "What is the HIGHEST Roman numeral ?" is a folded repeat
    assert report["examples"] == {"train": 4305, "val": 536, "test": 538}
    assert sorted(p.name for p in (project.path / "data" / "prepared").iterdir()) == [
        "examples.parquet", "labels.json", "meta.json", "texts.parquet"]
    second = project.dvc("repro", "prepare")
    assert _ran(second) == set()
    assert "Stage 'prepare' didn't change, skipping" in second.stdout


def _small_project(tmp_path: Path) -> tuple[DvcProject, dict[str, Any], Path, Path]:
    project = DvcProject(tmp_path / "project")
    model = save_tiny_bert(tmp_path / "tiny-bert")
    data = project.path / "data" / "raw" / "mine.csv"
    rows = [f'"{s}",L{i % 3}' for i, s in enumerate(sentences(60))]
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    params = project.path / "params.yaml"
    raw = yaml.safe_load(params.read_text())
    raw["prepare"]["source"] = "file"
    raw["prepare"]["file"]["path"] = "data/raw/mine.csv"
    raw["encoders"] = encoder_params(model)
    raw["cache"]["device"] = "cpu"
    # head mode, as these tests were written for (params.yaml's `auto` would pick the top
    # layers of the tiny BERT); the pipeline tests that run params.yaml as shipped keep `auto`
    raw["train"]["mode"] = "head"
    raw["train"]["schedule"]["head"].update(batch_size=8, max_epochs=2)
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    return project, raw, params, data


def build_baseline(folder: Path) -> None:
    """Into `folder`, `project`: the small project (one epoch) after its first `dvc repro`,
    not committed, and `store`: the vector store that repro filled (the `pipeline_baseline`
    fixture of tests/conftest.py builds it once per session)."""
    project, raw, params, _ = _small_project(folder)
    project.env["SIMTUNE_STORE"] = str(folder / "store")
    raw["train"]["schedule"]["head"]["max_epochs"] = 1
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    first = project.dvc("repro")
    assert _ran(first) == set(STAGES) and any((folder / "store" / "vectors").iterdir())
    (folder / "first-repro.log").write_text(first.stderr)  # what a copy's first repro said


def _baseline_copy(baseline: Path, tmp_path: Path, store: Path | None = None
                   ) -> tuple[DvcProject, dict[str, Any], Path, Path]:
    """A copy of `baseline` in `tmp_path` / project, as if this test had run the repro itself:
    the project folder (outputs, dvc.lock, DVC cache, git history) and, into `store` (this
    test's own `$SIMTUNE_STORE` unless given), the vectors that repro stored."""
    store = store or Path(os.environ["SIMTUNE_STORE"])
    shutil.copytree(baseline / "store", store, symlinks=True)
    project = DvcProject(tmp_path / "project", copy_of=baseline / "project")
    project.env["SIMTUNE_STORE"] = str(store)
    params = project.path / "params.yaml"
    return (project, yaml.safe_load(params.read_text()), params,
            project.path / "data" / "raw" / "mine.csv")


def test_the_edit_rerun_loop(pipeline_baseline: Path, tmp_path: Path) -> None:
    # the small project after its first `dvc repro` (every stage ran: `build_baseline`)
    project, raw, params, data = _baseline_copy(pipeline_baseline, tmp_path)
    assert "cache tiny: 0 cached, 60 to embed" in (pipeline_baseline / "first-repro.log"
                                                   ).read_text()
    metrics = json.loads((project.path / "reports" / "metrics.json").read_text())
    assert set(metrics) == {"trained", "baseline", "lift"}  # trained vs frozen
    report = json.loads((project.path / "reports" / "evaluate.json").read_text())
    assert set(report) >= {"trained", "baseline", "lift", "significance"}
    assert _ran(project.dvc("repro")) == set()

    # a train key: train, evaluate and export rerun; no encoder is loaded
    raw["train"]["schedule"]["head"]["lr"] = 0.002
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    retrain = project.dvc("repro")
    assert _ran(retrain) == {"train", "evaluate", "export"}
    assert "loaded encoder" not in retrain.stderr

    # a fill knob changes no vector: nothing reruns
    raw["cache"]["batch_size"] = 7
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert _ran(project.dvc("repro")) == set()

    # 5 new rows: everything downstream of the data reruns, exactly 5 texts are embedded
    data.write_text(data.read_text() + "".join(f'"{s}",L0\n' for s in sentences(5, 500)))
    grown = project.dvc("repro")
    assert {"prepare", "cache", "train", "evaluate"} <= _ran(grown)
    assert "cache tiny: 60 cached, 5 to embed" in grown.stderr

    # pooling changes every vector: the cache rebuilds and says why; prepare does not rerun
    raw["encoders"]["models"]["tiny"]["pooling"] = "max"
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    rebuilt = project.dvc("repro")
    assert {"cache", "train", "evaluate"} <= _ran(rebuilt) and "prepare" not in _ran(rebuilt)
    assert "encoder changed (pooling: 'mean' -> 'max')" in rebuilt.stderr
    assert "cache tiny: 0 cached, 65 to embed" in rebuilt.stderr


@pytest.fixture(scope="module")
def two_experiments(tmp_path_factory: pytest.TempPathFactory, pipeline_baseline: Path
                    ) -> tuple[DvcProject, bytes]:
    """A small project run (the baseline's copy), rerun with the same params, committed, then
    two experiments (`dvc exp run -S train.schedule.head.lr=...`): shared by the tests that
    read what DVC shows of it. Returns it and reports/evaluate.json's bytes after the first run."""
    folder = tmp_path_factory.mktemp("experiments")
    project, *_ = _baseline_copy(pipeline_baseline, folder, folder / "store")
    before = (project.path / "reports" / "evaluate.json").read_bytes()
    project.dvc("repro", "-f", "train", "evaluate")  # same params again
    assert (project.path / "reports" / "evaluate.json").read_bytes() == before
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "baseline run")
    for lr in ("0.004", "0.02"):
        run = project.dvc("exp", "run", "-S", f"train.schedule.head.lr={lr}")
        assert "Running stage 'train'" in run.stdout
    return project, before


def test_experiments_and_identical_reruns(two_experiments: tuple[DvcProject, bytes]) -> None:
    project, _ = two_experiments
    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    text = json.dumps(shown)
    experiments = [e for commit in shown for e in commit.get("experiments") or []]
    assert len(experiments) == 2, text[:2000]
    lrs = set()
    for exp in experiments:
        data = exp["revs"][0]["data"]
        lrs.add(data["params"]["params.yaml"]["data"]["train"]["schedule"]["head"]["lr"])
        metric_files = data["metrics"]
        assert set(metric_files["reports/metrics.json"]["data"]) == {"trained", "baseline",
                                                                     "lift"}
        assert set(metric_files["reports/train_metrics.json"]["data"]) == {
            "mode", "kept_epoch", "train_s"}
    assert lrs == {0.004, 0.02}

    # what users compare experiments with fits a screen: the changed param, the headline
    # metrics (trained and lift), the kept epoch, the training time and the changed outputs
    header = project.dvc("exp", "show", "--only-changed", "--csv").stdout.splitlines()[0]
    columns = header.split(",")
    assert len(columns) <= 20, columns
    assert "train.schedule.head.lr" in columns and "train_s" in columns, columns
    headline = {f"{part}.{m}" for part in ("trained", "baseline", "lift")
                for m in ("p@1", "mrr@10", "ndcg@10", "map@r")} | {"mode"}
    listing = {"Experiment", "rev", "typ", "Created", "parent", "State", "Executor"}
    outputs = {"models/head", "reports/evaluate.json"}  # deps of evaluate and export
    assert set(columns) <= (listing | {"train.schedule.head.lr", "kept_epoch", "train_s"}
                            | headline | outputs), columns


def _plain_exp_show_columns(project: DvcProject) -> list[str]:
    """The columns of plain `dvc exp show`: those of its CSV, less the three its table merges
    into the Experiment column (rev, typ, parent)."""
    header = project.dvc("exp", "show", "--csv").stdout.splitlines()[0].split(",")
    return [c for c in header if c not in ("rev", "typ", "parent")]


def _leaves(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict) and tree:
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [] if isinstance(tree, dict) else [prefix[:-1]]


def test_plain_exp_show_lists_metrics_then_params_then_one_column_per_stage_package(
        two_experiments: tuple[DvcProject, bytes]) -> None:
    from tests.test_dvc_deps import stage_deps

    columns = _plain_exp_show_columns(two_experiments[0])
    headline = [f"{part}.{m}" for part in ("trained", "baseline", "lift")
                for m in ("p@1", "mrr@10", "ndcg@10", "map@r")]
    metrics = [*headline, "mode", "kept_epoch", "train_s"]
    n = 2 + len(metrics)
    assert columns[:2] == ["Experiment", "Created"] and sorted(columns[2:n]) == sorted(metrics)
    # every leaf of params.yaml (DVC shows the default params file whole), as many as the
    # default project's: the test project changes values (and the encoder's name), not keys
    project = two_experiments[0]
    params = _leaves(yaml.safe_load((project.path / "params.yaml").read_text()))
    assert len(params) == len(_leaves(yaml.safe_load((ROOT / "params.yaml").read_text())))
    assert sorted(columns[n:n + len(params)]) == sorted(params)
    assert "train.schedule.head.lr" in params
    code = {d for s in ("check", *STAGES) for d in stage_deps(s)}
    data = {"data/raw", "data/prepared", "cache", "negatives", "models/head",
            "reports/evaluate.json", "reports/prepare.json", "reports/params_checked.json"}
    assert columns[n + len(params):] == sorted(code | data), columns[n + len(params):]
    assert "src/simtune/train" in code and not [c for c in columns if c.startswith(
        "src/simtune/train/")]


def test_dvc_plots_show_draws_titled_curves_offline(two_experiments: tuple[DvcProject, bytes]
                                                    ) -> None:
    # plain `dvc plots show`: the page is .dvc/plots/page.html (.dvc/config), scripts inlined
    project = two_experiments[0]
    project.dvc("plots", "show", "-o", "plots")
    page = (project.path / "plots" / "index.html").read_text()
    assert not re.search(r"<script[^>]*\bsrc=", page) and "cdn.jsdelivr" not in page
    specs = {i: json.loads(spec) for i, spec in
             re.findall(r'<div id = "(\w+)">\s*<script type = "text/javascript">\s*'
                        r"var spec = (\{.*?\});\n", page)}
    assert sorted(specs) == ["loss", "reports_recall_at_k_json", "validation",
                             "validation_recall"]
    kept = json.loads((project.path / "reports" / "train_metrics.json").read_text())
    for name in ("loss", "validation", "validation_recall"):
        spec = specs[name]
        assert spec["title"]["text"].endswith("by epoch (the dashed rule is the kept epoch)")
        assert spec["layer"][0]["encoding"]["x"]["title"] == "epoch"
        rules = [d for d in spec["data"]["values"] if "kept_epoch" in d]
        assert [d["kept_epoch"] for d in rules] == [kept["kept_epoch"]], name
        assert spec["layer"][1]["mark"]["type"] == "rule"
    fields = {d["field"] for d in specs["validation"]["data"]["values"]}
    assert fields == {"p@1", "mrr@10", "ndcg@10", "map@r", "kept_epoch"}
    # Recall@k: each model a colour of its own (DVC's templates colour by revision only)
    recall = specs["reports_recall_at_k_json"]
    assert recall["title"]["text"] == ("Recall@k on the test split, trained head vs frozen "
                                       "encoder")
    assert recall["layer"][0]["encoding"]["color"]["field"] == "field"
    assert {d["field"] for d in recall["data"]["values"]} == {"trained", "baseline"}


def _embedded(text: str) -> list[str]:
    """Every 'N cached, M to embed' the cache stage logged in `text`."""
    return [line.split("cache tiny: ")[1] for line in text.splitlines()
            if "cache tiny: " in line and " to embed" in line]


def _nothing_embedded(text: str) -> bool:
    return all(said.endswith(" 0 to embed") for said in _embedded(text))


def _committed_baseline(baseline: Path, tmp_path: Path
                        ) -> tuple[DvcProject, dict[str, Any], Path, Path]:
    project, raw, params, data = _baseline_copy(baseline, tmp_path)
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "baseline run")
    return project, raw, params, data


def test_a_queued_grid_and_a_temp_experiment_embed_nothing(
        pipeline_baseline: Path, tmp_path: Path) -> None:
    import time

    project, *_ = _committed_baseline(pipeline_baseline, tmp_path)
    # a grid of two -S (one of them one value: each queued experiment is a full run's cost)
    project.dvc("exp", "run", "--queue", "-S", "train.schedule.head.lr=0.01",
                "-S", "train.head.type=mlp,skip_connection")
    project.dvc("queue", "start", "-j", "2")
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        status = project.dvc("queue", "status").stdout
        if not any(s in status for s in ("Queued", "Running")):
            break
        time.sleep(1)
    tasks = re.findall(r"^[0-9a-f]{7}\s+(\S+)\s.*\s(\w+)\s*$", status, re.MULTILINE)
    names = [name for name, _ in tasks]
    assert len(tasks) == 2 and {state for _, state in tasks} == {"Success"}, status
    for name in names:
        logs = project.dvc("queue", "logs", name).stdout
        assert "Running stage 'train'" in logs and _nothing_embedded(logs), logs[-3000:]
    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    experiments = [e for commit in shown for e in commit.get("experiments") or []]
    trains = [e["revs"][0]["data"]["params"]["params.yaml"]["data"]["train"]
              for e in experiments]
    grid = {(t["schedule"]["head"]["lr"], t["head"]["type"]) for t in trains}
    assert grid == {(0.01, h) for h in ("mlp", "skip_connection")}
    assert all("lift" in e["revs"][0]["data"]["metrics"]["reports/metrics.json"]["data"]
               for e in experiments)
    temp = project.dvc("exp", "run", "--temp", "-S", "train.schedule.head.lr=0.02")
    assert "Running stage 'train'" in temp.stdout
    assert _nothing_embedded(temp.stdout + temp.stderr)


def test_settings_round_trip_checkout_and_a_teammates_clone(
        pipeline_baseline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, raw, params, _ = _committed_baseline(pipeline_baseline, tmp_path)
    first = json.loads((project.path / "cache" / "tiny" / "manifest.json").read_text())
    raw["encoders"]["models"]["tiny"]["max_length"] = 16
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert _embedded(project.dvc("repro").stderr) == ["0 cached, 60 to embed"]
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "max_length 16")
    raw["encoders"]["models"]["tiny"]["max_length"] = 32
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    back = project.dvc("repro")
    assert "cache" in _ran(back), back.stdout
    assert _nothing_embedded(back.stderr)
    # an older commit's vectors come back with `dvc checkout`
    project.git("checkout", "-q", "-f", "HEAD~1")
    project.dvc("checkout")
    assert json.loads((project.path / "cache" / "tiny" / "manifest.json").read_text()) == first
    project.git("checkout", "-q", "-f", "-")
    project.dvc("checkout")
    # a teammate: push to a remote, clone, pull, repro embeds nothing; on their machine (an empty
    # store of their own), the pulled vectors feed their store
    project.dvc("remote", "add", "-d", "shared", str(tmp_path / "remote"))
    project.git("commit", "-q", "-am", "remote")
    project.dvc("push")
    monkeypatch.setenv("SIMTUNE_STORE", str(tmp_path / "teammate-store"))
    mate = DvcProject(tmp_path / "mate", clone_of=project)
    mate.dvc("pull")
    # models/export is out of DVC's cache (a user's file in it is never dropped: dvc.yaml):
    # the teammate's repro exports the pulled head, and runs nothing else
    assert _ran(mate.dvc("repro")) == {"export"}
    mine = mate.path / "data" / "raw" / "mine.csv"
    mine.write_text(mine.read_text() + "".join(f'"{s}",L1\n' for s in sentences(3, 700)))
    grown = mate.dvc("repro")
    assert _embedded(grown.stderr) == ["60 cached, 3 to embed"], grown.stderr[-3000:]


def test_a_failing_stage_loses_nothing_dvc_checkout_restores(
        pipeline_baseline: Path, tmp_path: Path) -> None:
    project, _, params, data = _baseline_copy(pipeline_baseline, tmp_path)
    outputs = ("data/prepared/texts.parquet", "reports/prepare.json", "reports/metrics.json",
               "reports/train.json", "models/head/config.json", "cache/tiny/manifest.json",
               "models/export/simtune.json")
    good = {o: (project.path / o).read_bytes() for o in outputs}
    # a params mistake (a typo, a key given twice) is refused before any stage runs: DVC
    # deletes a stage's outputs before its command, so the check is a stage of its own that
    # every stage follows; the last good model stays (issue 35 item 13)
    text = params.read_text()
    for bad, said in ((text.replace("\n      lr: ", "\n      learning_rate: ", 1),
                       "unknown key 'learning_rate' in section 'train.schedule.head'"),
                      (text.replace("\n      max_epochs: ",
                                    "\n      max_epochs: 3\n      max_epochs: ", 1),
                       "found duplicate key \"max_epochs\"")):  # DVC's own refusal
        params.write_text(bad)
        failed = project.dvc("repro", check=False)
        assert failed.returncode != 0 and said in failed.stderr, failed.stderr[-2000:]
        assert _ran(failed) == set(), failed.stdout
        assert {o: (project.path / o).read_bytes() for o in outputs} == good
    params.write_text(text)
    assert _ran(project.dvc("repro")) == set()  # the check passes: nothing else reruns
    assert not [line for line in project.git("status", "--porcelain", "--untracked-files=all"
                                             ).stdout.splitlines()
                if not line.endswith((" dvc.lock", " params.yaml", " data/raw/mine.csv"))
                and ".gitignore" not in line]  # what the pipeline writes: DVC's or ignored
    data.write_text(data.read_text() + '"unclosed quote,L1\n')
    failed = project.dvc("repro", check=False)
    assert failed.returncode != 0 and "error:" in failed.stderr
    assert not (project.path / "data" / "prepared").exists()  # DVC removed it before the run
    manifest = "cache/tiny/manifest.json"
    assert (project.path / manifest).read_bytes() == good[manifest]
    project.dvc("checkout", "--force")
    assert {o: (project.path / o).read_bytes() for o in outputs} == good


def test_a_stage_reruns_for_its_own_code_only(pipeline_baseline: Path, tmp_path: Path
                                              ) -> None:
    project, *_ = _baseline_copy(pipeline_baseline, tmp_path)
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "baseline run")

    def edit(rel: str) -> set[str]:
        path = project.path / rel
        path.write_text(path.read_text() + "# an edit\n")
        return _ran(project.dvc("repro"))

    # the search command is no stage: nothing reruns
    assert edit("stages/search.py") == set()
    # the BEIR reader is prepare's alone; the prepared data comes out the same, so every later
    # stage is skipped
    assert edit("src/simtune/prepare/beir.py") == {"prepare"}
    # evaluate's run-file writer: evaluate reruns, its outputs are the same, export skips
    assert edit("src/simtune/evaluate/runs.py") == {"evaluate"}
    # the core reruns every stage that runs it
    assert {"cache", "train", "evaluate"} <= edit("src/simtune/encoders.py")


def test_top_layers_views_reference_the_store_and_a_teammate_refills(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, raw, params, _ = _small_project(tmp_path)
    raw["train"]["mode"] = "top_layers"
    raw["train"]["schedule"]["top_layers"].update(layers=1, max_epochs=1, batch_size=16)
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    first = project.dvc("repro")
    assert "cache tiny@layer1: 0 cached, 60 to embed" in first.stderr
    view = project.path / "cache" / "tiny@layer1"
    good = {f.name: f.read_bytes() for f in view.iterdir()}
    assert sorted(good) == ["reference.json", "rows.arrow"]  # no states: those are the store's
    fingerprint = json.loads(good["reference.json"])["fingerprint"]
    store = Path(project.env["SIMTUNE_STORE"]) / "vectors" / fingerprint
    assert any(store.glob("shard-*.arrow"))
    assert _ran(project.dvc("repro")) == set()
    project.dvc("remote", "add", "-d", "shared", str(tmp_path / "remote"))
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "top_layers run")
    project.dvc("push")
    # a teammate pulls the reference; the states stay on the machine that filled them, so
    # training says how to refill, and the refill gives the very view DVC has: nothing reruns
    monkeypatch.setenv("SIMTUNE_STORE", str(tmp_path / "teammate-store"))
    mate = DvcProject(tmp_path / "mate", clone_of=project)
    mate.dvc("pull")
    failed = mate.dvc("repro", "-f", "-s", "train", check=False)
    assert failed.returncode != 0 and "dvc repro -f -s cache" in failed.stderr, failed.stderr
    refill = mate.dvc("repro", "-f", "-s", "cache")
    assert "cache tiny@layer1: 0 cached, 60 to embed" in refill.stderr
    assert "cache tiny: 60 cached, 0 to embed" in refill.stderr  # the pulled vector view's
    mine = mate.path / "cache" / "tiny@layer1"
    assert {f.name: f.read_bytes() for f in mine.iterdir()} == good
    # models/export is not in DVC's cache (issue 52 item 1): a pull leaves it to the export stage
    assert _ran(mate.dvc("repro")) == {"export"}
