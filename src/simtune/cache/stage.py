"""The `cache` stage: embed every text each frozen encoder must see, once, for good.

Vectors live in the machine-wide shared store (`simtune.cache.store`, keyed by encoder fingerprint
and content hash): every workspace, queued or temp experiment and data set on the machine reuses
them, and settings switched back and forth re-embed nothing. The stage's output is a *view*,
`cache/<encoder>/`: exactly the rows this workspace's data needs, keyed by its text ids, in the
same Arrow format; DVC tracks it, so it can be pushed, pulled and checked out. A view pulled from
a teammate feeds the store in turn. Fills are locked per store entry, journaled and resumable;
under `torchrun` each rank embeds a slice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from simtune import threads
from simtune.atomic import write_json
from simtune.cache import cutting, store, views
from simtune.cache.fills import (
    Dist,
    FillResult,
    dist_from_env,
    fill_encoder,
    fill_with_states,
)
from simtune.cache.formats import Format
from simtune.encoders import check_student, check_teacher, describe, fingerprint, prompt_of
from simtune.errors import UserError
from simtune.model import load_encoder
from simtune.params import CacheParams, EncodersParams
from simtune.prepare.prepared import Prepared
from simtune.prepare.prepared import load as load_prepared

log = logging.getLogger(__name__)
__all__ = ["Dist", "FillResult", "Target", "dist_from_env", "fill", "fill_encoder",
           "fill_with_states", "texts_per_encoder", "write_report"]


@dataclass(frozen=True)
class Target:
    """One view to fill: encoder `name` embedding `role` texts into `<out>/<view>/`."""

    name: str
    role: str  # query | document: which prompt goes before each text
    view: str


def texts_per_encoder(prepared: Prepared, encoders: EncodersParams,
                      teacher: str | None = None) -> dict[Target, pa.Array]:
    """Distinct text ids each view must hold: groups' texts and pairs' queries are `query` texts
    of `encoders.query`, pairs' documents `document` texts of `encoders.document`; one view (one
    set of ids) when both roles read the same one (one encoder, one prompt). `teacher`
    (`train.distill.teacher`): that encoder's views of the same texts too (pairs: its query
    view of the queries, its document view of the documents: a static student's targets)."""
    ex = prepared.examples
    if prepared.kind == "groups":
        columns = [("query", encoders.query, ex.column("text_id"))]
        if teacher is not None:
            columns.append(("query", teacher, ex.column("text_id")))
    else:
        columns = [("query", encoders.query, ex.column("query_id")),
                   ("document", encoders.document, ex.column("doc_id"))]
        if teacher is not None:
            columns += [("query", teacher, ex.column("query_id")),
                        ("document", teacher, ex.column("doc_id"))]
    found: dict[str, tuple[Target, list[pa.ChunkedArray]]] = {}
    for role, name, column in columns:
        view = views.view_name(name, encoders.models[name], role)
        found.setdefault(view, (Target(name, role, view), []))[1].append(column)
    return {target: pc.unique(pa.chunked_array([c for col in cols for c in col.chunks],
                                               pa.string()))
            for target, cols in found.values()}


def _unused_document_prompt(encoders: EncodersParams) -> None:
    """Say so when groups data meets a document prompt: every groups text is a query text."""
    spec = encoders.models[encoders.query]
    if prompt_of(spec, "document") != prompt_of(spec, "query"):
        log.warning("encoders.models.%s.prompts.document: not used: groups data embeds every "
                    "text as a query (prompts.query), in training, evaluate and search",
                    encoders.query)


def fill(prepared_dir: Path, out: Path, encoders: EncodersParams, cp: CacheParams,
         dist: Dist | None = None, layer: int | None = None, teacher: str | None = None
         ) -> list[FillResult]:
    """Fill the view of every (encoder, role) the prepared data needs (`texts_per_encoder`),
    embedding only what the shared store (`cache.store`) lacks; with `layer` k, also the token
    states after layer k (`<view>@layer<k>/`) of the query encoder's views (top-layers
    training); with `teacher` (`train.distill.teacher`), that encoder's vectors of the texts
    (a simtune export folder runs with its head: `simtune.model.load_encoder`)."""
    prepared = load_prepared(prepared_dir)
    if prepared.texts.num_rows == 0:
        raise UserError(f"{prepared_dir}: prepared data has no texts")
    dist = dist or dist_from_env()
    needs = texts_per_encoder(prepared, encoders, teacher)
    check_student(encoders, {t.name for t in needs} - {teacher})
    check_teacher(encoders, teacher)
    if prepared.kind == "groups":
        _unused_document_prompt(encoders)
    cutting.check_prompts([(t.name, encoders.models[t.name], t.role) for t in needs])
    threads.announce()
    described = described_in_use(encoders, needs, layer)
    keep = {fingerprint(d) for d in described.values()}
    results = []
    for target, ids in needs.items():
        name, role = target.name, target.role
        texts = prepared.text_map(ids)
        spec = encoders.models[name]
        windows, cut = cutting.split(name, spec, role, texts, target.view)
        if layer is not None and name == encoders.query:
            views.check_layer_size(name, spec, texts, Format(layer), cp, role)
            results += fill_with_states(
                name, spec, texts, Path(out) / target.view,
                Path(out) / views.view_name(name, spec, role, layer), cp, dist, layer,
                role=role, keep=keep,
                descriptions=(described[target.view, None], described[target.view, layer]),
                windows=windows)
            results[-2].cut = cut.report()
            continue
        results.append(fill_encoder(name, spec, texts, Path(out) / target.view, cp, dist,
                                    encoder_factory=load_encoder, role=role, keep=keep,
                                    description=described[target.view, None],
                                    windows=windows))
        results[-1].cut = cut.report()
    if dist.rank == 0:  # views of earlier settings go (their vectors stay in the store)
        views.remove_stale(Path(out), {r.view for r in results}, store.root(cp.store))
    return results


def write_report(path: Path, results: list[FillResult]) -> None:
    """`reports/cache.json`: per view, the texts it holds (`texts`), how many of them had every
    window in the store already (`texts_cached`), how many distinct windows this run embedded
    (`windows_embedded`: a text that fits is one window, a long one with `chunks` several;
    equal windows are embedded once),
    and (vectors' views) what the window cuts (`window`: `chunks.Cut.report`, its `windows`
    all of the view's windows)."""
    write_json(path, {r.view: {"texts": r.needed, "texts_cached": r.cached,
                               "windows_embedded": r.embedded,
                               **({"window": r.cut} if r.cut is not None else {})}
                      for r in results})


def described_in_use(encoders: EncodersParams, targets: Iterable[Target], layer: int | None
                     ) -> dict[tuple[str, int | None], dict]:
    """(view, layer) -> settings description of every store entry the current params use: each
    target's vectors (its encoder in its role) and, with `layer`, the query encoder's layer
    states. The size policy never drops them (their fingerprints)."""
    out = {}
    for target in targets:
        spec = encoders.models[target.name]
        out[target.view, None] = describe(target.name, spec, role=target.role, chunks=False)
        if layer is not None and target.name == encoders.query:
            out[target.view, layer] = describe(target.name, spec, layer, target.role,
                                               chunks=False)
    return out


