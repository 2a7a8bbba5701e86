"""simtune: fast fine-tuning of similarity models on cached frozen-encoder embeddings.

Importing `simtune` is cheap: torch, transformers and Lightning load only in the modules that need
them. `simtune.load_model(dir)` loads a trained or exported model (`.encode(texts)`).
"""

from typing import Any

from simtune.errors import UserError

__all__ = ["UserError", "load_model"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from simtune.model import load_model

        return load_model
    raise AttributeError(f"module 'simtune' has no attribute {name!r}")
