"""Issue 28, "try these yourself": concurrent fills of the shared store, as a hostile tester
would run them. Two real fills of one new store entry at once, then `simtune cache verify`; a
fill killed mid-write, then `simtune cache gc`; a store path that is a regular file; a fill
waiting for an entry that gc removes meanwhile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtune.atomic import locked
from simtune.cache import policy, store, vectors
from simtune.errors import UserError
from stages import app
from tests.cache.test_cache import _fill_subprocess, _project
from tests.cache_helpers import cache_params, encoder_params
from tests.conftest import ROOT, repo_params, write_params


def _cli(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output.strip().splitlines()


def _verify(tmp_path: Path, params_file: Path, out: Path) -> tuple[int, list[str]]:
    return _cli("cache", "verify", "--params", str(params_file), "--prepared",
                str(tmp_path / "prepared"), "--out", str(out), "--sample", "8")


def test_concurrent_two_fills_of_a_new_entry_then_verify_passes(tmp_path: Path,
                                                                tiny_bert: Path) -> None:
    """Two processes (two queue workers' workspaces) fill the same new store entry at once:
    one embeds, the other waits and copies; `cache verify` passes on both views."""
    params_file = _project(tmp_path, tiny_bert, n=40)
    outs = [tmp_path / "w1", tmp_path / "w2"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "stages", "cache", "--params", str(params_file), "--prepared",
         str(tmp_path / "prepared"), "--out", str(out)], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for out in outs]
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    for out in outs:
        code, lines = _verify(tmp_path, params_file, out)
        assert code == 0 and lines[-1].startswith("tiny: ok: 40 rows, 8 re-embedded"), lines
    [entry] = policy.entries(store.root(""))
    assert entry.rows == 40 and vectors.verify(entry.path) == []


def test_concurrent_killed_fill_then_gc(tmp_path: Path, tiny_bert: Path) -> None:
    """A fill killed (SIGKILL) after 2 of its 6 shards: `cache gc` with these settings current
    keeps the entry, journal included (the next fill embeds only the rest and verifies); with
    other settings current, gc drops the whole entry, leaving nothing behind."""
    params_file = _project(tmp_path, tiny_bert, n=60)
    killed = _fill_subprocess(tmp_path, params_file, tmp_path / "cache", kill_after=2)
    assert killed.returncode == -signal.SIGKILL
    [entry] = policy.entries(store.root(""))
    assert (entry.path / "journal-r0.json").is_file()
    code, lines = _cli("cache", "gc", "--params", str(params_file), "--max-gb", "0")
    assert code == 0 and "kept 1 encoder settings" in lines[0], lines
    code, lines = _cli("cache", "--params", str(params_file), "--prepared",
                       str(tmp_path / "prepared"), "--out", str(tmp_path / "cache"))
    assert code == 0, lines
    code, lines = _verify(tmp_path, params_file, tmp_path / "cache")
    assert code == 0 and lines[-1].startswith("tiny: ok: 60 rows"), lines
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert, max_length=16)  # other settings now current
    raw["cache"] = cache_params()
    other = write_params(tmp_path / "other.yaml", raw)
    code, lines = _cli("cache", "gc", "--params", str(other), "--max-gb", "0")
    said = "kept 0 encoder settings (0.0 MB), dropped 1"
    assert code == 0 and any(said in x for x in lines), lines
    assert not entry.path.exists() and policy.skipped(store.root("")) == []


@pytest.mark.parametrize("under", [False, True])
@pytest.mark.parametrize("command", ["cache", "cache verify", "cache gc"])
def test_concurrent_store_is_a_regular_file(tmp_path: Path, tiny_bert: Path,
                                            monkeypatch: pytest.MonkeyPatch, command: str,
                                            under: bool) -> None:
    """$SIMTUNE_STORE (or cache.store) naming a regular file, or a path under one: one line
    naming the file, for the fill, verify and gc alike (gc said "kept 0 encoder settings",
    verify "ok", the fill named a folder deep inside the file)."""
    params_file = _project(tmp_path, tiny_bert, n=20)
    assert _cli("cache", "--params", str(params_file), "--prepared",
                str(tmp_path / "prepared"), "--out", str(tmp_path / "cache"))[0] == 0
    afile = tmp_path / "store-file"
    afile.write_text("not a folder")
    monkeypatch.setenv(store.ENV, str(afile / "sub" if under else afile))
    args = ["--params", str(params_file)]
    if command != "cache gc":
        args += ["--prepared", str(tmp_path / "prepared"), "--out", str(tmp_path / "cache")]
    code, lines = _cli(*command.split(), *args)
    which = f"$SIMTUNE_STORE is {afile / 'sub'}" if under else "$SIMTUNE_STORE"
    errors = [x for x in lines if not x.startswith("INFO ")]  # the fill logs as it goes
    assert (code, errors) == (1, [f"error: {afile}: not a folder, so it cannot hold the "
                                  f"shared cache store ({which})"])
    assert afile.read_text() == "not a folder"


def test_concurrent_fill_waiting_while_gc_removes_its_entry(tmp_path: Path) -> None:
    """A fill waits for an entry's lock while gc removes the entry (holding that lock): once
    free, the waiter must hold the lock of the folder that exists now, not of the removed
    file, or a third process could fill the same entry beside it."""
    entry = tmp_path / "vectors" / ("f" * 32)
    entry.mkdir(parents=True)
    (entry / vectors.MANIFEST).write_text("{}")
    inside: list[bool] = []
    waiting = threading.Event()

    def fill() -> None:
        waiting.set()
        with store.locked(entry, "tiny"):
            inside.append((entry / store.LOCK).is_file())
            try:  # the lock it holds is the one everyone else sees
                with locked(entry / store.LOCK, busy="busy"):
                    inside.append(False)
            except UserError:
                inside.append(True)

    with locked(entry / store.LOCK):  # gc holds the entry while removing it
        worker = threading.Thread(target=fill)
        worker.start()
        waiting.wait()
        worker.join(0.5)
        assert worker.is_alive()  # still waiting
        import shutil

        shutil.rmtree(entry)
    worker.join(30)
    assert inside == [True, True]
