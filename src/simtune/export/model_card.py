"""The export's model card: `README.md` as the Hugging Face Hub and sentence-transformers read it.

YAML front matter (`library_name: sentence-transformers`, `pipeline_tag: sentence-similarity`,
`tags`, `base_model` when the encoder is a Hub model, `metrics` and a `model-index` with the
trained model's test metrics), then a body: the encoder, pooling, head and training mode, the
data set and its size, the params that matter, the test metrics of the trained model against the
frozen encoder with the verdict (better / no better / worse than it), and the command that
reproduces the model.

Every input beyond the training record is optional: a card written without `params.yaml`, the
prepare report or the metrics says so instead of inventing values.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simtune.errors import UserError
from simtune.examples import batch_for
from simtune.export.long_texts import recipe
from simtune.params import Params

HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}  # bundled encoders on the Hub
LOSS_KEYS = {"supcon": ("temperature",), "triplet": ("margin", "mining"),
             "contrastive": ("margin",), "arcface": ("margin", "scale"), "cosine_mse": (),
             "mnrl": ("scale", "symmetric")}
# min_steps and min_batch: with batch_size, what a small set's batch became (`examples.batch_for`)
# each mode's own schedule section (`train.schedule.<mode>`), the one in force
MODE_KEYS = {"head": ("schedule.head.lr", "schedule.head.batch_size", "min_steps", "min_batch",
                      "schedule.head.max_epochs", "schedule.head.patience"),
             "top_layers": ("schedule.top_layers.layers", "schedule.top_layers.lr",
                            "schedule.top_layers.head_lr", "schedule.top_layers.batch_size",
                            "min_steps", "min_batch", "schedule.top_layers.max_epochs",
                            "schedule.top_layers.patience"),
             "full": ("schedule.full.lr", "schedule.full.head_lr", "schedule.full.batch_size",
                      "min_steps", "min_batch", "schedule.full.max_epochs",
                      "schedule.full.patience")}
# a head folder saved at identity (`simtune.export.stage.kept_frozen`): what the model is
FROZEN = "the frozen encoder (no trained epoch beat it on validation)"
MODES = {"head": "encoder frozen; the head trained on cached embeddings",
         "top_layers": "the encoder's top layers and the head trained (lower layers frozen)",
         "full": "the whole encoder fine-tuned with the head"}


@dataclass
class CardInputs:
    """What the card reports beyond the export itself: the params the model was trained with,
    `reports/prepare.json` (data set size) and `reports/metrics.json` (test metrics); each
    None when not available."""

    params: Params | None = None
    data_report: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None


def read_report(path: Path | None) -> dict[str, Any] | None:
    """A JSON report as a dict; None when `path` is None or absent; `UserError` when it is not a
    JSON object."""
    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def _value(p: Params, dotted: str) -> Any:
    obj: Any = p
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _show(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def key_params(p: Params, kind: str) -> list[tuple[str, Any]]:
    """(dotted params.yaml key, value) of the settings that make this model: data, encoder,
    mode, head, loss and the mode's schedule."""
    keys = ["prepare.source"]
    keys += {"trec": ["prepare.trec_labels"], "file": ["prepare.file.path"]}.get(
        p.prepare.source, [])
    keys += ["prepare.split.by", "prepare.split.seed", "encoders.query"]
    if kind == "pairs" and p.encoders.document != p.encoders.query:
        keys.append("encoders.document")
    keys += ["train.mode", "train.head.type"]
    keys += ["train.head.side"] * (p.train.head.side != "both")
    if p.train.head.type == "mlp":
        keys += ["train.head.expansion", "train.head.dropout"]
    keys += _loss_keys(p)
    keys += [f"train.{k}" for k in MODE_KEYS[p.train.mode]]
    keys += ["train.frozen_candidate", "train.seed"]
    return [(k, _value(p, k)) for k in keys]


