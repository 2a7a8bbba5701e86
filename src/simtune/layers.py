"""The top of an encoder, from layer k: the model's own layers, masks and position handling.

One mechanism for every family: the model itself, with its embedding module standing in for
the input (`InputStates` returns the given states) and its layer list cut to layers k..L-1. The
model's own forward then builds its own attention masks (bidirectional, causal, sliding window),
its own positions (absolute embeddings already sit in the cached states; relative biases and
rotary embeddings are computed from the sequence as usual) and applies its own final norm.

| family                       | layer list          | embeddings     |
|------------------------------|---------------------|----------------|
| BERT, RoBERTa, XLM-R, MPNet  | `encoder.layer`     | `embeddings`   |
| DistilBERT                   | `transformer.layer` | `embeddings`   |
| ModernBERT                   | `layers`            | `embeddings`   |
| Qwen2/Qwen3, Llama, Mistral  | `layers`            | `embed_tokens` |

The config follows the cut (`num_hidden_layers` = K, `layer_types` from k on: models that pick
a layer's mask by its index in the list, as Qwen3 does, then pick the cut layer's own), and the
KV cache is off (no generation here). `top_model` proves the cut on a probe batch: the full
model's states after layer k through the top equal its last hidden state, else the family is
refused with one line (`UserError`). What trains is the top layers' own weights only: a
module outside the list may be shared with the frozen bottom (MPNet's relative attention bias,
computed once for all layers), and the final norm (ModernBERT, decoders) stays as it was.
`states_vectors` and `embed_rows` run such a top over cached states (a
`simtune.cache.states.StatesTable`): training, validation and evaluate share them, so the
vectors evaluate scores are the ones validation chose the epoch by. Lightning-free.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune.chunks import pool_windows
from simtune.encoders import load_pretrained, pooled, prompt_skip
from simtune.errors import UserError
from simtune.params import EncoderParams
from simtune.pretrained import load_tokenizer

LAYER_LISTS = ("encoder.layer", "transformer.layer", "layers")
EMBEDDINGS = ("embeddings", "embed_tokens")
PROBE_TOLERANCE = 1e-5  # relative to the largest |state|; the cut is exact on CPU (0.0 measured)
# padded tokens one more forward is worth (small GEMMs run slower on CPU; launches on GPU)
GROUP_OVERHEAD = {"cpu": 64, "other": 8192}  # TREC top-2 step, 64 rows: 2.79 s one group,
# 1.61 s at 256, 1.24 s at 64 (fwd+bwd, 2 CPU cores at load 7; bench/layers.py measures epochs)
# the bound on |difference| of a unit vector computed from float16 states against the whole
# encoder from the text (the export): MiniLM on TREC's 538 test questions, top 2 layers trained,
# measured 4.1e-5 at most (mean 4.5e-6, cosine >= 0.9999998); the random test BERT's larger
# activations round more, hence the margin
STATES_TOLERANCE = 5e-3
TOKENS_PER_CHUNK = 4096  # embed_rows: padded tokens per forward (bounds memory; TREC val+train
# at load 6: 32768 -> 4096 tokens took 23.0 -> 14.0 s, sorting alone 37 -> 23 s)


class InputStates(torch.nn.Module):
    """Stands in for the embedding module: the cached states (passed as `inputs_embeds`) are
    the input. Families call it by keyword (BERT, ModernBERT) or positionally (DistilBERT:
    `embeddings(input_ids, inputs_embeds, position_ids)`); decoders never call it when given
    `inputs_embeds`."""

    def forward(self, *args: Any, inputs_embeds: torch.Tensor | None = None,
                **_: Any) -> torch.Tensor:
        if inputs_embeds is not None:
            return inputs_embeds
        return next(a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())


def _get(obj: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        obj = getattr(obj, name, None)
    return obj


def structure(model: torch.nn.Module) -> tuple[str, str] | None:
    """(layer list path, embeddings attribute) of `model`, or None for an unknown layout."""
    total = int(model.config.num_hidden_layers)
    layers = next((p for p in LAYER_LISTS if isinstance(_get(model, p), torch.nn.ModuleList)
                   and len(_get(model, p)) == total), None)
    embeddings = next((e for e in EMBEDDINGS if isinstance(getattr(model, e, None),
                                                          torch.nn.Module)), None)
    return (layers, embeddings) if layers and embeddings else None


def family(model: torch.nn.Module) -> str:
    """`Qwen3Model (qwen3)`: how a refusal names the model."""
    return f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"


def cut(model: Any, layer: int) -> Any:
    """`model` in place minus its embeddings and first `layer` layers: it maps the states after
    layer `layer` (B, T, H), given as `inputs_embeds` with the (B, T) attention mask, to the
    last hidden states (B, T, H). `UserError` for an unknown layout."""
    found = structure(model)
    if found is None:
        raise UserError(f"train.mode top_layers: a {family(model)} is not supported (no "
                        f"{' / '.join(LAYER_LISTS)} layer list with an embeddings module); "
                        "use head or full")
    path, embeddings = found
    parent, _, attr = path.rpartition(".")
    owner = _get(model, parent) if parent else model
    top = torch.nn.ModuleList(list(getattr(owner, attr))[layer:])
    setattr(owner, attr, top)
    setattr(model, embeddings, InputStates())
    # only the top layers' own weights train: what else the model holds may be shared with the
    # frozen bottom (MPNet's relative attention bias), whose cached states must stay valid
    model.requires_grad_(False)
    top.requires_grad_(True)
    if getattr(model, "pooler", None) is not None:
        model.pooler = None  # unused (we pool ourselves): no parameter without a gradient
    config = model.config
    types = getattr(config, "layer_types", None)
    config.num_hidden_layers = int(config.num_hidden_layers) - layer
    if types is not None:
        config.layer_types = list(types)[layer:]
    config.use_cache = False
    return model


def _probe(model: Any) -> dict[str, torch.Tensor]:
    """Two rows of random token ids, the second right-padded (masks and padding exercised)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(model.config.vocab_size), (2, 16), generator=gen)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 9:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def top_model(path: Path, layer: int, native: bool = False) -> Any:
    """The encoder at `path` cut at `layer` (`cut`), in eval mode, float32, proven on a probe
    batch to give the full model's last hidden state from its states after layer `layer`
    (`hidden_states[layer]`, what the layer cache stores) at every real token. `native`:
    `load_pretrained`'s (evaluate, which only runs it; training wraps it)."""
    model, _ = load_pretrained(path, "train.mode top_layers", tokenizer=False, native=native)
    probe = _probe(model)
    with torch.no_grad():
        out = model(**probe, output_hidden_states=True)
        top = cut(model, layer)
        got = top(inputs_embeds=out.hidden_states[layer],
                  attention_mask=probe["attention_mask"]).last_hidden_state
    real = probe["attention_mask"].bool()
    want = out.last_hidden_state[real]
    diff = float((got[real] - want).abs().max()) / max(float(want.abs().max()), 1e-12)
    if not diff <= PROBE_TOLERANCE:
        raise UserError(f"train.mode top_layers: a {family(top)} is not supported (its layers "
                        f"from layer {layer} do not reproduce the model: relative difference "
                        f"{diff:.1e}); use head or full")
    return top


