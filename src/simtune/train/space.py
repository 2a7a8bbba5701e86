"""The sweep's search space (`sweep.space` of params.yaml) as Optuna suggestions, and a trial's
values applied three ways: to the params (a trial), as `dvc exp run -S` overrides (the line
that reproduces a trial through the pipeline), and into params.yaml in place (`--apply`,
comments kept). Lightning-free; Optuna is used only through the trial passed in.
"""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simtune import params as P
from simtune.atomic import write_bytes
from simtune.errors import UserError
from simtune.train.losses import USED_BY

log = logging.getLogger(__name__)


def check_mode(p: P.Params) -> None:
    """Every swept and fixed key matters in `train.mode` (checked when a sweep starts, not when
    params.yaml loads: another mode must not break the pipeline's stages): a key of another
    mode's schedule (`train.schedule.<other>.*`) is refused, naming the mode that runs."""
    mode = p.train.mode
    for what, keys in (("space", p.sweep.space), ("fixed", p.sweep.fixed)):
        for key in keys:
            parts = key.removeprefix("train.").split(".")
            if parts[0] == "schedule" and len(parts) > 1 and parts[1] != mode:
                raise UserError(f"sweep.{what}.{key}: has no effect in train.mode {mode} "
                                f"(its schedule is train.schedule.{mode}; set "
                                f"sweep.fixed train.mode: {parts[1]} to sweep that mode)")


def check_ignored(p: P.Params, kind: str) -> None:
    """A swept or fixed `train.loss.*` key that no loss of the sweep reads (`loss.margin` with
    supcon) is a warning line; when every swept key is such a key (every trial would train the
    same), the sweep is refused; so is a loss choice that `auto` repeats (`auto` and `supcon`
    on groups data). `kind`: the data's (groups | pairs), which `auto` resolves by."""
    sw = p.sweep
    name = sw.space.get("train.loss.name")
    given = set(name.choices) if name is not None and name.choices else \
        {sw.fixed.get("train.loss.name", p.train.loss.name)}
    auto = P.LOSSES[kind][0] if kind in P.LOSSES else "auto"
    if name is not None and name.choices and {"auto", auto} <= set(name.choices):
        raise UserError(f"sweep.space.train.loss.name: auto is {auto} on {kind} data, also a "
                        "choice: their trials would train the same; remove one")
    names = {auto if n == "auto" else n for n in given}
    losses = ", ".join(sorted(str(n) for n in names))
    reader = f"train.loss.name {losses}"
    ignored = [(what, key, f"{reader} does not read it ({', '.join(sorted(users))} do)")
               for what, keys in (("space", sw.space), ("fixed", sw.fixed))
               for key in keys if key.startswith("train.loss.")
               and not (users := USED_BY.get(key.removeprefix("train.loss."), names)) & names]
    objective = _objective_ignored(p)
    if objective:  # the objective's reason first: it holds whatever the loss would read
        keys = {key for _, key, _ in objective}
        ignored = objective + [i for i in ignored if i[1] not in keys]
        reader = "the objective"
    if set(sw.space) <= {key for _, key, _ in ignored}:
        raise UserError(f"sweep.space: {reader if not objective else _reason(objective)} "
                        f"reads none of the swept keys ({', '.join(sw.space)}): every trial "
                        "would train the same")
    for what, key, why in ignored:
        log.warning("sweep.%s.%s: %s: every value of it trains the same", what, key, why)


def _values(p: P.Params, key: str) -> set[Any] | None:
    """The values `key` (`train.<path>`) takes in the sweep's trials: its choices, its fixed
    value or params.yaml's; None for a swept range (any value)."""
    sw = p.sweep
    if key in sw.space:
        return set(sw.space[key].choices) if sw.space[key].choices is not None else None
    if key in sw.fixed:
        return {sw.fixed[key]}
    node: Any = p.train
    for part in key.removeprefix("train.").split("."):
        node = getattr(node, part)
    return {node}


def _objective_ignored(p: P.Params) -> list[tuple[str, str, str]]:
    """(where, key, why) of each swept or fixed key the objective leaves unread: `train.distill.*`
    under `similarity`; under `distill`, `train.loss.*` while the labels stay out of the loss
    (`label_weight` 0) and the distillation `temperature` unless the loss is kl."""
    objective, sw = _values(p, "train.objective"), p.sweep
    keys = [(what, key) for what, keys in (("space", sw.space), ("fixed", sw.fixed))
            for key in keys]
    out = []
    for what, key in keys:
        if key.startswith("train.distill.") and objective == {"similarity"}:
            out.append((what, key, "train.objective similarity does not read train.distill"))
        elif objective != {"distill"}:
            continue
        elif key.startswith("train.loss.") and _values(p, "train.distill.label_weight") == {0}:
            out.append((what, key, "train.objective distill with train.distill.label_weight 0 "
                                   "does not read train.loss (the labels stay out of the loss)"))
        elif key == "train.distill.temperature" and "kl" not in (
                _values(p, "train.distill.loss") or {"kl"}):
            loss = ", ".join(sorted(_values(p, "train.distill.loss") or ()))
            out.append((what, key, f"train.distill.loss {loss} does not read it (kl does)"))
    return out


