"""`simtune encode`: a file of texts (one a line) into a .npy of the model's vectors, row i =
line i, with the user's files left alone: an existing output is replaced only when asked, the
texts file never, and a refusal writes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from simtune import static
from simtune.model import load_model
from simtune.train import static_init
from stages import app
from tests.conftest import WORDS

TEXTS = [f"{a} {b}" for a, b in zip(WORDS, WORDS[5:] + WORDS[:5], strict=True)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A static model folder: model2vec's distill of a tiny random BERT (8 dims)."""
    from tests.conftest import save_tiny_bert

    root = tmp_path_factory.mktemp("encode")
    init = static_init.distilled_init(save_tiny_bert(root / "bert"), 8, None)
    static.write(root / "static", init.tokenizer, init.weight, None)
    return root / "static"


def _encode(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["encode", *(str(a) for a in args)])
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


def test_rows_are_the_lines_vectors(model: Path, tmp_path: Path) -> None:
    (tmp_path / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    code, out, _ = _encode(tmp_path / "docs.txt", "--model", model, "--batch-size", 3)
    assert code == 0 and out.strip() == f"{len(TEXTS)} texts -> {tmp_path / 'docs.npy'}"
    got = torch.from_numpy(np.load(tmp_path / "docs.npy"))
    want = load_model(model, "cpu").encode(TEXTS)
    assert got.shape == want.shape and float((got - want).abs().max()) < 1e-6
    # a static model has no prompts: the document role gives the same rows
    code, _, _ = _encode(tmp_path / "docs.txt", "--model", model, "--role", "document",
                         "--out", tmp_path / "d.npy")
    assert code == 0 and np.array_equal(np.load(tmp_path / "d.npy"), got.numpy())


@pytest.mark.parametrize(("out", "reason"), [
    ("docs.npy", "{out}: exists; pass --overwrite to replace it"),
    ("docs.txt", "{out}: the output is a .npy file; name it *.npy"),
    ("vectors.bin", "{out}: the output is a .npy file; name it *.npy"),
    ("missing/v.npy", "{parent}: no such folder for the output"),
])
def test_a_refusal_names_the_path_and_touches_nothing(model: Path, tmp_path: Path, out: str,
                                                      reason: str) -> None:
    (tmp_path / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    (tmp_path / "docs.npy").write_bytes(b"the user's own file")
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    code, _, err = _encode(tmp_path / "docs.txt", "--model", model, "--out", tmp_path / out)
    target = tmp_path / out
    assert code == 1 and err.strip().splitlines()[-1] == "error: " + reason.format(
        out=target, parent=target.parent)
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_overwrite_replaces_only_when_asked(model: Path, tmp_path: Path) -> None:
    (tmp_path / "docs.txt").write_text("\n".join(TEXTS[:4]) + "\n")
    (tmp_path / "docs.npy").write_bytes(b"the user's own file")
    code, _, _ = _encode(tmp_path / "docs.txt", "--model", model, "--overwrite")
    assert code == 0 and np.load(tmp_path / "docs.npy").shape == (4, 8)


def test_texts_that_are_not_utf8_leave_no_output(model: Path, tmp_path: Path) -> None:
    (tmp_path / "docs.txt").write_bytes(b"the city\n" + b"\xff\xfe river\n")
    code, _, err = _encode(tmp_path / "docs.txt", "--model", model)
    assert code == 1 and err.strip().splitlines()[-1].startswith(
        f"error: {tmp_path / 'docs.txt'}: not UTF-8 text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.txt"]


def test_a_missing_texts_file_is_named_before_the_model_loads(model: Path,
                                                              tmp_path: Path) -> None:
    (tmp_path / "not-a-model").mkdir()  # loading it would fail with the model's error
    code, _, err = _encode(tmp_path / "gone.txt", "--model", tmp_path / "not-a-model")
    assert code == 1 and err.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'gone.txt'}: no such file of texts (one text a line)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-model"]


def test_a_folder_it_cannot_write_is_named_as_the_user_gave_it(model: Path,
                                                               tmp_path: Path) -> None:
    """/proc is a folder no file can be created in (even as root): the error names the
    output the user gave, not the temp file simtune tried first."""
    (tmp_path / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    code, _, err = _encode(tmp_path / "docs.txt", "--model", model, "--out", "/proc/v.npy")
    assert code == 1 and err.strip().splitlines()[-1] == (
        "error: /proc/v.npy: cannot write there (No such file or directory)")


def test_a_non_utf8_byte_is_named_by_its_line_and_its_byte_in_the_line(model: Path,
                                                                       tmp_path: Path) -> None:
    """Issue 52, item 6: the byte at file offset 21 (line 3, its 5th byte) was named "byte 21
    of a line" (the offset in the decoder's chunk)."""
    data = b"the city\nriver bank\nold \xff road\n"
    assert data.index(b"\xff") == 24 and data.split(b"\n")[2].index(b"\xff") == 4
    (tmp_path / "docs.txt").write_bytes(data)
    code, _, err = _encode(tmp_path / "docs.txt", "--model", model)
    assert code == 1 and err.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'docs.txt'}: not UTF-8 text (line 3, byte 5 of the line)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.txt"]


# --- issue 52, item 7: temps a kill -9 left, and the output's permissions ----------------------

KILLED = """
import os, sys
from pathlib import Path
import numpy as np
from simtune.static import encode_file

class Rows:  # what encode_file reads of a batch of vectors: .numpy()
    def __init__(self, n): self.shape, self.n = (n, 4), n
    def numpy(self): return np.ones((self.n, 4), "<f4")

class Model:  # embeds the first batch, then says so and waits to be killed mid-write
    calls = 0
    def encode(self, texts, batch_size, role):
        Model.calls += 1
        if Model.calls == 3:  # 1: the width probe, 2: the first batch
            print("written", flush=True)
            os.read(0, 1)  # blocks on the test's open pipe: killed here
        return Rows(len(texts))

encode_file(Model(), Path(sys.argv[1]), Path(sys.argv[2]), batch_size=2, progress=False)
"""


def test_a_killed_encode_leaves_a_temp_that_the_next_run_removes(model: Path,
                                                                 tmp_path: Path) -> None:
    """kill -9 of a real `encode_file` mid-write (after its first batch, on a signal from the
    process, not a sleep) left `.docs.npy.tmp-*.npy`, and the next run kept it; the output was
    -rw------- whatever the umask. Now the next run removes the killed run's temp (only names
    simtune gives its temps: a file of the user's alike is kept) and the output is 0666 & ~umask."""
    import os
    import signal
    import subprocess
    import sys

    (tmp_path / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "docs.npy"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path / "docs.txt"), str(out)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=tmp_path)
    try:  # its first batch is written when it says so; then it blocks on stdin until killed
        assert proc.stdout.readline() == b"written\n"  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    finally:
        proc.kill()
        proc.communicate()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".docs.npy.tmp-")]
    assert len(left) == 1 and left[0].endswith(".npy") and not out.exists()
    stale = tmp_path / left[0]
    mine = tmp_path / ".docs.npy.tmp-mine.npy"  # the user's, not of simtune's pattern
    mine.write_text("mine")
    old = os.umask(0o027)
    try:
        code, _, _ = _encode(tmp_path / "docs.txt", "--model", model)
    finally:
        os.umask(old)
    assert code == 0 and np.load(out).shape == (len(TEXTS), 8)
    assert not stale.exists() and mine.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name, "docs.npy", "docs.txt"]
    assert out.stat().st_mode & 0o777 == 0o640


def test_a_temp_a_live_encode_holds_is_not_removed(model: Path, tmp_path: Path) -> None:
    """A temp of simtune's pattern under a flock (another encode writing the same output
    now) is not stale: it stays."""
    import fcntl
    import os

    (tmp_path / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    live = tmp_path / ".docs.npy.tmp-abcd_123.npy"
    live.write_bytes(b"being written")
    with live.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        code, _, _ = _encode(tmp_path / "docs.txt", "--model", model)
        assert code == 0 and live.read_bytes() == b"being written"
    os.unlink(live)
