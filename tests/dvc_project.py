"""A throw-away git + DVC copy of this project, for tests that run the real pipeline."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT

OUTPUTS = ("models/", "reports/", "cache/", "negatives/", "data/prepared/", "dvc.lock", "bench/")


def project_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files of the checkout (what a commit would hold),
    minus pipeline outputs a developer's checkout may hold."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return [f for f in out.splitlines()
            if (ROOT / f).is_file() and not f.startswith(OUTPUTS)]


class DvcProject:
    """A copy of the project in `path`, committed to a fresh git repository."""

    def __init__(self, path: Path, clone_of: DvcProject | None = None,
                 copy_of: Path | None = None) -> None:
        self.path = path
        self._environment(path)
        if clone_of is not None:  # a teammate's `git clone`
            self.run("git", "clone", "-q", str(clone_of.path), str(path), cwd=path.parent)
            return
        if copy_of is not None:  # the very folder, outputs, DVC cache and git history included
            shutil.copytree(copy_of, path, symlinks=True,
                            ignore=lambda d, _: ["tmp"] if Path(d) == copy_of / ".dvc" else [])
            return
        for rel in project_files():
            dest = path / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest)
        self.git("init", "-q")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "project copy")

    def _environment(self, path: Path) -> None:
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            # the copy's own code runs, not the editable install's
            "PYTHONPATH": f"{path / 'src'}{os.pathsep}{path}",
            "DVC_NO_ANALYTICS": "1",
            "HF_HUB_OFFLINE": "1",
            "GIT_AUTHOR_NAME": "simtune tests", "GIT_AUTHOR_EMAIL": "tests@example.invalid",
            "GIT_COMMITTER_NAME": "simtune tests", "GIT_COMMITTER_EMAIL": "tests@example.invalid",
        }

    def run(self, *cmd: str, check: bool = True, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(cmd), cwd=cwd or self.path, env=self.env,
                              capture_output=True, text=True, timeout=900)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def git(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("git", *args)

    def dvc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "dvc", *args, check=check)


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]
               ) -> Path:
    """The folder `name`, made by `build(folder)` once per test session, and once for all of
    pytest-xdist's workers (they share the parent of their base temp folders; a lock file
    there makes the others wait for the first's build rather than do it again; the done
    marker names the run, so a folder left by an earlier run under a fixed --basetemp is
    rebuilt)."""
    root = factory.getbasetemp()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file() or done.read_text() != run or not folder.is_dir():
            done.unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.write_text(run)
    return folder