def _loss_keys(p: Params) -> list[str]:
    """The loss's keys: `train.loss` (with its own keys), or a distillation's (and `train.loss`
    only when the labels are in its loss)."""
    keys = []
    d = p.train.distill
    if p.train.objective == "distill":
        keys += ["train.objective", "train.distill.teacher", "train.distill.loss"]
        keys += ["train.distill.temperature"] * (d.loss == "kl")
        keys += ["train.distill.label_weight"]
        if d.label_weight == 0:
            return keys
    keys += ["train.loss.name", "train.loss.distance"]
    # `auto` stays as it is only where the head does not record its data kind (older heads)
    return keys + [f"train.loss.{k}" for k in LOSS_KEYS.get(p.train.loss.name, ())]


def _dataset(p: Params | None, kind: str) -> str:
    if p is None:
        return f"{kind} data"
    if p.prepare.source == "trec":
        n = 50 if p.prepare.trec_labels == "fine" else 6
        return f"TREC question classification ({p.prepare.trec_labels} labels, {n} classes)"
    if p.prepare.source == "news_pairs":
        return "news article title -> body pairs"
    return Path(str(p.prepare.file.path)).name


# the data sentence's words for each kind (what makes two texts similar)
KINDS = {"groups": "groups: texts with the same label are similar",
         "pairs": "pairs: each query with the documents relevant to it",
         "texts": "texts without labels"}
BATCH_KEYS = tuple(f"train.schedule.{m}.batch_size" for m in ("head", "top_layers", "full"))


def in_force(params: list[tuple[str, Any]], report: dict[str, Any] | None
             ) -> list[tuple[str, str]]:
    """(key, value as shown) of the params in force: the batch an epoch of the training
    examples ran with (`examples.batch_for`: shrunk for `train.min_steps`; one batch of all
    of them when larger, the train stage's `fit_batch_size`, one process), shown with the
    params.yaml value beside it when they differ."""
    n = (report or {}).get("examples", {}).get("train")
    given = dict(params)
    steps, floor = given.get("train.min_steps", 0), given.get("train.min_batch", 1)
    out = []
    for key, value in params:
        if key not in BATCH_KEYS or not isinstance(n, int) or n <= 0:
            out.append((key, _show(value)))
            continue
        batch = batch_for(n, value, steps, floor)[0]
        if batch >= n and value > n:
            out.append((key, f"{n} (params.yaml {value}: one batch of all {n} training "
                             "examples)"))
        elif batch != value:
            out.append((key, f"{batch} (params.yaml {value}: {-(-n // batch)} steps an epoch "
                             f"over {n} training examples; train.min_steps {steps}, "
                             f"min_batch {floor})"))
        else:
            out.append((key, _show(value)))
    return out


def _front_matter(meta: dict[str, Any], head: dict[str, Any], title: str, dataset: str,
                  metrics: dict[str, Any] | None, frozen: bool) -> dict[str, Any]:
    kind = "frozen-encoder" if frozen else f"{head['type']}-head"  # frozen: no head kept
    front: dict[str, Any] = {
        "library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
        "tags": ["sentence-transformers", "sentence-similarity", "feature-extraction",
                 "simtune", kind, f"{meta['mode']}-training"]}
    if meta["encoder"]["model"] in HUB_IDS:
        front["base_model"] = HUB_IDS[meta["encoder"]["model"]]
    if metrics is not None:
        trained = metrics["trained"]
        front["metrics"] = list(trained)
        front["model-index"] = [{"name": title, "results": [{
            "task": {"type": "information-retrieval", "name": "Information Retrieval"},
            "dataset": {"name": dataset, "type": "simtune", "split": "test"},
            "metrics": [{"type": k, "value": float(v), "name": f"{k} (test)"}
                        for k, v in trained.items()]}]}]
    return front


