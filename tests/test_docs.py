"""The documentation site as a reader meets it.

`mkdocs build --strict` passes (and fails on a broken link, a broken anchor or a page left out of
the navigation); the generated parts list exactly what the code holds; no sentence is kept in two
places; and a headless Chromium (Debian's `chromium`) renders the built home page and `dvc plots
show`'s page with no script error and every Vega plot drawn. The browser tests skip, saying why,
where `chromium` is not installed (`apt-get install chromium`: ~300 MB, so `make test` does not
install it); the plots page needs no network (its scripts are inlined: tests/test_plots.py).
Set `SIMTUNE_SHOTS=<dir>` to keep the pages' screenshots there.
"""

from __future__ import annotations

import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the backport (import-linter's dependency)
    import tomli as tomllib

import pytest
import yaml

from simtune import params as P
from tests.conftest import ROOT

DOCS = ROOT / "docs"
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(out)], cwd=config.parent, env=ENV, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = build(ROOT / "mkdocs.yml", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _text(page: Path) -> str:
    """A built page's text: tags dropped, entities decoded, whitespace collapsed."""
    raw = page.read_text().replace("<wbr>", "")
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", raw)).split())


def test_the_parameters_page_has_every_schema_key_with_its_value(site: Path) -> None:
    page = (site / "reference" / "parameters" / "index.html").read_text().replace("<wbr>", "")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    keys = P.documented_keys()
    assert len(keys) >= 25
    missing = [k for k, _ in keys if f'<code class="param-key">{html.escape(k)}</code>' not in page]
    assert missing == []
    rows = {re.sub(r"<[^>]+>", "", m.group(1)): m.group(0)
            for m in re.finditer(r'<tr>\s*<td><code class="param-key">([^<]+)</code></td>.*?</tr>',
                                 page, re.S)}
    assert len(rows) == len(keys)
    # one row checked cell by cell: the value from params.yaml, the choices from the Literal
    mode = rows["train.mode"]
    assert f"<code>{raw['train']['mode']}</code>" in mode
    assert "<code>head</code> | <code>top_layers</code> | <code>full</code>" in mode
    # a description with `<...>` and `|` outside code is shown as written, not parsed as HTML
    assert "qrels/&lt;split&gt;.tsv" in rows["prepare.file.format"]
    assert "|positive score|" in html.unescape(rows["negatives.margin_type"])
    # generic types in words, not as typing's repr
    assert "list of int" in rows["train.loss.matryoshka_dims"]
    assert "Annotated" not in page and "FieldInfo" not in page
    # a mapping of named entries shows each entry's value
    assert "minilm: <code>mean</code>" in rows["encoders.models.&lt;name&gt;.pooling"]


def test_the_architecture_page_lists_every_module_and_import_rule(site: Path) -> None:
    text = _text(site / "architecture" / "index.html")
    modules = [".".join(p.relative_to(ROOT / "src").with_suffix("").parts).removesuffix(
        ".__init__") for p in (ROOT / "src" / "simtune").rglob("*.py")
        if "__pycache__" not in p.parts]
    assert len(modules) >= 40
    assert [m for m in modules if m not in text] == []
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    names = [c["name"] for c in contracts["contracts"]]
    assert len(names) >= 7
    assert [n for n in names if n not in text] == []


def test_the_api_page_renders_the_docstrings(site: Path) -> None:
    text = _text(site / "reference" / "api" / "index.html")
    for name in ("load_model", "CacheTable", "evict", "Representation", "CachedStates",
                 "LiveEncoder"):
        assert name in text
    # a docstring's own words, not just a name
    assert "Never returns a partially valid table" in text


def test_a_broken_link_or_a_page_left_out_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "project"
    for rel in ("docs", "src/simtune", "stages"):
        shutil.copytree(ROOT / rel, copy / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in ("mkdocs.yml", "params.yaml", "pyproject.toml"):
        shutil.copy2(ROOT / rel, copy / rel)
    page = copy / "docs" / "data.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md) [bad](cache.md#no-anchor)\n")
    (copy / "docs" / "orphan.md").write_text("# Not in the nav\n")
    proc = build(copy / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "'no-such-page.md'" in proc.stderr
    assert "'#no-anchor'" in proc.stderr
    assert "orphan.md" in proc.stderr


def _sentences(text: str) -> list[str]:
    text = re.sub(r"```.*?```", " ", text, flags=re.S)  # commands may repeat; prose may not
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return [s for s in (" ".join(p.split()) for p in re.split(r"(?<=[.:;])\s+|\n\n", text))
            if len(s) >= 60]


def test_no_sentence_is_kept_in_two_places() -> None:
    """Every fact has one home: the README or one docs page (links point to it)."""
    seen: dict[str, str] = {}
    twice = []
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for sentence in set(_sentences(path.read_text())):
            if sentence in seen:
                twice.append((sentence, seen[sentence], path.name))
            seen[sentence] = path.name
    assert twice == []


# --- in a browser ---------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[[Path], str]]:
    """Serves a directory over HTTP on localhost (as a reader's browser gets the site)."""
    servers = []

    def serve(directory: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield serve
    for server in servers:
        server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def render(url: str, tmp_path: Path, shot: str) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and every console message it logged.

    Chromium logs console messages (errors, uncaught exceptions, warnings) to stderr as
    `INFO:CONSOLE...] "message", source: url (line)` under `--enable-logging=stderr --v=0`."""
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr",
              "--v=0", "--virtual-time-budget=15000", "--window-size=1280,1600"]
    proc = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = re.findall(r":CONSOLE[^\]]*\] (.*)", proc.stderr)
    shots = os.environ.get("SIMTUNE_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        subprocess.run([*common, f"--screenshot={Path(shots) / shot}", url],
                       capture_output=True, timeout=180, check=True)
    return proc.stdout, console


@needs_chromium
def test_the_home_page_renders_without_a_script_error(site: Path, served: Callable[[Path], str],
                                                     tmp_path: Path) -> None:
    dom, console = render(served(site), tmp_path, "home.png")
    assert console == []
    assert "<title>simtune</title>" in dom
    assert 'class="md-nav' in dom  # Material's navigation was built by its scripts and CSS
    assert 'href="getting-started/"' in dom


# What Vega logs on every DVC page, errors excluded: vega-embed's version check compares "v5" with
# the full version (its own bug), and DVC's templates hold layers (hover rules, the smoothing's
# selection) that are empty until the reader interacts, whose extent Vega warns about
BENIGN = re.compile(r'"(The compiled spec uses Vega v5, but current version is v5\.[\d.]+\.'
                    r'|The input spec uses Vega-Lite v5, but the current version of Vega-Lite '
                    r'is v5\.[\d.]+\.|WARN Infinite extent for field "[^"]+": '
                    r'\[Infinity, -Infinity\])", source: ')


@needs_chromium
@pytest.mark.integration
def test_dvc_plots_show_page_renders_every_plot(tmp_path: Path,
                                                served: Callable[[Path], str]) -> None:
    from tests.test_pipeline import _small_project

    project, *_ = _small_project(tmp_path)
    project.dvc("repro")
    # plain `dvc plots show`: the project's page (.dvc/plots/page.html) inlines Vega's scripts
    out = tmp_path / "plots"
    project.dvc("plots", "show", "-o", str(out))
    page = (out / "index.html").read_text()
    assert not re.search(r"<script[^>]*\bsrc=", page)
    plots = len(re.findall(r"vegaEmbed\('#", page))
    # the loss, the validation metrics, validation Recall@k (each with the kept epoch) and the
    # test Recall@k of both models (drawn once: dvc.yaml's top-level entries)
    ids = re.findall(r'<div id = "([^"]+)"', page)
    assert plots == len(ids) == 4
    assert ids == ["loss", "validation", "validation_recall", "reports_recall_at_k_json"]

    dom, console = render(served(out) + "index.html", tmp_path, "plots.png")
    assert [m for m in console if not BENIGN.match(m)] == []
    assert dom.count('class="marks"') == plots  # each plot drawn (a canvas or an svg)
