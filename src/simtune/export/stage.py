"""The `export` stage: a trained head directory -> a self-contained servable model folder."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

from simtune import heads, model_files, st_files
from simtune.atomic import atomic_dir, write_json
from simtune.encoders import model_dir
from simtune.export import st_layout
from simtune.export.destination import destination
from simtune.export.model_card import FROZEN, CardInputs, render
from simtune.model import (
    FORMAT_VERSION,
    _trained_as,
    frozen_encoder,
    trained_encoder,
    training_meta,
)
from simtune.params import ANGULAR_LOSSES, effective, resolve_loss

log = logging.getLogger(__name__)

# files of sentence-transformers' own layout in an encoder directory (the bundled minilm has
# them): not copied, the export writes its own
_ST_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_*_config.json",
             "README.md", ".gitattributes", "[0-9]_[A-Z]*")



def export(head_dir: Path, out: Path, card: CardInputs | None = None,
           encoder: str | None = None) -> bool:
    """Write a self-contained servable model from a trained head directory (atomically, into
    `out` or the folder a link `out` leads to: new, empty or an earlier export, never another
    folder; see `simtune.export.destination`), with its model card (`card`: what it reports
    beyond the head; nothing more when None).

    `encoder`: the `model` of the encoder the params name (default: `card.params`' query
    encoder), needed when the head has no `encoder/` of its own and training.json names a
    local one (see `simtune.model.trained_encoder`: a folder never picks files outside itself).
    Returns True when plain `SentenceTransformer(out)` loads it, False when the head needs
    `trust_remote_code=True` (a head type with no `Dense` form; see `simtune.export.st_layout`)."""
    head_dir, card = Path(head_dir), card or CardInputs()
    meta = training_meta(head_dir)
    model_files.contained(head_dir)  # the copy below follows links: none may leave the folder
    if card.params is not None and meta.kind is not None:  # the loss that ran (`auto` resolved)
        p = card.params
        train = resolve_loss(effective(p.train, meta.mode, "as trained (training.json)"),
                             meta.kind, f"the data {head_dir} was trained on")
        card = replace(card, params=p.model_copy(update={"train": train}))
    name, normalize_output = _trained_as(meta)
    head = heads.load(head_dir)
    frozen_kept = meta.selected == "frozen" or kept_frozen(head, head_dir)
    if encoder is None and card.params is not None:
        encoder = card.params.encoders.models[card.params.encoders.query].model
    source = model_dir("encoder", meta.encoder.model_copy(
        update={"model": trained_encoder(head_dir, meta, encoder)}))
    # a query tower (top_layers, side query): the frozen encoder embeds the documents
    frozen = (model_dir("encoder", meta.encoder.model_copy(
        update={"model": frozen_encoder(head_dir, meta, encoder)}))
        if meta.head_side == "query" and (head_dir / "encoder").is_dir() else None)
    similarity = None
    if card.params is not None:
        loss = card.params.train.loss
        similarity = "cosine" if loss.name in ANGULAR_LOSSES else loss.distance
    # before any work: never over a user's folder, a link, the inputs or a workspace's data
    where = destination(Path(out), [head_dir, source, *([frozen] if frozen else [])])
    with atomic_dir(where) as tmp:
        _copy_tree(source, tmp / "encoder")
        if frozen is not None:
            _copy_tree(frozen, tmp / "document_encoder")
        spec = {**meta.encoder.model_dump(), "model": "encoder"}
        shutil.copytree(head_dir, tmp / "head", ignore=shutil.ignore_patterns("encoder"))
        plain = st_layout.write(tmp, spec, head, normalize_output, similarity, meta.head_side)
        modules = [m["type"].rsplit(".", 1)[-1]
                   for m in json.loads((tmp / "modules.json").read_text())]
        (tmp / "README.md").write_text(render(meta.model_dump(), head.config, plain, modules, card,
                                              frozen=frozen_kept), encoding="utf-8")
        write_json(tmp / "simtune.json", {
            "format_version": FORMAT_VERSION, "encoder_name": name, "encoder": spec,
            "head": "head", "normalize_output": normalize_output,
            "sentence_transformers": "plain" if plain else "trust_remote_code",
            # every file that decides how sentence-transformers computes a vector (the head's
            # two copies, modules.json, the module configs), checked whenever simtune reads
            # the export back
            "sha256": {rel: st_files.sha256_file(tmp / rel)
                       for rel in st_files.decisive_files(tmp)},
            # what a later export may replace (`destination`): this list and nothing else
            "files": model_files.written(tmp, "simtune.json"),
            **({"head_side": meta.head_side} if meta.head_side != "both" else {}),
            **({"document_encoder": "document_encoder"} if frozen is not None else {})})
    what = f"{FROZEN}:" if frozen_kept else f"head '{head.config['type']}' as"
    if plain:
        log.info("exported %s: loads with plain SentenceTransformer(%r) (%s %s)", out,
                 str(out), what, " -> ".join(modules))
    else:
        log.warning("exported %s: head '%s' has no plain sentence-transformers form; "
                    "SentenceTransformer(%r, trust_remote_code=True) loads it (simtune installed)",
                    out, head.config["type"], str(out))
    return plain



def kept_frozen(head: heads.Head, head_dir: Path) -> bool:
    """Whether a trained head folder is the frozen encoder itself: train saves the head at its
    identity state when no trained epoch beat epoch 0 on validation (reports/train.json
    `selected: frozen`), and in head mode (no fine-tuned `encoder/` beside it) that is the
    whole model. An `identity` head type trains nothing: no selection to report."""
    return (head.config["type"] != "identity" and not (head_dir / "encoder").is_dir()
            and head.at_identity())


def _copy_tree(src: Path, dest: Path) -> None:
    """Hard-link files when possible (same filesystem: no copy of the weights), else copy;
    sentence-transformers' own files of `src` are left out."""
    def link_or_copy(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dest, copy_function=link_or_copy,
                    ignore=shutil.ignore_patterns(*_ST_FILES))
