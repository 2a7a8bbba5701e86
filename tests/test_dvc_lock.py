"""Issue 52 item 10: the committed dvc.lock records the code it was run with.

A lock whose code deps' hashes are not the tree's makes a fresh clone's `make run` rerun stages
the lock claims are done (and its `git diff dvc.lock` ~200 lines), and the docs' figures
(docs/run/, written with the lock by `make figures`) no longer come from the committed code.
The hashes are DVC's own (`Dependency.get_hash`: a file's md5, a folder's `.dir` md5 of its
listing, .dvcignore applied), so this fails exactly when `dvc status` would list the dep as
modified. Deps that are another stage's output (data/prepared, cache, models/head, reports)
are the run's, not the tree's: not compared here.
"""

from __future__ import annotations

import yaml

from tests.conftest import ROOT

FIX = ("the committed dvc.lock was not written with this code: run `make figures` (dvc repro "
       "of the default run, then docs/run/) and commit dvc.lock with docs/run/")


def _stale_deps() -> list[str]:
    """'<stage>: <path> (<what>)' for every code or data dep dvc.yaml lists whose hash in
    dvc.lock is not DVC's hash of it in the tree (or that dvc.lock does not record)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    stale = []
    with Repo(str(ROOT)) as repo:
        stages = list(repo.index.stages)
        outputs = {out.def_path for stage in stages for out in stage.outs}
        for stage in stages:
            recorded = {d["path"]: d.get("md5") for d in lock.get(stage.name, {}).get("deps", [])}
            for dep in stage.deps:
                if isinstance(dep, ParamsDependency) or dep.def_path in outputs:
                    continue
                now = dep.get_hash().value
                was = recorded.get(dep.def_path)
                if was != now:
                    what = "not in dvc.lock" if was is None else f"locked {was}, tree {now}"
                    stale.append(f"{stage.name}: {dep.def_path} ({what})")
    return stale


def test_committed_lock_records_the_trees_code() -> None:
    stale = _stale_deps()
    assert not stale, f"{FIX}; {len(stale)} deps differ:\n" + "\n".join(stale)
