"""A head is scored and searched only with vectors cut the way it was trained on: evaluate and
`simtune search` compare the head's `training.json` (the query view's settings, as the cache
describes them) with the current settings, which the cache's own fingerprint is checked
against (`cache.views.open_cache`)."""

from __future__ import annotations

from pathlib import Path

from simtune.encoders import changes, describe, fingerprint
from simtune.errors import UserError
from simtune.model import training_meta
from simtune.params import EncodersParams


def check(head_dir: Path, encoders: EncodersParams) -> None:
    """`UserError` (one line naming what differs) when the head folder `head_dir` was trained
    on other settings of the query encoder than `encoders` (the current ones, the cache's):
    another encoder name, pooling, max_length, dtype, prompts, chunk settings or model files.
    A head folder without `training.json` (not a trained head) is the callers' to refuse; one
    trained before the description was recorded is compared by its settings alone."""
    if not (Path(head_dir) / "training.json").is_file():
        return
    meta = training_meta(head_dir)
    name = encoders.query
    current = encoders.models[name]
    now = describe(name, current, role="query")
    old = meta.encoder_description
    if old is None:  # an older head: its settings, with the current model's files
        old = describe(name, meta.encoder.model_copy(update={"model": current.model}),
                       role="query")
    differs = []
    if meta.query_encoder != name:
        differs.append(f"encoders.query: {meta.query_encoder!r} -> {name!r}")
    if fingerprint(old) != fingerprint(now):
        differs.append(changes(old, now))
    if differs:
        raise UserError(f"{Path(head_dir) / 'training.json'}: the head was trained on other "
                        f"encoder settings than the cache's ({'; '.join(differs)}); rerun train "
                        "(dvc repro) or set them back")
