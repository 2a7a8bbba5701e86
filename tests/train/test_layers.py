"""Top-layers mode for every common architecture through one mechanism (`simtune.layers`):
each family's own layers from layer k, with its own masks and positions, give exactly the whole
model's last hidden state; each trains one epoch and exports as an ordinary model of its family
that plain sentence-transformers loads, giving the pipeline's vectors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from simtune import layers
from simtune import params as P
from simtune.encoders import FrozenEncoder
from simtune.errors import UserError
from simtune.prepare.prepared import text_id
from simtune.train import represent
from simtune.train.data import load_data
from tests.cache_helpers import sentences
from tests.conftest import WORDS
from tests.train_helpers import project, set_schedule, train_top_layers

H, LAYERS, TOP = 32, 4, 2  # the cut: k = 2, so the top holds layers 2 and 3
SIZES = {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": 2,
         "intermediate_size": 2 * H, "max_position_embeddings": 128}
# family -> its layer list (the layers from index k on train)
FAMILIES = {"bert": "encoder.layer.", "roberta": "encoder.layer.", "xlm-roberta":
            "encoder.layer.", "mpnet": "encoder.layer.", "distilbert": "transformer.layer.",
            "modernbert": "layers.", "qwen3": "layers.", "qwen3-left": "layers.",
            "llama": "layers."}
TYPE_IDS = {"bert", "roberta", "xlm-roberta"}


def _config(family: str, vocab: int) -> Any:  # a transformers config
    import transformers as T

    ids = {"vocab_size": vocab, "pad_token_id": 0}
    # RoBERTa, XLM-R, MPNet count positions from pad_token_id + 1: 2 more position embeddings
    shifted = {**SIZES, **ids, "max_position_embeddings": 130}
    if family == "bert":
        return T.BertConfig(**SIZES, **ids)
    if family == "roberta":
        return T.RobertaConfig(**shifted)
    if family == "xlm-roberta":
        return T.XLMRobertaConfig(**shifted)
    if family == "mpnet":  # relative attention bias shared by every layer
        return T.MPNetConfig(**shifted)
    if family == "distilbert":
        return T.DistilBertConfig(vocab_size=vocab, pad_token_id=0, dim=H, n_layers=LAYERS,
                                  n_heads=2, hidden_dim=2 * H, max_position_embeddings=128)
    if family == "modernbert":  # layers 0, 2 global; 1, 3 local (a window of 4 tokens)
        return T.ModernBertConfig(**SIZES, **ids, global_attn_every_n_layers=2,
                                  local_attention=4, bos_token_id=2, eos_token_id=3,
                                  cls_token_id=2, sep_token_id=3)
    if family.startswith("qwen3"):  # layers 0-2 full causal, layer 3 a 3-token sliding window
        return T.Qwen3Config(**SIZES, **ids, num_key_value_heads=1, head_dim=16,
                             use_sliding_window=True, sliding_window=3, max_window_layers=3,
                             bos_token_id=2, eos_token_id=3)
    if family == "llama":
        return T.LlamaConfig(**SIZES, **ids, num_key_value_heads=1, bos_token_id=2,
                             eos_token_id=3)
    if family == "gpt2":
        return T.GPT2Config(vocab_size=vocab, n_embd=H, n_layer=LAYERS, n_head=2, n_positions=128)
    raise AssertionError(family)


def save_tiny(path: Path, family: str, seed: int = 0) -> Path:
    """A random 4-layer model of `family` and a WordPiece tokenizer, as a local model dir
    (`qwen3-left`: the tokenizer pads on the left, as decoder embedders' do)."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789?.,'")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters,
             *(f"##{c}" for c in letters)]
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if family in TYPE_IDS else [])
    tokenizer = transformers.BertTokenizerFast(
        vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True, model_input_names=names,
        padding_side="left" if family.endswith("-left") else "right")
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(_config(family, len(vocab))).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: save_tiny(root / f, f) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_from_layer_k_equals_the_whole_model(tiny_models: dict[str, Path],
                                                         family: str) -> None:
    """The layer cache's states (each text's own, padding removed, as the fill stores them)
    padded again on the right, through the cut model, give the whole model's last hidden
    state at every real token (the batch below padded on the tokenizer's own side)."""
    path = tiny_models[family]
    k = LAYERS - TOP
    spec = P.EncoderParams(model=str(path), pooling="mean", normalize=True, max_length=32,
                           dtype="float32", states_dtype="float32", prompts=None,
                           chunks={"max": 1, "overlap": 0, "pool": "mean"})
    frozen = FrozenEncoder("tiny", spec, torch.device("cpu"))
    texts = sentences(12)
    batch = frozen.tokenize(texts)
    with torch.no_grad():
        want = frozen.model(**batch).last_hidden_state
        cached = frozen.states(batch, k)  # [(T_i, H)]
    lengths = torch.tensor([len(s) for s in cached])
    assert len(set(lengths.tolist())) > 3  # padding in play
    states = torch.zeros(len(texts), int(lengths.max()), H)
    for i, s in enumerate(cached):
        states[i, :len(s)] = torch.from_numpy(s)
    mask = (torch.arange(states.shape[1])[None] < lengths[:, None]).long()
    top = layers.top_model(path, k)
    with torch.no_grad():
        got = top(inputs_embeds=states, attention_mask=mask).last_hidden_state
    real = batch["attention_mask"].bool()
    for i in range(len(texts)):  # real tokens of row i, in order, on either padding side
        diff = float((got[i, :lengths[i]] - want[i][real[i]]).abs().max())
        assert diff <= 1e-5, (family, i, diff)
    assert float(want.abs().max()) > 0.5  # not a vanishing output
    # only the top layers' own weights train (the rest may be shared with the frozen bottom)
    trainable = {n for n, q in top.named_parameters() if q.requires_grad}
    assert trainable and all(n.startswith(FAMILIES[family]) for n in trainable)
    assert len(trainable) == sum(1 for n, _ in top.named_parameters()
                                 if n.startswith(FAMILIES[family]))


