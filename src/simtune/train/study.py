"""The sweep's study: where it is stored, what it was made for, and who may run it.

- **Storage** (`sweep.storage`): a SQLite file, named by its path, used literally (`a?b.db` is
  that file), or in the `sqlite:///path` form that optuna-dashboard takes (read as the path;
  other URL schemes are refused). A folder, a file that is not SQLite, a damaged one, a study
  file of another program, or a place where no file can be created is one line naming the file,
  found before any data is loaded or anything written.
- **Identity**: a study holds trials of one search on one data. Stored as its user attr
  `identity` when it is created: the space, the train params every trial shares (the fixed keys
  applied, the swept ones left out) and `evaluate.corpus`, the prepared data's bytes, the cache
  tables' fingerprints (full mode: the encoder's) and, with `train.hard_negatives`, the mined
  negatives' bytes (the pieces of the train checkpoint's fingerprint). A study whose identity
  differs is refused in one line naming what changed (and the params that changed since, the
  likely cause); a new name (`sweep.study`, `--study`) starts a new study. Refusing, rather than
  starting a new study silently, keeps the old study's trials where the user can still see them.
- **Lock**: one sweep per study at a time (`flock` on `.<storage>.<study>.lock` beside the file);
  a second is refused at once.
- **Resume**: trials a killed run left running are marked failed; the sampler is seeded with
  `sweep.seed` + the number of trials the study holds, so a resumed sweep does not draw the
  first run's proposals again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import optuna

from simtune.atomic import locked
from simtune.errors import UserError
from simtune.params import Params, SweepParams
from simtune.train.checkpoint import cache_fingerprints, hash_files

IDENTITY_VERSION = 1
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_SQLITE_HEADER = b"SQLite format 3\0"


def storage_path(value: str) -> Path:
    """The study file that `sweep.storage` names: a path used literally, or `sqlite:///path`
    (URL-decoded, as SQLAlchemy reads it); any other URL is refused in one line."""
    if value.startswith("sqlite:///"):
        rest = value.removeprefix("sqlite:///")
        if not rest or "?" in rest:
            raise UserError(f"sweep.storage: '{value}': give a sqlite:/// URL a file path and no "
                            "query (or give the file's path itself)")
        if rest == ":memory:":  # SQLAlchemy's in-memory database: the study would be lost
            raise UserError(f"sweep.storage: '{value}': a study lives in a file (it resumes "
                            "and is applied from it); give its path (reports/sweep.db)")
        return Path(unquote(rest))
    if _URL.match(value):
        raise UserError(f"sweep.storage: '{value}': a study is stored in a SQLite file; give "
                        "its path (reports/sweep.db) or sqlite:///path")
    return Path(value)


def check_storage(path: Path) -> None:
    """Refuse, writing nothing, a study file that cannot be used: a folder, not a regular file,
    not SQLite, damaged, another program's database, or one that cannot be created."""
    where = f"sweep.storage: {path}"
    if path.is_dir():
        raise UserError(f"{where}: a folder, not a study file (name a file, e.g. "
                        f"{path / 'sweep.db'})")
    if path.exists():
        if not path.is_file():
            raise UserError(f"{where}: not a regular file")
        _check_sqlite(path, where)
        return
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{where}: {ancestor} is not a folder")
    try:  # the only sure test of "can a file be created here" (root, read-only mounts, /proc)
        fd, probe = tempfile.mkstemp(prefix=".simtune-probe-", dir=ancestor)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{where}: cannot create the study file in {ancestor} "
                        f"({e.strerror or e})") from None


