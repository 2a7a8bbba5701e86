"""Where a static student's token table starts (`train.schedule.static.init`), cached in the store.

`teacher` (the default): each token of the teacher's own tokenizer, alone between its special
tokens (after its prompt), run through the whole teacher (encoder, pooling, head), its vector
scaled by model2vec's SIF weight (Zipf's law on the token's id rank: frequent tokens count
less in a mean). The table is then already in the teacher's space, so the map starts at
identity and the student's tokenizer is the teacher's (every row is one of its ids, no string
matching). `distill`: model2vec's `distill` of the query encoder (every token through the
encoder alone, PCA to `pca_dims`, the same SIF weights), the map fitted by least squares.

Measured on TREC (the top-2 export as teacher, 0.868 test P@1; frozen MiniLM 0.450;
`bench.static`): the teacher start kept 0.71-0.73 against 0.665-0.68 for the distilled one,
every other setting alike. Both cost one pass of ~30k one-token texts through an encoder
(~30 s on one CPU thread), once: the table is cached under `store/static-init/<key>`, the key
hashing the model's files and what else shaped the table.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simtune import atomic
from simtune.errors import UserError
from simtune.static import StaticEncoder

log = logging.getLogger(__name__)
INIT_VERSION = 1  # the cached init tables' format: a change makes new keys
SIF_COEFFICIENT = 1e-4  # model2vec's default: weight a / (a + p(token)), p by Zipf's law


def init_key(model_dir: Path, tag: str) -> str:
    """The store key of an init table: the model's files (names and bytes), `tag` (what else
    shaped the table: the start, its width), `INIT_VERSION` and model2vec's version."""
    import model2vec

    h = hashlib.sha256(f"{INIT_VERSION} {model2vec.__version__} {tag}".encode())
    for path in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        h.update(path.relative_to(model_dir).as_posix().encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:24]


def _cached(where: Path | None) -> StaticEncoder | None:
    from tokenizers import Tokenizer

    if where is None or not (where / "table.npy").is_file():
        return None
    tokenizer = Tokenizer.from_file(str(where / "tokenizer.json"))
    table = np.load(where / "table.npy")
    if table.ndim != 2 or len(table) < tokenizer.get_vocab_size(with_added_tokens=True):
        raise UserError(f"{where}: the cached start table has {table.shape} rows x dims, its "
                        f"tokenizer {tokenizer.get_vocab_size(with_added_tokens=True)} tokens; "
                        f"delete the folder to rebuild it")
    return StaticEncoder(tokenizer, torch.from_numpy(table), "init")


def _keep(where: Path | None, tokenizer: Any, table: np.ndarray, meta: dict[str, Any]) -> None:
    if where is None:
        return
    with atomic.atomic_dir(where) as tmp:
        np.save(tmp / "table.npy", table)
        tokenizer.save(str(tmp / "tokenizer.json"))
        atomic.write_json(tmp / "meta.json", meta)


def distilled_init(model_dir: Path, pca_dims: int, store: Path | None) -> StaticEncoder:
    """`init: distill`: model2vec's `distill` of the encoder at `model_dir` (a Hugging Face
    folder: its tokenizer, every token through the encoder alone, PCA to `pca_dims`, SIF
    weights) as a static table (V, pca_dims); cached under `store` (None: not cached)."""
    where = None if store is None else (Path(store) / "static-init" /
                                        init_key(model_dir, f"distill {pca_dims}"))
    if (hit := _cached(where)) is not None:
        return hit
    from model2vec.distill import distill_from_model
    from transformers import AutoModel, AutoTokenizer

    log.info("static: distilling a token table from %s (model2vec; cached once)", model_dir)
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, use_fast=True)
    distilled = distill_from_model(model, tok, pca_dims=pca_dims, device="cpu",
                                   quantize_to="float32")
    table = np.asarray(distilled.embedding, dtype=np.float32)
    _keep(where, distilled.tokenizer, table, {"model_dir": str(model_dir), "init": "distill",
                                              "pca_dims": pca_dims})
    return StaticEncoder(distilled.tokenizer, torch.from_numpy(table), "init")


def token_batches(hf_tokenizer: Any, prompt: str, batch: int
                  ) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """[(ids, tokenised batch)] in id order: every id of `hf_tokenizer` (a transformers fast
    tokenizer) alone as a text after `prompt`, between the special tokens its template adds,
    as the encoder's `embed` takes a batch (input_ids, attention_mask, and token_type_ids
    where it uses them). The template is read off the tokenizer: `prompt` + one special token
    (unk, mask or pad: a single id whatever the text around it), whose place each id takes."""
    probe = next((t for t in (hf_tokenizer.unk_token, hf_tokenizer.mask_token,
                              hf_tokenizer.pad_token) if t), None)
    probe_id = None if probe is None else hf_tokenizer.convert_tokens_to_ids(probe)
    template = [] if probe is None else hf_tokenizer(prompt + probe)["input_ids"]
    if probe_id not in template:
        raise UserError("train.schedule.static.init: teacher needs a tokenizer with an unk, "
                        "mask or pad token (to place each token in its template); use distill")
    at = len(template) - 1 - template[::-1].index(probe_id)
    n = len(hf_tokenizer)
    out = []
    for start in range(0, n, batch):
        ids = torch.tensor(template).repeat(min(batch, n - start), 1)
        ids[:, at] = torch.arange(start, start + len(ids))
        tokens = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if "token_type_ids" in hf_tokenizer.model_input_names:
            tokens["token_type_ids"] = torch.zeros_like(ids)
        out.append((ids[:, at].clone(), tokens))
    return out


def sif_weights(n: int) -> torch.Tensor:
    """(n,) float32: model2vec's SIF weight of token ids 0..n-1 (distill's: Zipf's law on the
    id's rank, `SIF_COEFFICIENT`), what `teacher_init` scales each row by."""
    from model2vec.distill.inference import compute_weights

    return torch.from_numpy(np.asarray(compute_weights(n, SIF_COEFFICIENT), dtype=np.float32))


def teacher_init(encoder: Any, model_dir: Path, store: Path | None,
                 batch: int = 256) -> StaticEncoder:
    """`init: teacher`: the table (V, D) of the teacher's vectors of its own tokenizer's V
    tokens, each alone (module docstring), SIF-weighted; the tokenizer is the teacher's (no
    special tokens added when a text is split, as `StaticEmbedding` splits). `encoder`: the
    teacher as the cache fill loads it (`simtune.model.load_encoder`: a frozen encoder or an
    export with its head), `model_dir` its folder (the cache key); cached under `store`."""
    from tokenizers import Tokenizer

    inner = getattr(encoder, "inner", encoder)  # an export: its encoder's tokenizer and prompt
    where = None if store is None else (Path(store) / "static-init" /
                                        init_key(model_dir, f"teacher {inner.prompt!r}"))
    if (hit := _cached(where)) is not None:
        return hit
    hf = inner.tokenizer
    log.info("static: the teacher's vector of each of its %d tokens (cached once)", len(hf))
    with torch.inference_mode():  # batches in id order: row i is token i
        rows = torch.cat([encoder.embed(tokens).float().cpu()
                          for _, tokens in token_batches(hf, inner.prompt, batch)]).numpy()
    table = (rows * sif_weights(len(rows)).numpy()[:, None]).astype(np.float32)
    tokenizer = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    _keep(where, tokenizer, table, {"model_dir": str(model_dir), "init": "teacher"})
    return StaticEncoder(tokenizer, torch.from_numpy(table), "init")
