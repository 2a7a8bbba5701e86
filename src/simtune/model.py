"""A servable model: a frozen (or fine-tuned) encoder plus a trained head, loadable anywhere.

Export directory layout (`simtune export`):

- `simtune.json` — `{"format_version": 2, "encoder_name", "encoder": {model, pooling, normalize,
  max_length, dtype}, "head": "head", "normalize_output"}`; `encoder.model` is `encoder` (a copy
  inside the export) or `minilm`; `encoder_name` is the encoder's name in `params.yaml` (with
  "fine-tuned" in full mode); `normalize_output` is true when training compared vectors by angle
  (cosine distance, or arcface), so the output is L2-normalised: unit vectors, the same cosine
  ranking. Version 1 exports lack the last two keys: named after `encoder.model`, not normalised.
- `encoder/` — the Hugging Face model files (absent when the encoder is the bundled `minilm`).
- `head/` — `model.safetensors` + `config.json` (see `simtune.heads`).
- sentence-transformers files (`modules.json`: Transformer, `1_Pooling/`, `2_Normalize/` when the
  encoder normalises, the head, a last `N_Normalize/` when `normalize_output`), so
  `SentenceTransformer(dir)` loads the same model when that package is installed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from simtune import heads
from simtune.atomic import atomic_dir, write_json
from simtune.encoders import FrozenEncoder, model_dir, resolve_device
from simtune.errors import UserError
from simtune.params import EncoderParams

FORMAT_VERSION = 2


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


def export(head_dir: Path, out: Path) -> None:
    """Write a self-contained servable model from a trained head directory (atomically)."""
    head_dir = Path(head_dir)
    meta_path = head_dir / "training.json"
    if not meta_path.is_file():
        raise UserError(f"{head_dir}: no trained head here (run the train stage)")
    meta = json.loads(meta_path.read_text())
    spec = meta["encoder"]
    name, normalize_output = _trained_as(meta)
    source = head_dir / "encoder" if (head_dir / "encoder").is_dir() else None
    if source is None and spec["model"] != "minilm":
        source = model_dir("encoder", EncoderParams(**spec))
    with atomic_dir(Path(out)) as tmp:
        if source is not None:
            _copy_tree(source, tmp / "encoder")
            spec = {**spec, "model": "encoder"}
        shutil.copytree(head_dir, tmp / "head", ignore=shutil.ignore_patterns("encoder"))
        write_json(tmp / "simtune.json", {"format_version": FORMAT_VERSION, "encoder_name": name,
                                          "encoder": spec, "head": "head",
                                          "normalize_output": normalize_output})
        _sentence_transformers_files(tmp, spec, heads.load(tmp / "head").config["dim"],
                                     normalize_output)


def _copy_tree(src: Path, dest: Path) -> None:
    """Hard-link files when possible (same filesystem: no copy of the weights), else copy."""
    def link_or_copy(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dest, copy_function=link_or_copy)


def _sentence_transformers_files(root: Path, spec: dict, dim: int, normalize_output: bool
                                 ) -> None:
    """modules.json etc. so sentence-transformers loads: Transformer -> Pooling ->
    (Normalize) -> our head module -> (Normalize, when `normalize_output`)."""
    encoder_path = "encoder" if spec["model"] == "encoder" else ""
    modules = [{"idx": 0, "name": "0", "path": encoder_path,
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if spec["normalize"]:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (root / "2_Normalize").mkdir()
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": "head",
                    "type": "simtune.st_module.HeadModule"})
    if normalize_output:
        path = f"{len(modules)}_Normalize"
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path,
                        "type": "sentence_transformers.models.Normalize"})
        (root / path).mkdir()
    write_json(root / "modules.json", modules)
    (root / "1_Pooling").mkdir()
    write_json(root / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dim, "pooling_mode_cls_token": spec["pooling"] == "cls",
        "pooling_mode_mean_tokens": spec["pooling"] == "mean",
        "pooling_mode_max_tokens": spec["pooling"] == "max",
        "pooling_mode_mean_sqrt_len_tokens": False})
    write_json(root / "sentence_bert_config.json", {"max_seq_length": spec["max_length"],
                                                    "do_lower_case": False})
