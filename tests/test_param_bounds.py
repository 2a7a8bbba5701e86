"""Every numeric key of params.yaml is bounded by what the code can honour (issue 44, items 10-11).

The schema is walked at run time (`numeric_leaves`), so a key added later is covered without
editing this file: each int/float leaf (list items and mapping entries included) has a lower and
an upper bound, or is in `ALLOWED` with the reason. Each leaf is then set to its extremes (-1, 0,
huge, tiny, its own bounds and just past them): a value past a bound is refused by `check` in one
line naming the key and the whole allowed range; a value within the bounds is accepted (or
refused in one line naming the key by a rule across keys). Separate tests run the code paths
that read the risky keys at their bound values (seeds, temperatures, scale, margin, resamples,
ranking depth, mined negatives); batch sizes, shard rows, store and layer-cache sizes, token
lengths and epochs are only checked at the schema (a run at 2^20 rows or tokens is too slow for
a unit test).
"""

from __future__ import annotations

import copy
import math
import types
import typing
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import yaml
from pydantic import BaseModel

from simtune import params as P
from simtune.errors import UserError
from tests.conftest import repo_params, write_params


class Leaf(NamedTuple):
    """One numeric key of the schema: its dotted path (`<name>`: an entry of a mapping, `[]`:
    an item of a list), its type (int or float) and its pydantic constraints."""

    key: str
    kind: type
    metadata: tuple[Any, ...]


def _unwrap(ann: Any, meta: tuple[Any, ...]) -> list[tuple[Any, tuple[Any, ...]]]:
    """The concrete types an annotation stands for, each with the constraints that apply."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(ann)
        return _unwrap(base, (*meta, *extra))
    if origin in (typing.Union, types.UnionType):
        return [u for a in typing.get_args(ann) if a is not type(None) for u in _unwrap(a, meta)]
    return [(ann, meta)]


def numeric_leaves(model: type[BaseModel] = P.Params, prefix: str = "") -> list[Leaf]:
    """Every int and float leaf of `model`, in schema order."""
    out: list[Leaf] = []

    def visit(ann: Any, meta: tuple[Any, ...], key: str) -> None:
        for base, m in _unwrap(ann, meta):
            origin = typing.get_origin(base)
            if origin is list:
                visit(typing.get_args(base)[0], (), f"{key}[]")
            elif origin is dict:
                visit(typing.get_args(base)[1], (), f"{key}.<name>")
            elif isinstance(base, type) and issubclass(base, BaseModel):
                out.extend(numeric_leaves(base, f"{key}."))
            elif base in (int, float):
                out.append(Leaf(key, base, m))

    for name, field in model.model_fields.items():
        visit(field.annotation, tuple(field.metadata), prefix + name)
    return out


def bounds(leaf: Leaf) -> dict[str, float]:
    """The leaf's bounds: {'gt'|'ge': lower, 'lt'|'le': upper} (those it has)."""
    out: dict[str, float] = {}
    for m in leaf.metadata:
        for sub in getattr(m, "metadata", [m]):  # an item's `Field(gt=0)` holds its own list
            for op in ("gt", "ge", "lt", "le"):
                if getattr(sub, op, None) is not None:
                    out[op] = getattr(sub, op)
    return out


# Numeric keys with a bound the schema's metadata does not show, each with the reason. A key is
# here only while that reason holds: `test_the_allow_lists_are_current` fails on a stale entry.
ALLOWED = {
    # a sweep's values are train.* values: `_check_space` validates each against the train key's
    # own field (bounds included), so they cannot carry bounds of their own
    "sweep.space.<name>.low": "checked against the swept train key's schema",
    "sweep.space.<name>.high": "checked against the swept train key's schema",
    "sweep.space.<name>.choices[]": "checked against the swept train key's schema",
    "sweep.fixed.<name>": "checked against the fixed train key's schema",
}
# TrainParams keys whose bounds come with the lead's restructuring of the train section (issue
# 44: the schedule moved into train.schedule.<mode>, bounded there; TrainParams is theirs while
# it is under way). Remove each as it is bounded: `test_the_allow_lists_are_current` says when.
PENDING_TRAIN: set[str] = set()