def _reason(ignored: list[tuple[str, str, str]]) -> str:
    """The objective's reason of a refusal: what reads none of the keys."""
    return ignored[0][2].split(" does not read")[0]


def combinations(space: dict[str, P.SpaceEntry]) -> int | None:
    """How many distinct trials the space holds (choices, integer ranges); None: unbounded (a
    float range)."""
    sizes = []
    for key, entry in space.items():
        if entry.choices is not None:
            sizes.append(len(entry.choices))
        elif P.train_field(key.removeprefix("train.")).annotation in (int, "int"):
            sizes.append(int(entry.high) - int(entry.low) + 1)
        else:
            return None
    return math.prod(sizes)


def suggest(trial: Any, space: dict[str, P.SpaceEntry]) -> dict[str, Any]:
    """`train.<key>` -> the value `trial` (an `optuna.Trial`) picks from each entry: a choice,
    an integer of an integer key's range, else a float; on a log scale where `log`."""
    values: dict[str, Any] = {}
    for key, entry in space.items():
        if entry.choices is not None:
            values[key] = trial.suggest_categorical(key, entry.choices)
        elif P.train_field(key.removeprefix("train.")).annotation in (int, "int"):
            values[key] = trial.suggest_int(key, int(entry.low), int(entry.high), log=entry.log)
        else:
            values[key] = trial.suggest_float(key, float(entry.low), float(entry.high),
                                              log=entry.log)
    return values


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        raw = raw[part]
    raw[leaf] = value


def apply(p: P.Params, values: dict[str, Any]) -> P.Params:
    """`p` with each dotted key (`train.lr`) set to its value, validated as params.yaml is."""
    raw = p.model_dump()
    for key, value in values.items():
        _set(raw, key, value)
    return P.validate(raw)


def literal(value: Any) -> str:
    """A value as YAML (and DVC's -S parser) read it back to the same value: floats by their
    shortest exact repr, booleans lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def overrides(values: dict[str, Any], temp: bool = False) -> str:
    """The `dvc exp run` line that trains and evaluates with `values` through the pipeline;
    `temp`: with `--temp` (a temporary copy: the workspace's params.yaml stays as it is)."""
    return "dvc exp run " + "--temp " * temp + " ".join(f"-S {shlex.quote(f'{k}={literal(v)}')}"
                                     for k, v in values.items())


def parse_overrides(line: str) -> dict[str, Any]:
    """The `-S key=value` pairs of a `dvc exp run` line, values read as YAML (as DVC reads
    them); the inverse of `overrides` for its own lines."""
    import yaml

    words = shlex.split(line)
    pairs = [words[i + 1] for i, w in enumerate(words) if w == "-S"]
    out = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        out[key] = P._yaml_float(yaml.safe_load(value))
    return out


def write_yaml(path: Path, values: dict[str, Any],
               unchanged: Callable[[bytes], None] | None = None) -> None:
    """Set each dotted key of `values` in the YAML file `path` in place: ruamel's round trip
    keeps comments, order and layout; the file is replaced atomically and must still validate
    (so a failure leaves it as it was). `unchanged` (raises to refuse) is given the file's
    bytes when they are read and again just before the rename: an edit landing meanwhile is
    refused, never overwritten (what is left is the atomic rename's own instant)."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip mode
    yaml.width = 4096  # never re-wrap a long line
    yaml.preserve_quotes = True
    yaml.representer.add_representer(  # ruamel writes null as nothing; keep the file's `null`
        type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    data = path.read_bytes()
    if unchanged is not None:
        unchanged(data)
    before = data.decode("utf-8")
    P.parse_yaml(before, str(path))  # a key given twice: one line (ruamel raises its own error)
    raw = yaml.load(before)
    for key, value in values.items():
        try:
            _set(raw, key, value)
        except (KeyError, TypeError):
            raise UserError(f"{path}: no key {key} to set") from None
    out = io.StringIO()
    yaml.dump(raw, out)
    text = out.getvalue()
    P.validate(P.parse_yaml(text, str(path)), str(path))
    if unchanged is not None:
        unchanged(path.read_bytes())
    write_bytes(path, text.encode("utf-8"))
