"""The ONE way a Hugging Face model directory is loaded (`load_pretrained`): offline, float32,
every weight from the checkpoint, a tokenizer that knows the model's words, and one `UserError`
line for any directory that does not load or loads wrong.

transformers loads a damaged directory either with an exception of almost any type (a
tokenizer.json that is a list: TypeError; a config.json with a string for a number: a
dataclass validation error; a vocabulary of 10^12: RuntimeError from the allocator) or, worse,
silently: missing weights filled at random, a folder without tokenizer files given a tokenizer
of its special tokens only (every word [UNK]: nearly equal vectors for every text). Both are
refused here, naming the params key or file that chose the directory.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from simtune.errors import UserError, shorten


def _load_failure(e: BaseException) -> str:
    """One short line for why transformers could not load a model directory."""
    if isinstance(e, pickle.UnpicklingError):  # torch's weights_only loader refused a pickle
        return ("its pickled weights (*.bin) hold more than tensors, so torch will not load them "
                "safely; re-save the model with save_pretrained() (safetensors)")
    if isinstance(e, SafetensorError):
        return f"corrupt or truncated safetensors weights ({shorten(str(e))})"
    if isinstance(e, RecursionError):  # json's decoder on a file nested thousands deep
        return "a JSON file (config.json, tokenizer.json, ...) is nested too deep to read"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if not isinstance(e, OSError | ValueError):  # transformers' own say what; others do not
        first = f"{type(e).__name__}: {first}"
    return shorten(first, 200)


# missing weights of modules no simtune vector uses (pooling is simtune's own): a checkpoint
# saved from a task model (BertForMaskedLM) has no `pooler`, and that changes no vector
UNUSED_MISSING = ("pooler.",)


def _weight_problem(model: Any, info: dict[str, Any]) -> str | None:
    """What is wrong with the loaded weights, or None. Missing (except `UNUSED_MISSING`) and
    mis-shaped weights are problems (they would be random); unexpected ones are when they
    belong to a module the model has (`encoder.layer.1.*` of a 1-layer config), not when they
    are another architecture's task head (`cls.*` of a BertForMaskedLM checkpoint)."""
    children = {name for name, _ in model.named_children()}
    found = {
        "missing": sorted(k for k in info["missing_keys"] if not k.startswith(UNUSED_MISSING)),
        "mis-shaped": sorted(str(k[0] if isinstance(k, tuple) else k)
                             for k in info["mismatched_keys"]),
        "unexpected": sorted(k for k in info["unexpected_keys"] if k.split(".")[0] in children),
    }
    parts = [f"{len(keys)} {what} weights ({', '.join(shorten(k) for k in keys[:3])}"
             f"{', ...' if len(keys) > 3 else ''})" for what, keys in found.items() if keys]
    return "; ".join(parts) or None


def load_tokenizer(path: Path, where: str, native: bool = True) -> Any:
    """The tokenizer of model directory `path` (offline); `UserError` naming `where` and `path`
    when it does not load or knows no token but its special ones (transformers builds one when
    a folder has no tokenizer files: every word would be [UNK]). `native`: a BERT folder's
    tokenizer straight from its tokenizer.json (`simtune.bert_tokenizer`: the same encodings,
    without transformers' import) when that reproduces it, else transformers'; False: always
    transformers' (a caller that saves it with the model)."""
    tok = None
    if native:
        from simtune import bert_tokenizer

        tok = bert_tokenizer.load(path)
    if tok is None:
        tok = _transformers_tokenizer(path, where)
    vocab = tok.get_vocab()
    if not set(vocab.values()) - set(tok.all_special_ids):
        raise UserError(f"{where}: {path}: its tokenizer knows only its {len(vocab)} special "
                        "tokens (no tokenizer.json, vocab.txt, ... in the folder?): every word "
                        "would be unknown")
    return tok


def _transformers_tokenizer(path: Path, where: str) -> Any:
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # of any type: a damaged directory, not our code (see the top)
        raise UserError(f"{where}: {path}: cannot load: {_load_failure(e)}") from None


def _tokenizer_problem(tok: Any, model: Any) -> str | None:
    """What is wrong with the tokenizer for `model`, or None: it gives ids past the model's
    embedding table (another model's tokenizer: an index error at the first text)."""
    vocab = tok.get_vocab()
    # the ids a text can meet: the vocabulary's and the special tokens put around it (an added
    # token the model was never resized for, unused in simtune's inputs, is not counted)
    added = set(tok.get_added_vocab())
    used = {i for t, i in vocab.items() if t not in added}
    used |= {getattr(tok, f"{name}_token_id") for name in ("pad", "unk", "cls", "sep", "bos",
                                                            "eos")} - {None}
    rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
    if rows is not None and max(used) >= rows:
        return (f"its tokenizer gives ids up to {max(used)}, its embedding table has {rows} "
                "rows (the tokenizer of another model?)")
    return None


def load_pretrained(path: Path, where: str, tokenizer: bool = True,
                    native: bool = False) -> tuple[Any, Any]:
    """The ONE way a model directory is loaded: (transformers model in eval mode, float32,
    with every weight from the checkpoint; its tokenizer, or None when `tokenizer` is False).
    `native`: a BERT folder that `simtune.bert` reproduces exactly loads as its torch-only
    `BertModel` (the same vectors bit for bit, without transformers' 4-6 s model import) and
    the tokenizer as `load_tokenizer`'s; for callers that only run the model (a fill,
    evaluate), not those that save it or wrap it (training in full mode, LoRA, the merge).

    Never touches the network. `UserError` naming `where` (the params key or file that chose
    the directory) and `path` for any directory that does not load, for one that loads
    with missing, unexpected or mis-shaped weights (transformers would fill them with random
    numbers: wrong vectors, different on each load), and for a tokenizer that does not fit
    the model (`_tokenizer_problem`) — before anything is written."""
    if native:
        from simtune import bert

        found = bert.load(path)
        if found is not None:
            tok = load_tokenizer(path, where) if tokenizer else None
            problem = _tokenizer_problem(tok, found) if tok is not None else None
            if problem:
                raise UserError(f"{where}: {path}: {problem}")
            return found, tok
    import transformers

    transformers.logging.set_verbosity_error()  # its load report: we check the info ourselves
    transformers.logging.disable_progress_bar()
    # a folder simtune.bert does not reproduce loads exactly as it always has
    tok = load_tokenizer(path, where, native=False) if tokenizer else None
    try:
        model, info = transformers.AutoModel.from_pretrained(
            path, local_files_only=True, dtype=torch.float32, output_loading_info=True,
            ignore_mismatched_sizes=True)  # mis-shaped weights listed in `info`, not raised
    except Exception as e:  # of any type: a damaged directory, not our code (see the top)
        raise UserError(f"{where}: {path}: cannot load: {_load_failure(e)}") from None
    problem = _weight_problem(model, info)
    if problem:
        raise UserError(f"{where}: {path}: the weights do not fit its config.json "
                        f"({model.config.model_type}): {problem}")
    problem = _tokenizer_problem(tok, model) if tok is not None else None
    if problem:
        raise UserError(f"{where}: {path}: {problem}")
    return model.eval(), tok


def check_positions(model: Any, max_length: int, key: str) -> None:
    """`UserError` naming `key` (the max_length's) when `max_length` exceeds the positions the
    model has (`max_position_embeddings` of its config.json, when it says): a longer text would
    stop the encoder with a tensor-size error mid-fill, after the short texts were embedded."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and max_length > positions:
        raise UserError(f"{key}: {max_length} is more than the model's {positions} positions "
                        "(max_position_embeddings in its config.json); use at most that")
