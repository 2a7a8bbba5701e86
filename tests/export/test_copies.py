"""An export holds its head twice: `head/` (what `load_model` runs) and the sentence-transformers
`Dense` modules (what `SentenceTransformer(dir)` runs). simtune.json records the sha256 of every
file of both copies, and whatever simtune reads an export with (`load_model`, a distillation
teacher) refuses a copy that changed, in one line (issue 35 item 3); so it does every other file
that decides how sentence-transformers computes a vector: modules.json, the module configs
(issue 44 item 3)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from simtune.errors import UserError
from simtune.export.stage import export
from simtune.model import load_encoder, load_model
from simtune.params import EncoderParams
from tests.export.test_export import TEXTS, _head_dir


@pytest.fixture
def exported(tiny_bert: Path, tmp_path: Path) -> Path:
    head = _head_dir(tmp_path, tiny_bert, "mlp", True)
    out = tmp_path / "export"
    export(head, out, encoder=str(tiny_bert))
    return out


def _dense(out: Path) -> list[str]:
    return [m["path"] for m in json.loads((out / "modules.json").read_text())
            if m["type"].endswith(".Dense")]


def test_simtune_json_records_every_file_of_both_copies(exported: Path) -> None:
    recorded = json.loads((exported / "simtune.json").read_text())["sha256"]
    dense = _dense(exported)
    assert len(dense) == 2  # the mlp: two Dense modules
    # with every other file that decides a vector (issue 44 item 3)
    files = sorted([p.relative_to(exported).as_posix() for folder in ("head", *dense, "1_Pooling")
                    for p in (exported / folder).rglob("*") if p.is_file()]
                   + ["modules.json", "config_sentence_transformers.json",
                      "encoder/sentence_bert_config.json"])
    assert sorted(recorded) == files
    assert "head/model.safetensors" in files and f"{dense[0]}/model.safetensors" in files
    assert recorded == {f: hashlib.sha256((exported / f).read_bytes()).hexdigest()
                        for f in files}


def _edit_dense(out: Path) -> Path:
    from safetensors.torch import load_file, save_file

    path = out / _dense(out)[0] / "model.safetensors"
    weights = load_file(str(path))
    weights["linear.weight"][0, 0] += 0.25
    save_file(weights, str(path))
    return path


def test_edited_dense_weights_are_refused_in_one_line(exported: Path) -> None:
    path = _edit_dense(exported)
    with pytest.raises(UserError) as e:
        load_model(exported, "cpu")
    assert str(e.value) == (
        f"{path}: changed since the export (its sha256 is not simtune.json's): the export's "
        "two copies of the head (head/ for simtune, the Dense modules for sentence-transformers) "
        "may no longer agree; export again")


def test_edited_head_weights_are_refused_in_one_line(exported: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = exported / "head" / "model.safetensors"
    weights = load_file(str(path))
    save_file({k: v + 0.01 for k, v in weights.items()}, str(path))
    with pytest.raises(UserError, match=r"head/model.safetensors: changed since the export"):
        load_model(exported, "cpu")


def test_an_unrecorded_or_missing_copy_is_refused(exported: Path) -> None:
    config_path = exported / "simtune.json"
    config = json.loads(config_path.read_text())
    dense = _dense(exported)[1]
    del config["sha256"][f"{dense}/model.safetensors"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(UserError) as e:
        load_model(exported, "cpu")
    assert str(e.value) == (f"{exported / dense / 'model.safetensors'}: a copy of the head that "
                            f"{config_path} does not record (sha256); export again")
    config["sha256"][f"{dense}/model.safetensors"] = "0" * 64
    config["sha256"]["9_Dense/model.safetensors"] = "0" * 64
    config_path.write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"9_Dense/model.safetensors: missing \(.*simtune.json "
                                        r"records it\)"):
        load_model(exported, "cpu")


def test_a_recorded_path_leaving_the_folder_is_refused(exported: Path) -> None:
    config_path = exported / "simtune.json"
    config = json.loads(config_path.read_text())
    config["sha256"]["../outside"] = "0" * 64
    config_path.write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"simtune.json: sha256: '../outside' leads outside"):
        load_model(exported, "cpu")


def test_a_teacher_export_with_an_edited_copy_is_refused(exported: Path) -> None:
    spec = EncoderParams.model_validate({**json.loads(
        (exported / "simtune.json").read_text())["encoder"], "model": str(exported)})
    load_encoder("teacher", spec, torch.device("cpu")).encode(TEXTS[:2], 2)  # intact: loads
    path = _edit_dense(exported)
    with pytest.raises(UserError, match=f"{path}: changed since the export"):
        load_encoder("teacher", spec, torch.device("cpu"))


def test_an_export_without_hashes_still_loads(exported: Path) -> None:
    """Exports written before the hashes (no `sha256` key) load as before."""
    config_path = exported / "simtune.json"
    config = json.loads(config_path.read_text())
    del config["sha256"]
    config_path.write_text(json.dumps(config))
    assert load_model(exported, "cpu").encode(TEXTS[:2]).shape == (2, 32)


# --- issue 44 item 3: every file that decides how sentence-transformers computes a vector is
# recorded (sha256) and checked, not only the head's weights ---------------------------------

def _json_edit(rel: str, change: Any) -> Any:
    def edit(folder: Path) -> None:
        path = folder / rel
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return edit


DECISIVE = {  # an edit that check_st_files lets through, and the file it changed
    "modules.json: the last Normalize dropped": ("modules.json", lambda m: m[:-1]),
    "sentence_bert_config.json: lower case": ("encoder/sentence_bert_config.json",
                                              lambda c: {**c, "do_lower_case": True}),
    "config_sentence_transformers.json: truncate_dim": (
        "config_sentence_transformers.json", lambda c: {**c, "truncate_dim": 8}),
    "Pooling: a weighted mean too": ("1_Pooling/config.json",
                                     lambda c: {**c, "pooling_mode_weightedmean_tokens": True}),
}
CHANGED = ("{path}: changed since the export (its sha256 is not simtune.json's): "
           "sentence-transformers would no longer compute simtune's vectors; export again")


@pytest.mark.parametrize("case", sorted(DECISIVE))
def test_an_edited_file_that_decides_the_vectors_is_refused(exported: Path, tmp_path: Path,
                                                            case: str) -> None:
    rel, change = DECISIVE[case]
    folder = tmp_path / "edited"
    shutil.copytree(exported, folder)
    _json_edit(rel, change)(folder)
    with pytest.raises(UserError) as e:
        load_model(folder, "cpu")
    assert str(e.value) == CHANGED.format(path=folder / rel)
    recorded = json.loads((exported / "simtune.json").read_text())["sha256"]
    assert recorded[rel] == hashlib.sha256((exported / rel).read_bytes()).hexdigest()


def test_dropping_the_last_normalize_parts_the_vectors_and_is_refused(exported: Path,
                                                                      tmp_path: Path) -> None:
    """The tester's edit: plain sentence-transformers then gives other vectors than simtune."""
    st = pytest.importorskip("sentence_transformers")
    folder = tmp_path / "edited"
    shutil.copytree(exported, folder)
    _json_edit("modules.json", lambda m: m[:-1])(folder)
    want = load_model(exported, "cpu").encode(TEXTS)
    got = torch.as_tensor(st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS))
    assert (got - want).abs().max() > 0.05  # what the record guards against
    with pytest.raises(UserError, match=r"modules.json: changed since the export"):
        load_model(folder, "cpu")


def test_an_unrecorded_file_that_decides_the_vectors_is_refused(exported: Path) -> None:
    config_path = exported / "simtune.json"
    config = json.loads(config_path.read_text())
    del config["sha256"]["1_Pooling/config.json"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(UserError) as e:
        load_model(exported, "cpu")
    assert str(e.value) == (f"{exported / '1_Pooling/config.json'}: decides how "
                            f"sentence-transformers computes a vector, but {config_path} does "
                            "not record it (sha256); export again")


def test_an_export_without_the_record_of_its_files_checks_the_head_copies_only(
        exported: Path) -> None:
    """Exports written before `files` hashed the head's copies only: they load as before."""
    config_path = exported / "simtune.json"
    config = json.loads(config_path.read_text())
    del config["files"]
    config["sha256"] = {k: v for k, v in config["sha256"].items()
                        if k.startswith(("head/", "2_Dense/", "3_Dense/"))}
    config_path.write_text(json.dumps(config))
    want = load_model(exported, "cpu").encode(TEXTS)
    _json_edit("1_Pooling/config.json", lambda c: {**c, "word_embedding_dimension": 32})(exported)
    assert torch.equal(load_model(exported, "cpu").encode(TEXTS), want)
