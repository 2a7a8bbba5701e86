"""dvc.yaml's code deps: each stage's own package as one directory, plus each module it runs
from elsewhere (the core, another stage's package, its command under `stages/`) as a file.

So editing a stage's own code reruns that stage (and DVC reruns what follows), editing a shared
module reruns exactly the stages that run it, and editing anything else (`stages/search.py`,
docs, tests) reruns nothing; `dvc exp show` lists one column per package rather than one per file.

What a stage runs is the closure of `python -m stages <name>`: the top-level imports of
`stages/__init__.py` and `stages/__main__.py` (commands are registered lazily: only the one asked
for is imported), then every import of `stages/<name>.py` and, transitively, of each `simtune`
module it reaches, imports inside functions included (they may run). A package `__init__.py`
counts with its top-level imports only (its lazy `__getattr__` imports run only when that
attribute is used). `python -m tests.test_dvc_deps` rewrites the deps in dvc.yaml.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

PACKAGES = {"simtune": ROOT / "src" / "simtune", "stages": ROOT / "stages"}


def _module_file(dotted: str) -> Path | None:
    top, *rest = dotted.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, top_level_only: bool) -> set[Path]:
    """Project files imported by `path` (its package `__init__` files included)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # submodules
    out = set()
    for dotted in found:
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__
            f = _module_file(".".join(parts[:i]))
            if f is not None:
                out.add(f)
    return out


def _closure(start: set[Path], top_level_only: set[Path]) -> set[Path]:
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        only_top = f in top_level_only or f.name == "__init__.py"
        todo.extend(_imports(f, only_top) - seen)
    return seen


def stage_closure(stage: str) -> set[str]:
    """Repository-relative files `python -m stages <stage>` can run."""
    entry = {ROOT / "stages" / "__init__.py", ROOT / "stages" / "__main__.py"}
    files = _closure(entry, entry) | _closure({ROOT / "stages" / f"{stage}.py"}, set())
    return {str(f.relative_to(ROOT)) for f in files}


def stage_deps(stage: str) -> set[str]:
    """The code deps dvc.yaml should list for `stage`: its package directory and every file of
    its closure outside that package."""
    own = f"src/simtune/{stage}"
    package = {own} if (ROOT / own).is_dir() else set()  # `check` runs the core alone
    return package | {f for f in stage_closure(stage) if not f.startswith(own + "/")}


def _is_code(dep: str) -> bool:
    return dep.startswith(("src/", "stages/"))


def _declared() -> dict[str, set[str]]:
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    return {name: {d for d in stage.get("deps", []) if _is_code(d)}
            for name, stage in dvc["stages"].items()}


def rerun_by(path: str, declared: dict[str, set[str]]) -> set[str]:
    """The stages whose own deps change when the file `path` is edited (DVC then reruns what
    follows them)."""
    return {s for s, deps in declared.items()
            if any(path == d or path.startswith(d + "/") for d in deps)}


