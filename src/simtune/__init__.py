"""simtune: fast fine-tuning of similarity models on cached frozen-encoder embeddings.

Importing `simtune` is cheap: torch, transformers and Lightning load only in the modules that need
them.
"""

from simtune.errors import UserError

__all__ = ["UserError"]
__version__ = "0.1.0"