def _bounded(leaf: Leaf) -> bool:
    b = bounds(leaf)
    return bool({"gt", "ge"} & set(b)) and bool({"lt", "le"} & set(b))


def test_the_walk_finds_every_kind_of_numeric_key() -> None:
    keys = {leaf.key: leaf for leaf in numeric_leaves()}
    # a section's key, a list's items, a mapping's entries, an optional float, a nested section
    assert keys["train.seed"].kind is int
    assert keys["evaluate.ks[]"].kind is int and bounds(keys["evaluate.ks[]"])["gt"] == 0
    assert keys["encoders.models.<name>.chunks.overlap"].kind is int
    assert keys["cache.max_layer_gb"].kind is float
    assert keys["train.loss.matryoshka_weights[]"].kind is float
    assert bounds(keys["prepare.split.fractions.val"]) == {"ge": 0, "le": 1}
    assert len(keys) >= 60


def test_every_numeric_key_has_a_lower_and_an_upper_bound() -> None:
    unbounded = [leaf.key for leaf in numeric_leaves() if not _bounded(leaf)
                 and leaf.key not in ALLOWED and leaf.key not in PENDING_TRAIN]
    assert unbounded == []


def test_the_allow_lists_are_current() -> None:
    """An allow-listed key still exists and still has no bounds (else it should leave the list);
    the reason is given."""
    leaves = {leaf.key: leaf for leaf in numeric_leaves()}
    stale = [k for k in (*ALLOWED, *PENDING_TRAIN) if k not in leaves or _bounded(leaves[k])]
    assert stale == []
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_parameters_page_states_every_bound() -> None:
    """The page's meaning column (`documented_keys`) ends with each key's bounds, as the
    one-line refusal gives them."""
    described = dict(P.documented_keys())
    missing = [leaf.key for leaf in numeric_leaves() if bounds(leaf) and not
               described[leaf.key.removesuffix("[]")].endswith(
                   f"bounds: `{P.range_text(leaf.metadata)}`)")]
    assert missing == []
    assert described["train.seed"].endswith("(bounds: `>= 0 and <= 4294967295`)")
    assert described["evaluate.ks"].endswith("(each item's bounds: `> 0 and <= 1000000`)")


# --- each key at its extremes -------------------------------------------------------------------

