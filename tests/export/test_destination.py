"""`simtune export --out DIR` deletes nothing a user owns (issue 35 item 1): it writes a new or
empty folder, or replaces a folder that is itself a simtune export; anything else is refused in
one line naming the folder, before any work. A link is written through, never replaced; the
export's own input and a workspace's data are never an output."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simtune.errors import UserError
from simtune.export.stage import export
from stages import app
from tests.export.test_export import _head_dir


@pytest.fixture
def head(tiny_bert: Path, tmp_path: Path) -> Path:
    return _head_dir(tmp_path, tiny_bert, "linear")


def _refused(head: Path, out: Path, tiny_bert: Path) -> str:
    with pytest.raises(UserError) as e:
        export(head, out, encoder=str(tiny_bert))
    assert "\n" not in str(e.value)
    return str(e.value)


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry below `root` (links as their target, files as their bytes)."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


def test_a_users_folder_is_refused_and_kept(head: Path, tiny_bert: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("my notes")
    message = _refused(head, mine, tiny_bert)
    assert message == (f"{mine}: holds 'precious.txt', which no simtune export holds: not "
                       "replaced (export to a new or empty folder, or move it away)")
    assert _tree(mine) == {"precious.txt": b"my notes"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_an_empty_folder_and_an_earlier_export_are_replaced(head: Path, tiny_bert: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    export(head, out, encoder=str(tiny_bert))
    first = _tree(out)
    assert "simtune.json" in first
    export(head, out, encoder=str(tiny_bert))  # an export: replaced
    assert _tree(out) == first


def test_an_export_with_a_users_file_added_is_refused(head: Path, tiny_bert: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(head, out, encoder=str(tiny_bert))
    (out / "notes.md").write_text("mine")
    before = _tree(out)
    assert _refused(head, out, tiny_bert) == f"{out}: " + FOREIGN.format(what="'notes.md'")
    assert _tree(out) == before


def test_a_folder_with_a_damaged_simtune_json_is_not_an_export(head: Path, tiny_bert: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "simtune.json").write_text('{"format_version": "my own file"}')
    assert _refused(head, out, tiny_bert).startswith(
        f"{out}: not a simtune export (its simtune.json: {out / 'simtune.json'}: ")
    assert (out / "simtune.json").read_text() == '{"format_version": "my own file"}'


def test_a_link_to_a_folder_is_written_through_and_kept(head: Path, tiny_bert: Path,
                                                        tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "export"
    target.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(target)
    export(head, link, encoder=str(tiny_bert))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target / "simtune.json").is_file()
    export(head, link, encoder=str(tiny_bert))  # again: the export behind the link is replaced
    assert link.is_symlink() and (target / "simtune.json").is_file()


def test_a_link_to_a_users_folder_is_refused(head: Path, tiny_bert: Path, tmp_path: Path
                                             ) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "precious.txt").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert _refused(head, link, tiny_bert).startswith(f"{link}: holds 'precious.txt'")
    assert link.is_symlink() and _tree(target) == {"precious.txt": b"x"}


@pytest.mark.parametrize("kind", ["dangling", "loop", "file"])
def test_a_link_that_leads_to_no_folder_is_refused(head: Path, tiny_bert: Path, tmp_path: Path,
                                                   kind: str) -> None:
    link = tmp_path / "link"
    if kind == "dangling":
        link.symlink_to(tmp_path / "nowhere")
        want = f"{link}: a link to nothing ({tmp_path / 'nowhere'}); export to a folder"
    elif kind == "loop":
        link.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(link)
        want = f"{link}: a loop of links; export to a folder"
    else:
        (tmp_path / "file.txt").write_text("x")
        link.symlink_to(tmp_path / "file.txt")
        want = f"{link}: not a folder; export to a folder"
    assert _refused(head, link, tiny_bert) == want
    assert link.is_symlink()
    assert not (tmp_path / "nowhere").exists()


def test_a_file_is_refused(head: Path, tiny_bert: Path, tmp_path: Path) -> None:
    path = tmp_path / "file.txt"
    path.write_text("x")
    assert _refused(head, path, tiny_bert) == f"{path}: not a folder; export to a folder"
    assert _refused(head, path / "sub", tiny_bert) == (
        f"{path / 'sub'}: {path} is a file, not a folder; export to a folder")
    assert path.read_text() == "x"


@pytest.mark.parametrize("where", ["head", "head/sub", "parent", "encoder", "encoder/x"])
def test_its_own_input_is_never_the_output(head: Path, tiny_bert: Path, tmp_path: Path,
                                           where: str) -> None:
    out = {"head": head, "head/sub": head / "sub", "parent": head.parent,
           "encoder": tiny_bert, "encoder/x": tiny_bert / "x"}[where]
    inputs = {p: _tree(p) for p in (head, tiny_bert)}
    message = _refused(head, out, tiny_bert)
    assert message.startswith(f"{out}: ") and "export" in message
    assert {p: _tree(p) for p in inputs} == inputs
    assert not (head / "sub").exists() and not (tiny_bert / "x").exists()


def test_relative_paths_with_dotdot_are_the_folders_they_name(head: Path, tiny_bert: Path,
                                                              tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    out = Path("..") / head.name / ".." / head.name  # the head folder itself
    assert _refused(head, out, tiny_bert).startswith(f"{out}: is the export's own input")


@pytest.mark.parametrize("rel", ["data/raw", "data/raw/new", "data", "cache/minilm",
                                 "reports", "negatives", "."])
def test_a_workspaces_data_is_never_the_output(head: Path, tiny_bert: Path, tmp_path: Path,
                                               rel: str) -> None:
    work = tmp_path / "work"
    (work / "data" / "raw").mkdir(parents=True)
    (work / "data" / "raw" / "mine.csv").write_text("text,label\na,b\n")
    (work / "dvc.yaml").write_text("stages: {}\n")
    before = _tree(work)
    message = _refused(head, work / rel, tiny_bert)
    assert message.startswith(f"{work / rel}: ") and "\n" not in message
    assert _tree(work) == before


def test_a_read_only_parent_is_one_line(head: Path, tiny_bert: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        result = CliRunner().invoke(app, ["export", "--head", str(head), "--out",
                                          str(parent / "export"), "--params",
                                          str(tmp_path / "none.yaml")])
    finally:
        parent.chmod(0o755)
    assert result.exit_code == 1
    assert list(parent.iterdir()) == []


def test_the_command_refuses_a_users_folder_in_one_line(head: Path, tiny_bert: Path,
                                                        tmp_path: Path) -> None:
    from tests.cache_helpers import encoder_params
    from tests.conftest import repo_params, write_params

    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    params = write_params(tmp_path / "params.yaml", raw)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("x")
    result = CliRunner().invoke(app, ["export", "--head", str(head), "--out", str(mine),
                                      "--params", str(params)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"error: {mine}: holds 'precious.txt', which no simtune export holds: not replaced "
        "(export to a new or empty folder, or move it away)")
    assert (mine / "precious.txt").read_text() == "x"


# --- issue 44 item 2: a re-export replaces only the files the earlier export wrote (its
# simtune.json's `files`), at any depth --------------------------------------------------------

MINE = {"encoder/onnx/model.onnx": b"\x00onnx graph", "head/MY_NOTES.txt": b"my notes\n",
        "7_Dense/mine.bin": b"\x01\x02\x03"}
FOREIGN = ("holds {what}, which the export there did not write (not in its simtune.json's "
           "files): not replaced (export to a new or empty folder, or move it away)")


def test_the_record_lists_every_file_and_folder_the_export_wrote(head: Path, tiny_bert: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(head, out, encoder=str(tiny_bert))
    recorded = json.loads((out / "simtune.json").read_text())["files"]
    written = sorted(p.relative_to(out).as_posix() + ("/" if p.is_dir() else "")
                     for p in out.rglob("*"))
    assert recorded == written
    assert {"simtune.json", "README.md", "modules.json", "head/model.safetensors",
            "encoder/config.json", "1_Pooling/config.json", "2_Dense/"} <= set(recorded)


def test_files_added_inside_an_earlier_exports_folders_are_kept(head: Path, tiny_bert: Path,
                                                                tmp_path: Path) -> None:
    """The tester's re-export into ../exB deleted all three (only top-level names were
    checked): now it is refused naming the first, and every byte stays."""
    out = tmp_path / "exB"
    export(head, out, encoder=str(tiny_bert))
    for rel, data in MINE.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    before = _tree(out)
    assert _refused(head, out, tiny_bert) == f"{out}: " + FOREIGN.format(
        what="'7_Dense/mine.bin' (and 2 more)")
    assert _tree(out) == before
    assert {rel: (out / rel).read_bytes() for rel in MINE} == MINE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exB", "head-linear"]  # no temp left
    shutil.rmtree(out / "7_Dense")  # the next one in path order is named
    assert _refused(head, out, tiny_bert) == f"{out}: " + FOREIGN.format(
        what="'encoder/onnx/model.onnx' (and 1 more)")
    shutil.rmtree(out / "encoder" / "onnx")
    assert _refused(head, out, tiny_bert) == f"{out}: " + FOREIGN.format(
        what="'head/MY_NOTES.txt'")
    assert (out / "head" / "MY_NOTES.txt").read_bytes() == MINE["head/MY_NOTES.txt"]


def test_a_users_empty_folder_or_link_inside_an_export_is_refused(head: Path, tiny_bert: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(head, out, encoder=str(tiny_bert))
    (out / "head" / "mine").mkdir()
    assert _refused(head, out, tiny_bert) == f"{out}: " + FOREIGN.format(what="'head/mine/'")
    (out / "head" / "mine").rmdir()
    (out / "encoder" / "link").symlink_to(out / "encoder" / "config.json")
    assert _refused(head, out, tiny_bert) == f"{out}: " + FOREIGN.format(what="'encoder/link'")
    (out / "encoder" / "link").unlink()
    (out / "README.md").write_text("my own card")  # a file the export wrote, edited: replaced
    export(head, out, encoder=str(tiny_bert))
    assert (out / "README.md").read_text().startswith("---\n")


def test_an_export_without_a_record_of_its_files_is_not_replaced(head: Path, tiny_bert: Path,
                                                                  tmp_path: Path) -> None:
    """An export written before simtune.json listed its files: what it wrote is unknown, so it
    is not replaced (it still loads: tests/export/test_copies.py)."""
    out = tmp_path / "out"
    export(head, out, encoder=str(tiny_bert))
    config = json.loads((out / "simtune.json").read_text())
    del config["files"]
    (out / "simtune.json").write_text(json.dumps(config))
    before = _tree(out)
    assert _refused(head, out, tiny_bert) == (
        f"{out}: an export written before simtune recorded the files it writes (its "
        "simtune.json has no `files`), so what it holds beyond them is unknown: not replaced "
        "(export to a new folder, or delete this one yourself)")
    assert _tree(out) == before


def test_the_command_refuses_a_re_export_over_a_users_file_in_one_line(
        head: Path, tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "exB"
    export(head, out, encoder=str(tiny_bert))
    (out / "head" / "MY_NOTES.txt").write_text("mine")
    from tests.cache_helpers import encoder_params
    from tests.conftest import repo_params, write_params

    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    params = write_params(tmp_path / "params.yaml", raw)
    result = CliRunner().invoke(app, ["export", "--head", str(head), "--out", str(out),
                                      "--params", str(params)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"error: {out}: " + FOREIGN.format(what="'head/MY_NOTES.txt'"))
    assert (out / "head" / "MY_NOTES.txt").read_text() == "mine"


def _static_export(out: Path, files: list[str] | None) -> None:
    """A static student's export as `simtune.static.write` lays it out (contents stood in)."""
    for rel in ("0_StaticEmbedding/model.safetensors", "0_StaticEmbedding/tokenizer.json",
                "modules.json", "config_sentence_transformers.json", "README.md"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("x")
    (out / "1_Normalize").mkdir()
    config = {"format_version": 3, "kind": "static", "table": "0_StaticEmbedding",
              "sha256": {}, **({"files": files} if files is not None else {})}
    (out / "simtune.json").write_text(json.dumps(config))


@pytest.mark.parametrize("recorded", [True, False])  # a static export before `files`: its set
def test_a_static_export_is_replaced_by_a_model_export_but_not_over_a_users_file(
        head: Path, tiny_bert: Path, tmp_path: Path, recorded: bool) -> None:
    """Issue 52 item 1: the pipeline's models/export is no longer deleted by DVC first, so
    an export of either kind must replace the other (a change of train.mode), and a file of
    the user's inside a static export's module folder is named (only its top was checked)."""
    out = tmp_path / "out"
    out.mkdir()
    _static_export(out, None)
    files = sorted(p.relative_to(out).as_posix() + ("/" if p.is_dir() else "")
                   for p in out.rglob("*"))
    if recorded:
        _static_export(tmp_path / "again", files)
        shutil.rmtree(out)
        shutil.copytree(tmp_path / "again", out)
    (out / "0_StaticEmbedding" / "notes.txt").write_text("mine")
    assert _refused(head, out, tiny_bert) == f"{out}: " + FOREIGN.format(
        what="'0_StaticEmbedding/notes.txt'")
    assert (out / "0_StaticEmbedding" / "notes.txt").read_text() == "mine"
    (out / "0_StaticEmbedding" / "notes.txt").unlink()
    export(head, out, encoder=str(tiny_bert))
    assert json.loads((out / "simtune.json").read_text())["head"] == "head"
    assert not (out / "0_StaticEmbedding").exists()