def merge(path: Path, top: torch.nn.Module, layer: int) -> Any:
    """The full encoder at `path` with the trained `top` (a `cut(…, layer)` model, plain
    weights) written over its layers from `layer` on; the rest of the top (frozen) equals the
    original. Returns the transformers model."""
    full, _ = load_pretrained(path, "train.mode top_layers", tokenizer=False)
    found = structure(full)
    assert found is not None  # the top was cut from the same model
    prefix = found[0] + "."
    state = {}
    for name, value in top.state_dict().items():
        if name.startswith(prefix):
            index, rest = name[len(prefix):].split(".", 1)
            name = f"{prefix}{int(index) + layer}.{rest}"
        state[name] = value
    _, unexpected = full.load_state_dict(state, strict=False)  # missing: the bottom
    assert not unexpected, unexpected[:5]
    return full


def prompt_skips(path: Path, spec: EncoderParams) -> dict[str, int]:
    """Prompt tokens left out of the pooling, by prompt role (`encoders.prompt_skip`); the
    tokenizer is loaded only when a prompt is set with include_prompt false."""
    if spec.prompts is None or spec.prompts.include_prompt:
        return {"query": 0, "document": 0}
    tokenizer = load_tokenizer(path, "train.mode top_layers")
    return {role: prompt_skip(tokenizer, spec, role) for role in ("query", "document")}


