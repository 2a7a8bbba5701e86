"""The core encoder helpers: the one pooling function (equal to sentence-transformers' Pooling,
lasttoken and include_prompt included, either padding side), prompts and the fingerprint, the
file hash, the config helper."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from simtune.encoders import (
    FrozenEncoder,
    describe,
    fingerprint,
    model_config,
    model_dir,
    pooled,
    prompt_skip,
    sha256_of,
    trim_padding,
)
from simtune.params import EncoderParams


def _spec(pooling: str = "mean", normalize: bool = True, model: str = "unused",
          prompts: dict | None = None) -> EncoderParams:
    return EncoderParams(model=model, pooling=pooling, normalize=normalize, max_length=8,
                         dtype="float32", states_dtype="float32", prompts=prompts,
                         chunks={"max": 1, "overlap": 0, "pool": "mean"})


def test_pooled_pools_then_normalises_by_hand() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [5.0, 6.0], [100.0, 100.0]],
                           [[0.0, 5.0], [9.0, 9.0], [9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # masked means (3, 4) and (0, 5); unit length: (0.6, 0.8) and (0, 1)
    assert pooled(hidden, mask, _spec()).tolist() == [[0.6000000238418579, 0.800000011920929],
                                                     [0.0, 1.0]]
    assert pooled(hidden, mask, _spec(normalize=False)).tolist() == [[3.0, 4.0], [0.0, 5.0]]
    assert pooled(hidden, mask, _spec("max", False)).tolist() == [[5.0, 6.0], [0.0, 5.0]]
    assert pooled(hidden, mask, _spec("cls", False)).tolist() == [[1.0, 2.0], [0.0, 5.0]]


def test_pooled_gives_float32_from_half_states() -> None:
    hidden = torch.tensor([[[3.0, 4.0]]], dtype=torch.float16)
    out = pooled(hidden, torch.tensor([[1]]), _spec(normalize=False))
    assert out.dtype == torch.float32 and out.tolist() == [[3.0, 4.0]]


def test_sha256_of_equals_hashlib_across_chunks(tmp_path: Path) -> None:
    data = bytes(range(256)) * ((1 << 22) // 256 + 3)  # more than one 4 MiB chunk
    (tmp_path / "f").write_bytes(data)
    assert sha256_of(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_model_config_reads_the_directory_config(tiny_bert: Path) -> None:
    config = model_config("tiny", _spec(model=str(tiny_bert)))
    assert (config.hidden_size, config.num_hidden_layers) == (32, 2)


def test_unknown_pooling_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pooling"):
        pooled(torch.zeros(1, 1, 2), torch.ones(1, 1), _spec().model_copy(
            update={"pooling": "median"}))


def _mask(lengths: list[int], width: int, side: str) -> torch.Tensor:
    real = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return (real if side == "right" else real.flip(1)).long()


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("include_prompt", [True, False])
@pytest.mark.parametrize("mode", ["mean", "cls", "max", "lasttoken"])
def test_pooled_equals_sentence_transformers_pooling(mode: str, side: str,
                                                     include_prompt: bool) -> None:
    """Bit for bit, every pooling, right and left padding, the prompt's first 2 tokens
    pooled or not (`prompt_length` 2 as sentence-transformers passes it)."""
    st = pytest.importorskip("sentence_transformers.models")
    hidden = torch.randn(4, 7, 5, generator=torch.Generator().manual_seed(0))
    mask = _mask([7, 3, 5, 4], 7, side)
    theirs = st.Pooling(5, pooling_mode=mode, include_prompt=include_prompt)(
        {"token_embeddings": hidden, "attention_mask": mask.clone(), "prompt_length": 2}
    )["sentence_embedding"]
    ours = pooled(hidden, mask, _spec(mode, normalize=False), 0 if include_prompt else 2)
    assert torch.equal(ours, theirs)


def test_lasttoken_and_cls_by_hand_on_both_padding_sides() -> None:
    hidden = torch.tensor([[[1.0], [2.0], [3.0]], [[4.0], [5.0], [6.0]]])
    right, left = torch.tensor([[1, 1, 0], [1, 1, 1]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert pooled(hidden, right, _spec("lasttoken", False)).tolist() == [[2.0], [6.0]]
    assert pooled(hidden, left, _spec("lasttoken", False)).tolist() == [[3.0], [6.0]]
    assert pooled(hidden, left, _spec("cls", False)).tolist() == [[2.0], [4.0]]
    # the first real token left out (include_prompt false, 1 prompt token)
    assert pooled(hidden, right, _spec("mean", False), 1).tolist() == [[2.0], [5.5]]
    assert pooled(hidden, left, _spec("cls", False), 1).tolist() == [[3.0], [5.0]]


def test_trim_padding_keeps_the_used_columns_on_either_side() -> None:
    ids = torch.arange(10).reshape(2, 5)
    right = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])}
    left = {"input_ids": ids, "attention_mask": torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]])}
    assert trim_padding(right)["input_ids"].tolist() == [[0, 1], [5, 6]]
    assert trim_padding(left)["input_ids"].tolist() == [[3, 4], [8, 9]]
    assert trim_padding(left)["attention_mask"].tolist() == [[1, 1], [0, 1]]


def test_prompt_skip_is_the_prompt_with_its_first_token(tiny_bert: Path) -> None:
    """sentence-transformers' prompt length: [CLS] what is the [SEP] less the trailing [SEP]."""
    encoder = FrozenEncoder("tiny", _spec(model=str(tiny_bert), prompts={
        "query": "what is the ", "document": "", "include_prompt": False}), torch.device("cpu"))
    assert prompt_skip(encoder.tokenizer, encoder.spec, "query") == 4
    assert prompt_skip(encoder.tokenizer, encoder.spec, "document") == 0  # no prompt
    kept = encoder.spec.model_copy(update={"prompts": encoder.spec.prompts.model_copy(
        update={"include_prompt": True})})
    assert prompt_skip(encoder.tokenizer, kept, "query") == 0
    assert encoder.tokenize(["city"])["input_ids"].tolist() == (
        encoder.as_role("document").tokenize(["what is the city"])["input_ids"].tolist())


