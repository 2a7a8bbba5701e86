"""One DVC run of the pipeline at a time in a workspace, and params.yaml unchanged under it.

DVC releases its own repository lock while a stage's command runs, so a second `dvc exp run` in
the same folder starts meanwhile: it writes its `-S` values into params.yaml before any stage
runs (DVC's doing, before simtune can act), then runs the check stage, whose record in dvc.lock
the params guard (`stages._common.check_params_unchanged`) compares against. The first run then
trained on the second's values, or recorded them beside a model trained on its own.

So every stage that DVC runs (`$DVC_STAGE` set, in a folder with `.dvc/`) first takes the
workspace's run record, `.dvc/tmp/simtune-run.json` (git-ignored with DVC's tmp/):

- held by another DVC process that is still alive (its pid and start time): refused in one
  line naming it, before the stage does anything, so DVC records nothing of this run (the
  check stage's record in dvc.lock stays the other run's); the refusal is noted in the record;
- held by this stage's own DVC process (an earlier stage of the same run): params.yaml must
  read as it did when the run's first stage took the record, every key, not only the stage's
  own (`dvc exp run` commits params.yaml whole with the experiment); otherwise refused, naming
  the keys that changed and the run refused meanwhile, when there was one. Checked again when
  the stage ends;
- absent, or left by a process that has ended: taken, with params.yaml as it reads now.

The record is released by its process ending (a run never has to clean up after a failure). A
stage run by hand, or by DVC through its Python API (no `dvc` process above it), is not held.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from simtune import atomic
from simtune.errors import UserError
from stages._common import PARAMS_FILE, _yaml, params_changed

RECORD = Path(".dvc", "tmp", "simtune-run.json")
ONE_AT_A_TIME = ("one run at a time in a workspace; queue more with `dvc exp run --queue` and "
                 "`dvc queue start`")


def _dvc_process() -> dict[str, Any] | None:
    """The DVC process running this stage (the nearest ancestor whose command line runs
    `dvc`): {"pid", "start" (its start time, so a reused pid is another process), "cmd"}."""
    import psutil  # DVC's own dependency: this runs only under DVC

    try:
        proc = psutil.Process(os.getppid())
        while proc is not None:
            argv = proc.cmdline()
            at = next((i for i, a in enumerate(argv[:3])
                       if os.path.basename(a) in ("dvc", "dvc.exe")), None)
            if at is not None:
                return {"pid": proc.pid, "start": round(proc.create_time(), 2),
                        "cmd": " ".join(["dvc", *argv[at + 1:]])}
            proc = proc.parent()
    except (psutil.Error, OSError):
        return None
    return None


def _alive(owner: dict[str, Any]) -> bool:
    import psutil

    try:
        return round(psutil.Process(int(owner["pid"])).create_time(), 2) == owner["start"]
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _params() -> Any:
    """params.yaml as DVC parses it (None: unreadable; the stages say why)."""
    try:  # as JSON holds it (the record is JSON): a date or a set compares as its text
        return json.loads(json.dumps(_yaml(PARAMS_FILE), default=str))
    except Exception:  # a file only the stages may report on
        return None


def _changed(was: Any, now: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two parsed params trees."""
    if isinstance(was, dict) and isinstance(now, dict):
        return [k for key in sorted({*was, *now}, key=str)
                for k in _changed(was.get(key, "(absent)"), now.get(key, "(absent)"),
                                  f"{prefix}{key}.")]
    same = json.dumps(was, sort_keys=True, default=str) == json.dumps(now, sort_keys=True,
                                                                         default=str)
    return [] if same else [prefix[:-1] or "(the whole file)"]


def _read() -> dict[str, Any] | None:
    try:
        record = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("owner"), dict) else None


def _under_dvc() -> str | None:
    stage = os.environ.get("DVC_STAGE", "")
    return stage if stage and Path(".dvc").is_dir() else None


def hold() -> None:
    """At a stage's start: take or join the workspace's run record, or refuse (module
    docstring)."""
    stage = _under_dvc()
    me = _dvc_process() if stage else None
    if me is None:
        return
    with atomic.locked(RECORD.with_suffix(".lock")):
        record = _read()
        owner = record["owner"] if record else None
        if owner and _alive(owner) and (owner["pid"], owner["start"]) != (me["pid"], me["start"]):
            refused = [*record.get("refused", []), {**me, "at": time.strftime("%H:%M:%S")}]
            atomic.write_json(RECORD, {**record, "refused": refused})
            raise UserError(
                f"another DVC run is running this workspace's pipeline (pid {owner['pid']}: "
                f"{owner['cmd']}, since {owner['at']}): refused before the {stage} stage ran, so "
                "DVC records nothing of this run (values a `dvc exp run -S` wrote into "
                "params.yaml before any stage ran stop the other run at its next stage, which "
                f"names them); {ONE_AT_A_TIME}")
        if not (owner and _alive(owner)):  # none yet, or its process has ended: take it
            atomic.write_json(RECORD, {"owner": {**me, "at": time.strftime("%H:%M:%S")},
                                       "params": _params(), "refused": []})
            return
    unchanged("since this run's first stage read it")


def unchanged(when: str) -> None:
    """`UserError` (one line) when this DVC run holds the record and params.yaml no longer
    reads as it did when the run took it: the keys that changed, and who, when a run was
    refused meanwhile."""
    me = _dvc_process() if _under_dvc() else None
    record = _read() if me else None
    if not me or not record or (record["owner"].get("pid"), record["owner"].get("start")) != (
            me["pid"], me["start"]):
        return
    changed = _changed(record.get("params"), _params())
    if not changed:
        return
    others = record.get("refused") or []
    if not others:
        raise params_changed(changed, when)
    last = others[-1]
    raise params_changed(changed, when, f"another DVC run, pid {last['pid']} ({last['cmd']}) at "
                         f"{last['at']}, wrote them, and was refused: {ONE_AT_A_TIME}")


def last_run_start() -> float | None:
    """When the last DVC run of this workspace's pipeline started (its `dvc` process's start,
    seconds since the epoch), if params.yaml reads now as that run's first stage read it;
    else None (no record, or params.yaml edited since). A file that run wrote is newer; one
    older is a previous run's, whatever params.yaml's own time says (`dvc exp run --temp`
    rewrites the workspace's params.yaml with the same bytes)."""
    record = _read()
    if record is None or _changed(record.get("params"), _params()):
        return None
    start = record["owner"].get("start")
    return float(start) if isinstance(start, int | float) else None