def _repository_files() -> list[str]:
    """Every file of the checkout, tracked or not (git's ignored files aside)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


@pytest.mark.parametrize("stage", sorted(_declared()))
def test_dvc_code_deps_are_the_package_and_the_modules_it_runs_elsewhere(stage: str) -> None:
    want, have = stage_deps(stage), _declared()[stage]
    assert have == want, (f"dvc.yaml stage '{stage}': missing {sorted(want - have)}, "
                          f"not run {sorted(have - want)}; the code deps should be:\n"
                          + "\n".join(f"      - {f}" for f in sorted(want)))


@pytest.mark.parametrize("stage", sorted(_declared()))
def test_editing_a_stage_s_own_code_reruns_it(stage: str) -> None:
    declared = _declared()
    own = [f for f in _repository_files() if f.startswith(f"src/simtune/{stage}/")]
    assert f"src/simtune/{stage}/stage.py" in own or stage == "check"  # the core's params
    for path in [*own, f"stages/{stage}.py", *sorted(stage_closure(stage))]:
        assert stage in rerun_by(path, declared), path


def test_editing_the_search_command_docs_or_tests_reruns_nothing() -> None:
    declared = _declared()
    others = ["stages/search.py", "README.md", "mkdocs.yml", "Makefile"]
    others += [f for f in _repository_files() if f.startswith(("docs/", "tests/", "bench/"))]
    assert "docs/index.md" in others and "tests/test_dvc_deps.py" in others
    assert {f: rerun_by(f, declared) for f in others if rerun_by(f, declared)} == {}


def test_editing_a_module_reruns_exactly_the_stages_that_run_it() -> None:
    # a shared module (the core, retrieval/, a module of one stage that later stages read, the
    # command entry points) reruns every stage whose closure holds it; a stage package's other
    # modules (e.g. train/sweep.py, which only `simtune sweep` runs) rerun that stage alone
    declared, closures = _declared(), {s: stage_closure(s) for s in _declared()}
    code = [f for f in _repository_files() if f.startswith(("src/", "stages/"))
            and f.endswith(".py")]
    assert len(code) > 60
    for path in code:
        want = {s for s, c in closures.items()
                if path in c or path.startswith(f"src/simtune/{s}/")}
        assert rerun_by(path, declared) == want, path
    # e.g. the prepared-data format: every stage that reads it; BM25 (retrieval/lexical) and the
    # servable model: what evaluates and exports
    assert rerun_by("src/simtune/prepare/prepared.py", declared) == set(declared) - {"export",
                                                                                    "check"}
    assert rerun_by("src/simtune/retrieval/lexical.py", declared) == {"evaluate"}
    # (and the cache: a distillation teacher from a simtune export embeds through the model;
    # and train: a static student's start runs each token through that teacher)
    assert rerun_by("src/simtune/model.py", declared) == {"cache", "train", "evaluate",
                                                           "export"}
    assert rerun_by("stages/_common.py", declared) == set(declared)


def test_python_bytecode_is_no_part_of_a_package_dep(tmp_path: Path) -> None:
    # running a stage writes __pycache__ into its package: were it hashed with the directory, a
    # fresh clone (no bytecode) or another Python would rerun every stage
    from dvc.repo import Repo

    shutil.copy(ROOT / ".dvcignore", tmp_path / ".dvcignore")
    package = tmp_path / "src" / "simtune" / "train"
    (package / "__pycache__").mkdir(parents=True)
    for name in ("stage.py", "__pycache__/stage.cpython-311.pyc", "stale.pyc"):
        (package / name).write_text("")
    with Repo.init(str(tmp_path), no_scm=True) as repo:
        ignored = {str(f.relative_to(package)): repo.dvcignore.is_ignored(repo.fs, str(f))
                   for f in (package / "stage.py", package / "__pycache__", package / "stale.pyc")}
    assert ignored == {"stage.py": False, "__pycache__": True, "stale.pyc": True}


def test_the_closure_sees_imports_inside_functions(tmp_path: Path) -> None:
    # the train command imports simtune.train inside its function body; simtune.train imports
    # Lightning-wired code inside functions too: both must be in the closure
    closure = stage_closure("train")
    assert "src/simtune/train/stage.py" in closure and "stages/train.py" in closure
    assert "src/simtune/train/module.py" in closure
    assert "src/simtune/model.py" not in stage_closure("prepare")


@pytest.mark.parametrize("stage", sorted(_declared()))
def test_a_stage_runs_no_other_command_and_no_later_stage(stage: str) -> None:
    # lazy registration: `python -m stages train` imports stages/train.py alone, so editing
    # stages/search.py (no stage) or another stage's command reruns nothing
    closure = stage_closure(stage)
    commands = {f for f in closure if f.startswith("stages/") and f[7:-3] not in
                ("__init__", "__main__", "_common", "_runlock")}  # what every command shares
    assert commands == {f"stages/{stage}.py"}
    order = list(_declared())
    later = order[order.index(stage) + 1:]
    assert not [f for f in closure if any(f.startswith(f"src/simtune/{s}/") for s in later)]


def test_the_data_readers_are_prepare_s_alone() -> None:
    # editing the BEIR or CSV reader reruns prepare only; later stages read the prepared format
    readers = {"src/simtune/prepare/beir.py", "src/simtune/prepare/sources.py",
               "src/simtune/prepare/stage.py", "src/simtune/prepare/split.py"}
    assert readers <= stage_closure("prepare")
    for stage in sorted(set(_declared()) - {"prepare"}):
        assert not readers & stage_closure(stage), stage
    assert all(rerun_by(r, _declared()) == {"prepare"} for r in readers)


def rewrite_dvc_yaml() -> None:
    """Replace each stage's code deps in dvc.yaml by `stage_deps`, keeping everything else:
    `python -m tests.test_dvc_deps`."""
    import re

    lines, out, stage, done = (ROOT / "dvc.yaml").read_text().split("\n"), [], None, False
    for line in lines:
        m = re.match(r"^  (\w+):$", line)
        if m:
            stage, done = m.group(1), False
        if stage and re.match(r"^      - (src|stages)/\S+\s*$", line):
            if not done:
                out += [f"      - {f}" for f in sorted(stage_deps(stage))]
                done = True
            continue
        out.append(line)
    (ROOT / "dvc.yaml").write_text("\n".join(out))


if __name__ == "__main__":
    rewrite_dvc_yaml()