def _place(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set the leaf `key` of `raw` to `value`: `<name>` steps into the mapping's first entry,
    `[]` makes the list hold `value` alone."""
    node: Any = raw
    parts = key.split(".")
    for i, part in enumerate(parts):
        name = part.removesuffix("[]")
        last = i == len(parts) - 1
        if part == "<name>":
            entry = next(iter(node))
            if last:
                node[entry] = value
                return
            node = node[entry]
        elif last:
            node[name] = [value] if part.endswith("[]") else value
        else:
            node = node[name]


def _outside(value: float, b: dict[str, float]) -> bool:
    return (("gt" in b and value <= b["gt"]) or ("ge" in b and value < b["ge"])
            or ("lt" in b and value >= b["lt"]) or ("le" in b and value > b["le"]))


def _extremes(leaf: Leaf) -> list[Any]:
    """-1, 0, huge, tiny (floats), and each bound with the values just past it."""
    values: list[Any] = [-1, 0, 10**30] if leaf.kind is int else [-1.0, 0.0, 1e30, 1e-300]
    for at in bounds(leaf).values():
        if leaf.kind is int:
            values += [int(at) - 1, int(at), int(at) + 1]
        else:
            values += [math.nextafter(at, -math.inf), float(at), math.nextafter(at, math.inf)]
    return list(dict.fromkeys(values))


CASES = [pytest.param(leaf, value, id=f"{leaf.key}={value!r}")
         for leaf in numeric_leaves() for value in _extremes(leaf)]
_RAW = repo_params()  # read once: ~550 cases each take a copy


# a bound whose refusal says why instead of the range (the range is in the key's description)
OWN_MESSAGE = {("evaluate.hybrid.rrf_k", True): f"params.yaml: evaluate.hybrid.rrf_k: "
               f"{P.rrf_k_bound()}"}


def _dotted(key: str) -> str:
    """The dotted path pydantic reports for the placed value (first entry, first item)."""
    parts: list[str] = []
    node: Any = _RAW
    for part in key.split("."):
        if part == "<name>":
            parts.append(next(iter(node)))
            node = node[parts[-1]]
        elif part.endswith("[]"):
            parts += [part[:-2], "0"]
        else:
            parts.append(part)
            node = node.get(part) if isinstance(node, dict) else None
    return ".".join(parts)


@pytest.mark.parametrize(("leaf", "value"), CASES)
def test_each_numeric_key_at_its_extremes(leaf: Leaf, value: Any) -> None:
    params_raw = copy.deepcopy(_RAW)
    _place(params_raw, leaf.key, value)
    b = bounds(leaf)
    try:
        P.validate(params_raw, "params.yaml")
    except UserError as e:
        message = str(e)
        assert "\n" not in message
        if _outside(value, b):  # the bound's own refusal: the key and the whole range
            noun = "an integer" if leaf.kind is int else "a number"
            line = (f"params.yaml: {_dotted(leaf.key)}: expected {noun} "
                    f"{P.range_text(leaf.metadata)}, got {value!r}")
            own = OWN_MESSAGE.get((leaf.key, value > b.get("le", math.inf)))
            assert message == (line if own is None else f"{own}, got {value!r}")
        else:  # within the bounds: only a rule across keys may refuse it, naming the key
            # (or its section, for a rule over the section's keys: fractions summing to 1)
            parts = [p for p in _dotted(leaf.key).split(".") if not p.isdigit()]
            assert message.startswith("params.yaml: "), message
            assert parts[-1] in message or ".".join(parts[:-1]) in message, message
        return
    assert not _outside(value, b), f"{leaf.key}={value!r} is past its bounds {b} but passed"
    if value in (10**30, 1e30):  # a huge value passes only a key whose bound is elsewhere
        assert leaf.key in ALLOWED or leaf.key in PENDING_TRAIN


# --- item 10: seeds ---------------------------------------------------------------------------

SEEDS = ["prepare.split.seed", "train.seed", "evaluate.significance.seed", "sweep.seed"]


@pytest.mark.parametrize("key", SEEDS)
@pytest.mark.parametrize("seed", [-1, 10**30, 2**32])
def test_a_seed_no_generator_takes_is_refused_naming_the_key(params_raw: dict[str, Any],
                                                             key: str, seed: int) -> None:
    """-1 passed `check`; DVC then deleted models/head and train died in a Lightning traceback
    (the sweep in Optuna's, evaluate in numpy's)."""
    _place(params_raw, key, seed)
    with pytest.raises(UserError) as e:
        P.validate(params_raw, "params.yaml")
    top = 2**31 - 1 if key == "sweep.seed" else 2**32 - 1
    assert str(e.value) == (f"params.yaml: {key}: expected an integer >= 0 and <= {top}, "
                            f"got {seed}")


def test_the_check_command_refuses_a_negative_seed_before_any_stage(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from stages import app

    raw = repo_params()
    raw["train"]["seed"] = -1
    params = write_params(tmp_path / "params.yaml", raw)
    out = tmp_path / "checked.json"
    result = CliRunner().invoke(app, ["check", "--params", str(params), "--out", str(out)])
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"error: {params}: train.seed: expected an integer >= 0 "
                                     "and <= 4294967295, got -1")
    assert not out.exists()


LRS = ["train.schedule.head.lr", "train.schedule.top_layers.lr",
       "train.schedule.top_layers.head_lr", "train.schedule.full.lr", "train.schedule.full.head_lr"]


@pytest.mark.parametrize("key", LRS)
def test_the_check_command_bounds_every_learning_rate_as_statics(tmp_path: Path, key: str
                                                                  ) -> None:
    """Issue 52, item 5: `lr: 1e30` passed `check` for head, top_layers and full (static's was
    refused above 10); DVC then deleted models/head and train diverged. Refused at the check
    now, by the same bound as static's."""
    from typer.testing import CliRunner

    from stages import app

    raw = repo_params()
    _place(raw, key, 1e30)
    params = write_params(tmp_path / "params.yaml", raw)
    out = tmp_path / "checked.json"
    result = CliRunner().invoke(app, ["check", "--params", str(params), "--out", str(out)])
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"error: {params}: {key}: expected a number > 0 and "
                                     "<= 10, got 1e+30")
    assert not out.exists()
    _place(raw, key, 10)  # the bound itself passes, as static's
    P.validate(raw)
    assert _max("train.schedule.static.lr") == 10


