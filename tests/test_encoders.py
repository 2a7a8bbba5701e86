"""The core encoder helpers: the one pooling function, the file hash, the config helper."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from simtune.encoders import model_config, pooled, sha256_of
from simtune.params import EncoderParams


def _spec(pooling: str = "mean", normalize: bool = True, model: str = "unused"
          ) -> EncoderParams:
    return EncoderParams(model=model, pooling=pooling, normalize=normalize, max_length=8,
                         dtype="float32")


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
