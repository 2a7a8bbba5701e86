"""BERT's encoder in torch alone, for the processes that only run a BERT forward (the cache fill,
evaluate, `simtune search`): transformers' model import costs each of them 4-6 s of start-up
(its modelling utilities pull in torch.distributed.tensor, dynamo and scipy), more than the
work of a small fill.

`load` builds it from a model folder only when the folder is one it reproduces exactly: a
`bert` config.json whose every key is known here (`KNOWN`, with the values that change no
computation, `FIXED`), one `model.safetensors` holding exactly the weights of that config
(the pooler's, or none), and otherwise returns None: the caller loads the folder with
transformers, which also gives the one-line refusals of damaged folders. The module names,
parameter names, forward arguments and outputs are transformers' `BertModel`'s (what
`simtune.layers.cut` and the weights need), and so is every operation, in the same order:
vectors equal transformers' bit for bit on CPU (tests/test_bert.py, the tiny test BERT and
MiniLM), dropout included (the same calls draw the same random numbers in training).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

# config.json keys that change nothing computed here, whatever their value
IGNORED = frozenset({
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype",
    "gradient_checkpointing", "initializer_range", "classifier_dropout", "use_cache",
    "output_hidden_states", "output_attentions", "return_dict", "bos_token_id", "eos_token_id",
    "tie_word_embeddings", "id2label", "label2id", "problem_type", "tokenizer_class", "prefix",
    "finetuning_task", "task_specific_params",
})
# keys that must hold these values (a decoder, cross-attention, relative positions, another
# activation: transformers computes something else)
FIXED = {"model_type": ("bert",), "hidden_act": ("gelu",),
         "position_embedding_type": ("absolute", None), "is_decoder": (False,),
         "add_cross_attention": (False,), "chunk_size_feed_forward": (0,),
         "is_encoder_decoder": (False,), "attn_implementation": (None, "sdpa"),
         "_attn_implementation": (None, "sdpa"), "layer_types": (None,),
         "pruned_heads": ({},)}
SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "intermediate_size", "max_position_embeddings", "type_vocab_size")
FLOATS = ("layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob")
WEIGHTS = "model.safetensors"
# a buffer older transformers saved with the weights; it holds 0..P-1, rebuilt here (and by
# transformers, which ignores the saved copy too)
SAVED_BUFFERS = frozenset({"embeddings.position_ids"})


@dataclass
class BertConfig:
    """The config.json values a BERT forward uses (attribute names as transformers'); `cut`
    sets `layer_types` and `use_cache` on it as on any config."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_dropout_prob: float
    attention_probs_dropout_prob: float
    pad_token_id: int | None
    model_type: str = "bert"
    layer_types: list[str] | None = None
    use_cache: bool = False


def read_config(path: Path) -> BertConfig | None:
    """The `BertConfig` of `path/config.json`, or None when it is not a BERT this module
    reproduces (an unknown key, a value outside `FIXED`, a size that is not a positive int)."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("model_type") != "bert":
        return None
    known = IGNORED | set(FIXED) | set(SIZES) | set(FLOATS) | {"pad_token_id"}
    if set(raw) - known or any(raw.get(k) not in ok for k, ok in FIXED.items()
                               if k in raw and k != "model_type"):
        return None
    if any(type(raw.get(k)) is not int or raw[k] < 1 for k in SIZES) or any(
            type(raw.get(k)) not in (int, float) or not math.isfinite(raw[k]) for k in FLOATS):
        return None
    pad = raw.get("pad_token_id", 0)
    if pad is not None and type(pad) is not int:
        return None
    if raw["hidden_size"] % raw["num_attention_heads"]:
        return None
    return BertConfig(**{k: raw[k] for k in (*SIZES, *FLOATS)}, pad_token_id=pad)


def _embedding(rows: int, width: int, padding_idx: int | None = None) -> nn.Embedding:
    """An (rows, width) embedding with its weight left uninitialised (`load` assigns every
    weight from the file). nn.Embedding's own initialisation draws `normal_`, which on the meta
    device goes through torch's Python reference ops and imports torch._dynamo: 2-3 s of the
    evaluate stage's start-up, measured (Linear's and LayerNorm's initialisers do not)."""
    return nn.Embedding(rows, width, padding_idx=padding_idx, _weight=torch.empty(rows, width))


class Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = _embedding(c.vocab_size, c.hidden_size, c.pad_token_id)
        self.position_embeddings = _embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = _embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        # filled by `load` (arange on the meta device imports torch's symbolic shapes: sympy)
        self.register_buffer("position_ids", torch.empty(1, c.max_position_embeddings,
                                                         dtype=torch.long),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        embeds = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = embeds.shape[:2]
        positions = self.position_ids[:, :length]
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=embeds.device)
        out = embeds + self.token_type_embeddings(token_type_ids)
        out = out + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(out))


class SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.head = c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        shape = (*x.shape[:-1], -1, self.head)
        q, k, v = (f(x).view(*shape).transpose(1, 2) for f in (self.query, self.key, self.value))
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout.p if self.training else 0.0,
            scale=self.head ** -0.5, is_causal=False)
        return out.transpose(1, 2).contiguous().reshape(*x.shape[:-1], -1).contiguous()


class AddNorm(nn.Module):
    """dense, dropout, LayerNorm(+ residual): transformers' BertSelfOutput and BertOutput."""

    def __init__(self, width: int, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(width, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(c)
        self.output = AddNorm(c.hidden_size, c)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = AddNorm(c.intermediate_size, c)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        attended = self.attention(x, mask)
        return self.output(self.intermediate(attended), attended)


class Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))


class Pooler(nn.Module):
    """The [CLS] dense + tanh of a BERT checkpoint: loaded so that its weights are used by a
    module, never run (simtune pools the token states itself)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)


@dataclass
class Output:
    """transformers' output fields that simtune reads."""

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


class BertModel(nn.Module):
    """transformers' `BertModel` forward for an encoder: (B, T) `input_ids` (or (B, T, H)
    `inputs_embeds`) and (B, T) `attention_mask` -> `Output` with the (B, T, H) last hidden
    state and, with `output_hidden_states`, the L + 1 states (embeddings, each layer's)."""

    def __init__(self, c: BertConfig, pooler: bool) -> None:
        super().__init__()
        self.config = c
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.pooler = Pooler(c) if pooler else None

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                output_hidden_states: bool = False, **_: Any) -> Output:
        x = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids,
                            inputs_embeds=inputs_embeds)
        mask = None  # no padding: none (as transformers; traced: always, for any batch)
        if attention_mask is not None and (torch.jit.is_tracing()
                                           or not bool(attention_mask.all())):
            # the key mask of every query, as transformers' bidirectional mask for sdpa
            keys = attention_mask.bool()[:, None, None, :]
            mask = keys.expand(-1, 1, x.shape[1], -1).contiguous()
        states = [x]
        for layer in self.encoder.layer:
            x = layer(x, mask)
            states.append(x)
        return Output(x, tuple(states) if output_hidden_states else None)


def load(path: Path) -> BertModel | None:
    """The BERT of model folder `path` in eval mode, float32, every weight from its
    `model.safetensors` and every module's weights there; None when the folder is not one
    this module reproduces exactly (see the top): the caller loads it with transformers."""
    from safetensors import SafetensorError, safe_open

    config = read_config(path)
    weights = path / WEIGHTS
    if config is None or not weights.is_file():
        return None
    try:
        with safe_open(str(weights), framework="pt") as f:
            keys = set(f.keys()) - SAVED_BUFFERS
            # built on the meta device: no memory for a config's sizes before the file's
            # weights are known to have them (a vocabulary of 10^9 would allocate terabytes),
            # and no random initialisation of weights that are all replaced
            with torch.device("meta"):
                model = BertModel(config, pooler=any(k.startswith("pooler.") for k in keys))
            want = model.state_dict()
            if keys != set(want) or any(f.get_slice(k).get_shape() != list(want[k].shape)
                                        for k in keys):
                return None
            state = {k: f.get_tensor(k).to(torch.float32) for k in keys}
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return None
    model.load_state_dict(state, strict=True, assign=True)
    model.embeddings.position_ids = torch.arange(config.max_position_embeddings)[None]
    return model.eval()
