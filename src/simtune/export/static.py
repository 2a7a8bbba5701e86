"""Export of a static student (`train.mode: static`): the plain sentence-transformers folder
(`StaticEmbedding` + `Normalize`, `simtune.static`) with a model card naming the teacher, the
share of its lift the student keeps and its encode speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simtune import static


def card(teacher: str | None, figures: dict[str, Any]) -> str:
    """The model card (Markdown) of a static student: `figures` may hold `p@1`, `teacher_p@1`,
    `frozen_p@1` (test P@1 of the student, its teacher and the frozen encoder), `share` (the
    student's P@1 gain over the frozen encoder as a share of the teacher's), `speed_x` (encode
    speed against the frozen encoder, one thread), `dim`, `vocab`."""
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
        f"- encode speed, one thread: {fig('speed_x', '{:.0f}x')} the frozen encoder's", "",
        "```python", "from sentence_transformers import SentenceTransformer",
        "model = SentenceTransformer(\"path/to/this/folder\")",
        "vectors = model.encode([\"a text\", \"another\"])", "```", ""])


def export(model_dir: Path, out: Path, figures: dict[str, Any] | None = None) -> Path:
    """Write the export `out` of the static model folder `model_dir` (the train stage's
    output, read through `simtune.static.load`: its hashes checked) with the model card."""
    encoder, config = static.load(Path(model_dir))
    figures = {"dim": encoder.dim, "vocab": int(encoder.weight.shape[0]), **(figures or {})}
    text = card(config.teacher, figures).encode()
    static.write(Path(out), encoder.tokenizer, encoder.weight, config.teacher,
                 extra={"README.md": text})
    return Path(out)
