"""What a bench ran under, against today's params.yaml: the note under each generated table.

Each bench/<name>.json records `run_under` (bench.common.write_results: the commit and every
params.yaml value, flattened to dotted keys). A table or figure from a file whose values differ
from today's says which, with today's value beside each (`settings_note`, `settings_text`); a
key that moved since (simtune.params.MOVED: `train.patience` is now
`train.schedule.head.patience`) is compared at its new place, so a move alone is no change.
A file written before `run_under` existed says so, and what it records of its settings.
Pure Python (no torch): the docs build imports it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

# the params.yaml sections a bench's figures depend on; a bench not named depends on every
# section (it starts from params.yaml and changes a few keys). results.json's no-op rerun
# depends on no value.
DEPENDS: dict[str, tuple[str, ...]] = {"results": ()}
# keys every row of a bench sets itself (each row is named by its mode and runs in it, whatever
# params.yaml's default): today's value of such a key changes nothing the bench measured
ROW_KEYS: dict[str, tuple[str, ...]] = {name: ("train.mode",) for name in (
    "layers", "layers_full", "distill", "long_docs", "long_docs_top2", "small_data")}
# bench.static's teachers trained in the top layers on every set (auto chose them: its JSON
# records each teacher's mode), so the full mode's schedule changed nothing it measured
ROW_KEYS["static"] = tuple(f"train.schedule.full.{k}" for k in (
    "lr", "head_lr", "probe_rates", "probe_steps", "min_run_steps", "batch_size", "max_epochs",
    "patience", "val_every", "train_embeddings"))
# the default pipeline's stages (startup) and top-layers and head epochs (threads): no run of
# either trains in full mode
ROW_KEYS["startup"] = ROW_KEYS["threads"] = ROW_KEYS["static"]


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A params tree as `{dotted key: value}` (an empty mapping is a value)."""
    if isinstance(tree, dict) and tree:
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def _moved() -> dict[str, str]:
    """simtune.params.MOVED as old dotted key -> new dotted key (the first one named; a move
    to several places, `<mode>`, is left out: no single value to compare with)."""
    if str(ROOT / "src") not in sys.path:  # the checkout's code, not an installed copy
        sys.path.insert(0, str(ROOT / "src"))
    from simtune import params

    out = {}
    for old, new in getattr(params, "MOVED", {}).items():
        first = new.split(" ")[0]
        if "<" not in first:
            out[old] = first
    return out


def today_key(key: str, now: dict[str, Any]) -> str:
    """Where a recorded key lives in today's flattened params: itself, or the place it moved to
    (also inside a key, as the sweep's `sweep.space.train.lr.low`); itself when neither is."""
    if key in now:
        return key
    for old, new in sorted(_moved().items(), key=lambda kv: -len(kv[0])):
        found = re.search(rf"(?:^|\.)({re.escape(old)})(?:\.|$)", key)
        moved = found and key[:found.start(1)] + new + key[found.end(1):]
        if moved and moved in now:
            return moved
    return key


def settings_changed(name: str, results: dict[str, Any], today: dict[str, Any]
                     ) -> list[tuple[str, Any, Any]] | None:
    """`(key, then, now)` for each params.yaml value bench `name` ran under (`run_under`) that
    differs today, within the sections it depends on; a key added since is no change (it was
    not there to differ), a key removed since is (`now` None), a key moved since is compared at
    its new place. None: the bench records nothing."""
    entry = results if name == "results" else results.get(name, {})
    record = entry.get("run_under") if isinstance(entry, dict) else None
    if record is None:
        return None
    sections = DEPENDS.get(name)
    now = flat(today)
    out = []
    for k, v in record["params"].items():
        if (sections is not None and k.split(".")[0] not in sections) or k in ROW_KEYS.get(
                name, ()):
            continue
        value = now.get(today_key(k, now))
        if value != v and not (value == "auto" and v == resolved_auto(today_key(k, now))):
            out.append((k, v, value))
    return out


def resolved_auto(key: str) -> Any:
    """What `auto` resolved to for `key` in the checked-in default run (docs/run/train.json,
    TREC): the rate `lr: auto` chose for a `train.schedule.<mode>.lr` or `.head_lr` (its
    `in_force`; None when that run trained another mode), the metric `train.monitor: auto`
    selected by (its `monitor`). A bench run at that value ran as today's default does there."""
    try:
        run = json.loads((ROOT / "docs" / "run" / "train.json").read_text())
        shown = run["in_force"]
    except (OSError, ValueError, KeyError):
        return None
    if key == "train.monitor":
        return run.get("monitor")
    return shown.get(key) if shown.get("train.mode") and key.startswith(
        f"train.schedule.{shown['train.mode']}.") else None


def _said(changed: list[tuple[str, Any, Any]], today: dict[str, Any]) -> str:
    now = flat(today)
    parts = []
    for k, then, value in changed:
        where = today_key(k, now)
        at = f" at `{where}`" if where != k else ""
        parts.append(f"`{k}: {json.dumps(then)}` (now {json.dumps(value)}{at})")
    return ", ".join(parts)


def settings_text(name: str, results: dict[str, Any], today: dict[str, Any]) -> str:
    """In words, what bench `name` ran under that differs from today's params.yaml."""
    changed = settings_changed(name, results, today)
    if changed is None:
        raise KeyError(f"bench/{name}.json records no run_under (rerun it)")
    if not changed:
        return "today's params.yaml"
    return _said(changed, today)


def _earlier(name: str, entry: dict[str, Any], today: dict[str, Any]) -> str:
    """What a file without `run_under` records of its settings, against today's: its `train`
    section (bench.small_data's `train_params`), or the params.yaml of the commit it names
    (where this checkout has that commit); otherwise that it is not known."""
    if isinstance(entry.get("train_params"), dict):
        then = {f"train.{k}": v for k, v in flat(entry["train_params"]).items()
                if f"train.{k}" not in ROW_KEYS.get(name, ())}
        changed = _differing(then, today)
        return (f"of its `train` section, {_said(changed, today)}" if changed
                else "its `train` section is today's")
    commit = entry.get("commit") or (entry.get("git") or {}).get("commit")
    if commit:
        proc = subprocess.run(["git", "show", f"{commit}:params.yaml"], cwd=ROOT,
                              capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            changed = _differing(flat(yaml.safe_load(proc.stdout)), today)
            said = _said(changed, today) if changed else "today's"
            return f"params.yaml at the commit it names ({commit[:7]}; some rows are older): {said}"
        return f"it names commit {commit[:7]}, which this checkout lacks: what differs is not known"
    return "what differs is not known"


def _differing(then: dict[str, Any], today: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    now = flat(today)
    return [(k, v, now.get(today_key(k, now))) for k, v in then.items()
            if now.get(today_key(k, now)) != v]


def settings_note(name: str, results: dict[str, Any], today: dict[str, Any]) -> str:
    """The line under a table generated from bench/<name>.json: empty when it ran under today's
    params.yaml; each differing key with today's value when not; for a file that records no
    `run_under`, that these are the settings of an earlier version and what is known of them."""
    entry = results if name == "results" else results.get(name, {})
    changed = settings_changed(name, results, today)
    if changed == []:
        return ""
    if changed is None:
        return (f"*Settings of an earlier version*: `bench/{name}.json` records no `run_under`; "
                f"{_earlier(name, entry if isinstance(entry, dict) else {}, today)}.")
    return (f"*Run under settings that differ from today's params.yaml* "
            f"(`bench/{name}.json`): {_said(changed, today)}.")