def test_the_cut_follows_the_layer_types_of_the_layers_it_keeps(
        tiny_models: dict[str, Path]) -> None:
    # Qwen3 picks a layer's mask by its index in the list: the cut layer 3 (index 1 of the
    # top) keeps its sliding window because the config's layer types are cut too
    top = layers.top_model(tiny_models["qwen3"], 2)
    assert top.config.layer_types == ["full_attention", "sliding_attention"]
    assert top.config.num_hidden_layers == 2 and len(top.layers) == 2


def test_an_unsupported_family_is_one_line_naming_it(tmp_path: Path) -> None:
    path = save_tiny(tmp_path / "gpt2", "gpt2")
    with pytest.raises(UserError) as e:
        layers.top_model(path, 2)
    assert str(e.value) == (
        "train.mode top_layers: a GPT2Model (gpt2) is not supported (no encoder.layer / "
        "transformer.layer / layers layer list with an embeddings module); use head or full")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_one_epoch_and_exports_an_ordinary_model(
        tmp_path: Path, tiny_models: dict[str, Path], family: str) -> None:
    changed = _train_and_export(tmp_path, tiny_models[family], family)
    assert any(k.endswith("norm.weight") or "LayerNorm" in k for k in changed)  # not LoRA's


@pytest.mark.parametrize("family", ["bert", "qwen3"])
def test_lora_on_the_top_layers_trains_and_merges_into_an_ordinary_model(
        tmp_path: Path, tiny_models: dict[str, Path], family: str) -> None:
    """LoRA on: the adapters train, the merged weights are saved (same keys as the original,
    no adapter files), only the adapted linear layers' weights of the top layers changed."""
    changed = _train_and_export(tmp_path, tiny_models[family], family, lora={
        "r": 4, "alpha": 8, "dropout": 0.1, "target_modules": "all-linear"})
    assert all(k.endswith(".weight") and "norm" not in k.lower() for k in changed), changed
    assert not list((tmp_path / "head" / "encoder").glob("adapter*"))


def _train_and_export(tmp_path: Path, model: Path, family: str, **encoder: object
                      ) -> set[str]:
    """Train one epoch of the top 2 layers of `model`, export, and check that the saved model
    is an ordinary one of its family whose layers k.. alone changed and that plain
    sentence-transformers gives the pipeline's vectors; returns the changed weights' names."""
    raw, params_file = project(tmp_path, model, mode="top_layers")
    raw["train"]["frozen_candidate"] = False  # the trained layers are what is checked
    set_schedule(raw, "top_layers", layers=TOP, lr=0.003, head_lr=0.01, batch_size=8,
                 max_epochs=1, patience=1, **encoder)
    p = train_top_layers(tmp_path, raw, params_file)
    # the saved encoder is an ordinary model of the family whose layers k.. alone changed
    saved = load_file(str(tmp_path / "head" / "encoder" / "model.safetensors"))
    original = load_file(str(model / "model.safetensors"))
    assert saved.keys() == original.keys()
    changed = {k for k in original if not torch.equal(saved[k], original[k])}
    pattern = re.compile(rf"^{re.escape(FAMILIES[family])}([0-9]+)\.")
    assert changed and all(int(pattern.match(k)[1]) >= LAYERS - TOP for k in changed
                           if pattern.match(k)), sorted(changed)[:5]
    assert all(pattern.match(k) for k in changed), sorted(changed)[:5]
    # the pipeline's vectors (cached states -> trained top -> head) == plain sentence-transformers
    from simtune import heads
    from simtune.export.stage import export

    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    rep = represent.build("top_layers", p.encoders, data.tables, p.train.lora, True)
    rep.top = layers.top_model(tmp_path / "head" / "encoder", LAYERS - TOP)
    head = heads.load(tmp_path / "head").eval()
    split = data.splits["test"]
    with torch.no_grad():
        pipeline = torch.nn.functional.normalize(head(rep.eval().embed_split(split, "text")),
                                                 dim=-1)
    assert export(tmp_path / "head", tmp_path / "export")  # plain: no remote code
    texts = {text_id(t): t for t in sentences(80)}
    ids = data.tables["query"].ids.take(split.tensors["rows"].numpy()).to_pylist()
    st = pytest.importorskip("sentence_transformers")
    plain = st.SentenceTransformer(str(tmp_path / "export"), device="cpu").encode(
        [texts[i] for i in ids], convert_to_tensor=True)
    assert torch.allclose(plain, pipeline, atol=1e-5), float((plain - pipeline).abs().max())
    return changed
