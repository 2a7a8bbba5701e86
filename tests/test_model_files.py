"""Model folders (issue 19): a model directory with missing, unexpected or mis-shaped weights is
refused (item 2); a head or export folder loads nothing from outside itself (item 6); damaged head
and export JSON is one line (item 7); a tokenizer.json nested 200,000 deep is one line (item 8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from simtune import heads, model_files
from simtune.encoders import FrozenEncoder, load_pretrained
from simtune.errors import UserError, echo
from simtune.export.stage import export
from simtune.layers import top_model
from simtune.model import load_model
from simtune.params import EncoderParams
from simtune.train.represent import LiveEncoder
from tests.cache_helpers import encoder_params, sentences
from tests.conftest import save_tiny_bert

TEXTS = sentences(5)


POOLING_CHOICE = "Input should be 'mean', 'cls', 'max' or 'lasttoken', got 'bogus'"

def _spec(model: Path) -> EncoderParams:
    return EncoderParams(**encoder_params(model)["models"]["tiny"])


def _encode(model: Path) -> torch.Tensor:
    return FrozenEncoder("tiny", _spec(model), torch.device("cpu")).encode(TEXTS, 4)


def _copy(tiny_bert: Path, dest: Path) -> Path:
    shutil.copytree(tiny_bert, dest)
    return dest


def _edit_weights(folder: Path, edit: Any) -> None:
    weights = load_file(folder / "model.safetensors")
    save_file(edit(weights), folder / "model.safetensors", metadata={"format": "pt"})


def _edit_json(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _rehash(folder: Path) -> None:
    """Record the sha256 of the export's files as they are now: an export written with the
    settings a test edited in (the record would refuse the edit first: tests/export/
    test_copies.py), so the check the test is about is reached."""
    from simtune.st_files import sha256_file

    config = folder / "simtune.json"
    recorded = json.loads(config.read_text())["sha256"]
    _edit_json(config, sha256={rel: sha256_file(folder / rel) for rel in recorded})


# --- item 2: weights that do not fit the config are an error, not random numbers -------------


def test_item2_missing_layer_weights_are_refused_by_every_loader(tiny_bert: Path,
                                                                 tmp_path: Path) -> None:
    """`encoder.layer.1.*` dropped: transformers would fill layer 1 at random (different vectors
    on each load). The cache's encoder, top_layers' top model and full mode's encoder all go
    through `load_pretrained` and refuse it, naming the folder and the first keys."""
    folder = _copy(tiny_bert, tmp_path / "dropped")
    _edit_weights(folder, lambda w: {k: v for k, v in w.items()
                                     if not k.startswith("encoder.layer.1.")})
    want = (f"encoders.models.tiny.model: {folder}: the weights do not fit its config.json "
            "(bert): 16 missing weights (encoder.layer.1.attention.output.LayerNorm.bias, "
            "encoder.layer.1.attention.output.LayerNorm.weight, "
            "encoder.layer.1.attention.output.dense.bias, ...)")
    with pytest.raises(UserError) as e:
        _encode(folder)
    assert str(e.value) == want
    with pytest.raises(UserError, match=r"^train.mode top_layers: .*16 missing weights"):
        top_model(folder, 1)
    with pytest.raises(UserError, match=r"^train.mode full: .*16 missing weights"):
        LiveEncoder(folder, _spec(folder), None, True)


def test_item2_another_model_type_is_refused(tiny_bert: Path, tmp_path: Path) -> None:
    """`"model_type": "gpt2"` in a BERT's config.json: a GPT-2 of random weights."""
    folder = _copy(tiny_bert, tmp_path / "gpt2")
    _edit_json(folder / "config.json", model_type="gpt2")
    with pytest.raises(UserError) as e:
        _encode(folder)
    msg = str(e.value)
    assert msg.startswith(f"encoders.models.tiny.model: {folder}: the weights do not fit its "
                          "config.json (gpt2): 28 missing weights (h.0.attn.c_attn.bias, ")
    # BERT's own weights are not GPT-2 modules: another architecture's, not counted as unexpected
    assert msg.endswith("h.0.attn.c_proj.bias, ...)") and "unexpected" not in msg


