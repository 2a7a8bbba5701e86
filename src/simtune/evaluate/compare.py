"""`simtune compare`: experiments side by side in a terminal's width.

DVC's own `dvc exp show` lists every leaf of `params.yaml` and a 38-character hash per dependency,
so even `--only-changed` hides the changed settings and the metrics behind `…` in 120 columns.
This view keeps what a comparison needs: one row per experiment, the params whose values differ
between the rows, and the trained model's headline metrics (`HEADLINE` of `reports/metrics.json`,
then the kept epoch and the training seconds while they fit). The records are DVC's
(`dvc.api.exp_show`); this module only picks and lays out columns, so it needs no DVC.

Each row says its state (done, failed, running, queued: DVC's `State`), and shows only the
metrics the row produced. DVC fills a failed queued experiment's metrics from the files of the
commit it was queued on (its run wrote none), and a running one's from whatever its workspace
holds so far; a metrics file whose values equal the parent commit's in such a row is the
parent's, shown as `-`. The workspace row's metrics are DVC's reading of the workspace's files
(or of dvc.lock's record when a failed run deleted them): a metrics file that is missing or
older than params.yaml (`stale_files`; older than the last run's start where params.yaml reads
as that run read it) is not its params' result, so its cells are `-` and the row's state
`stale`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# the metrics shown, in order; the first two always, the rest while the table fits the width
# (`mode`: the mode that trained, `train.mode: auto` resolved; its schedule is the row's
# `train.schedule.<mode>` params)
METRICS = ("trained.p@1", "trained.mrr@10", "mode", "kept_epoch", "train_s")
ALWAYS = 2
GAP = "  "
MIN_CELL = 8  # a param column is cut to no fewer characters (then `…`)
# the shown metrics by the DVC metrics file that holds them (reports/metrics.json: evaluate's
# headline; reports/train_metrics.json: train's kept epoch and seconds): a row's metrics file is
# its own or the parent's as a whole
METRIC_FILES = (("trained.p@1", "trained.mrr@10"), ("mode", "kept_epoch", "train_s"))
# where each of those lives in the workspace (dvc.yaml's `metrics`), in the same order
METRIC_PATHS = ("reports/metrics.json", "reports/train_metrics.json")
# DVC's `State` of an experiment (its executor's: `dvc queue status`) -> the word shown; a row
# without one (a commit, an experiment read from its git ref) ran to the end
STATES = {"success": "done", "failed": "failed", "running": "running", "queued": "queued"}
UNFINISHED = ("failed", "running", "queued")


def flat_keys(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted leaf keys of a params mapping (`{"train": {"lr": 1}}` -> `["train.lr"]`)."""
    out: list[str] = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out += flat_keys(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def _shown(value: Any, key: str = "") -> str:
    """A cell: metrics of the model to 4 decimals (as DVC's table), other floats as written;
    no value is `-`. `dvc.api.exp_show` gives a key a row lacks (a param an older commit's
    params.yaml did not have, a null) as the string "None" (its cells are rendered to text,
    then read back as a float where they parse), not as None."""
    if value is None or value == "None":
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if key.startswith(("trained.", "lift.")) else f"{value:.6g}"
    return str(value)


def _label(record: Mapping[str, Any]) -> str:
    """The row's name as `dvc exp show` gives it: the workspace, a commit (branch or short rev),
    or an experiment (its name, under its commit)."""
    name, rev = record.get("Experiment"), str(record.get("rev") or "")
    if "workspace" in (record.get("typ"), rev):  # dvc.api's workspace row: rev "workspace"
        return "workspace"
    if record.get("typ") in ("branch_commit", "branch_base"):
        return f"  {name or rev[:7]}"
    return str(name or rev[:7] or "workspace")


def stale_files(root: Path, params: Path, run_start: float | None = None) -> list[int]:
    """The indices (into `METRIC_FILES`) of the workspace's metrics files under `root` that
    are missing or older than the params file `params`: a run that failed (DVC deleted its
    outputs first) or not yet run since params.yaml was edited (`dvc exp run -S` writes it
    before any stage runs). `run_start` (seconds since the epoch): the start of the last DVC
    run, given when params.yaml reads as that run read it (`stages._runlock.last_run_start`):
    files older than that start are stale instead, whatever params.yaml's own time (`dvc exp
    run --temp` rewrites it, the same bytes)."""
    since = (Path(params).stat().st_mtime_ns if run_start is None
             else int(run_start * 1_000_000_000))
    out = []
    for i, rel in enumerate(METRIC_PATHS):
        path = Path(root) / rel
        if not path.is_file() or path.stat().st_mtime_ns < since:
            out.append(i)
    return out


def ran_otherwise(params: Any, lock: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in params.yaml, value the run read) for each key whose value in an
    experiment's committed params.yaml (`params`, parsed) differs from the one its committed
    dvc.lock says its check stage read (`lock`, parsed: the check stage tracks params.yaml
    whole, so its record is every key the run trained on). They differ when a second `dvc exp
    run -S` wrote its values after the first run's last stage had checked params.yaml and
    before DVC committed it: a window no stage can see, so the experiment's params are not what
    it ran. [] when they agree, or when `lock` records no check stage (an older simtune's)."""
    if not prefix:
        try:
            lock = lock["stages"]["check"]["params"]["params.yaml"]
        except (KeyError, TypeError):
            return []
    if isinstance(params, dict) and isinstance(lock, dict):
        return [d for key in sorted({*params, *lock}, key=str)
                for d in ran_otherwise(params.get(key), lock.get(key), f"{prefix}{key}.")]
    return [] if _same(params, lock) else [(prefix[:-1], params, lock)]


def _same(a: Any, b: Any) -> bool:
    """Equal as values: `5.0e-5` is text to PyYAML and a number to DVC's reader."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))

    def number(x: Any) -> Any:
        try:
            return float(x) if isinstance(x, str | int) and not isinstance(x, bool) else x
        except ValueError:
            return x
    return a == b or number(a) == number(b)


def state(record: Mapping[str, Any]) -> str:
    """The row's state: done, failed, running or queued, `mismatch` when its committed
    params.yaml is not what it ran (`ran_otherwise`, set on the record by the command); for
    the workspace `stale` when a metrics file of it is not its params' result (`own_metrics`),
    else `-` (DVC does not say whether its outputs follow its params: `dvc status` does)."""
    if _label(record) == "workspace":
        return "stale" if record.get("State") == "stale" else "-"
    if record.get("ran_otherwise"):  # its params.yaml is not what it ran (`ran_otherwise`)
        return "mismatch"
    value = str(record.get("State") or "success").lower()
    return STATES.get(value, value)


def own_metrics(records: Sequence[Mapping[str, Any]], stale: Sequence[int] = ()
                ) -> list[dict[str, Any]]:
    """`records` with the metrics an unfinished row (failed, running, queued) did not produce
    set to None: each metrics file (`METRIC_FILES`) whose shown values all equal those of the
    row's parent commit (the `baseline` row above it, as DVC lists them), or all of them where
    no parent is listed. A finished row keeps every value: an experiment that reran no stage
    of a file holds its parent's file as its own result. The workspace row: the files
    `stale` (indices into `METRIC_FILES`, `stale_files`) set to None, its state `stale`."""
    out: list[dict[str, Any]] = []
    parent: Mapping[str, Any] | None = None
    for record in records:
        row = dict(record)
        if _label(row) == "workspace":
            for i in stale:
                row.update(dict.fromkeys(METRIC_FILES[i]))
            row["State"] = "stale" if stale else None
        elif row.get("typ") == "baseline":
            parent = row
        elif state(row) in UNFINISHED:
            for keys in METRIC_FILES:
                if parent is None or all(row.get(k) == parent.get(k) for k in keys):
                    row.update(dict.fromkeys(keys))
        out.append(row)
    return out


def changed_params(records: Sequence[Mapping[str, Any]], params: Iterable[str]) -> list[str]:
    """The params (dotted keys, in `params` order) whose shown values differ between records."""
    return [k for k in params if any(k in r for r in records)
            and len({_shown(r.get(k)) for r in records}) > 1]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return GAP.join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(header), *(line(r) for r in rows)]


def render(records: Sequence[Mapping[str, Any]], params: Iterable[str], width: int,
           stale: Sequence[int] = ()) -> list[str]:
    """The comparison as lines of at most `width` characters.

    `records`: DVC's experiment records (`dvc.api.exp_show`: one mapping per row, with
    `Experiment`, `rev`, `typ`, `State` and one key per param and metric). `params`: the
    params' dotted keys (those of `params.yaml`). The first table holds the experiment, its
    state, the changed params that fit and the metrics (those the row produced: `own_metrics`);
    params that do not fit follow in further tables, each again with the experiment column, so
    nothing is hidden. A cell wider than its share is cut with `…`. `stale`: the workspace's
    metrics files that are not its params' result (`stale_files`).
    """
    records = own_metrics(records, stale)
    labels = [_label(r) for r in records]
    label_w = min(max(len(x) for x in ["Experiment", *labels]), max(width // 3, MIN_CELL))
    labels = [_cut(x, label_w) for x in labels]
    metrics = [m for m in METRICS if any(r.get(m) is not None for r in records)]
    changed = changed_params(records, params)

    def column(key: str) -> list[str]:
        return [key, *(_shown(r.get(key), key) for r in records)]

    def fits(cols: list[list[str]]) -> bool:
        return sum(max(len(c) for c in col) + len(GAP) for col in cols) + label_w <= width

    budget = max(MIN_CELL, width - label_w - len(GAP))
    pending = [[_cut(c, budget) for c in column(k)] for k in changed]
    must = [column(m) for m in metrics[:ALWAYS]]
    optional = [column(m) for m in metrics[ALWAYS:]]
    # the changed params first (the point of the view), the two headline metrics always, the
    # kept epoch and the seconds while they fit
    first: list[list[str]] = [["state", *(state(r) for r in records)]]
    while pending and fits([*first, pending[0], *must]):
        first.append(pending.pop(0))
    if len(first) == 1 and pending:  # not one param fits beside the metrics: cut it to fit
        room = width - label_w - sum(max(len(c) for c in col) + len(GAP)
                                     for col in [*first, *must])
        # its values may be cut, not its name (a cut name no longer says which param it is)
        if room - len(GAP) >= max(MIN_CELL, len(pending[0][0])):
            first.append([_cut(c, room - len(GAP)) for c in pending.pop(0)])
    first += must
    while optional and fits([*first, optional[0]]):
        first.append(optional.pop(0))
    tables = [first]
    while pending:
        block = [pending.pop(0)]
        while pending and fits([*block, pending[0]]):
            block.append(pending.pop(0))
        tables.append(block)
    out: list[str] = []
    for cols in tables:
        header = ["Experiment", *(c[0] for c in cols)]
        rows = [[label, *(c[i + 1] for c in cols)] for i, label in enumerate(labels)]
        numeric = {j + 1 for j, c in enumerate(cols) if c[0] in METRICS}
        if out:
            out.append("")
        out += [_cut(x, width) for x in _table(header, rows, numeric)]
    if not changed:
        out.append("(no param differs between these rows)")
    return out