def length_groups(lengths: torch.Tensor, overhead: int) -> list[torch.Tensor]:
    """Partition of a batch's rows (by their (n,) token `lengths`) into groups that minimise the
    padded tokens computed, sum over groups of (longest x rows), plus `overhead` tokens per
    group (the cost of one more, smaller forward). Exact dynamic programme over the rows sorted
    by length (an optimal group is a run of them). Returns index tensors into the batch."""
    n = len(lengths)
    order = torch.argsort(lengths, descending=True, stable=True)
    if n <= 1:
        return [order]
    sl = lengths[order].to(torch.float64).cpu().numpy()  # the programme runs on the host
    best = np.zeros(n + 1)  # best[i]: cost of the i longest rows
    cut_at = np.zeros(n + 1, dtype=np.int64)
    j = np.arange(n)
    for i in range(1, n + 1):  # last group = sorted rows j..i-1, padded to sl[j]
        cost = best[:i] + sl[:i] * (i - j[:i]) + overhead
        cut_at[i] = int(np.argmin(cost))
        best[i] = cost[cut_at[i]]
    bounds, i = [], n
    while i > 0:
        bounds.append((int(cut_at[i]), i))
        i = int(cut_at[i])
    return [order[a:b] for a, b in reversed(bounds)]


def capped_groups(lengths: torch.Tensor, overhead: int, max_tokens: int) -> list[torch.Tensor]:
    """`length_groups`, each group then cut into runs of at most `max_tokens` padded tokens
    (at least one row each): bounds one forward's memory where a group is large (a whole
    split's texts), at the cost of one more forward per piece."""
    out = []
    for g in length_groups(lengths, overhead):
        rows = max(1, max_tokens // max(1, int(lengths[g[0]])))  # g[0]: the group's longest
        out.extend(g[i:i + rows] for i in range(0, len(g), rows))
    return out


def run_in_groups(groups: list[torch.Tensor], run: Callable[[Any], torch.Tensor]
                  ) -> torch.Tensor:
    """(n, D): `run(index)`, the (len(index), D) vectors of the rows at `index`, for each group
    of row indices (a partition of range(n), `length_groups`), put back in the rows' order. One
    group runs as `run(slice(None))`: the rows as they are, with nothing gathered or scattered."""
    if len(groups) == 1:
        return run(slice(None))
    outs = [run(g) for g in groups]
    vectors = torch.empty(sum(len(g) for g in groups), outs[0].shape[1], dtype=outs[0].dtype,
                          device=outs[0].device)
    vectors[torch.cat(groups).to(vectors.device)] = torch.cat(outs)
    return vectors


def states_vectors(top: Any, table: Any, rows: torch.Tensor, spec: EncoderParams, skip: int,
                   device: torch.device) -> torch.Tensor:
    """(n, D) pooled vectors of the texts at `rows` of the states `table`, through `top` (a
    `cut` model). Each text's (window's) vector depends only on its own tokens, so the rows run
    as groups of similar length (`length_groups`), each padded to its own longest; a text of
    several windows (`simtune.chunks`) is their pooled vector. `skip`: prompt tokens left out
    of the pooling."""
    rows, counts = table.window_rows(rows)
    groups = length_groups(table.lengths(rows).cpu(),
                           GROUP_OVERHEAD.get(device.type, GROUP_OVERHEAD["other"]))

    def run(part: torch.Tensor) -> torch.Tensor:
        states, mask = table.batch(part, device)
        hidden = top(inputs_embeds=states, attention_mask=mask).last_hidden_state
        return pooled(hidden, mask, spec, skip)

    vectors = run_in_groups(groups, lambda g: run(rows[g]))
    if counts is None:
        return vectors
    return pool_windows(vectors, counts, spec.chunks.pool, spec.normalize)


def embed_rows(top: Any, table: Any, rows: torch.Tensor, spec: EncoderParams, skip: int,
               device: torch.device) -> torch.Tensor:
    """(n, D) vectors of the texts at `rows` (n,) of `table`, in their order: run length-sorted
    in chunks of about `TOKENS_PER_CHUNK` padded tokens (padding to a random chunk's longest
    text costs ~2x the compute on short texts, and a fixed row count would bound nothing)."""
    n = len(rows)
    lengths = table.text_tokens(rows)
    order = torch.argsort(lengths.cpu(), descending=True, stable=True)
    out, s = [], 0
    while s < n:  # sorted descending: the chunk's first row is its longest
        e = min(n, s + max(1, TOKENS_PER_CHUNK // max(1, int(lengths[order[s]]))))
        out.append(states_vectors(top, table, rows[order[s:e]], spec, skip, device))
        s = e
    vectors = torch.empty(n, out[0].shape[1], dtype=out[0].dtype, device=out[0].device)
    vectors[order.to(vectors.device)] = torch.cat(out)
    return vectors