def test_item2_mis_shaped_and_extra_layer_weights_are_refused(tiny_bert: Path,
                                                              tmp_path: Path) -> None:
    shaped = _copy(tiny_bert, tmp_path / "shaped")
    key = "encoder.layer.0.attention.self.query.weight"
    _edit_weights(shaped, lambda w: {**w, key: torch.zeros(32, 16)})
    with pytest.raises(UserError, match=rf"1 mis-shaped weights \({key}\)$"):
        _encode(shaped)
    one_layer = _copy(tiny_bert, tmp_path / "one-layer")  # the config says 1, the file has 2
    _edit_json(one_layer / "config.json", num_hidden_layers=1)
    with pytest.raises(UserError, match=r": 16 unexpected weights \(encoder\.layer\.1\."):
        _encode(one_layer)


def test_item2_a_task_checkpoint_still_loads_with_the_same_vectors(tiny_bert: Path,
                                                                   tmp_path: Path) -> None:
    """A BertForMaskedLM checkpoint (how many encoders are published): its `cls.*` head is
    another architecture's (unused), its missing pooler is never used by simtune's pooling; the
    vectors equal those of the same encoder weights saved as a plain BertModel."""
    import transformers

    base, _ = load_pretrained(tiny_bert, "x", tokenizer=False)
    mlm = transformers.BertForMaskedLM(base.config)
    mlm.bert.load_state_dict(base.state_dict(), strict=False)  # the mlm has no pooler
    folder = tmp_path / "mlm"
    mlm.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_bert / name, folder / name)
    assert any(k.startswith("cls.") for k in load_file(folder / "model.safetensors"))
    assert torch.equal(_encode(folder), _encode(tiny_bert))


def test_item2_nothing_is_written_before_the_refusal(tiny_bert: Path, tmp_path: Path,
                                                      _own_store: Path) -> None:
    """The cache fill refuses the folder before it creates a view or a store entry."""
    from simtune import params as P
    from simtune.cache import stage as cache
    from simtune.prepare import stage as prepare
    from simtune.prepare.prepared import write as write_prepared
    from tests.train_helpers import train_raw

    folder = _copy(tiny_bert, tmp_path / "dropped")
    _edit_weights(folder, lambda w: {k: v for k, v in w.items()
                                     if not k.startswith("encoder.layer.1.")})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": f"L{i % 4}"}) + "\n"
                            for i, t in enumerate(sentences(40))))
    p = P.validate(train_raw(folder, data))
    write_prepared(prepare.build(p.prepare), tmp_path / "prepared", tmp_path / "prepare.json")
    with pytest.raises(UserError, match=r"16 missing weights \(encoder\.layer\.1\."):
        cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.arrow"))
    assert not _own_store.exists() or not any(_own_store.rglob("*.arrow"))


# --- item 8: a tokenizer.json nested 200,000 deep ---------------------------------------------