@pytest.mark.parametrize("key", LRS)
@pytest.mark.parametrize(("text", "shown"), [("1e+30", "1e+30"), ("-1e-4", "-0.0001")])
def test_a_rate_written_as_dvcs_s_writes_it_gets_the_bounds_line(tmp_path: Path, key: str,
                                                                 text: str, shown: str) -> None:
    """`dvc exp run -S train.schedule.top_layers.lr=1e30` writes `lr: 1e+30`, which PyYAML
    reads as text: the encoder modes' `number | auto` rates said "expected a number or 'auto',
    got '1e+30'" (the hostile round of issue 52); the bound's line, as a number, now."""
    raw = repo_params()
    _place(raw, key, "PLACEHOLDER")
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw, sort_keys=False).replace("PLACEHOLDER", text))
    with pytest.raises(UserError) as err:
        P.load(params)
    assert str(err.value) == (f"{params}: {key}: expected a number > 0 and <= 10, "
                              f"got {shown}")


def _max(key: str) -> int:
    leaf = next(leaf for leaf in numeric_leaves() if leaf.key == key)
    return int(bounds(leaf)["le"])


@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_every_generator_takes_a_seed_at_its_bounds(seed: int) -> None:
    """What reads each seed accepts both ends of its range: Lightning (train), numpy (evaluate),
    torch (the batch order), the split's hash; the sweep's sampler gets sweep.seed + the
    trials its study holds, which stays below 2^32 up to 2^31 trials."""
    import optuna
    import pytorch_lightning as pl

    from simtune.prepare.split import assign
    from simtune.retrieval.significance import paired
    from simtune.train.sampling import EpochBatches

    assert _max("train.seed") == _max("prepare.split.seed") == 2**32 - 1
    assert _max("evaluate.significance.seed") == 2**32 - 1
    pl.seed_everything(seed, workers=True, verbose=False)
    sig = paired(np.array([0.5, 1.0, 0.0, 1.0]), np.array([0.0, 0.5, 0.0, 0.0]), 100, seed)
    assert 0 < sig["p_value"] <= 1
    sampler = EpochBatches(10, 4, seed)
    sampler.set_epoch(10**5)  # seed * 100_003 + epoch: far inside torch's 64-bit seeds
    assert sorted(i for batch in sampler for i in batch) == list(range(10))
    split = assign([f"k{i}" for i in range(20)], {"train": 0.8, "val": 0.1, "test": 0.1}, seed)
    assert sorted(split.values()).count("train") == 16
    top = min(seed, _max("sweep.seed")) + 2**31  # the sampler's seed after 2^31 trials
    assert top <= 2**32 - 1
    optuna.samplers.TPESampler(seed=top)


# --- item 11: the numeric code paths at their bounds ----------------------------------------

def _train(raw: dict[str, Any], **loss: Any) -> P.TrainParams:
    raw["train"]["loss"].update(loss)
    return P.validate(raw).train


def _finite_loss_and_grad(module: torch.nn.Module, *args: Any) -> float:
    value = module(*args)
    value.backward()
    grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert math.isfinite(value.item())
    return value.item()


def _limits(leaf_key: str) -> tuple[float, float]:
    leaf = next(leaf for leaf in numeric_leaves() if leaf.key == leaf_key)
    b = bounds(leaf)
    return b.get("ge", b.get("gt")), b.get("le", b.get("lt"))


def _embeddings(rows: int = 16, dim: int = 8) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(0)).requires_grad_()