def _metrics_table(m: dict[str, Any]) -> list[str]:
    no_rel = m.get("queries_without_relevant", 0)
    rows = [f"Test split: {m['queries']} queries against a corpus of {m['corpus']}"
            + (f"; {no_rel} queries without a relevant item." if no_rel else "."), "",
            "| metric | trained | frozen encoder | lift | p-value |", "|---|---|---|---|---|"]
    for k, v in m["trained"].items():
        sig = m.get("significance", {}).get(k)
        p_value = f"{sig['p_value']:.4g}" if sig else ""
        rows.append(f"| {k} | {v:.4f} | {m['baseline'][k]:.4f} | {m['lift'][k]:+.4f} | "
                    f"{p_value} |")
    rows += ["", "p-value: paired randomization test of the lift over the same queries."]
    return rows + _verdict_lines(m.get("verdict"))


def _verdict_lines(v: Any) -> list[str]:
    """The verdict of `reports/evaluate.json` (better / no better / worse than the frozen
    encoder) in a sentence; nothing for a report written before verdicts."""
    if v is None:
        return []
    if not (isinstance(v, dict) and v.get("verdict") in ("better", "no better", "worse")
            and isinstance(v.get("says"), str)):
        raise UserError("the evaluate report's `verdict` is not one of better / no better / "
                        "worse with its sentence (rerun evaluate)")
    lines = ["", f"**Verdict: {v['says']}.**"]
    if v["verdict"] == "worse":
        lines += ["", "On this test set the frozen encoder alone ranks better than this model."]
    elif v["verdict"] == "no better":
        lines += ["", "On this test set this model cannot be told apart from the frozen "
                  "encoder alone."]
    return lines