def test_item8_deeply_nested_tokenizer_json_is_one_line(tiny_bert: Path, tmp_path: Path) -> None:
    folder = _copy(tiny_bert, tmp_path / "deep")
    (folder / "tokenizer.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(UserError) as e:
        _encode(folder)
    assert str(e.value) == (f"encoders.models.tiny.model: {folder}: cannot load: a JSON file "
                            "(config.json, tokenizer.json, ...) is nested too deep to read")


def test_item8_deeply_nested_head_json_is_one_line(tmp_path: Path) -> None:
    heads.save(heads.build("linear", 4, 2, 0.0), tmp_path)
    (tmp_path / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(UserError, match=r"config.json: JSON nested too deep$"):
        heads.load(tmp_path)


# --- item 7: damaged head / export JSON, one checked schema each ------------------------------


HEAD_DAMAGE = {  # config.json edit -> the one line's end
    "type bogus": ({"type": "bogus"}, "type: Input should be 'identity', 'linear', "
                   "'skip_connection', 'gated' or 'mlp', got 'bogus'"),
    "expansion a string": ({"expansion": "2"}, "expansion: Input should be a valid integer, "
                           "got '2'"),
    "expansion negative": ({"expansion": -1}, "expansion: Input should be greater than or equal "
                           "to 1, got -1"),
    "dim a float": ({"dim": 32.0}, "dim: Input should be a valid integer, got 32.0"),
    "dim 64": ({"dim": 64}, "model.safetensors: weight net.0.bias is (64,), a mlp head of dim 64 "
               "(config.json) needs (128,)"),
}


@pytest.mark.parametrize("case", sorted(HEAD_DAMAGE))
def test_item7_damaged_head_config_is_one_line(tmp_path: Path, case: str) -> None:
    edit, end = HEAD_DAMAGE[case]
    heads.save(heads.build("mlp", 32, 2, 0.0), tmp_path)
    _edit_json(tmp_path / "config.json", **edit)
    with pytest.raises(UserError) as e:
        heads.load(tmp_path)
    where = "" if case == "dim 64" else "config.json: "
    got = str(e.value)
    assert got.startswith(str(tmp_path)) and got.endswith(where + end), got
    assert "\n" not in got


def test_item7_head_config_that_is_a_list_or_not_json(tmp_path: Path) -> None:
    heads.save(heads.build("linear", 4, 2, 0.0), tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(UserError, match=r"config.json: expected a JSON object, got list$"):
        heads.load(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(UserError, match=r"config.json: not JSON: Expecting property name"):
        heads.load(tmp_path)


def _head(root: Path, tiny_bert: Path, **meta: Any) -> Path:
    """A head folder as train writes it (head mode over the tiny encoder)."""
    heads.save(heads.build("linear", 32, 2, 0.0), root)
    enc = encoder_params(tiny_bert)["models"]["tiny"]
    (root / "training.json").write_text(json.dumps({
        "mode": "head", "kind": "groups", "query_encoder": "tiny", "document_encoder": "tiny",
        "encoder": enc, "normalize_output": True, **meta}))
    return root


def _error(call: Any) -> str:
    """The one line of the `UserError` that `call()` raises."""
    with pytest.raises(UserError) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_item7_damaged_training_and_simtune_json_are_one_line(tiny_bert: Path,
                                                              tmp_path: Path) -> None:
    head = _head(tmp_path / "head", tiny_bert)
    export(head, tmp_path / "export", encoder=str(tiny_bert))
    meta = head / "training.json"
    good = meta.read_text()
    meta.write_text("not json")
    for call in (lambda: load_model(head, "cpu", encoder=str(tiny_bert)),
                 lambda: export(head, tmp_path / "e2", encoder=str(tiny_bert))):
        assert _error(call) == f"{meta}: not JSON: Expecting value (line 1, column 1)"
    meta.write_text(good.replace('"pooling": "mean"', '"pooling": "bogus"'))
    assert _error(lambda: load_model(head, "cpu", encoder=str(tiny_bert))) == (
        f"{meta}: encoder.pooling: {POOLING_CHOICE}")
    config = tmp_path / "export" / "simtune.json"
    good = config.read_text()
    config.write_text(good.replace('"pooling": "mean"', '"pooling": "bogus"'))
    assert _error(lambda: load_model(tmp_path / "export", "cpu")) == (
        f"{config}: encoder.pooling: {POOLING_CHOICE}")
    config.write_text("[]")
    assert _error(lambda: load_model(tmp_path / "export", "cpu")) == (
        f"{config}: expected a JSON object, got list")
    assert not (tmp_path / "e2").exists()


# --- item 6: a model folder never loads files from outside itself -----------------------------


def test_item6_export_paths_outside_the_folder_are_refused(tiny_bert: Path,
                                                           tmp_path: Path) -> None:
    head = _head(tmp_path / "head", tiny_bert)
    out = tmp_path / "export"
    export(head, out, encoder=str(tiny_bert))
    want = load_model(out, "cpu").encode(TEXTS)
    other = _copy(tiny_bert, tmp_path / "other" / "encoder")
    shutil.copytree(head, tmp_path / "other" / "head")
    config = out / "simtune.json"
    good = json.loads(config.read_text())
    cases = {  # edit -> the refused key and value
        "absolute encoder": ({"encoder": {**good["encoder"], "model": str(other)}},
                             f"encoder.model: {echo(str(other))} must be a path inside {out}"),
        "encoder above": ({"encoder": {**good["encoder"], "model": "../other/encoder"}},
                          "encoder.model: '../other/encoder' leads outside"),
        "head above": ({"head": "../other/head"}, "head: '../other/head' leads outside"),
    }
    for edit, message in cases.values():
        config.write_text(json.dumps({**good, **edit}))
        with pytest.raises(UserError) as e:
            load_model(out, "cpu")
        assert str(e.value).startswith(f"{config}: {message}"), str(e.value)
    config.write_text(json.dumps(good))
    link = tmp_path / "export-link"  # a symlinked encoder/ that leaves the folder
    shutil.copytree(out, link, ignore=shutil.ignore_patterns("encoder"))
    (link / "encoder").symlink_to(other, target_is_directory=True)
    with pytest.raises(UserError, match=r"encoder\.model: 'encoder' leads outside"):
        load_model(link, "cpu")
    assert torch.equal(load_model(out, "cpu").encode(TEXTS), want)  # the folder itself: fine


def test_item6_a_head_folder_follows_its_training_json_only_when_the_params_agree(
        tiny_bert: Path, tmp_path: Path) -> None:
    """training.json's `encoder.model` lies outside the head folder (head mode): it is used
    only when the caller's params name the same encoder; `../other/encoder` or an absolute
    path of the folder's own choosing is refused, by load_model and by export."""
    other = save_tiny_bert(tmp_path / "other" / "encoder", seed=5)
    head = _head(tmp_path / "head", tiny_bert)
    want = load_model(head, "cpu", encoder=str(tiny_bert)).encode(TEXTS)
    meta = head / "training.json"
    assert _error(lambda: load_model(head, "cpu")) == (
        f"{meta}: encoder.model '{tiny_bert}' is outside the head folder: load the export "
        "(simtune export), or pass that encoder: load_model(dir, encoder=...)")
    for planted in ("../other/encoder", str(other)):
        _edit_json(meta, encoder={**json.loads(meta.read_text())["encoder"], "model": planted})
        for call in (lambda: load_model(head, "cpu", encoder=str(tiny_bert)),
                     lambda: export(head, tmp_path / "export", encoder=str(tiny_bert))):
            assert _error(call) == (f"{meta}: encoder.model {echo(planted)} is outside the head "
                                    f"folder and is not the encoder the params name "
                                    f"('{tiny_bert}')")
    assert not (tmp_path / "export").exists()
    _edit_json(meta, encoder={**json.loads(meta.read_text())["encoder"], "model": str(tiny_bert)})
    assert torch.equal(load_model(head, "cpu", encoder=str(tiny_bert)).encode(TEXTS), want)


def test_inside_resolves_within_and_refuses_escapes(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert model_files.inside(tmp_path / "a", "b", "w") == tmp_path / "a" / "b"
    assert model_files.inside(tmp_path / "a", "b/../b", "w") == tmp_path / "a" / "b/../b"
    for bad in ("..", "b/../..", "/etc", ""):
        with pytest.raises(UserError, match=r"^w: "):
            model_files.inside(tmp_path / "a", bad, "w")


# --- issue 28: prompts and model folders ------------------------------------------------------


@pytest.mark.parametrize("role", ["query", "document"])
def test_item2_a_model_folders_prompt_leaving_too_few_tokens_refused(tiny_bert: Path,
                                                                     tmp_path: Path,
                                                                     role: str) -> None:
    """A prompt read from an export's simtune.json (what `simtune search` and `load_model`
    use) that leaves too little of the window is refused at load, naming the file's key."""
    head = _head(tmp_path / "head", tiny_bert)
    out = tmp_path / "export"
    export(head, out, encoder=str(tiny_bert))
    config = out / "simtune.json"
    good = json.loads(config.read_text())
    prompts = {"query": "", "document": "", "include_prompt": True, role: "the " * 40}
    config.write_text(json.dumps({**good, "encoder": {**good["encoder"], "prompts": prompts}}))
    _edit_json(out / "config_sentence_transformers.json", default_prompt_name="query",
               prompts={"query": prompts["query"], "document": prompts["document"]})
    _rehash(out)
    assert _error(lambda: load_model(out, "cpu")) == (
        f"{config}: encoder.prompts.{role}: the prompt is 40 tokens, leaving 0 of max_length 32 "
        "for the text (2 special tokens); at least 15 are needed (half the window): shorten the "
        "prompt or raise max_length")


# --- issue 28, model folders as a hostile tester finds them: one line naming the file, never a
# traceback, never a path or link followed out of the folder --------------------------------


@pytest.fixture(scope="module")
def exported(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export of a linear head over the tiny encoder (no prompts), copied by each case."""
    root = tmp_path_factory.mktemp("exported")
    export(_head(root / "head", tiny_bert), root / "export", encoder=str(tiny_bert))
    return root / "export"


def _damaged(exported: Path, dest: Path, edit: Any) -> Path:
    """A copy of `exported` at `dest` with `edit(folder)` applied."""
    shutil.copytree(exported, dest)
    edit(dest)
    return dest


def _json_edit(name: str, change: Any) -> Any:
    def edit(folder: Path) -> None:
        path = folder / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return edit


ST_FILES = {  # edit of an export's sentence-transformers files -> (file, the line's rest)
    "modules.json absolute": (_json_edit("modules.json", lambda m: [
        {**m[0], "path": "/etc"}, *m[1:]]), "modules.json", "0.path: '/etc' must be a path "
        "inside {folder}"),
    "modules.json above": (_json_edit("modules.json", lambda m: [
        *m[:1], {**m[1], "path": "../1_Pooling"}, *m[2:]]), "modules.json", "1.path: "
        "'../1_Pooling' leads outside {folder}; a model folder only loads files from inside "
        "itself"),
    "modules.json an object": (_json_edit("modules.json", lambda m: {"0": m[0]}),
                               "modules.json", "expected a JSON array, got dict"),
    "modules.json path a number": (_json_edit("modules.json", lambda m: [{**m[0], "path": 0}]),
                                   "modules.json", "0.path: Input should be a valid string, "
                                   "got 0"),
    "pooling not simtune's": (_json_edit("1_Pooling/config.json", lambda c: {
        **c, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}),
        "1_Pooling/config.json", "pooling modes ['cls'] are not simtune.json's pooling 'mean'"),
    "include_prompt not simtune's": (_json_edit("1_Pooling/config.json", lambda c: {
        **c, "include_prompt": False}), "1_Pooling/config.json", "include_prompt False is not "
        "simtune.json's True"),
    "max_seq_length not simtune's": (_json_edit("encoder/sentence_bert_config.json", lambda c: {
        **c, "max_seq_length": 128}), "encoder/sentence_bert_config.json", "max_seq_length 128 "
        "is not simtune.json's max_length 32"),
    "prompt a number": (_json_edit("config_sentence_transformers.json", lambda c: {
        **c, "prompts": {"query": 3}}), "config_sentence_transformers.json",
        "prompts.query: Input should be a valid string, got 3"),
    "prompts a list": (_json_edit("config_sentence_transformers.json", lambda c: {
        **c, "prompts": ["query: "]}), "config_sentence_transformers.json",
        "prompts: Input should be a valid dictionary, got ['query: ']"),
    "prompts not simtune's": (_json_edit("config_sentence_transformers.json", lambda c: {
        **c, "prompts": {"query": "q: ", "document": ""}, "default_prompt_name": "query"}),
        "config_sentence_transformers.json", "prompts {'query': 'q: ', 'document': ''} are not "
        "simtune.json's {}: sentence-transformers would embed with other prompts"),
}


@pytest.mark.parametrize("case", sorted(ST_FILES))
def test_model_folder_sentence_transformers_files_are_checked(exported: Path, tmp_path: Path,
                                                              case: str) -> None:
    """`load_model` ignored the sentence-transformers files, so a folder whose modules lead
    elsewhere, whose prompts are of the wrong type or not simtune.json's, or whose pooling or
    truncation is not simtune.json's, loaded: `SentenceTransformer(dir)` then loads other
    files, embeds otherwise than `load_model`, or fails."""
    edit, name, rest = ST_FILES[case]
    folder = _damaged(exported, tmp_path / "export", edit)
    assert _error(lambda: load_model(folder, "cpu")) == (
        f"{folder / name}: {rest.replace('{folder}', str(folder))}")


def test_model_folder_prompts_of_simtune_json_must_be_the_st_configs(tiny_bert: Path,
                                                                     tmp_path: Path) -> None:
    """An export with prompts loads (its files agree); a default prompt other than `query` is
    refused: plain `encode()` would embed as a document where `load_model` embeds a query."""
    head = _head(tmp_path / "head", tiny_bert)
    meta = head / "training.json"
    prompts = {"query": "what is ", "document": "the ", "include_prompt": True}
    _edit_json(meta, encoder={**json.loads(meta.read_text())["encoder"], "prompts": prompts})
    out = tmp_path / "export"
    export(head, out, encoder=str(tiny_bert))
    want = load_model(out, "cpu").encode(TEXTS, role="document")
    config = out / "config_sentence_transformers.json"
    written = config.read_bytes()
    _edit_json(config, default_prompt_name="document")
    assert _error(lambda: load_model(out, "cpu")) == (
        f"{config}: default_prompt_name 'document' must be 'query': plain encode() embeds as a "
        "query")
    config.write_bytes(written)
    assert torch.equal(load_model(out, "cpu").encode(TEXTS, role="document"), want)


@pytest.mark.parametrize("link", ["encoder/model.safetensors", "encoder/tokenizer.json",
                                  "head/config.json", "head/model.safetensors"])
def test_model_folder_links_leading_outside_are_refused(exported: Path, tmp_path: Path,
                                                        link: str) -> None:
    """A file of the folder replaced by a symbolic link to a file elsewhere (here: the same
    bytes, so nothing else would notice) was followed; a link inside the folder still loads."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def relink(folder: Path) -> None:
        shutil.copy(folder / link, outside / "file")
        (folder / link).unlink()
        (folder / link).symlink_to(outside / "file")

    folder = _damaged(exported, tmp_path / "export", relink)
    assert _error(lambda: load_model(folder, "cpu")) == (
        f"{folder / link}: a link leading outside {folder}; a model folder only loads files "
        "from inside itself")
    inner = _damaged(exported, tmp_path / "inner", lambda f: (
        shutil.move(f / link, f / "kept"), (f / link).symlink_to(f / "kept")))
    assert torch.equal(load_model(inner, "cpu").encode(TEXTS),
                       load_model(exported, "cpu").encode(TEXTS))


def _header(length: int, body: bytes = b"") -> bytes:
    """A safetensors file's start: the little-endian u64 header length, then `body`."""
    import struct

    return struct.pack("<Q", length) + body


SAFETENSORS = {  # bytes -> the end of safetensors' own reason
    "garbage": (b"garbage", "header too small"),
    "empty": (b"", "header too small"),
    "a header of 2^62 bytes": (_header(1 << 62), "header too large"),
    "a header past the end": (_header(90_000_000, b"{"), "invalid header length"),
    "a header not JSON": (_header(10, b"{not json}"), "invalid JSON in header: key must be a "
                          "string at line 1 column 2"),
    "offsets past the end": (_header(80, json.dumps({"x": {
        "dtype": "F32", "shape": [32, 32], "data_offsets": [0, 4096]}}).ljust(80).encode()),
        "incomplete metadata, file not fully covered"),
}


@pytest.mark.parametrize("case", sorted(SAFETENSORS))
@pytest.mark.parametrize("where", ["encoder", "head"])
def test_model_folder_damaged_or_huge_safetensors_header_is_one_line(
        exported: Path, tmp_path: Path, case: str, where: str) -> None:
    data, reason = SAFETENSORS[case]
    folder = _damaged(exported, tmp_path / "export",
                      lambda f: (f / where / "model.safetensors").write_bytes(data))
    got = _error(lambda: load_model(folder, "cpu"))
    if where == "head":
        assert got.startswith(f"{folder}/head/model.safetensors: cannot read: "), got
    else:
        assert got.startswith(f"{folder}/simtune.json: encoder.model: {folder}/encoder: cannot "
                              "load: corrupt or truncated safetensors weights ("), got
    assert reason[:40] in got, got


ENCODER_DAMAGE = {  # edit of the export's encoder/ -> the end of the line
    "tokenizer.json a list": (lambda f: (f / "encoder/tokenizer.json").write_text("[]"),
                              "cannot load: TypeError: 'str' object cannot be interpreted as an "
                              "integer"),
    "config.json a list": (lambda f: (f / "encoder/config.json").write_text("[1]"),
                           "cannot load: TypeError: transformers.configuration_utils."
                           "PreTrainedConfig() argument after ** must be a mapping, not list"),
    "hidden_size a string": (_json_edit("encoder/config.json", lambda c: {
        **c, "hidden_size": "32"}), "cannot load: StrictDataclassFieldValidationError: "
        "Validation error for field 'hidden_size':"),
    "config.json a folder": (lambda f: ((f / "encoder/config.json").unlink(),
                                        (f / "encoder/config.json").mkdir()),
                             "not a Hugging Face model directory (no config.json)"),
    "no tokenizer files": (lambda f: [(f / "encoder" / n).unlink() for n in (
        "tokenizer.json", "tokenizer_config.json")], "its tokenizer knows only its 5 special "
        "tokens (no tokenizer.json, vocab.txt, ... in the folder?): every word would be unknown"),
    "max_length past the positions": (lambda f: (_json_edit("simtune.json", lambda c: {
        **c, "encoder": {**c["encoder"], "max_length": 1000}})(f), _json_edit(
            "encoder/sentence_bert_config.json", lambda c: {**c, "max_seq_length": 1000})(f),
        _rehash(f)), None),
    "another model's tokenizer": (_json_edit("encoder/tokenizer.json", lambda t: {
        **t, "model": {**t["model"], "vocab": {**t["model"]["vocab"], "zzzz": 5000}}}),
        "its tokenizer gives ids up to 5000, its embedding table has 143 rows (the tokenizer "
        "of another model?)"),
}


@pytest.mark.parametrize("case", sorted(ENCODER_DAMAGE))
def test_model_folder_damaged_encoder_is_one_line(exported: Path, tmp_path: Path,
                                                  case: str) -> None:
    """Tracebacks (TypeError, a dataclass validation error) and, without tokenizer files, a
    silently wrong model (every word [UNK]) became one line naming the file and the folder."""
    edit, end = ENCODER_DAMAGE[case]
    folder = _damaged(exported, tmp_path / "export", edit)
    if end is None:  # was a tensor-size RuntimeError at the first text over 128 tokens
        assert _error(lambda: load_model(folder, "cpu")) == (
            f"{folder}/simtune.json: encoder.max_length: 1000 is more than the model's 128 "
            "positions (max_position_embeddings in its config.json); use at most that")
        return
    assert _error(lambda: load_model(folder, "cpu")) == (
        f"{folder}/simtune.json: encoder.model: {folder}/encoder: {end}")


def test_load_model_on_an_empty_folder_a_file_or_nothing_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    assert _error(lambda: load_model(tmp_path / "empty", "cpu")) == (
        f"{tmp_path / 'empty'}: not a simtune model (no simtune.json or training.json; an "
        "export or a trained head folder)")
    assert _error(lambda: load_model(tmp_path / "file", "cpu")) == (
        f"{tmp_path / 'file'}: not a folder (a model is a folder: an export or a trained head)")
    assert _error(lambda: load_model(tmp_path / "nothing", "cpu")) == (
        f"{tmp_path / 'nothing'}: no such model folder")


def test_model_folder_link_loops_and_a_head_folders_outside_links_are_one_line(
        exported: Path, tiny_bert: Path, tmp_path: Path) -> None:
    """A loop of links raised Python's RuntimeError; `export` copied a head folder's link to a
    file elsewhere into the export (shutil follows links), and load_model read it."""
    def loop(folder: Path) -> None:
        (folder / "a").symlink_to(folder / "b")
        (folder / "b").symlink_to(folder / "a")

    folder = _damaged(exported, tmp_path / "export", loop)
    assert _error(lambda: load_model(folder, "cpu")) == (
        f"{folder / 'a'}: a loop of links, or a link that cannot be followed")
    head = _head(tmp_path / "head", tiny_bert)
    shutil.move(head / "config.json", tmp_path / "config.json")
    (head / "config.json").symlink_to(tmp_path / "config.json")
    want = (f"{head / 'config.json'}: a link leading outside {head}; a model folder only loads "
            "files from inside itself")
    assert _error(lambda: export(head, tmp_path / "out", encoder=str(tiny_bert))) == want
    assert _error(lambda: load_model(head, "cpu", encoder=str(tiny_bert))) == want
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("damage", "end"), [
    ("a list", "cannot load: TypeError: 'str' object cannot be interpreted as an integer"),
    ("none", "its tokenizer knows only its 5 special tokens (no tokenizer.json, vocab.txt, ... in "
             "the folder?): every word would be unknown")])
def test_an_encoders_damaged_tokenizer_is_one_line_in_the_cache_fill(
        tiny_bert: Path, tmp_path: Path, damage: str, end: str) -> None:
    """The fill reads the tokenizer before the model (to cut windows, to check a prompt's
    room): a tokenizer.json that is a list was a TypeError traceback there, and none at all
    filled the cache with vectors of [UNK]s."""
    folder = _copy(tiny_bert, tmp_path / "model")
    if damage == "a list":
        (folder / "tokenizer.json").write_text("[]")
    else:
        (folder / "tokenizer.json").unlink()
        (folder / "tokenizer_config.json").unlink()
    assert _error(_groups_fill(tmp_path, folder)) == f"encoders.models.tiny.model: {folder}: {end}"


def _groups_fill(root: Path, model: Path, **enc: Any) -> Any:
    """A call filling the cache of 8 groups texts (one of 600 tokens) prepared under `root` with
    encoder `model` (`enc` keys updated)."""
    from simtune import params as P
    from simtune.cache import stage as cache
    from simtune.prepare import stage as prepare
    from simtune.prepare.prepared import write as write_prepared
    from tests.train_helpers import train_raw

    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": f"L{i % 2}"}) + "\n"
                            for i, t in enumerate([*sentences(7), "the city " * 300])))
    raw = train_raw(model, data)
    raw["encoders"]["models"]["tiny"].update(enc)
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    return lambda: cache.fill(root / "prepared", root / "cache", p.encoders, p.cache)


def test_a_max_length_past_the_models_positions_is_one_line_before_the_fill(
        tiny_bert: Path, tmp_path: Path, _own_store: Path) -> None:
    """max_length 1000 on a model of 128 positions: a tensor-size RuntimeError traceback at the
    first batch holding a text over 128 tokens."""
    assert _error(_groups_fill(tmp_path, tiny_bert, max_length=1000)) == (
        "encoders.models.tiny.max_length: 1000 is more than the model's 128 positions "
        "(max_position_embeddings in its config.json); use at most that")
    assert not _own_store.exists() or not any(_own_store.rglob("*.arrow"))


@pytest.mark.parametrize("name", ["config_sentence_transformers.json", "modules.json",
                                  "1_Pooling/config.json"])
def test_probe_a_dangling_link_for_a_sentence_transformers_file_is_refused(
        exported: Path, tmp_path: Path, name: str) -> None:
    """A sentence-transformers file replaced by a link to nothing was taken for absent and the
    folder loaded, though `SentenceTransformer(dir)` then embeds without the prompts (it skips
    a config it cannot open); it is refused, one line. A dangling link to no file simtune or
    sentence-transformers reads, and links inside the folder, still load."""
    def dangle(folder: Path) -> None:
        (folder / name).unlink()
        (folder / name).symlink_to(folder / "gone.json")

    folder = _damaged(exported, tmp_path / "export", dangle)
    assert _error(lambda: load_model(folder, "cpu")) == f"{folder / name}: a link to nothing"
    junk = _damaged(exported, tmp_path / "junk", lambda f: (
        (f / "junk").symlink_to(f / "gone"),
        shutil.move(f / "config_sentence_transformers.json", f / "st.json"),
        (f / "config_sentence_transformers.json").symlink_to("st.json")))
    assert torch.equal(load_model(junk, "cpu").encode(TEXTS),
                       load_model(exported, "cpu").encode(TEXTS))