def test_prompts_enter_the_fingerprint_only_when_set(tiny_bert: Path) -> None:
    plain = describe("tiny", _spec(model=str(tiny_bert)))
    assert "prompt" not in plain and "include_prompt" not in plain  # old caches stay valid
    empty = _spec(model=str(tiny_bert), prompts={"query": "", "document": "",
                                                  "include_prompt": False})
    assert fingerprint(describe("tiny", empty)) == fingerprint(plain)
    e5 = _spec(model=str(tiny_bert), prompts={"query": "query: ", "document": "passage: ",
                                               "include_prompt": True})
    q, d = describe("tiny", e5), describe("tiny", e5, role="document")
    assert (q["prompt"], d["prompt"], q["include_prompt"]) == ("query: ", "passage: ", True)
    assert len({fingerprint(plain), fingerprint(q), fingerprint(d)}) == 3


def test_probe_a_sentence_transformers_folder_with_a_dense_module_is_refused(
        tmp_path: Path) -> None:
    """A plain sentence-transformers folder (a teacher, or any encoder) whose chain has a module
    simtune does not run, such as a Dense projection after the pooling, was embedded without
    it: other vectors than the model's, silently. Now one line; Transformer, Pooling and
    Normalize load as before, and a simtune export (its head is Dense) is its own loader's."""
    import json

    from simtune.errors import UserError
    from tests.conftest import save_tiny_bert

    folder = save_tiny_bert(tmp_path / "st")
    chain = [{"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{t}"}
             for i, (p, t) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"),
                                         ("2_Normalize", "Normalize")])]
    (folder / "modules.json").write_text(json.dumps(chain))
    spec = _spec(model=str(folder))
    assert model_dir("teacher", spec) == folder
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    (folder / "modules.json").write_text(json.dumps([*chain[:2], dense, chain[2]]))
    with pytest.raises(UserError) as e:
        model_dir("teacher", spec)
    assert str(e.value) == (
        f"encoders.models.teacher.model: {folder} chains Dense after its transformer "
        "(modules.json), which simtune does not run: its vectors would not be the model's (use "
        "a folder of Transformer, Pooling and Normalize modules, or a simtune export)")
    (folder / "modules.json").write_text("[{")
    with pytest.raises(UserError, match=r"modules.json"):
        model_dir("teacher", spec)
