"""The sentence-transformers files of an export, in sentence-transformers' own modules.

`SentenceTransformer(export_dir)` reads `modules.json`: `Transformer` (`encoder/`) -> `Pooling`
(`1_Pooling/`, with `include_prompt` when prompts are set) -> `Normalize` when the encoder
normalises -> the head -> `Normalize` when `normalize_output` (not twice in a row: a head at
identity, the frozen encoder kept, is no module); the encoder's prompts are
`config_sentence_transformers.json`'s `prompts` (`query`, `document`; `query` the default).
Every simtune head is affine or a residual MLP, so each is written as sentence-transformers'
own `Dense` modules: no code of ours runs, no `trust_remote_code`.

- identity: no module;
- linear, y = W x + b: one `Dense` (identity activation);
- skip_connection, y = x + s * (W x + b) with s = sigmoid(g): one `Dense`, W' = I + diag(s) W,
  b' = s * b;
- gated, y = 2 sigmoid(g) * x: one `Dense`, W' = diag(2 sigmoid(g)), b' = 0;
- mlp, y = x + W2 gelu(W1 x + b1) + b2 (dropout does nothing at inference): two `Dense`,
  because x = gelu(x) - gelu(-x) exactly (gelu(z) = z Phi(z) and Phi(z) + Phi(-z) = 1):
  `Dense(dim -> hidden + 2 dim, GELU)` with rows [W1; I; -I] and bias [b1; 0; 0], then
  `Dense(hidden + 2 dim -> dim, identity)` with columns [W2, I, -I] and bias b2.

Folding runs in float64 and is stored as float32: the vectors equal the pipeline's to float32
rounding (about 1e-6). A head type without a rule here falls back to
`simtune.st_module.HeadModule`, which sentence-transformers imports only with
`trust_remote_code=True` (and simtune installed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from simtune import heads
from simtune.atomic import write_json

ST = "sentence_transformers.models."  # the classic paths: every sentence-transformers >= 2 has them


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Dense:
    """One sentence-transformers `Dense` module: activation(weight @ x + bias)."""

    weight: torch.Tensor  # (out, in) float64
    bias: torch.Tensor  # (out,) float64
    activation: type[nn.Module]  # nn.Identity or nn.GELU (default arguments)


def _params(head: heads.Head) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().double() for k, v in head.state_dict().items()}


def _linear(w: dict[str, torch.Tensor], dim: int) -> list[Dense]:
    return [Dense(w["fc.weight"], w["fc.bias"], nn.Identity)]


def _skip(w: dict[str, torch.Tensor], dim: int) -> list[Dense]:
    s = torch.sigmoid(w["gates"])
    return [Dense(torch.eye(dim, dtype=torch.float64) + s[:, None] * w["fc.weight"],
                  s * w["fc.bias"], nn.Identity)]


def _gated(w: dict[str, torch.Tensor], dim: int) -> list[Dense]:
    return [Dense(torch.diag(2 * torch.sigmoid(w["gates"])),
                  torch.zeros(dim, dtype=torch.float64), nn.Identity)]


def _mlp(w: dict[str, torch.Tensor], dim: int) -> list[Dense]:
    eye = torch.eye(dim, dtype=torch.float64)
    zeros = torch.zeros(dim, dtype=torch.float64)
    up = Dense(torch.cat([w["net.0.weight"], eye, -eye]),
               torch.cat([w["net.0.bias"], zeros, zeros]), nn.GELU)
    down = Dense(torch.cat([w["net.3.weight"], eye, -eye], dim=1), w["net.3.bias"], nn.Identity)
    return [up, down]


RULES: dict[str, Callable[[dict[str, torch.Tensor], int], list[Dense]]] = {
    "identity": lambda w, dim: [], "linear": _linear, "skip_connection": _skip,
    "gated": _gated, "mlp": _mlp}


def dense_chain(head: heads.Head) -> list[Dense] | None:
    """The head as a chain of `Dense` modules (identity: empty), or None when its type has no
    rule (then only `HeadModule` can serve it). The mlp's GELU must be the exact (erf) one.
    A head at its identity state (a kept epoch 0) is the empty chain: the mlp's chain would
    give x only to float rounding."""
    rule = RULES.get(head.config["type"])
    if head.at_identity():  # the frozen encoder kept (epoch 0): its vectors, bit for bit
        return []
    if rule is None:
        return None
    return rule(_params(head), head.config["dim"])


def _write_dense(directory: Path, dense: Dense) -> None:
    from safetensors.torch import save_file

    directory.mkdir()
    out_features, in_features = dense.weight.shape
    write_json(directory / "config.json", {
        "in_features": in_features, "out_features": out_features, "bias": True,
        "activation_function": _class_path(dense.activation)})
    save_file({"linear.weight": dense.weight.float().contiguous(),
               "linear.bias": dense.bias.float().contiguous()},
              str(directory / "model.safetensors"))


def write(root: Path, spec: dict[str, Any], head: heads.Head, normalize_output: bool,
          similarity: str | None, side: str = "both") -> bool:
    """Write `modules.json` and every module folder into export `root`, whose `encoder/` holds
    the Hugging Face model and `head/` simtune's head; True when it loads with plain
    `SentenceTransformer(root)`, False when the head needs `trust_remote_code=True`.

    `similarity` (`cosine` | `dot` | `euclidean`: `train.loss.distance`, the same names in
    sentence-transformers; None: unknown) becomes its `similarity_fn_name`; with
    `normalize_output` that is `cosine` (a dot product of unit vectors). `side` `query`
    (`train.head.side`): the head and its `Normalize` sit in a `Router` (`query_side.write_router`)
    on the `query` route, the `document` route is empty: `encode_document` gives the frozen
    encoder's vectors. A query tower (`root/document_encoder` holds the frozen encoder beside
    the fine-tuned `encoder/`): the folder itself is one `Router` whose routes hold both
    (`query_side.write_towers`)."""
    modules: list[dict[str, Any]] = []

    def add(kind: str, path: str) -> Path:
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": kind})
        return root / path

    towers = side == "query" and (root / "document_encoder").is_dir()
    for tower in ("encoder", "document_encoder") if towers else ("encoder",):
        write_json(root / tower / "sentence_bert_config.json",
                   {"max_seq_length": spec["max_length"], "do_lower_case": False})
    add(ST + "Router" if towers else ST + "Transformer", "" if towers else "encoder")
    pooling = root / "1_Pooling"
    pooling.mkdir()
    prompts = spec.get("prompts")  # None: no prompts (and exports from before they existed)
    pool_config: dict[str, Any] = {
        "word_embedding_dimension": head.config["dim"],
        "pooling_mode_cls_token": spec["pooling"] == "cls",
        "pooling_mode_mean_tokens": spec["pooling"] == "mean",
        "pooling_mode_max_tokens": spec["pooling"] == "max",
        "pooling_mode_mean_sqrt_len_tokens": False}
    if spec["pooling"] == "lasttoken":  # the key only where needed: older readers lack it
        pool_config["pooling_mode_lasttoken"] = True
    if prompts is not None:
        pool_config["include_prompt"] = bool(prompts["include_prompt"])
    write_json(pooling / "config.json", pool_config)
    chain = dense_chain(head)
    # the output's Normalize right after the encoder's (no head module: the frozen encoder
    # kept) would normalise unit vectors again: the same vectors (to float rounding), written
    # once
    last_normalize = normalize_output and not (chain == [] and spec["normalize"])
    if towers:  # the Router is the folder itself: both towers (`query_side.write_towers`)
        from simtune.export.query_side import write_towers

        write_towers(root, chain, spec["normalize"], last_normalize, _write_dense)
    else:
        add(ST + "Pooling", "1_Pooling")
        if spec["normalize"]:
            add(ST + "Normalize", f"{len(modules)}_Normalize").mkdir()
        if side == "query":
            from simtune.export.query_side import write_router

            write_router(add(ST + "Router", f"{len(modules)}_Router"), chain,
                         last_normalize, _write_dense)
        else:
            if chain is None:
                add("simtune.st_module.HeadModule", "head")
            for dense in chain or []:
                _write_dense(add(ST + "Dense", f"{len(modules)}_Dense"), dense)
            if last_normalize:
                add(ST + "Normalize", f"{len(modules)}_Normalize").mkdir()
    write_json(root / "modules.json", modules)
    config: dict[str, Any] = {"model_type": "SentenceTransformer", "prompts": {},
                              "default_prompt_name": None}
    if prompts is not None:
        # `encode` without a prompt name embeds as a query, as `simtune.Model.encode` does
        config.update(prompts={"query": prompts["query"], "document": prompts["document"]},
                      default_prompt_name="query")
    if normalize_output or similarity is not None:
        config["similarity_fn_name"] = "cosine" if normalize_output else similarity
    write_json(root / "config_sentence_transformers.json", config)
    return chain is not None
