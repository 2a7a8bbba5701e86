"""The `train` stage: Lightning over one representation interface (a head on cached vectors, the
top layers on cached token states, or the full encoder). The only package that imports Lightning."""
