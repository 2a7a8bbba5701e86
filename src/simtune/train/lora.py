"""LoRA adapters (Hu et al. 2021) on the trainable layers, through `peft`; merged when saved.

`adapt` wraps the trainable model (the cut top in `top_layers` mode, the whole encoder in `full`)
in a `peft.PeftModel`: each targeted linear layer W x becomes W x + (alpha / r) B A dropout(x),
W frozen, A (r, in) and B (out, r) trained (B starts at zero: the wrapped model starts equal to
the original). Everything else freezes too, so AdamW keeps state for the adapters only. The
wrapper takes the model's own keyword arguments and returns its own outputs. `merged` gives the
plain transformers model with W + (alpha / r) B A in place of each adapted layer: what is saved,
so evaluate, export and plain sentence-transformers load it as any fine-tuned encoder.
Lightning-free; `peft` is imported only when LoRA is on.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

from simtune.errors import UserError, shorten
from simtune.params import LoraParams

# a BERT pooler is unused (we pool ourselves): adapters there would never get a gradient
EXCLUDE = r".*pooler.*"


def adapt(model: Any, lora: LoraParams | None) -> Any:
    """`model` with LoRA adapters on its `lora.target_modules` (only they train), or `model`
    unchanged when `lora` is None or `lora.r` is 0. `UserError` naming the key when no module
    matches."""
    if lora is None or lora.r == 0:
        return model
    check_rank(lora, int(model.config.hidden_size))
    import peft

    pooler = getattr(model, "pooler", None) is not None  # peft warns of an exclusion unused
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=lora.target_modules,
                             exclude_modules=EXCLUDE if pooler else None)
    try:
        with warnings.catch_warnings():  # peft asks transformers a deprecated question
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
            return peft.get_peft_model(model, config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise UserError(f"train.lora.target_modules: {lora.target_modules!r}: no such "
                        f"linear modules in the trainable layers of a {type(model).__name__} "
                        f"({shorten(str(e).splitlines()[0], 160)})") from None


def check_rank(lora: LoraParams, width: int) -> None:
    """`UserError` naming the key and the width when `lora.r` exceeds the layers' width: B A of
    a (width x width) layer has rank at most `width`, so a larger r adds no capacity, only
    compute (r 4096 on a 32-wide layer: epochs 30x slower)."""
    if lora.r > width:
        raise UserError(f"train.lora.r: {lora.r} is more than the width of the layers "
                        f"it adapts (hidden_size {width}): a rank above it adds no capacity, only "
                        f"compute; use at most {width} (LoRA's point is r much smaller)")


def merged(model: Any) -> Any:
    """The plain transformers model of `model`: a merged copy when it carries adapters (`model`
    itself unchanged, it may go on training), else `model`."""
    if not hasattr(model, "merge_and_unload"):
        return model
    return copy.deepcopy(model).merge_and_unload()
