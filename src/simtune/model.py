"""A servable model: a frozen (or fine-tuned) encoder plus a trained head, loadable anywhere.

Export directory layout (`simtune export`), format version 3:

- `simtune.json` — `{"format_version": 3, "encoder_name", "encoder": {model, pooling, normalize,
  max_length, dtype}, "head": "head", "normalize_output", "sentence_transformers": "plain" |
  "trust_remote_code"}`; `encoder.model` is `encoder` (the copy inside the export);
  `encoder_name` is the encoder's name in `params.yaml` (with "fine-tuned" in full mode);
  `normalize_output` is true when training compared vectors by angle (cosine distance, or
  arcface), so the output is L2-normalised: unit vectors, the same cosine ranking.
- `encoder/` — the Hugging Face model files (hard-linked where possible), the bundled `minilm`
  included, plus sentence-transformers' `sentence_bert_config.json` (`max_seq_length`).
- `head/` — `model.safetensors` + `config.json` (see `simtune.heads`): what `load_model` reads.
- sentence-transformers files (`modules.json`, `config_sentence_transformers.json`, the module
  folders; see `simtune.export.st_layout`): every head type is written as sentence-transformers' own
  `Dense` modules, so plain `SentenceTransformer(dir)` loads it (`"sentence_transformers":
  "plain"`); a head type without a `Dense` form would be served by `simtune.st_module.HeadModule`
  and need `trust_remote_code=True`.
- `README.md` — the model card (`simtune.export.model_card`).

Older exports still load with `load_model`: version 2 (no `sentence_transformers` key, the head
as `HeadModule`, no `encoder/` for `minilm`) and version 1 (also no `encoder_name`, not
normalised).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from simtune import heads
from simtune.encoders import FrozenEncoder, resolve_device
from simtune.errors import UserError
from simtune.params import EncoderParams

log = logging.getLogger("simtune.model")
FORMAT_VERSION = 3


class Model:
    """texts -> (N, dim) vectors: encoder, pooling, normalisation, the head, then (when
    `normalize_output`) L2 normalisation of the head's output."""

    def __init__(self, encoder: FrozenEncoder, head: heads.Head, normalize_output: bool) -> None:
        self.encoder, self.head = encoder, head.to(encoder.device).eval()
        self.normalize_output = normalize_output

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """(N, dim) float32 on CPU, in the order of `texts`; unit rows when `normalize_output`."""
        x = self.encoder.encode(list(texts), batch_size).to(self.encoder.device)
        out = self.head(x).float()
        if self.normalize_output:
            out = torch.nn.functional.normalize(out, dim=-1)
        return out.cpu()


def _trained_as(meta: dict[str, Any]) -> tuple[str, bool]:
    """(encoder name for logs and messages, normalize_output) from a head's training.json;
    heads trained before `normalize_output` existed were served unnormalised, and still are."""
    name = meta["query_encoder"] + (" fine-tuned" if meta["mode"] == "full" else "")
    return name, bool(meta.get("normalize_output", False))


def load_model(directory: str | Path, device: str = "auto") -> Model:
    """Load an export directory (or a trained `models/head` directory) as a `Model`."""
    directory = Path(directory)
    config_path = directory / "simtune.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        spec = dict(config["encoder"])
        name = config.get("encoder_name", spec["model"])  # version 1: no name, no normalisation
        normalize_output = bool(config.get("normalize_output", False))
        if spec["model"] != "minilm":
            spec["model"] = str(directory / spec["model"])
        head_dir = directory / config["head"]
    elif (directory / "training.json").is_file():  # a trained head straight from `train`
        meta = json.loads((directory / "training.json").read_text())
        spec = meta["encoder"]
        name, normalize_output = _trained_as(meta)
        if (directory / "encoder").is_dir():
            spec["model"] = str(directory / "encoder")
        head_dir = directory
    else:
        raise UserError(f"{directory}: not a simtune model (no simtune.json or training.json)")
    encoder = FrozenEncoder(name, EncoderParams(**spec), resolve_device(device))
    head = heads.load(head_dir)
    if head.config["dim"] != encoder.dim:
        raise UserError(f"{head_dir}: head expects {head.config['dim']}-d vectors, the encoder "
                        f"gives {encoder.dim}-d")
    return Model(encoder, head, normalize_output)


