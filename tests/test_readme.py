"""The README: one screenful whose links resolve, whose layout is the code's, and whose quickstart
runs as written (on a small CSV and a tiny random encoder instead of the user's data and MiniLM)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.cache_helpers import encoder_params, sentences
from tests.conftest import ROOT, save_tiny_bert
from tests.dvc_project import DvcProject

README = ROOT / "README.md"
STAGES = ("prepare", "cache", "negatives", "train", "evaluate", "export")


def section(title: str) -> str:
    """The README's `## <title>...` section, up to the next `## `."""
    text = README.read_text()
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no section '## {title}'"
    return match.group(1)


def code_block(text: str, lang: str = "") -> str:
    match = re.search(rf"```{lang}\n(.*?)```", text, re.S)
    assert match
    return match.group(1)


def test_the_readme_is_one_screenful_of_setup_quickstart_and_results() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    for title in ("Set-up: two commands", "Quickstart", "Results on TREC", "Which mode",
                  "Layout", "Documentation"):
        section(title)
    assert code_block(section("Set-up"), "bash").split("\n")[:2] == [
        "make run    # creates .venv, installs what the pipeline needs, runs it (dvc repro) on "
        "TREC",
        "make test   # creates .venv if needed, adds the test tools, runs the test suite"]
    assert len(section("Which mode").strip().splitlines()) == 3


