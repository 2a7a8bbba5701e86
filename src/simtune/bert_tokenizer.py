"""A BERT model folder's fast tokenizer from its `tokenizer.json` alone: the `tokenizers`
backend that transformers' `BertTokenizer` wraps, without importing transformers (2-3 s of a
stage's start-up: see `simtune.bert`).

`load` returns one only for a folder whose tokenizer files it reproduces exactly: a
`tokenizer.json`, and a `tokenizer_config.json` of the `BertTokenizer` class whose every key is
known here, whose normaliser settings agree with the `tokenizer.json`'s and whose special
tokens are plain strings of its vocabulary; else None, and the caller loads the folder with
transformers. The object answers what simtune asks of a transformers tokenizer (`__call__`
with padding, truncation, `max_length`, `return_tensors="pt"`, `add_special_tokens`; the
vocabulary, the special tokens and their ids, `backend_tokenizer`), equal to transformers'
answers (tests/test_bert.py: the test BERT's and MiniLM's tokenizers on TREC and odd texts).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

CLASSES = ("BertTokenizer", "BertTokenizerFast")
SPECIAL = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_config.json keys that change no encoding simtune asks for
# (`max_length`: transformers 5's save_pretrained writes the last call's there, and its calls do
# not read it: truncation=True still cuts at model_max_length, tests/test_bert.py)
IGNORED = frozenset({"name_or_path", "backend", "tokenizer_class", "special_tokens_map_file",
                     "clean_up_tokenization_spaces", "added_tokens_decoder", "model_max_length",
                     "do_lower_case", "strip_accents", "tokenize_chinese_chars", "is_local",
                     "local_files_only", "max_length"})
# keys allowed only at transformers' default value (save_pretrained writes several of them)
DEFAULTS = {"do_basic_tokenize": True, "never_split": None, "padding_side": "right",
            "truncation_side": "right", "extra_special_tokens": {},
            "additional_special_tokens": [], "pad_to_multiple_of": None, "pad_token_type_id": 0,
            "stride": 0, "truncation_strategy": "longest_first"}
# the normaliser of tokenizer.json against the settings of tokenizer_config.json
NORMALISER = {"lowercase": ("do_lower_case", True), "strip_accents": ("strip_accents", None),
              "handle_chinese_chars": ("tokenize_chinese_chars", True)}
NO_LIMIT = 10**9  # model_max_length above this: transformers' "no limit" (1e30)
_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}


class BertTokenizer:
    """transformers' `BertTokenizer` (fast) answers, from the `tokenizers` backend; thread-safe
    (each padding / truncation setting has its own backend copy, configured once)."""

    is_fast = True
    padding_side = truncation_side = "right"
    pad_token_type_id = 0
    model_input_names: ClassVar[list[str]] = ["input_ids", "token_type_ids", "attention_mask"]
    bos_token = eos_token = bos_token_id = eos_token_id = None

    def __init__(self, backend: Any, special: dict[str, str], model_max_length: int) -> None:
        """`special`: token by attribute name (`pad_token`: `[PAD]`), each in `backend`'s
        vocabulary; `model_max_length`: tokenizer_config.json's (1e30: no limit)."""
        self._backend, self.model_max_length = backend, model_max_length
        self._copies: dict[tuple[int | None, bool], Any] = {}
        self._lock = threading.Lock()
        for name, token in special.items():
            setattr(self, name, token)
            setattr(self, f"{name}_id", backend.token_to_id(token))
        self.all_special_tokens = list(dict.fromkeys(special.values()))
        self.all_special_ids = [backend.token_to_id(t) for t in self.all_special_tokens]

    @property
    def backend_tokenizer(self) -> Any:
        return self._backend

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    def get_added_vocab(self) -> dict[str, int]:
        return {t.content: i for i, t in self._backend.get_added_tokens_decoder().items()}

    def __len__(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return int(self._backend.num_special_tokens_to_add(pair))

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def _configured(self, limit: int | None, padding: bool) -> Any:
        key = (limit, padding)
        with self._lock:
            if key not in self._copies:
                from tokenizers import Tokenizer

                copy = Tokenizer.from_str(self._backend.to_str())
                copy.no_truncation()
                copy.no_padding()
                if limit is not None:
                    copy.enable_truncation(limit, strategy="longest_first", direction="right")
                if padding:
                    copy.enable_padding(direction="right", pad_id=self.pad_token_id,
                                        pad_type_id=0, pad_token=self.pad_token)
                self._copies[key] = copy
            return self._copies[key]

    def __call__(self, text: str | list[str], padding: bool = False,
                 truncation: bool | None = None, max_length: int | None = None,
                 return_tensors: str | None = None, add_special_tokens: bool = True,
                 return_offsets_mapping: bool = False) -> dict[str, Any]:
        """As transformers' call: a str gives lists, a list gives lists of lists (tensors with
        `return_tensors="pt"`); truncation at `max_length` (else the model's limit) when
        `truncation` is true, or not given while `max_length` is."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        limit = None
        if truncation or (truncation is None and max_length is not None):
            limit = max_length if max_length is not None else self.model_max_length
            limit = None if limit > NO_LIMIT else int(limit)
        encodings = self._configured(limit, bool(padding)).encode_batch(
            texts, add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {n: [getattr(e, _FIELDS[n]) for e in encodings]
                               for n in self.model_input_names}
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encodings]
        if return_tensors == "pt":
            return {k: torch.from_numpy(np.array(v, dtype=np.int64).reshape(len(texts), -1))
                    for k, v in out.items()}
        if return_tensors is not None:
            raise ValueError(f"return_tensors {return_tensors!r}: only 'pt'")
        return {k: v[0] for k, v in out.items()} if single else out


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _settings(folder: Path) -> dict[str, Any] | None:
    """tokenizer_config.json when it is a `BertTokenizer`'s this module reproduces, else None."""
    config = _read(folder / "tokenizer_config.json")
    if not isinstance(config, dict) or config.get("tokenizer_class") not in CLASSES:
        return None
    if set(config) - IGNORED - set(DEFAULTS) - set(SPECIAL):
        return None
    if any(k in config and config[k] != v for k, v in DEFAULTS.items()):
        return None
    if not all(isinstance(config.get(k, ""), str) for k in SPECIAL):
        return None
    limit = config.get("model_max_length", NO_LIMIT + 1)
    if type(limit) not in (int, float) or limit < 1:
        return None
    mapped = _read(folder / "special_tokens_map.json") if (
        folder / "special_tokens_map.json").exists() else {}
    if not isinstance(mapped, dict) or any(config.get(k) != v for k, v in mapped.items()):
        return None
    return config


def _agrees(backend: Any, config: dict[str, Any]) -> bool:
    """The tokenizer.json's normaliser is the BertNormalizer of `config`'s settings, and each
    added token the config lists is the tokenizer.json's own."""
    normaliser = json.loads(backend.to_str()).get("normalizer") or {}
    if normaliser.get("type") != "BertNormalizer":
        return False
    if any(normaliser.get(k) != config.get(c, default) for k, (c, default) in NORMALISER.items()):
        return False
    added = {str(i): t.content for i, t in backend.get_added_tokens_decoder().items()}
    listed = config.get("added_tokens_decoder") or {}
    return isinstance(listed, dict) and all(
        isinstance(v, dict) and added.get(k) == v.get("content") for k, v in listed.items())


def load(folder: Path) -> BertTokenizer | None:
    """The tokenizer of model folder `folder`, or None when it is not one this module
    reproduces (see the top)."""
    from tokenizers import Tokenizer

    config = _settings(folder)
    if config is None or not (folder / "tokenizer.json").is_file():
        return None
    try:
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # of any type (a damaged file): transformers then says what is wrong
        return None
    if not _agrees(backend, config):
        return None
    special = {k: config[k] for k in SPECIAL if config.get(k)}
    if any(backend.token_to_id(t) is None for t in special.values()):
        return None
    limit = config.get("model_max_length", NO_LIMIT + 1)
    return BertTokenizer(backend, special, int(limit))