def _check_sqlite(path: Path, where: str) -> None:
    """An existing file is an empty file or a sound SQLite database holding Optuna's tables."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError as e:
        raise UserError(f"{where}: cannot read it ({e.strerror or e})") from None
    if not head:
        return  # SQLite reads an empty file as an empty database
    if head != _SQLITE_HEADER:
        raise UserError(f"{where}: not a SQLite file; name another file or delete it")
    try:
        with contextlib.closing(sqlite3.connect(
                f"file:{quote(str(path.absolute()))}?mode=ro", uri=True)) as con:
            check = con.execute("PRAGMA quick_check").fetchone()
            tables = {r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as e:
        raise UserError(f"{where}: a damaged SQLite file ({e}); restore it or name another "
                        "file") from None
    if check != ("ok",):
        raise UserError(f"{where}: a damaged SQLite file ({check[0] if check else 'no check'});"
                        " restore it or name another file")
    if tables and "studies" not in tables:
        raise UserError(f"{where}: a SQLite database of something else (no Optuna studies in "
                        "it); name another file")


def _files_digest(directory: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    hash_files(h, directory)
    return h.hexdigest()


def flat(prefix: str, value: Any) -> dict[str, Any]:
    """A nested mapping as dotted key -> leaf value (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, sub in value.items():
        out.update(flat(f"{prefix}.{key}", sub))
    return out


def identity(p: Params, prepared_dir: Path, negatives_dir: Path | None,
             tables: dict[str, Any]) -> dict[str, Any]:
    """What a study's trials depend on (see the module's docstring). `p`: the params every trial
    starts from (`sweep.fixed` applied; the whole tree, as the identity reads `train`,
    `sweep.space`, `evaluate.corpus` and the `prepare`, `encoders`, `cache` and `negatives`
    sections); `tables`: the loaded data's cache tables. JSON-ready."""
    params = flat("train", p.train.model_dump(mode="json"))
    for key in p.sweep.space:
        params.pop(key, None)
    params["evaluate.corpus"] = p.evaluate.corpus
    negatives = None
    if p.train.hard_negatives and negatives_dir is not None:
        negatives = _files_digest(negatives_dir)
    settings = {}  # not compared: named when the data they make changed
    for section in ("prepare", "encoders", "cache", "negatives"):
        settings.update(flat(section, getattr(p, section).model_dump(mode="json")))
    return {"version": IDENTITY_VERSION,
            "space": {k: e.model_dump(mode="json") for k, e in p.sweep.space.items()},
            "params": params, "prepared": _files_digest(prepared_dir),
            "cache": cache_fingerprints(p.encoders, tables), "negatives": negatives,
            "settings": settings}


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def changes(old: dict[str, Any], new: dict[str, Any], missing: str,
             prefixes: tuple[str, ...] = ("",)) -> str:
    """`key old -> new` for the keys (under `prefixes`) whose values differ, at most 3."""
    keys = [k for k in dict.fromkeys([*old, *new]) if k.startswith(prefixes)
            and old.get(k, missing) != new.get(k, missing)]
    shown = [f"{k} {_show(old.get(k, missing))} -> {_show(new.get(k, missing))}"
             for k in keys[:3]]
    more = f", and {len(keys) - 3} more" if len(keys) > 3 else ""
    return ", ".join(shown) + more


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between a study's stored identity and today's, in words (empty: none)."""
    out = []
    if old.get("version") != new["version"]:
        return [f"another version of simtune (identity v{old.get('version')})"]
    if old["params"] != new["params"]:
        out.append(f"other params ({changes(old['params'], new['params'], '(swept)')})")
    if old["space"] != new["space"]:
        keys = [k for k in dict.fromkeys([*old["space"], *new["space"]])
                if old["space"].get(k) != new["space"].get(k)]
        out.append(f"another space (sweep.space: {', '.join(keys)})")
    for part, what, prefixes, otherwise in (
            ("prepared", "other prepared data", ("prepare.",), "its files changed"),
            ("cache", "another cache", ("encoders.", "cache."), "its vectors changed"),
            ("negatives", "other mined negatives", ("negatives.",), "its files changed")):
        if old[part] != new[part]:
            since = changes(old["settings"], new["settings"], "(none)", prefixes)
            out.append(f"{what} ({f'changed since: {since}' if since else otherwise})")
    return out


def lock_path(path: Path, name: str) -> Path:
    """The lock file of study `name` in the study file `path` (a name that is not a plain file
    name is hashed)."""
    tag = name if re.fullmatch(r"[\w.-]{1,64}", name) else \
        hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    return path.parent / f".{path.name}.{tag}.lock"


@contextlib.contextmanager
def lock(path: Path, name: str) -> Iterator[None]:
    """Hold study `name` of the file `path` for the block; another holder: one line at once."""
    with locked(lock_path(path, name), busy=f"another sweep is running study '{name}' "
                f"({path}); wait for it to finish (or stop it)"):
        yield


def _reason(e: BaseException) -> str:
    """The first line of the SQLite error under a database error (SQLAlchemy's and Optuna's
    own texts run to many lines), else of the error itself."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, sqlite3.Error):
            return str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        cause = cause.__cause__ or cause.__context__
    return (str(e) or type(e).__name__).splitlines()[0]


def _database_error_types() -> tuple[type[BaseException], ...]:
    import sqlalchemy.exc

    return sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, optuna.exceptions.StorageInternalError


@contextlib.contextmanager
def database_errors(path: Path, doing: str) -> Iterator[None]:
    """A database error in the block (a read-only file or folder, a full disk) -> one line
    naming the study file; `doing`: what failed ("write the study")."""
    try:
        yield
    except _database_error_types() as e:
        raise UserError(f"sweep.storage: {path}: cannot {doing} ({_reason(e)})") from None


def open_study(sw: SweepParams, path: Path, ident: dict[str, Any]) -> optuna.Study:
    """Create study `sweep.study` (of `sw`, the `sweep` section) in `path` (with `ident`) or
    resume it (its identity must equal `ident`); trials a killed run left running are marked
    failed; the sampler is seeded with `sweep.seed` + the number of trials the study holds.
    Call it holding `lock`."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is ours
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=sw.min_epochs)
        if sw.pruner == "median" else
        optuna.pruners.SuccessiveHalvingPruner(min_resource=sw.min_epochs))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # percent-encoded, a name is read back literally (`?` is no URL query)
        storage = optuna.storages.RDBStorage(f"sqlite:///{quote(str(path.absolute()))}")
        study = optuna.create_study(storage=storage, study_name=sw.study, direction="maximize",
                                    load_if_exists=True, pruner=pruner)
        known, trials = study.user_attrs.get("identity"), study.get_trials(deepcopy=False)
    except (*_database_error_types(), OSError, RuntimeError) as e:
        raise UserError(f"sweep.storage: {path}: cannot open the study ({_reason(e)})") from None
    where = f"sweep.study: study '{sw.study}' in {path}"
    if known is None and trials:
        raise UserError(f"{where} was made by an older simtune that did not record its data; "
                        "set sweep.study (or --study) to a new name")
    if known is not None and (changed := differences(known, ident)):
        raise UserError(f"{where} was made for {'; '.join(changed)}; set sweep.study (or "
                        "--study) to a new name")
    with database_errors(path, "write the study"):
        if known is None:
            study.set_user_attr("identity", ident)
            study.set_user_attr("fixed", dict(sw.fixed))  # the best trial's line carries them
        for trial in trials:
            if trial.state == optuna.trial.TrialState.RUNNING:  # a killed run's (we hold it)
                storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    study.sampler = optuna.samplers.TPESampler(seed=sw.seed + len(trials))
    return study
