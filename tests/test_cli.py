"""Every command's options with bad values: exit non-zero with one `error:` line (or Typer's own
usage error) naming the bad option or value, never a traceback.

The project is laid out as `dvc.yaml` expects (params.yaml, data/prepared, cache, models/head)
in a temporary directory that is the working directory, so each case passes only its bad value
and every other option keeps its default, which is valid there. Bad values fail before any model
is loaded (search's missing --prepared aside: it loads the tiny encoder first).
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import torch
import typer
from typer.testing import CliRunner

from simtune import heads
from stages import app
from tests.conftest import ROOT, save_tiny_bert
from tests.train_helpers import project

# what each path option is; bad values: a directory for a file, a file for a directory, and a
# missing path for an input ("dir-opt", "file-opt": an input whose absence is not an error)
PATHS = {
    ("check",): {"--params": "file-in", "--out": "file-out"},
    ("prepare",): {"--params": "file-in", "--out": "dir-out", "--report": "file-out"},
    ("cache",): {"--params": "file-in", "--prepared": "dir-in", "--out": "dir-out",
                 "--report": "file-out"},
    ("cache", "verify"): {"--params": "file-in", "--prepared": "dir-in", "--out": "dir-in"},
    ("cache", "gc"): {"--params": "file-in"},
    # groups data needs no cache to mine from (an empty table), and train reads negatives only
    # when train.hard_negatives > 0
    ("negatives",): {"--params": "file-in", "--prepared": "dir-in", "--cache": "dir-opt",
                     "--out": "dir-out", "--report": "file-out"},
    ("train",): {"--params": "file-in", "--prepared": "dir-in", "--cache": "dir-in",
                 "--out": "dir-out", "--report": "file-out", "--metrics": "file-out",
                 "--live": "dir-out", "--negatives": "dir-opt", "--checkpoint": "dir-out"},
    ("evaluate",): {"--params": "file-in", "--prepared": "dir-in", "--cache": "dir-in",
                    "--head": "dir-in", "--out": "file-out", "--metrics": "file-out",
                    "--plot": "file-out",
                    "--detail": "file-out", "--run-trained": "file-out",
                    "--run-baseline": "file-out"},
    ("export",): {"--head": "dir-in", "--out": "dir-out", "--params": "file-in",
                  "--metrics": "file-opt", "--data-report": "file-opt"},
    ("search",): {"--params": "file-in", "--head": "dir-in", "--prepared": "dir-in",
                  "--cache": "dir-opt"},
    ("encode",): {"--model": "dir-in", "--out": "file-out"},
    ("sweep",): {"--params": "file-in", "--prepared": "dir-in", "--cache": "dir-in",
                 "--negatives": "dir-opt"},
    ("compare",): {"--params": "file-in"},
}
# numeric options: values that must be refused (a seed may be any integer); flags need none
INTS = {("cache", "verify"): {"--sample": ["-1", "abc"], "--seed": ["abc"]},
        ("search",): {"--k": ["0", "-1", "abc"]}, ("cache", "gc"): {"--max-gb": ["-1", "abc"]},
        ("encode",): {"--batch-size": ["0", "-1", "abc"]},
        ("sweep",): {"--top": ["0", "-1", "abc"], "--trials": ["0", "-1", "abc"]},
        ("compare",): {"--num": ["0", "-1", "abc"], "--width": ["-1", "abc"]}}
# free-text options (a name): any string is valid there; an empty one is refused by the command
NAMES = {("sweep",): {"--study"}, ("compare",): {"--rev"},
         ("encode",): {"--role"}}  # a choice: Typer refuses any other value
# required arguments (encode's texts file: params.yaml is lines of text)
ARGS = {("search",): ["what is the capital"], ("encode",): ["params.yaml"]}


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """(command path) -> the command object, for every command and subcommand of the app."""
    out: dict[tuple[str, ...], Any] = {}
    ctx = click.Context(group)  # the stage commands are registered lazily: ask the group
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        out[(*prefix, name)] = cmd
        if hasattr(cmd, "commands"):  # a group (Typer vendors its own click classes)
            out.update(_commands(cmd, (*prefix, name)))
    return out


COMMANDS = _commands(typer.main.get_command(app))


def _options(cmd: Any) -> dict[str, Any]:
    return {p.opts[0]: p for p in cmd.params if p.param_type_name == "option"}


def test_every_option_has_bad_values() -> None:
    """A new option must be classified here, so it is walked too."""
    assert sorted(COMMANDS) == sorted(PATHS)
    for path, cmd in COMMANDS.items():
        opts = _options(cmd)
        ints = {o for o, p in opts.items() if p.type_descriptor.annotation in (int, float)}
        flags = {o for o, p in opts.items() if p.type_descriptor.annotation is bool}
        names = NAMES.get(path, set())
        assert names <= set(opts), path
        assert sorted(set(opts) - ints - flags - names) == sorted(PATHS[path]), path
        assert sorted(ints) == sorted(INTS.get(path, {})), path


def _cases() -> list[tuple[tuple[str, ...], str, str]]:
    cases = []
    for path, options in PATHS.items():
        for opt, kind in options.items():
            cases.append((path, opt, "<dir>" if kind.startswith("file") else "<file>"))
            if kind.endswith("-in"):
                cases.append((path, opt, "<missing>"))
        for opt, values in INTS.get(path, {}).items():
            cases += [(path, opt, v) for v in values]
    return cases


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid project at the default paths: params.yaml, data/prepared, cache, models/head."""
    root = tmp_path_factory.mktemp("cli")
    model = save_tiny_bert(root / "bert")
    raw, _ = project(root / "build", model)
    (root / "data").mkdir()
    (root / "build" / "prepared").rename(root / "data" / "prepared")
    (root / "build" / "cache").rename(root / "cache")
    (root / "build" / "params.yaml").rename(root / "params.yaml")
    heads.save(heads.build("linear", 32, 1, 0.0), root / "models" / "head")
    enc = raw["encoders"]
    (root / "models" / "head" / "training.json").write_text(json.dumps({
        "mode": "head", "kind": "groups", "query_encoder": "tiny", "document_encoder": "tiny",
        "encoder": enc["models"]["tiny"]}))
    return root


