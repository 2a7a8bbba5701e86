"""Figures that cannot go stale (issue 36 item 4): a page quotes a bench only while the settings it
ran under are today's (or says which differ), the default run's figures are its outputs as
dvc.lock records them, and a quoted message is the one the code prints."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from bench import report
from tests.conftest import ROOT, project_params

DOCS = ROOT / "docs"
QUOTE = re.compile(r"\{\{\s*bench\.(\w+)")


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / "hooks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections(text: str) -> list[str]:
    """A page cut at its headings (any level): a quote and its settings note share one."""
    return re.split(r"^#{1,6} ", text, flags=re.M)


def stale_quotes(pages: dict[str, str], results: dict, today: dict) -> list[str]:
    """One line per bench a page section quotes whose recorded settings differ from `today`
    without the section saying so (`{{ settings.<bench> }}`), or that records none.
    README.md is not built: its quotes are `bench/<name>.json` and `python -m bench.<name>`."""
    out = []
    for where, text in pages.items():
        for section in _sections(text):
            quoted = set(QUOTE.findall(section))
            if where == "README.md":
                quoted |= {a or b for a, b in re.findall(
                    r"bench/(\w+)\.json|python -m bench\.(\w+)", section)}
            for name in sorted(quoted):
                changed = report.settings_changed(name, results, today)
                if changed is None:
                    out.append(f"{where}: quotes bench/{name}.json, which records no run_under")
                elif changed and f"{{{{ settings.{name} }}}}" not in section:
                    out.append(f"{where}: quotes bench/{name}.json, run under "
                               f"{', '.join(f'{k}: {a!r}' for k, a, _ in changed)}, "
                               "not today's params.yaml: rerun it, drop the quote, or say so "
                               f"there with {{{{ settings.{name} }}}}")
    return out


def _pages() -> dict[str, str]:
    pages = {str(p.relative_to(DOCS)): p.read_text() for p in DOCS.rglob("*.md")}
    return {**pages, "README.md": (ROOT / "README.md").read_text()}


def test_no_page_quotes_a_bench_run_under_other_settings() -> None:
    today = project_params()
    assert stale_quotes(_pages(), report.load(), today) == []


def test_a_quote_of_a_bench_run_under_other_patience_is_caught() -> None:
    """main at f3a16f9 quoted "82 epochs" of a train_speed run under patience 25 (now 15)."""
    today = project_params()
    patience = today["train"]["schedule"]["head"]["patience"]
    then = {**report.flat(today), "train.schedule.head.patience": 25}
    results = {"train_speed": {"run_under": {"commit": "x", "params": then}}}
    page = "## The default data set\n\ntrain ({{ bench.train_speed.epochs }} epochs)\n"
    assert stale_quotes({"p.md": page}, results, today) == [
        "p.md: quotes bench/train_speed.json, run under train.schedule.head.patience: 25, not "
        "today's params.yaml: rerun it, drop the quote, or say so there with "
        "{{ settings.train_speed }}"]
    noted = page + "(run under {{ settings.train_speed }})\n"
    assert stale_quotes({"p.md": noted}, results, today) == []
    assert report.settings_text("train_speed", results, today) == (
        f"`train.schedule.head.patience: 25` (now {patience})")
    # a key added since is no change; one removed since is
    del then["train.schedule.head.patience"]
    assert report.settings_changed("train_speed", results, today) == []
    then["train.gone"] = 1
    assert report.settings_changed("train_speed", results, today) == [("train.gone", 1, None)]
    unrecorded = {"train_speed": {"rows": []}}
    assert stale_quotes({"p.md": page}, unrecorded, today) == [
        "p.md: quotes bench/train_speed.json, which records no run_under"]
    readme = "## Results\n\nThe stage takes 51 s (`bench/train_speed.json`).\n"
    assert len(stale_quotes({"README.md": readme}, results | {"train_speed": {
        "run_under": {"commit": "x", "params": {**report.flat(today),
                                                "train.schedule.head.patience": 25}}}},
        today)) == 1


def test_a_key_that_moved_since_is_compared_at_its_new_place() -> None:
    """`train.patience` moved to `train.schedule.head.patience` (simtune.params.MOVED): a bench
    that recorded the old key under today's value ran under today's settings; another value is
    named with the key it has now."""
    today = project_params()
    patience = today["train"]["schedule"]["head"]["patience"]
    now = {k: v for k, v in report.flat(today).items() if not k.startswith("train.schedule.")}
    same = {"x": {"run_under": {"commit": "x", "params": {**now, "train.patience": patience}}}}
    assert report.settings_changed("x", same, today) == []
    older = {"x": {"run_under": {"commit": "x", "params": {**now, "train.patience": 25}}}}
    assert report.settings_text("x", older, today) == (
        f"`train.patience: 25` (now {patience} at `train.schedule.head.patience`)")


def test_auto_is_the_value_it_resolved_to_in_the_default_run(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """`train.monitor: auto` today against a bench run under `mrr@10`: the same settings where
    the checked-in default run (docs/run/train.json) resolved auto to mrr@10, changed where it
    resolved it to another metric, and where that run records none."""
    from bench import settings

    today = project_params()
    today["train"]["monitor"] = "auto"
    then = {"x": {"run_under": {"commit": "x", "params": {**report.flat(today),
                                                          "train.monitor": "mrr@10"}}}}
    (tmp_path / "docs" / "run").mkdir(parents=True)
    monkeypatch.setattr(settings, "ROOT", tmp_path)
    for resolved, changed in (("mrr@10", []), ("map@r", [("train.monitor", "mrr@10", "auto")]),
                              (None, [("train.monitor", "mrr@10", "auto")])):
        run = {"in_force": {"train.mode": "top_layers"},
               **({"monitor": resolved} if resolved else {})}
        (tmp_path / "docs" / "run" / "train.json").write_text(json.dumps(run))
        assert settings.settings_changed("x", then, today) == changed


def test_a_bench_records_the_commit_and_params_it_ran_under(tmp_path: Path) -> None:
    code = ("from bench.common import write_results; "
            "print(write_results('probe', {'rows': [1]}))")
    env = {"SIMTUNE_BENCH_OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    got = json.loads((tmp_path / "probe.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert got["rows"] == [1] and got["run_under"]["commit"] == head
    assert got["run_under"]["params"] == report.flat(  # the file as it is: what a bench reads
        yaml.safe_load((ROOT / "params.yaml").read_text()))
    assert isinstance(got["run_under"]["dirty"], bool)


def test_the_default_runs_copies_are_the_outputs_dvc_lock_records() -> None:
    """docs/run/ (the default run's figures on the site) is what `make figures` wrote with the
    committed dvc.lock: a rerun committed without its copies fails here."""
    assert _hook("run_figures").mismatches() == []


def _commit(repo: Path, *paths: str) -> None:
    subprocess.run(["git", "add", *paths], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit",
                    "-qm", "x"], cwd=repo, check=True)


def test_a_copy_that_is_not_the_committed_locked_output_is_caught(tmp_path: Path) -> None:
    """Against the dvc.lock of the commit, not the workspace's: a user's `make run` rewrites
    the workspace's dvc.lock (its own timings) and leaves docs/run/ as it is (issue 44
    item 16), and `make test` after it still passes."""
    hook = _hook("run_figures")
    run = tmp_path / "docs" / "run"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text('{"trained": {"p@1": 0.5}}')
    outs = [{"path": f"reports/{n}.json", "md5": hook.md5(run / "metrics.json")}
            for n in hook.REPORTS]
    lock = tmp_path / "dvc.lock"
    lock.write_text(yaml.safe_dump({"schema": "2.0", "stages": {"x": {"outs": outs}}}))
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    _commit(tmp_path, "dvc.lock", "docs")
    lines = hook.mismatches(tmp_path)
    assert lines[0] == "docs/run/prepare.json is missing" and len(lines) == len(hook.REPORTS) - 1
    for name in hook.REPORTS:
        (run / f"{name}.json").write_text('{"trained": {"p@1": 0.5}}')
    assert hook.mismatches(tmp_path) == []
    lock.write_text(yaml.safe_dump({"schema": "2.0", "stages": {"x": {"outs": [
        {**o, "md5": "0" * 32} for o in outs]}}}))  # a user's run: the workspace's lock only
    assert hook.mismatches(tmp_path) == []
    _commit(tmp_path, "dvc.lock")  # committed without `make figures`: caught
    assert all(line.startswith("docs/run/") and "is not the reports/" in line
               and "`make figures`" in line for line in hook.mismatches(tmp_path))


def test_params_and_run_placeholders_are_the_files_values() -> None:
    hook = _hook("generate")
    today = project_params()
    metrics = json.loads((DOCS / "run" / "metrics.json").read_text())
    text = "{{ params.train.schedule.head.patience }} / {{ run.metrics.trained.p@1|.3f }}"
    assert hook.bench_figures(text, "p.md") == (
        f"{today['train']['schedule']['head']['patience']} / {metrics['trained']['p@1']:.3f}")
    with pytest.raises(ValueError, match=r"p\.md: \{\{ run\.nothing\.x \}\} names no figure"):
        hook.bench_figures("{{ run.nothing.x }}", "p.md")


# --- the FAQ's messages are the code's ------------------------------------------------------

def _faq_blocks() -> list[str]:
    faq = (DOCS / "faq.md").read_text()
    return [" ".join(b.split()) for b in re.findall(r"```text\n(.*?)```", faq, re.S)]


def test_the_faqs_batch_size_message_is_the_codes(caplog: pytest.LogCaptureFixture) -> None:
    from simtune.train.sampling import fit_batch_size

    with caplog.at_level(logging.WARNING):
        assert fit_batch_size(245, 1024, 1) == 245
    assert caplog.messages[-1] in _faq_blocks()


def test_the_faqs_wrong_loss_message_is_the_codes() -> None:
    from simtune import params as P
    from simtune.errors import UserError

    t = P.load(ROOT / "params.yaml").train
    t = t.model_copy(update={"loss": t.loss.model_copy(update={"name": "supcon"})})
    with pytest.raises(UserError) as e:
        P.resolve_loss(t, "pairs")
    assert str(e.value) in _faq_blocks()


def test_what_the_commands_call_a_dvc_metric_is_one_in_dvc_yaml() -> None:
    """The commands page (each option's help) called reports/prepare.json a DVC metric; only
    the files dvc.yaml lists under `metrics` are."""
    from tests.test_cli import COMMANDS

    metrics = {m if isinstance(m, str) else next(iter(m))
               for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values()
               for m in stage.get("metrics", [])}
    assert metrics == {"reports/train_metrics.json", "reports/metrics.json"}
    said = {str(p.default) for cmd in COMMANDS.values() for p in cmd.params
            if "DVC metrics" in (getattr(p, "help", "") or "")}
    assert said == metrics


def test_the_faqs_layer_cache_messages_are_the_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both refusals of a too-large layer cache, as cache.views prints them, for the FAQ's
    case: MiniLM (hidden 384, float16 states), a million texts of 16 tokens (~12.3 GB), a
    limit of 8 GB, then no limit and 4.1 GB free in /home/me/.cache/simtune."""
    from types import SimpleNamespace

    from simtune import params as P
    from simtune.cache import views
    from simtune.cache.formats import Format
    from simtune.errors import UserError

    p = P.load(ROOT / "params.yaml")
    spec = p.encoders.models["minilm"]
    assert spec.states_dtype == "float16"
    monkeypatch.setattr(views, "model_config", lambda name, spec: SimpleNamespace(
        hidden_size=384))
    monkeypatch.setattr(views, "model_dir", lambda name, spec: Path("minilm"))
    monkeypatch.setattr(views, "load_tokenizer", lambda *a: lambda texts, **kw: {
        "input_ids": [[0] * 16 for _ in texts]})
    texts = {str(i): f"text {i}" for i in range(1_000_000)}
    blocks = _faq_blocks()
    with pytest.raises(UserError) as e:
        views.check_layer_size("minilm", spec, texts, Format(4),
                               p.cache.model_copy(update={"max_layer_gb": 8}), "query")
    assert str(e.value) in blocks
    monkeypatch.setattr(views.store, "root", lambda s: Path("/home/me/.cache/simtune"))
    monkeypatch.setattr(views, "fingerprint", lambda d: "f" * 32)
    monkeypatch.setattr(views, "describe", lambda *a, **kw: {})
    monkeypatch.setattr(views, "_free_bytes", lambda root: int(4.1e9))
    with pytest.raises(UserError) as e:
        views.check_layer_size("minilm", spec, texts, Format(4),
                               p.cache.model_copy(update={"max_layer_gb": None}), "query")
    assert str(e.value) in blocks


# --- issue 44 item 18: a generated table says what it ran under; a figure has one source -----

def _today() -> dict:
    return project_params()


def test_every_generated_table_says_the_settings_it_ran_under_where_not_todays() -> None:
    """The benchmarks page's Training speed table quoted "82 epochs" of a run under patience 25
    (today's default stops at 72) with no word that its settings differ. Now every table
    generated from a bench is followed, before the next heading, by the note naming each key
    that differs (or that the file records none), and the summary lists those areas."""
    results, today = report.load(), _today()
    page = report.page(results, today)
    titles = {title: name for name, title in report.AREAS.items()}
    sections = re.split(r"^#{3,4} ", page, flags=re.M)[1:]
    checked = 0
    for section in sections:
        name = titles.get(section.splitlines()[0])
        if name is None:
            continue
        note = report.settings_note("results" if name == "noop" else name, results, today)
        assert (note in section) if note else ("*Run under" not in section), name
        checked += bool(note)
    assert checked >= 5
    speed = next(s for s in sections if s.startswith("Training speed"))
    assert "82 epochs" in speed and "`train.patience: 25` (now 15 at " in speed
    assert "[Training speed](#training-speed)" in report.summary(results, today)
    hook = _hook("generate")
    built = hook.bench_page("a\n\n<!-- generated:bench-table train_sweep -->\n\n## next\n")
    table_then_note = built.split("## next")[0].rstrip().splitlines()[-1]
    assert table_then_note == report.settings_note("train_sweep", results, today)


def test_a_note_names_each_differing_key_and_says_when_nothing_is_recorded() -> None:
    today = _today()
    now = report.flat(today)
    results = {
        "same": {"run_under": {"commit": "x", "params": now}},
        "older": {"run_under": {"commit": "x", "params": {
            **now, "encoders.models.minilm.max_length": 128, "cache.max_layer_gb": 8}}},
        "merged": {"train_params": {**today["train"], "seed": 7}},
        "named": {"commit": "0" * 40},
        "bare": {"rows": []}}
    assert report.settings_note("same", results, today) == ""
    assert report.settings_note("older", results, today) == (
        "*Run under settings that differ from today's params.yaml* (`bench/older.json`): "
        f"`encoders.models.minilm.max_length: 128` (now "
        f"{now['encoders.models.minilm.max_length']}), `cache.max_layer_gb: 8` (now "
        f"{json.dumps(now['cache.max_layer_gb'])}).")
    earlier = "*Settings of an earlier version*: `bench/{}.json` records no `run_under`; "
    assert report.settings_note("merged", results, today) == (
        earlier.format("merged") + f"of its `train` section, `train.seed: 7` (now "
        f"{today['train']['seed']}).")
    assert report.settings_note("named", results, today) == (
        earlier.format("named") + "it names commit 0000000, which this checkout lacks: what "
        "differs is not known.")
    assert report.settings_note("bare", results, today) == (
        earlier.format("bare") + "what differs is not known.")


SETUP = "getting-started.md"
DURATION = r"~?(\d+(?:\.\d+)?) min"


def _said_once() -> dict[str, str]:
    """The times the set-up section says, once, for the commands (docs/getting-started.md)."""
    text = (DOCS / SETUP).read_text()
    section = " ".join(text.split("## A walkthrough")[0].split())
    found = {
        "warm": re.search(rf"environment: {DURATION} from a warm uv cache", section),
        "cold": re.search(r"(\d+ to \d+) min from a cold one", section),
        "run": re.search(rf"`make run`'s pipeline, the first time: {DURATION} plus training",
                         section),
        "test": re.search(rf"`make test`: {DURATION}", section),
        "test-quick": re.search(rf"`make test-quick`: {DURATION}", section)}
    assert all(found.values()), {k: bool(v) for k, v in found.items()}
    return {k: m.group(1) for k, m in found.items()}


def _duration_sentences(text: str) -> list[str]:
    """Sentences that give `make run` or `make test` a time (a duration or "a minute")."""
    sentences = [" ".join(s.split()) for s in re.split(r"\n\s*\n|(?<=[.;:])\s+", text)]
    return [s for s in sentences if re.search(r"`?make (run|test)\b", s)
            and re.search(r"\d+(?:\.\d+)? ?(?:min|s)\b|a minute|an hour", s)]


def times_that_disagree(pages: dict[str, str], makefile_echoes: list[str],
                        said: dict[str, str]) -> list[str]:
    """One line per place that times `make run`/`make test` other than the set-up section
    says: a docs page giving its own figure (it links instead), the README or a Makefile
    message saying another one."""
    out = []
    for where, text in pages.items():
        if where == SETUP:
            continue
        for sentence in _duration_sentences(text):
            if where != "README.md":
                out.append(f"{where}: times a make command itself (link to {SETUP}#set-up): "
                           f"{sentence}")
                continue
            for command, value in re.findall(rf"`make (test-quick|test|run)`[^~;]*?{DURATION}",
                                             sentence):
                if said.get(command) != value:
                    out.append(f"README.md: `make {command}` {value} min, {SETUP} says "
                               f"{said.get(command)}")
    for echo in makefile_echoes:
        command = re.match(r'echo "== ([\w-]+):', echo)
        first = re.search(DURATION, echo)
        name = command.group(1) if command else ""
        if first and name in said and said[name] != first.group(1):
            out.append(f"Makefile: {echo}: {SETUP} says ~{said[name]} min")
        span = f"~{said['warm']}-{said['cold'].split(' to ')[1]} min"
        if name == "install" and first and span not in echo:
            out.append(f"Makefile: {echo}: {SETUP} says {span}")
    return out


def _echoes() -> list[str]:
    return [line.strip().removeprefix("@") for line in (ROOT / "Makefile").read_text()
            .splitlines() if line.strip().lstrip("@").startswith('echo "== ')]


def test_make_run_and_make_test_are_timed_in_one_place() -> None:
    """`make run` read "1 min 27 s" (benchmarks), "~1.5-4 min" then "~5 min" (the Makefile)
    and "about a minute" for the head (README). Now the set-up section says each time once;
    the README and the Makefile's messages say the same, other pages link to it."""
    assert times_that_disagree(_pages(), _echoes(), _said_once()) == []


def test_a_second_time_for_make_run_is_caught() -> None:
    said = {"warm": "1.5", "cold": "3 to 4", "run": "1", "test": "20", "test-quick": "1"}
    page = ("A fresh clone's `make run` on a 2-core CPU machine takes **1 min 27 s** in all.")
    assert times_that_disagree({"benchmarks.md": page}, [], said) == [
        f"benchmarks.md: times a make command itself (link to {SETUP}#set-up): {page}"]
    echo = 'echo "== run: dvc repro on TREC (first time ~5 min on 2 cores)"'
    assert times_that_disagree({}, [echo], said) == [
        f"Makefile: {echo}: {SETUP} says ~1 min"]
    readme = "On 2 CPU cores `make test` takes ~25 min."
    assert times_that_disagree({"README.md": readme}, [], said) == [
        f"README.md: `make test` 25 min, {SETUP} says 20"]


X = "\u00d7"  # the multiplication sign the pages write
FORMULA = rf"([\d,]+) {X} ([\d.]+) {X} 384 {X} (\d) B =\s*(\d+) MB"


def layer_cache_figures(pages: dict[str, str]) -> list[tuple[str, str]]:
    """Every figure a page gives TREC's layer cache (MB): the size formula's result, any
    "layer cache (N MB)", and "... 384 x <bytes> B ...: N MB for TREC"."""
    out = []
    for where, text in pages.items():
        flat = " ".join(text.split())
        for pattern in (FORMULA, r"layer cache \((\d+) MB\)",
                        rf"384 {X} \d B[^.]{{0,40}}?(\d+) MB for TREC"):
            out += [(where, m if isinstance(m, str) else m[-1])
                    for m in re.findall(pattern, flat)]
    return out


def test_trecs_layer_cache_has_one_size() -> None:
    """The layer cache was "56 MB (float16, the default)" and "107 MB" on one page. Every
    figure given for it is the formula's, with params.yaml's states_dtype."""
    today = _today()
    dtype = today["encoders"]["models"]["minilm"]["states_dtype"]
    page = _hook("generate").bench_figures((DOCS / "modes.md").read_text(), "modes.md")
    formula = re.search(FORMULA, " ".join(page.split()))
    assert formula, "modes.md gives TREC's layer cache size as a formula"
    texts = json.loads((DOCS / "run" / "prepare.json").read_text())["texts"]
    assert formula.group(1) == f"{texts:,}"  # the run's count of TREC's texts
    tokens, size, mb = float(formula.group(2)), int(formula.group(3)), formula.group(4)
    assert size == {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    assert mb == f"{texts * tokens * 384 * size / 1e6:.0f}"
    figures = layer_cache_figures(_pages())
    assert [f for f in figures if f[1] != mb] == []
    assert layer_cache_figures({"b.md": "the layer cache (107 MB) is filled once"}) == [
        ("b.md", "107")]


def test_a_benchs_out_file_records_what_it_ran_under_too(tmp_path: Path) -> None:
    """bench/query_adapter.json and small_data.json were merged from `--out` runs, which wrote
    no run_under; `write_results(..., path)` (every bench's --out) writes it as the default
    file does."""
    code = ("import sys; from bench.common import write_results; "
            "write_results('probe', {'rows': [1]}, sys.argv[1])")
    out = tmp_path / "elsewhere.json"
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, check=True,
                   env={"PATH": "/usr/bin:/bin"})
    got = json.loads(out.read_text())
    assert got["rows"] == [1] and set(got["run_under"]) == {"commit", "dirty", "params"}
    assert got["run_under"]["params"] == report.flat(_today())
    assert not (tmp_path / "probe.json").exists()


# --- one figure per fact (issue 53 item 4): every place that quotes it, one generated source ---

def prose_texts() -> dict[str, str]:
    """Every text a user reads a figure in: the docs pages as the site shows them (figures
    filled in from bench/ and docs/run/; the generated reference pages and the benchmarks
    page, whose every figure is its JSON's, left out), the README, the Makefile's messages and
    comments, params.yaml's comments and the command line's help (each command's docstring)."""
    import typer

    from stages import COMMANDS

    hook = _hook("generate")
    out = {f"docs/{where}": hook.bench_figures(text, where) for where, text in _pages().items()
           if where not in ("README.md", "benchmarks.md") and not where.startswith("reference")}
    for name in ("README.md", "Makefile", "params.yaml"):
        out[name] = (ROOT / name).read_text()
    for name, module in COMMANDS.items():
        app = importlib.import_module(f"stages.{module}").app
        out[f"simtune {name} --help"] = typer.main.get_command(app).help or ""
    return out


def _paragraphs(where: str, text: str) -> list[list[str]]:
    """`text` as paragraphs of sentences: a Markdown page's paragraphs (blank lines, headings
    apart), a config file's lines (each comment its own)."""
    if where in ("Makefile", "params.yaml"):
        return [[line] for line in text.splitlines()]
    blocks = re.split(r"\n\s*\n|\n(?=#)", text)
    return [re.split(r"(?<=[.;!?])\s+(?=[A-Z`(])", " ".join(b.split())) for b in blocks]


def _figures() -> dict[str, str]:
    """Each fact's one source, formatted as the prose writes it."""
    static = json.loads((ROOT / "bench" / "static.json").read_text())
    speed = json.loads((ROOT / "bench" / "train_speed.json").read_text())
    fill = json.loads((ROOT / "bench" / "cache_fill.json").read_text())
    run = json.loads((DOCS / "run" / "metrics.json").read_text())
    prepared = json.loads((DOCS / "run" / "prepare.json").read_text())
    steps = re.findall(r"== install (\d)/(\d)", (ROOT / "Makefile").read_text())
    return {"static speed": f"{static['headline']['default']['ours_labels']['x_MiniLM_1t']:.0f}",
            "static machine": static["machine"].split(",")[0],
            "head P@1": f"{speed['stage']['runs']['now'][0]['test']['p@1']:.3f}",
            "top 2 P@1": f"{run['trained']['p@1']:.3f}",
            "fill texts": f"{fill['texts']:,}", "fill seconds": f"{fill['seconds']['ours']:.0f}",
            "fill machine": fill["machine"].split(",")[0],
            "install steps": ["one", "two", "three", "four", "five"][int(steps[-1][1]) - 1],
            "TREC counts": (f"{prepared['texts']:,}", f"{prepared['examples']['train']:,}")}


def contradictions(texts: dict[str, str]) -> list[str]:
    """One line per figure of a fact that is not its source's (`_figures`): the static
    student's speed against MiniLM (bench/static.json, with its machine), TREC's test P@1 with
    the head (bench/train_speed.json) and with the top 2 layers (the default run, docs/run/),
    MiniLM's pass over TREC (bench/cache_fill.json, with its machine), the count of `make`'s
    install steps (the Makefile's `== install i/n` messages), what `auto` picks (full,
    top_layers or head), a count of tests (said nowhere: it drifts) and TREC's texts and
    training texts (the default run's prepare report: 5,380 and 4,306 were written beside its
    5,379 and 4,305)."""
    want, out = _figures(), []
    for where, text in texts.items():
        for paragraph, s in ((p, s) for p in _paragraphs(where, text) for s in p):
            bad = []
            if re.search(r"static|token table|StaticEmbedding", s) and "MiniLM" in s:
                speeds = re.findall(r"(\d[\d,.]*) ?(?:x|times) (?:as fast|faster|MiniLM)", s)
                bad += [f"static speed {x}" for x in speeds if x != want["static speed"]]
                if speeds and want["static machine"] not in " ".join(paragraph):
                    bad.append("static speed without its machine")
            if "TREC" in s and "coarse" not in s:
                for key, pattern in (("head P@1", r"(0\.\d{3}) with the head|the head reached "
                                      r"(0\.\d{3})"),
                                     ("top 2 P@1", r"(0\.\d{3}) with the top 2 layers|the top 2 "
                                      r"layers (0\.\d{3})")):
                    bad += [f"{key} {a or b}" for a, b in re.findall(pattern, s)
                            if (a or b) != want[key]]
            passes = re.findall(r"([\d,]+) questions in ~?([\d.]+) s", s) + [
                (want["fill texts"], x) for x in
                re.findall(r"MiniLM pass over TREC's questions took ~?([\d.]+) s", s)]
            for n, secs in passes:
                if (n, secs) != (want["fill texts"], want["fill seconds"]):
                    bad.append(f"MiniLM pass {n} questions in {secs} s")
                elif want["fill machine"] not in " ".join(paragraph):
                    bad.append("MiniLM pass without its machine")
            bad += [f"'{m}' steps" for m in re.findall(r"(\w+) steps\b", s)
                    if "install" in s or "`make`" in s
                    if m in ("one", "two", "three", "four", "five") and m != want["install steps"]]
            if re.search(r"\bauto\b\W{0,3}(?:\(the default\) )?(?:picks|chooses)", s) and (
                    "`head`" in s and "`top_layers`" in s and "`full`" not in s):
                bad.append("auto picks without full")
            bad += [f"a count: {m}" for m in re.findall(r"~?\d[\d,]*\d (?:unit )?tests\b", s)]
            bad += [f"TREC count {m}" for m in re.findall(r"\b(5,3\d\d|4,30\d)\b", s)
                    if m not in want["TREC counts"]]
            out += [f"{where}: {b}: {s[:120]}" for b in bad]
    return out


def test_each_fact_has_one_figure_everywhere_it_is_quoted() -> None:
    texts = prose_texts()
    assert "375x as fast as MiniLM" in texts["README.md"]  # the check reads real prose
    assert contradictions(texts) == []


@pytest.mark.parametrize(("text", "caught"), [
    ("A static student encodes about 100 times faster than MiniLM on a CPU.", "static speed 100"),
    ("The token table serves at 375x MiniLM's speed.", "static speed without its machine"),
    ("On TREC the head reached 0.783 and the top 2 layers 0.859.", "top 2 P@1 0.859"),
    ("TREC-50: test P@1 0.868 with the head, 0.868 with the top 2 layers.", "head P@1 0.868"),
    ("One MiniLM pass embeds the 5,379 questions in ~11 s.", "MiniLM pass without its machine"),
    ("One MiniLM pass embeds the 5,380 questions.", "TREC count 5,380"),
    ("`make` says each of the four steps; `== install` runs three steps.", "'three' steps"),
    ("The default, `auto`, picks `top_layers` or `head` from the data.", "auto picks without"),
    ("`make test-quick` (376 unit tests, ~1 min).", "a count: 376 unit tests"),
    ("`make test`: ~20 min (ruff, the import rules, then ~1,270 tests).", "a count: ~1,270"),
    ("TREC's 5,380 questions, 4,305 of them to train.", "TREC count 5,380"),
    ("The validation ranks against TREC's 4,306 training texts.", "TREC count 4,306"),
])
def test_a_figure_that_contradicts_its_source_is_caught(text: str, caught: str) -> None:
    """Each contradiction the first hour met (issue 53), written back into a page, is named."""
    found = contradictions({"page.md": text})
    assert found and caught in found[0], found
