"""Export of a static student (`train.mode: static`): the plain sentence-transformers folder
(`StaticEmbedding` + `Normalize`, `simtune.static`) with a model card naming the teacher, the
share of its lift the student keeps and its encode speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simtune import static
from simtune.export.destination import destination


def card(teacher: str | None, figures: dict[str, Any]) -> str:
    """The model card (Markdown) of a static student: `figures` may hold `p@1`, `teacher_p@1`,
    `frozen_p@1` (test P@1 of the student, its teacher and the frozen encoder), `share` (the
    student's P@1 gain over the frozen encoder as a share of the teacher's), `speed_x` (encode
    speed against the frozen encoder's), `dim`, `vocab`."""
    def fig(key: str, fmt: str = "{:.3f}") -> str:
        value = figures.get(key)
        return "not measured" if value is None else fmt.format(value)

    return "\n".join([
        "---", "library_name: sentence-transformers", "tags:", "- sentence-transformers",
        "- static-embeddings", "- simtune", "---", "",
        "# A static embedding model (simtune, `train.mode: static`)", "",
        "A token table, mean-pooled and L2-normalised: sentence-transformers' `StaticEmbedding`"
        " + `Normalize`. It loads with plain `SentenceTransformer(folder)` (no model2vec, no "
        "remote code) and encodes on a CPU in a fraction of a transformer's time.", "",
        f"- teacher: `{teacher or 'none'}` (the student learned to give its vectors)",
        f"- table: {fig('vocab', '{:,}')} tokens x {fig('dim', '{}')} dims",
        f"- test P@1: {fig('p@1')} (teacher {fig('teacher_p@1')}, frozen encoder "
        f"{fig('frozen_p@1')})",
        f"- share of the teacher's lift over the frozen encoder: {fig('share', '{:.0%}')}",
        f"- encode speed: {fig('speed_x', '{:.0f}x')} the frozen encoder's (texts/s on the "
        "test texts, evaluate's measure)", "",
        "```python", "from sentence_transformers import SentenceTransformer",
        "model = SentenceTransformer(\"path/to/this/folder\")",
        "vectors = model.encode([\"a text\", \"another\"])", "```", ""])


def figures(report: dict[str, Any] | None) -> dict[str, Any]:
    """The card's figures (`card`) from evaluate's report (reports/evaluate.json; None: none):
    test P@1 of the student, the frozen encoder and the teacher, the share of the teacher's
    P@1 lift (evaluate's `distill` report, its `recovered`) and the encode speed over the
    frozen encoder's (the evaluate stage's `distill` speed: every thread of `cache.device`)."""
    if not report:
        return {}
    d = report.get("distill") or {}
    out = {"p@1": report.get("trained", {}).get("p@1"),
           "frozen_p@1": report.get("baseline", {}).get("p@1"),
           "teacher_p@1": d.get("teacher", {}).get("p@1"),
           "share": (d.get("recovered") or {}).get("p@1")}
    rate = (d.get("speed") or {}).get("texts_per_s") or {}
    if rate.get("trained") and rate.get("baseline"):
        out["speed_x"] = rate["trained"] / rate["baseline"]
    return {k: v for k, v in out.items() if v is not None}


def export(model_dir: Path, out: Path, figures: dict[str, Any] | None = None) -> Path:
    """Write the export `out` of the static model folder `model_dir` (the train stage's output,
    read through `simtune.static.load`: its hashes checked) with the model card. `out` is new,
    empty or an earlier export of either kind holding only what it wrote (a link: the folder it
    leads to), as `simtune.export.destination` says, checked before any work."""
    where = destination(Path(out), [Path(model_dir)])
    encoder, config = static.load(Path(model_dir))
    figures = {"dim": encoder.dim, "vocab": int(encoder.weight.shape[0]), **(figures or {})}
    text = card(config.teacher, figures).encode()
    static.write(where, encoder.tokenizer, encoder.weight, config.teacher,
                 extra={"README.md": text})
    return Path(out)
