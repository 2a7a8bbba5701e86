"""The `export` stage: a plain sentence-transformers folder with a model card."""
