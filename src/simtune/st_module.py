"""The trained head as a sentence-transformers module (used by exported models).

`SentenceTransformer(export_dir, trust_remote_code=True)` imports this class (sentence-transformers
>= 6 asks for `trust_remote_code` before importing a module class from outside its own package).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from simtune import heads


class HeadModule(nn.Module):
    """features["sentence_embedding"] (B, dim) -> head(...) (B, dim)."""

    def __init__(self, head: heads.Head) -> None:
        super().__init__()
        self.head = head

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        features["sentence_embedding"] = self.head(features["sentence_embedding"])
        return features

    def save(self, output_path: str, *args: object, **kwargs: object) -> None:
        heads.save(self.head, Path(output_path))

    @staticmethod
    def load(input_path: str) -> HeadModule:
        return HeadModule(heads.load(Path(input_path)))