def _usage_error(stderr: str) -> str | None:
    """The message of Typer's usage error (`Usage: ...` then a boxed `Error`), else None."""
    if not stderr.startswith("Usage:"):
        return None
    box = [line.strip("│ ") for line in stderr.splitlines() if line.startswith("│")]
    return " ".join(box) or None


@pytest.mark.parametrize(("command", "option", "value"), _cases(),
                         ids=lambda x: " ".join(x) if isinstance(x, tuple) else x)
def test_bad_value_gives_one_line(workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  command: tuple[str, ...], option: str, value: str) -> None:
    monkeypatch.chdir(workdir)
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "a_file").write_text("not what was asked for\n")
    bad = {"<dir>": str(tmp_path / "a_dir"), "<file>": str(tmp_path / "a_file"),
           "<missing>": str(tmp_path / "missing" / "x")}.get(value, value)
    result = CliRunner().invoke(app, [*command, *ARGS.get(command, []), option, bad])
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # no traceback
    assert "Traceback" not in result.output
    usage = _usage_error(result.stderr)
    if usage is not None:
        assert result.exit_code == 2 and f"'{option}'" in usage, result.stderr
    else:
        last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
        assert result.exit_code == 1 and last.startswith("error: "), result.output
        assert bad in last, last  # it names the bad path
    assert (tmp_path / "a_file").is_file() and (tmp_path / "a_dir").is_dir()  # left as they were


