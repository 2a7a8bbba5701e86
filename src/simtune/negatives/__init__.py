"""The `negatives` stage: hard negatives mined from the cached vectors; `mined` is how training
reads them."""
