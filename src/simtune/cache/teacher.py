"""`train.distill.teacher: export`: this project's own `models/export`, kept as the teacher.

The static student's teacher is usually the export of this project's last run in another mode.
That folder is an output of the export stage, which the same static run then replaces with the
student; and a later stage's output cannot be a DVC dependency of the cache stage (a cycle).
So the cache stage copies the export into its own output (`params.EXPORT_SNAPSHOT`,
`cache/export.model`) before it fills the teacher's vectors: the copy is what train, evaluate
and export read as the teacher, DVC records it with the cache view (the later stages rerun
when it changes), and `dvc exp run --temp` has it, since DVC checks out its outputs there.

A static student in `models/export` (an earlier static run's own export) is not a teacher: the
snapshot it was taught by stays the teacher. Which export teaches is said in the log.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from simtune.atomic import atomic_dir
from simtune.encoders import is_export, model_files_hashes
from simtune.errors import UserError
from simtune.static import is_static

log = logging.getLogger(__name__)

KEY = "train.distill.teacher: export"


def snapshot(export: Path, dest: Path) -> bool:
    """Copy the export folder `export` (the pipeline's models/export) to `dest` (the cache
    stage's `export.model`) unless `dest` holds the same files already; keep `dest` when
    `export` holds a static student (an earlier static run's). Returns whether it copied.
    `UserError` (one line naming the key and the folder) when there is no teacher to take:
    no export there and no snapshot, or a static student and no snapshot."""
    export, dest = Path(export), Path(dest)
    kept = is_export(dest) and not is_static(dest)
    if is_static(export) or not export.exists():
        what = ("holds a static student (an earlier static run's export)" if export.exists()
                else "does not exist")
        if not kept:
            raise UserError(f"{KEY}: {export} {what}, and no teacher was taken from it before: "
                            f"run the pipeline in another train.mode first (dvc repro), so "
                            f"that {export} is the model to teach from")
        log.info("%s: %s %s: the teacher stays %s, the export taken before", KEY, export, what,
                 dest)
        return False
    if not is_export(export):
        raise UserError(f"{KEY}: {export} is not a simtune export (no simtune.json): run the "
                        "pipeline's export stage, or name a teacher of encoders.models")
    if kept and model_files_hashes(dest) == model_files_hashes(export):
        log.info("%s: %s, as taken before into %s", KEY, export, dest)
        return False
    with atomic_dir(dest) as tmp:
        shutil.copytree(export, tmp, dirs_exist_ok=True, symlinks=False)
    log.info("%s: %s copied into %s (the static student's teacher; a later export to %s "
             "leaves it as it is)", KEY, export, dest, export)
    return True