def test_help_panels_break_lines_only_where_the_width_does() -> None:
    """Issue 36 item 8: a docstring's source line breaks reached `simtune --help`'s command
    panel, cutting sentences mid-line; each entry is now filled to the panel's width."""
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb"}
    out = subprocess.run([sys.executable, "-m", "stages", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    panel = [line.strip("│").rstrip() for line in out.splitlines() if line.startswith("│ ")]
    entries: list[list[str]] = []
    for line in panel:
        if line[1:2].strip():  # a command's name starts an entry
            entries.append([line])
        elif entries:
            entries[-1].append(line)
    assert {e[0].split()[0] for e in entries} >= {"prepare", "negatives", "train", "compare"}
    inner = max(len(line) for line in panel)
    for entry in entries:
        for line, after in itertools.pairwise(entry):
            # the next line's first word would not have fitted on this one
            assert len(line) + 1 + len(after.split()[0]) > inner - 1, entry


def test_unknown_command_and_option_are_usage_errors(workdir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    for args, fragment in ((["trian"], "No such command 'trian'"),
                           (["train", "--lr", "1"], "No such option: --lr")):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and fragment in (_usage_error(result.stderr) or ""), (
            result.stderr)


@pytest.mark.parametrize(("args", "reason"), [
    (["prepare", "--report", "{file}/prepare.json"], "{file}: File exists"),
    # export checks its folder before any work (`simtune.export.destination`)
    (["export", "--out", "{file}/export"],
     "{file}/export: {file} is a file, not a folder; export to a folder"),
])
def test_an_output_under_a_file_is_one_line(workdir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch, args: list[str],
                                            reason: str) -> None:
    """The OS refuses to create the output: one line naming the path, nothing else written."""
    monkeypatch.chdir(workdir)
    (tmp_path / "a_file").write_text("x")
    before = sorted(p.name for p in workdir.rglob("*"))
    result = CliRunner().invoke(app, [a.format(file=tmp_path / "a_file") for a in args])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.strip().splitlines()[-1] == "error: " + reason.format(
        file=tmp_path / "a_file")
    assert sorted(p.name for p in workdir.rglob("*")) == before


def _bad_weights(root: Path, how: str) -> Path:
    """The tiny encoder with weights transformers cannot load: saved with torch.save(model) (a
    pickle of a module, not a state dict), or a truncated safetensors file."""
    import transformers

    model_dir = save_tiny_bert(root / how)
    weights = model_dir / "model.safetensors"
    if how == "pickled":
        model = transformers.AutoModel.from_pretrained(model_dir)
        weights.unlink()
        torch.save(model, model_dir / "pytorch_model.bin")
    else:
        weights.write_bytes(weights.read_bytes()[:1000])
    return model_dir


@pytest.mark.parametrize(("how", "reason"), [
    ("pickled", "its pickled weights (*.bin) hold more than tensors, so torch will not load "
                "them safely; re-save the model with save_pretrained() (safetensors)"),
    ("truncated", "corrupt or truncated safetensors weights (Error while deserializing header: "
                  "invalid header length)"),
])
def test_unloadable_weights_are_one_line(workdir: Path, tmp_path: Path, how: str,
                                         reason: str) -> None:
    import yaml

    raw = yaml.safe_load((workdir / "params.yaml").read_text())
    model_dir = _bad_weights(tmp_path, how)
    raw["encoders"]["models"]["tiny"]["model"] = str(model_dir)
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["cache", "--params", str(params_file), "--prepared",
                                      str(workdir / "data" / "prepared"), "--out",
                                      str(tmp_path / "cache")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: encoders.models.tiny.model: {model_dir}: cannot load: {reason}")
    assert not (tmp_path / "cache" / "tiny").exists() or not list(
        (tmp_path / "cache" / "tiny").glob("*.arrow"))


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--params", "data"], "Invalid value for '--params'"),
    (["cache", "verify", "--sample", "-1"], "Invalid value for '--sample'"),
])
def test_real_process_prints_no_traceback(workdir: Path, args: list[str], message: str) -> None:
    """The two reported tracebacks, in a real process (what DVC shows)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "stages", *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert message in (_usage_error(proc.stderr) or ""), proc.stderr


def test_the_train_commands_summary_names_every_mode() -> None:
    """`simtune --help` lists `train` by its help's first paragraph: it names every
    `train.mode` of the schema (it said "Train a head on the cached embeddings"), and what
    `auto` picks among them."""
    import typing

    from simtune.params import TrainParams
    from stages import unwrap

    modes = typing.get_args(TrainParams.model_fields["mode"].annotation)
    summary = unwrap(typer.main.get_command(importlib.import_module("stages.train").app).help)
    first = summary.split("\n\n")[0]
    assert set(modes) == {"auto", "head", "top_layers", "full", "static"}
    assert all(re.search(rf"\b{m}\b", first) for m in modes if m != "auto"), first
    assert "auto picks full, top_layers or head" in first
