"""The backend tokenisation path gives exactly the transformers call's tensors and lengths, and
is not used where it would not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from simtune import tokens
from tests.cache_helpers import sentences

TEXTS = [*sentences(40), "", "a " * 300, "Caf\u00e9 na\u00efve \u2014 \U0001f642 ok?",
         "  spaced  out  "]


def _want(tok: Any, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
    return dict(tok(texts, padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt"))


def _check(tok: Any, max_length: int) -> None:
    fast = tokens.fast_path(tok, max_length)
    assert fast is not None
    for size in (1, 3, 17, len(TEXTS)):
        for s in range(0, len(TEXTS), size):
            batch = TEXTS[s : s + size]
            want = _want(tok, batch, max_length)
            for got in (fast(batch), fast.pad(fast.pieces(batch))):  # backend- and numpy-padded
                assert list(got) == list(want)
                for name in want:
                    assert torch.equal(got[name], want[name]), (name, batch)
    lengths = [len(x) for x in tok(TEXTS, truncation=True, max_length=max_length)["input_ids"]]
    assert fast.lengths(TEXTS) == lengths and max(lengths) == max_length


@pytest.mark.parametrize("side", ["right", "left"])
def test_tiny_bert_tokens_equal_the_transformers_call(tiny_bert: Path, side: str) -> None:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    tok.padding_side = side
    _check(tok, 24)


@pytest.mark.integration
def test_minilm_tokens_equal_the_transformers_call() -> None:
    import transformers

    from simtune import params as P
    from simtune.encoders import model_dir
    from tests.conftest import ROOT

    spec = P.load(ROOT / "params.yaml").encoders.models["minilm"]
    tok = transformers.AutoTokenizer.from_pretrained(model_dir("minilm", spec))
    _check(tok, spec.max_length)


def test_no_fast_path_where_it_would_differ(tiny_bert: Path) -> None:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    tok.model_input_names = [*tok.model_input_names, "position_ids"]  # not from the backend
    assert tokens.fast_path(tok, 24) is None
    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    call = tok.__class__.__call__

    def louder(self: Any, texts: list[str], *a: Any, **kw: Any) -> Any:
        return call(self, [t.upper() + " extra" for t in texts], *a, **kw)

    # a transformers call that does more than its backend
    tok.__class__ = type("Louder", (tok.__class__,), {"__call__": louder})
    assert tokens.fast_path(tok, 24) is None