def render(meta: dict[str, Any], head: dict[str, Any], plain: bool, modules: list[str],
           inputs: CardInputs, frozen: bool = False) -> str:
    """The card's text. `meta`: the head's `training.json`; `head`: its `config.json`;
    `plain`: True when plain `SentenceTransformer(dir)` loads it; `modules`: the
    sentence-transformers module names of `modules.json`, in order; `frozen`: the head was
    saved at identity (no trained epoch beat the frozen encoder): the card says the model is
    the frozen encoder, never a trained head."""
    p, report, metrics = inputs.params, inputs.data_report, inputs.metrics
    enc = meta["encoder"]
    name = meta["query_encoder"]
    title = f"simtune {name}: {FROZEN}" if frozen else f"simtune {name} + {head['type']} head"
    dataset = _dataset(p, meta["kind"])
    front = _front_matter(meta, head, title, dataset, metrics, frozen)
    hub = f" ({HUB_IDS[enc['model']]})" if enc["model"] in HUB_IDS else ""
    head_desc = head["type"] + (f" (expansion {head['expansion']}, dropout {head['dropout']})"
                                if head["type"] == "mlp" else "")
    mode = f"{meta['mode']}: {MODES[meta['mode']]}"
    if meta.get("mode_reason"):  # train.mode auto: what chose it
        mode += f" ({meta['mode_reason']})"
    if meta.get("lr_reason"):  # lr auto: the probe's choice
        mode += f"; {meta['lr_reason']}"
    if meta.get("steps_reason"):  # the step floor added passes
        mode += f"; {meta['steps_reason']}"
    if frozen:
        head_desc = f"none: {FROZEN}; no epoch of the trained `{head['type']}` head was kept"
        trained = {"head": "a head trained on cached embeddings",
                   "top_layers": "the top layers and a head trained on cached states",
                   "full": "the whole encoder and a head trained"}.get(meta["mode"], "trained")
        mode = f"{meta['mode']}: {trained}, no epoch kept: the encoder frozen"
    output = ("unit vectors (compare by cosine or dot product)" if meta.get("normalize_output")
              else "unnormalised vectors")
    what = (f"a `{head['type']}` head on it" if meta["mode"] == "head" else
            f"{'its top layers' if meta['mode'] == 'top_layers' else 'the whole encoder'} "
            f"and a `{head['type']}` head ({meta['mode']} mode)")
    about = (f"This is {FROZEN}, exported with simtune: simtune trained {what}, and no "
             "trained epoch ranked the validation queries better than the "
             f"encoder alone, so it gives the encoder's own {head['dim']}-dimensional {output}."
             if frozen else f"A sentence-transformers model trained with simtune: "
             f"{head['dim']}-dimensional {output}.")
    load = ('SentenceTransformer("path/to/export")' if plain else
            'SentenceTransformer("path/to/export", trust_remote_code=True)  # head: simtune code')
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "", f"# {title}", "",
             about, "", "## Usage", "", "```python",
             "from sentence_transformers import SentenceTransformer", "",
             f"model = {load}", 'vectors = model.encode(["how far is the moon ?"])', "```", "",
             "or `simtune.load_model(\"path/to/export\").encode([...])` (the same vectors).", "",
             "## Model", "", "| | |", "|---|---|",
             f"| base encoder | {name}{hub} |",
             f"| pooling | {enc['pooling']}{', L2-normalised' if enc['normalize'] else ''}, "
             f"max {enc['max_length']} tokens |",
             f"| head | {head_desc} |",
             f"| training mode | {mode} |",
             f"| modules | {' -> '.join(modules)} |", ""]
    if not plain:
        lines += ["The head has no plain sentence-transformers form: loading it needs "
                  "`trust_remote_code=True` and simtune installed.", ""]
    if meta.get("head_side") == "query":  # train.head.side: query (docs/keep-your-index.md)
        tower = meta["mode"] != "head"  # a query tower: the encoder's top layers trained too
        lines += ["## Existing document vectors stay valid", "",
                  ("A query tower (the encoder's top layers and the head, trained for queries "
                   "only: `encoder/`) embeds queries: `model.encode_query(...)` runs it, "
                   "`model.encode_document(...)` runs the frozen base encoder "
                   "(`document_encoder/`) and gives its vectors bit for bit (a "
                   "sentence-transformers `Router` over both). " if tower else
                   "The head adapts queries only: `model.encode_query(...)` applies it, "
                   "`model.encode_document(...)` gives the frozen base encoder's vectors bit for "
                   "bit (a sentence-transformers `Router`). ") +
                  "An index already built from the base "
                  "encoder's document vectors stays valid: query it with `encode_query`, "
                  "nothing is re-embedded.", ""]
    chunks = enc.get("chunks")
    if chunks and chunks["max"] > 1:
        lines += ["## Long texts", "", f"simtune sees a text longer than {enc['max_length']} "
                  f"tokens as up to {chunks['max']} overlapping windows whose vectors are "
                  f"pooled ({chunks['pool']}) before the head; sentence-transformers' `encode` "
                  "truncates it instead. These lines give simtune's vector "
                  "(`simtune.load_model(...).encode` gives the same):", "", "```python",
                  recipe(enc).rstrip(), "```", ""]
    lines += ["## Data", "", f"{dataset}; {KINDS.get(meta['kind'], meta['kind'])}."]
    if report is not None:
        ex = report.get("examples", {})
        lines[-1] += (f" {report.get('texts', '?')} distinct texts; examples: "
                      + ", ".join(f"{s} {ex[s]}" for s in ("train", "val", "test") if s in ex)
                      + ".")
    lines.append("")
    params = key_params(p, meta["kind"]) if p is not None else []
    if params:
        lines += ["## Training parameters", "", "The values in force when it trained:", "",
                  "| params.yaml key | value |", "|---|---|",
                  *(f"| `{k}` | {v} |" for k, v in in_force(params, report)), ""]
    lines += ["## Evaluation", ""]
    lines += _metrics_table(metrics) if metrics is not None else [
        "No evaluation report was available when this model was exported."]
    lines += ["", "## Reproduce", "", "In the simtune project this model was trained in:", "",
              "```bash", "dvc repro"]
    if params:  # the same settings as an experiment, one per line
        lines += ["dvc exp run \\", *(f"  -S {shlex.quote(f'{k}={_show(v)}')} \\"
                                       for k, v in params)]
        lines[-1] = lines[-1].removesuffix(" \\")
    lines += ["```", ""]
    return "\n".join(lines)
