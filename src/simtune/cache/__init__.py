"""The `cache` stage: each frozen encoder runs once per text; vectors (or token states after a
lower layer) live in the machine-wide store, and `cache/<encoder>/` is the view this data needs.
`views` is how later stages open it."""
