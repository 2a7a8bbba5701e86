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
from tests.conftest import ROOT

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
    today = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert stale_quotes(_pages(), report.load(), today) == []


def test_a_quote_of_a_bench_run_under_other_patience_is_caught() -> None:
    """main at f3a16f9 quoted "82 epochs" of a train_speed run under patience 25 (now 15)."""
    today = yaml.safe_load((ROOT / "params.yaml").read_text())
    then = {**report.flat(today), "train.patience": 25}
    results = {"train_speed": {"run_under": {"commit": "x", "params": then}}}
    page = "## The default data set\n\ntrain ({{ bench.train_speed.epochs }} epochs)\n"
    assert stale_quotes({"p.md": page}, results, today) == [
        "p.md: quotes bench/train_speed.json, run under train.patience: 25, not today's "
        "params.yaml: rerun it, drop the quote, or say so there with "
        "{{ settings.train_speed }}"]
    noted = page + "(run under {{ settings.train_speed }})\n"
    assert stale_quotes({"p.md": noted}, results, today) == []
    assert report.settings_text("train_speed", results, today) == (
        f"`train.patience: 25` (now {today['train']['patience']})")
    # a key added since is no change; one removed since is
    del then["train.patience"]
    assert report.settings_changed("train_speed", results, today) == []
    then["train.gone"] = 1
    assert report.settings_changed("train_speed", results, today) == [("train.gone", 1, None)]
    unrecorded = {"train_speed": {"rows": []}}
    assert stale_quotes({"p.md": page}, unrecorded, today) == [
        "p.md: quotes bench/train_speed.json, which records no run_under"]
    readme = "## Results\n\nThe stage takes 51 s (`bench/train_speed.json`).\n"
    assert len(stale_quotes({"README.md": readme}, results | {"train_speed": {
        "run_under": {"commit": "x", "params": {**report.flat(today), "train.patience": 25}}}},
        today)) == 1


def test_a_bench_records_the_commit_and_params_it_ran_under(tmp_path: Path) -> None:
    code = ("from bench.common import write_results; "
            "print(write_results('probe', {'rows': [1]}))")
    env = {"SIMTUNE_BENCH_OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
    got = json.loads((tmp_path / "probe.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert got["rows"] == [1] and got["run_under"]["commit"] == head
    assert got["run_under"]["params"] == report.flat(
        yaml.safe_load((ROOT / "params.yaml").read_text()))
    assert isinstance(got["run_under"]["dirty"], bool)


def test_the_default_runs_copies_are_the_outputs_dvc_lock_records() -> None:
    """docs/run/ (the default run's figures on the site) is what `make run` wrote with the
    checked-in dvc.lock: a rerun whose copies were not committed fails here."""
    assert _hook("run_figures").mismatches() == []


def test_a_copy_that_is_not_the_locked_output_is_caught(tmp_path: Path) -> None:
    hook = _hook("run_figures")
    run = tmp_path / "run"
    run.mkdir()
    lock = tmp_path / "dvc.lock"
    (run / "metrics.json").write_text('{"trained": {"p@1": 0.5}}')
    outs = [{"path": f"reports/{n}.json", "md5": hook.md5(run / "metrics.json")}
            for n in hook.REPORTS]
    lock.write_text(yaml.safe_dump({"schema": "2.0", "stages": {"x": {"outs": outs}}}))
    hook.ROOT = tmp_path
    lines = hook.mismatches(run, lock)
    assert lines[0] == "run/prepare.json is missing" and len(lines) == len(hook.REPORTS) - 1
    (run / "metrics.json").write_text('{"trained": {"p@1": 0.6}}')
    assert any(line.startswith("run/metrics.json is not the reports/metrics.json")
               for line in hook.mismatches(run, lock))


def test_params_and_run_placeholders_are_the_files_values() -> None:
    hook = _hook("generate")
    today = yaml.safe_load((ROOT / "params.yaml").read_text())
    metrics = json.loads((DOCS / "run" / "metrics.json").read_text())
    text = "{{ params.train.patience }} / {{ run.metrics.trained.p@1|.3f }}"
    assert hook.bench_figures(text, "p.md") == (
        f"{today['train']['patience']} / {metrics['trained']['p@1']:.3f}")
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
