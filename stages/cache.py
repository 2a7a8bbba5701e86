"""`cache`: embed every text once per frozen encoder into versioned Arrow files; `cache verify`."""

from __future__ import annotations

from pathlib import Path

import typer

from simtune.errors import UserError
from stages._common import dir_option, file_option, user_errors

app = typer.Typer(help="Fill the embedding cache (check it: `cache verify`; bound the shared "
                  "store: `cache gc`).",
                  no_args_is_help=False, add_completion=False)

PARAMS = file_option("params.yaml", "params file (`encoders` and `cache` sections)")
PREPARED = dir_option("data/prepared", "prepared data directory")
OUT = dir_option("cache", "cache root: one cache/<encoder>/ directory per encoder")
REPORT = typer.Option(None, dir_okay=False,
                      help="write what each view holds and what the window cuts (JSON)")


@app.callback(invoke_without_command=True)
@user_errors
def cache(ctx: typer.Context, params: Path = PARAMS, prepared: Path = PREPARED,
          out: Path = OUT, report: Path | None = REPORT) -> None:
    """Embed every text each encoder needs, once, into cache/<encoder>/ (incremental)."""
    if ctx.invoked_subcommand:
        return
    from simtune import params as P
    from simtune.cache import stage as lib
    from simtune.cache.modes import resolve
    from simtune.cache.views import layer_for
    from simtune.prepare.prepared import kind, unlabelled

    p = P.load(params)
    # a loss the data cannot take is refused now, not at the train stage after the fill
    P.resolve_loss(p.train, kind(prepared), f"the prepared data ({prepared})")
    P.check_unlabelled(p.train, unlabelled(prepared), f"the prepared data ({prepared})")
    # train.mode auto: what the layers fit (and their time on this machine)
    t = resolve(p.train, p.encoders, prepared, p.cache.store, note_auto=True)
    teacher = P.teacher_of(p.train)
    if teacher is not None and p.encoders.models[teacher].model == P.EXPORT_SNAPSHOT:
        _take_export(out)
    results = lib.fill(prepared, out, p.encoders, p.cache, layer=layer_for(p.encoders, t),
                       teacher=P.teacher_of(p.train))
    if report is not None and lib.dist_from_env().rank == 0:
        lib.write_report(report, results)


def _take_export(out: Path) -> None:
    """`train.distill.teacher: export`: this project's models/export, copied into the cache
    output (`simtune.cache.teacher`) where the teacher's entry reads it."""
    from simtune import params as P
    from simtune.cache.teacher import KEY, snapshot

    dest = Path(P.EXPORT_SNAPSHOT)
    if dest.parent.resolve() != out.resolve():
        raise UserError(f"{KEY}: the teacher is copied into {dest} (the cache stage's --out "
                        f"{dest.parent}), not under --out {out}")
    snapshot(Path(P.EXPORT_DIR), dest)


@app.command()
@user_errors
def verify(params: Path = PARAMS, prepared: Path = PREPARED, out: Path = OUT,
           sample: int = typer.Option(64, min=0, help="cached texts to re-embed and compare "
                                      "(0: checksums and rows only)"),
           seed: int = typer.Option(0, help="seed of the sample")) -> None:
    """Check every view (checksums, schema, rows, settings; the layer states of top_layers mode
    too) and the store shards behind it, re-embed a random sample; exit 1 on any problem."""
    from simtune import params as P
    from simtune.cache import admin as lib
    from simtune.cache.modes import resolve
    from simtune.cache.views import layer_for
    from simtune.encoders import resolve_device

    p = P.load(params)
    if not out.is_dir():
        raise UserError(f"{out}: no cache here (run the cache stage)")
    t = resolve(p.train, p.encoders, prepared, p.cache.store)
    results = lib.verify(prepared, out, p.encoders, p.cache, sample, seed,
                         resolve_device(p.cache.device), layer_for(p.encoders, t),
                         P.teacher_of(p.train))
    for r in results:
        status = "ok" if not r.problems else "FAILED"
        print(f"{r.encoder}: {status}: {r.rows} rows, {r.sampled} re-embedded, "
              f"max abs diff {r.max_abs_diff:.3g}")
        for problem in r.problems:
            print(f"  {problem}")
    if any(r.problems for r in results):
        raise typer.Exit(1)


@app.command()
@user_errors
def gc(params: Path = PARAMS,
       max_gb: float = typer.Option(None, min=0, help="size bound for this run (default "
                                    "cache.store_max_gb; 0 keeps only the current settings)"),
       dry_run: bool = typer.Option(False, "--dry-run", help="say what would go, drop nothing"),
       prune_missing: bool = typer.Option(
           False, "--prune-missing", help="also drop the refs of layer views whose folder is "
           "missing (a project moved, renamed or deleted; kept and listed otherwise)")
       ) -> None:
    """Bound the shared store: drop least recently used encoder settings, never the current,
    never anything that is not a store entry (listed as skipped), never through a symlink."""
    from simtune import params as P
    from simtune.cache import admin as lib
    from simtune.cache import store
    from simtune.cache.modes import resolve
    from simtune.cache.views import layer_for

    p = P.load(params)
    try:  # auto: as the cache stage resolved it on the default prepared data, when there
        prepared = Path("data/prepared")
        t = resolve(p.train, p.encoders, prepared, p.cache.store) if p.train.mode != "auto" or (
            prepared / "texts.parquet").exists() else None
        layer = layer_for(p.encoders, t) if t is not None else None
    except UserError:  # the layer of a model that cannot load is not in use either
        layer = None
    kept, dropped, skipped = lib.gc(p.encoders, p.cache, max_gb, dry_run, layer, prune_missing)
    print(f"store {store.root(p.cache.store)}: kept {len(kept)} encoder settings "
          f"({sum(e.bytes for e in kept) / 1e6:.1f} MB), "
          f"{'would drop' if dry_run else 'dropped'} {len(dropped)} "
          f"({sum(e.bytes for e in dropped) / 1e6:.1f} MB)")
    for e in kept:
        print(f"  keep {e.fingerprint} {e.encoder}: {e.rows} rows, {e.bytes / 1e6:.1f} MB")
    for e in dropped:
        print(f"  drop {e.fingerprint} {e.encoder}: {e.rows} rows, {e.bytes / 1e6:.1f} MB")
    for path, why in skipped:
        print(f"  skip {path}: {why}; left alone")