@pytest.mark.parametrize("end", [0, 1])
@pytest.mark.parametrize("distance", ["cosine", "dot", "euclidean"])
def test_supcon_at_the_temperature_bounds_is_finite(params_raw: dict[str, Any], end: int,
                                                    distance: str) -> None:
    """1e-300 divided the similarities into inf and the run "diverged", blaming the lr."""
    from simtune.train.losses import build_loss

    temperature = _limits("train.loss.temperature")[end]
    assert temperature == (1e-3, 100)[end]
    t = _train(params_raw, name="supcon", temperature=temperature, distance=distance)
    loss = build_loss("groups", t, num_classes=4, dim=8)
    labels = torch.arange(16) % 4
    _finite_loss_and_grad(loss, _unit(_embeddings()) if distance == "cosine"
                          else _embeddings(), labels)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """`x` scaled to unit rows, a leaf that takes a gradient."""
    return torch.nn.functional.normalize(x, dim=-1).detach().requires_grad_()


@pytest.mark.parametrize("end", [0, 1])
def test_arcface_and_mnrl_at_the_scale_and_margin_bounds_are_finite(
        params_raw: dict[str, Any], end: int) -> None:
    from simtune.train.losses import build_loss

    scale, margin = _limits("train.loss.scale")[end], _limits("train.loss.margin")[end]
    arc = build_loss("groups", _train(params_raw, name="arcface", scale=scale, margin=margin),
                     num_classes=4, dim=8)
    _finite_loss_and_grad(arc, _embeddings(), torch.arange(16) % 4)
    mnrl = build_loss("pairs", _train(copy.deepcopy(repo_params()), name="mnrl", scale=scale,
                                      margin=margin, symmetric=True), num_classes=0, dim=8)
    q, d = _embeddings(), _embeddings(16).detach().flip(0).requires_grad_()
    _finite_loss_and_grad(mnrl, q, d, torch.arange(16), torch.arange(16) + 100, torch.ones(16))


@pytest.mark.parametrize("end", [0, 1])
def test_distillation_kl_at_the_temperature_bounds_is_finite(end: int) -> None:
    from simtune.train.distill import DistillLoss

    temperature = _limits("train.distill.temperature")[end]
    assert temperature == (1e-3, 100)[end]
    student = _embeddings()
    teacher = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    _finite_loss_and_grad(DistillLoss("kl", temperature), student, teacher, None)


def test_significance_at_the_most_resamples_finishes() -> None:
    """10**30 resamples ran forever with no message; at the bound (10**6) 40 queries take
    about a second."""
    from simtune.retrieval.significance import paired

    most = _max("evaluate.significance.resamples")
    assert most == 10**6
    rng = np.random.default_rng(0)
    trained, baseline = rng.random(40), rng.random(40)
    sig = paired(trained, baseline, most, _max("evaluate.significance.seed"))
    assert 1 / (most + 1) <= sig["p_value"] <= 1
    assert sig["ci95"][0] <= float(np.mean(trained - baseline)) <= sig["ci95"][1]


def test_ranking_and_mining_at_their_bounds_take_what_the_corpus_has() -> None:
    """Recall@k, the run depth and the mined negatives at their upper bounds on a small
    corpus: every document, in order, no error."""
    from simtune.negatives.mining import mine
    from simtune.retrieval.topk import topk

    k = max(_max("evaluate.ks[]"), _max("evaluate.run_depth"))
    corpus = torch.nn.functional.normalize(torch.randn(30, 8), dim=-1)
    scores, index = topk(corpus[:3], corpus, k)
    assert index.shape == (3, 30) and bool((scores[:, :-1] >= scores[:, 1:]).all())
    listed = torch.tensor([[0, 0], [1, 1], [2, 2]])
    mined = mine(corpus[:3], corpus, listed, torch.ones(3, dtype=torch.bool),
                 _max("negatives.count"), _limits("negatives.margin")[1], False)
    # the largest margin skips every document (cosines differ by at most 2)
    assert int((mined.index >= 0).sum()) == 0 and _limits("negatives.margin")[1] == 2