def test_every_link_of_the_readme_resolves_and_every_docs_page_is_linked() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"https?://", link)]
    assert [link for link in local if not (ROOT / link.split("#")[0]).is_file()] == []
    # every page but the home page, found by walking the nav's nested lists of {title: page}
    pages, todo = [], [yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo += item
        elif isinstance(item, dict):
            todo += list(item.values())
        elif item != "index.md":
            pages.append(f"docs/{item}")
    assert len(pages) >= 14
    assert sorted(set(pages) - set(local)) == []


def test_the_layout_names_every_package_of_the_code() -> None:
    block = code_block(section("Layout"))
    named = re.findall(r"^\s*([\w/]+)/ ", block, re.M)
    packages = sorted(p.name for p in (ROOT / "src" / "simtune").iterdir()
                      if (p / "__init__.py").is_file())
    assert sorted(n for n in named if "/" not in n and (ROOT / "src" / "simtune" / n).is_dir()
                  ) == packages
    assert all((ROOT / n).is_dir() or (ROOT / "src" / "simtune" / n).is_dir() for n in named)
    for core in ("params", "errors", "encoders", "tokens", "heads", "model"):
        assert (ROOT / "src" / "simtune" / f"{core}.py").is_file() and core in block


def test_the_results_quote_the_figures_the_bench_wrote() -> None:
    """The README cannot be generated like the site: its figures are checked against files
    instead: the trained head's test metrics (and the frozen baseline's and BM25's) against the
    default run's reports as dvc.lock records them (docs/run/, tests/test_figures.py), the
    other tables against the git-tracked bench/*.json."""
    results = section("Results on TREC")
    run = ROOT / "docs" / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    evaluate = json.loads((run / "evaluate.json").read_text())
    speed = json.loads((ROOT / "bench" / "train_speed.json").read_text())
    head = speed["stage"]["runs"]["now"][0]["test"]
    rows = {m.group(1): m.group(2).split(" | ")
            for m in re.finditer(r"^\| ([\w@]+) \| (.*) \|$", results, re.M)}
    for name, key in (("P@1", "p@1"), ("MRR@10", "mrr@10"), ("nDCG@10", "ndcg@10"),
                      ("MAP@R", "map@r")):
        trained, lift = rows[name][2], rows[name][3]
        assert trained == f"{metrics['trained'][key]:.3f}", name
        assert lift == f"{metrics['lift'][key]:+.3f}", name
        assert rows[name][1] == f"{evaluate['baseline'][key]:.3f}", name
        # the head alone: the train stage's head run of bench/train_speed.json (its one source)
        assert rows[name][4] == f"{head[key]:.3f}", name
        assert rows[name][5] == f"{head[key] - evaluate['baseline'][key]:+.3f}", name
    _layers_table_quotes_bench_layers(results)
    assert distill_sentence() in " ".join(results.split())
    assert query_side_sentence() in " ".join(results.split())


def _layers_table_quotes_bench_layers(results: str) -> None:
    """The top-layers table's figures are bench/layers.json's rows (its chosen peer and top-K)."""
    layers = json.loads((ROOT / "bench" / "layers.json").read_text())
    rows = {r["measure"].split(",")[0]: r for r in layers["rows"]}
    for encoder, name in (("MiniLM", "all-MiniLM-L6-v2"), ("MPNet", "all-mpnet-base-v2")):
        p1, wall, cpu = (rows[f"{encoder} trec: {m}"] for m in ("test P@1", "train s",
                                                                "train CPU s"))
        frozen = re.search(r"frozen (0\.\d+)", p1["measure"]).group(1)
        top = re.search(r"top-(\d+) layers", p1["measure"]).group(1)
        line = next(ln for ln in results.splitlines() if ln.startswith(f"| {name} "))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == frozen, name
        assert cells[2] == (f"{p1['peer']:.3f} ({_s(wall['peer'])}, {_s(cpu['peer'])})"), name
        assert cells[3] == (f"top {top}: {p1['ours']:.3f} ({_s(wall['ours'])}, "
                            f"{_s(cpu['ours'])})"), name
        shares = (float(p1["ratio"].split()[0]), wall["ratio"], cpu["ratio"])
        assert cells[4] == ", ".join(f"{round(x * 100)} %" for x in shares), name


def distill_sentence() -> str:
    """The results' distillation sentence, from bench/distill.json's headline."""
    bench = json.loads((ROOT / "bench" / "distill.json").read_text())
    h = bench["headline"]
    top2 = next(r for r in bench["results"] if r["row"].startswith("top2-") and not r["extra"])
    return (f"reaches P@1 {h['best_p1']:.3f}, {h['best_share'] * 100:.0f} % of the teacher's "
            f"lift over frozen MiniLM ({h['frozen_p1']:.3f}; the teacher {h['teacher_p1']:.3f}), "
            f"and encodes {h['speed_ratio']:.1f}x as fast; sentence-transformers' MSE recipe at "
            f"its best learning rate reached {h['peer_p1']:.3f} in {h['peer_train_s']:.0f} s of "
            f"training, which simtune's top-2 student beats ({top2['test']['p@1']:.3f}) in "
            f"{top2['train_s']:.0f} s")


def query_side_sentence() -> str:
    """The results' keep-your-index sentence, from bench/query_adapter.json's TREC rows."""
    bench = json.loads((ROOT / "bench" / "query_adapter.json").read_text())
    trec = {r["row"]: r for r in bench["results"] if r["set"] == "trec"}
    share = bench["summary"]["trec"]["share_of_symmetric_lift"]["query-mlp"]["mrr@10"]
    beaten = sum(bool(v.get("query_mlp_beats_chroma")) for v in bench["summary"].values())
    return (f"On TREC the query-side head keeps {share * 100:.0f} % of the symmetric head's "
            f"lift (P@1 {trec['query-mlp']['p@1']:.3f} against {trec['sym-mlp']['p@1']:.4f}) "
            f"and a query tower of the top two layers reaches {trec['query-top2']['p@1']:.3f}; "
            f"the query-side head beats a Chroma-style query adapter on all "
            f"{['no', 'one', 'two', 'three', 'four'][beaten]} sets measured")


def _s(seconds: float) -> str:
    """Seconds as the README writes them: tenths below 100 s."""
    return f"{seconds:.1f}" if seconds < 100 else f"{seconds:.0f}"


def _quickstart() -> list[str]:
    return [line for line in code_block(section("Quickstart"), "bash").splitlines()
            if line.strip()]


def _params_edit(line: str) -> dict[str, str]:
    """`# params.yaml: a.b: x, c.d: y` -> {"a.b": "x", "c.d": "y"}."""
    body = line.split("params.yaml:", 1)[1]
    return dict(pair.strip().split(": ", 1) for pair in body.split(","))


def _set(raw: dict, dotted: str, value: str) -> None:
    *path, last = dotted.split(".")
    node = raw
    for key in path:
        node = node[key]
    assert last in node, dotted  # the README names real keys
    node[last] = yaml.safe_load(value)


@pytest.mark.integration
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    """Every line of the quickstart, in order, in a copy of the project: the params edit it
    describes is applied to params.yaml, every command runs in bash (its experiments: the head,
    then the static student taught by the committed run's export, under --temp). Only the
    encoder (a tiny random BERT) and the epochs (a few) differ from what a user runs. Then
    `make test-quick`'s tests that read params.yaml pass on the user's params.yaml (issue 53)."""
    project = DvcProject(tmp_path / "project")
    home = tmp_path / "home"
    home.mkdir()
    rows = [f'"{s}",L{i % 3}' for i, s in enumerate(sentences(60))]
    (home / "tickets.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    project.env.update(HOME=str(home), COLUMNS="120")
    params = project.path / "params.yaml"
    raw = yaml.safe_load(params.read_text())
    raw["encoders"] = encoder_params(save_tiny_bert(tmp_path / "tiny-bert"))
    raw["cache"]["device"] = "cpu"
    shipped = params.read_text()
    raw["train"]["schedule"]["head"].update(batch_size=8, max_epochs=2)
    for mode in ("top_layers", "full", "static"):
        raw["train"]["schedule"][mode].update(batch_size=8, max_epochs=1)
    raw["evaluate"]["speed_texts"] = 8  # the static student's speeds: a few texts suffice
    params.write_text(yaml.safe_dump(raw, sort_keys=False))

    lines = _quickstart()
    assert 8 <= len(lines) <= 12
    outputs: dict[str, str] = {}
    for line in lines:
        command = re.sub(r"\s+#.*$", "", line).strip()
        if line.startswith("#"):
            edit = _params_edit(line)
            assert edit == {"prepare.source": "file",
                            "prepare.file.path": "data/raw/tickets.csv"}
            for key, value in edit.items():
                _set(raw, key, value)
                # the user's params.yaml: the shipped text, this key's line edited
                leaf = re.escape(key.split(".")[-1])
                shipped, n = re.subn(rf"^(\s+{leaf}: )\S+", rf"\g<1>{value}", shipped,
                                     count=1, flags=re.M)
                assert n == 1, key
            params.write_text(yaml.safe_dump(raw, sort_keys=False))
            continue
        if command == "source .venv/bin/activate":  # the test's PATH already has the venv's bin
            continue
        proc = project.run("bash", "-c", command)
        outputs[command.split()[0] + " " + command.split()[1]] = proc.stdout
        if command == "dvc repro":
            assert {s for s in STAGES if f"Running stage '{s}'" in proc.stdout} == set(STAGES)
            assert (project.path / "data" / "raw" / "tickets.csv").is_file()
        elif command.startswith("cat reports/metrics.json"):
            # the headline: trained vs frozen
            assert set(json.loads(proc.stdout)) == {"trained", "baseline", "lift"}
        elif command.startswith("dvc exp run --temp -C models/export -S train.mode=static"):
            # the static student taught by the committed run's export, in one command under
            # --temp (models/export, outside DVC's cache since issue 52, copied in by -C): its
            # teacher taken into the cache output
            log = proc.stdout + proc.stderr
            assert "Running stage 'cache'" in log and "Running stage 'export'" in log, log
            assert "train.distill.teacher: export: models/export copied into " \
                   "cache/export.model" in log, log
            assert yaml.safe_load(params.read_text()) == raw  # --temp: the file stays as it is
            assert not (project.path / "cache" / "export.model").exists()  # nor the workspace
        elif command.startswith("dvc exp run"):  # the head (the cache stage reruns, as
            assert "Running stage 'train'" in proc.stdout  # train.mode is its param: a hit)
            # auto chose the whole encoder on 60 texts: the head is another mode, said nowhere
            assert "the mode auto picks for this data too" not in proc.stdout + proc.stderr
            assert yaml.safe_load(params.read_text()) == raw  # --temp: the file stays as it is
        elif command.startswith("simtune compare"):
            # the two experiments' changed params and trained metrics, in 120 columns
            shown = proc.stdout.splitlines()
            assert max(map(len, shown)) <= 120, proc.stdout
            assert {"train.mode", "trained.p@1", "trained.mrr@10", "mode"} <= set(
                shown[0].split()), proc.stdout
            assert " static " in proc.stdout and " head " in proc.stdout, proc.stdout
            assert "None" not in proc.stdout
        elif command.startswith("simtune search"):
            hits = proc.stdout.strip().splitlines()
            assert len(hits) == 5
            assert all(re.match(r" ?-?\d\.\d{4}  \S", hit) for hit in hits)  # right-aligned
    assert set(outputs) == {"cp ~/tickets.csv", "dvc repro", "cat reports/metrics.json",
                            "git add", "dvc exp", "simtune compare", "simtune search"}
    # then `make test-quick`'s tests that read params.yaml, on the user's params.yaml (the
    # shipped one with the quickstart's edit): each passes, none takes the file as its truth
    params.write_text(shipped)
    assert yaml.safe_load(shipped)["prepare"]["file"]["path"] == "data/raw/tickets.csv"
    quick = re.search(r"^QUICK_TESTS := (.*?)\n(?=\S)", (ROOT / "Makefile").read_text(),
                      re.M | re.S).group(1).replace("\\", " ").split()
    reading = [t for t in quick if any(re.search(r"params\.yaml|repo_params|params_raw",
                                                 f.read_text()) for f in (
        sorted((ROOT / t).rglob("test_*.py")) if (ROOT / t).is_dir() else [ROOT / t]))]
    assert "tests/test_params.py" in reading and "tests/prepare" in reading
    proc = project.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       "-m", "not integration", *reading, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"^\d+ passed", proc.stdout.splitlines()[-1]), proc.stdout[-500:]
