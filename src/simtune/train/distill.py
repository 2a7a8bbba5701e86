"""Distillation (`train.objective: distill`): the student learns to give a teacher's vectors.

The teacher is an encoder of `encoders.models` (`train.distill.teacher`) whose vectors of every
text the cache stage filled once (`cache/<teacher>/`); training reads them like any cache table.
The student is the query encoder's representation (head, top_layers or full mode) and its head.

Losses, over this process's rows (anchors) and, for `kl`, every process's rows as columns
(all-gathered with gradients, as `simtune.train.losses` does, so 2 processes x B = 1 x 2B):

- `mse`: mean over rows and dims of (n(s) - n(t))^2, n = L2 normalisation;
- `cosine`: mean over rows of 1 - cos(s, t);
- `kl`: relational; per row i, KL(p_t || p_s) with p(j) = softmax_j(cos(x_i, x_j) / T) over the
  batch's other rows j != i (teacher's and student's similarity matrices), mean over rows. A
  query-side head (`train.head.side: query`) compares its output for row i with the frozen
  vectors of the rows j (what its queries are ranked against): p_s(j) = softmax_j(cos(h(x_i),
  x_j) / T), so the head learns to rank the frozen documents as the teacher ranks them.

mse and cosine compare a student vector (D_s) with a teacher vector (D_t): a wider teacher is
first projected onto the top D_s right singular vectors of its training vectors (uncentred
PCA: the rank-D_s projection that best keeps the teacher's inner products, hence its ranking),
a narrower one padded with zeros (which keeps them exactly). The projection is fixed (computed
once from the cached vectors when training starts): the student is matched directly, so what
is served is what was trained, and nothing extra is learned or exported. `kl` compares B x B
similarities: any widths. `train.distill.label_weight` > 0 adds the similarity loss
`train.loss` on the labels.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import nn

from simtune.examples import SPLIT_NAMES, Split
from simtune.params import DistillParams
from simtune.prepare.prepared import UNLABELLED
from simtune.train.losses import Gather

MASKED = -1e9  # a row's own column in `kl`: exp() is exactly 0, and no inf meets a 0


def projection(teacher: torch.Tensor, dim: int) -> torch.Tensor | None:
    """(D_t, dim) map of teacher vectors (N, D_t) to `dim` dims: the top `dim` right singular
    vectors of `teacher` (uncentred PCA, signs fixed: each column's largest entry positive)
    when D_t > dim; zero padding (I then 0) when D_t < dim; None when D_t == dim."""
    width = teacher.shape[1]
    if width == dim:
        return None
    if width < dim:
        return torch.eye(width, dim)
    gram = teacher.double().T @ teacher.double()  # (D_t, D_t): eigenvectors = right sing. vecs
    _, vecs = torch.linalg.eigh(gram)  # ascending eigenvalues
    top = vecs[:, -dim:].flip(1)
    sign = torch.sign(top.gather(0, top.abs().argmax(0, keepdim=True)))
    return (top * sign).float()


class DistillLoss(nn.Module):
    """The distillation loss of `train.distill` (module docstring), plus `label_weight` x the
    similarity loss `label_loss` on the labels when given."""

    def __init__(self, loss: str, temperature: float, proj: torch.Tensor | None = None,
                 label_loss: nn.Module | None = None, label_weight: float = 0.0) -> None:
        super().__init__()
        self.loss, self.temperature = loss, temperature
        self.register_buffer("proj", proj, persistent=False)  # not in any state dict
        self.label_loss, self.label_weight = label_loss, label_weight
        self.gather = Gather()

    def forward(self, student: torch.Tensor, teacher: torch.Tensor,
                labels: torch.Tensor | None = None, columns: torch.Tensor | None = None
                ) -> torch.Tensor:
        """student (B, D_s), teacher (B, D_t) float, labels (B,) -> the scalar loss, computed
        in float32 whatever the training precision (the masked logits of `kl` stay finite).
        `columns` (B, D_s), `kl` only: what the student's rows are compared with instead of
        the student's own rows (a query-side head: the rows' frozen vectors, the documents)."""
        with torch.autocast(student.device.type, enabled=False):
            total, count = self._rows(student.float(), teacher.float(),
                                      None if columns is None else columns.float())
        out = self.gather.mean(total, count)
        if self.label_loss is not None and self.label_weight > 0:
            out = out + self.label_weight * self.label_loss(student, labels)
        return out

    def _rows(self, student: torch.Tensor, teacher: torch.Tensor,
              columns: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum over this process's rows of the distillation loss, rows counted)."""
        if self.loss == "kl":
            return self._kl(student, teacher, columns)
        assert columns is None  # mse and cosine match vectors: no columns
        if self.proj is not None:
            teacher = teacher @ self.proj.float()
        s, t = F.normalize(student, dim=-1), F.normalize(teacher, dim=-1)
        per_row = (s - t).pow(2).mean(1) if self.loss == "mse" else 1 - (s * t).sum(1)
        return per_row.sum(), torch.tensor(len(s), device=s.device)

    def _kl(self, student: torch.Tensor, teacher: torch.Tensor,
            columns: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum over this process's rows of KL(p_t || p_s), rows with another column); the
        student's similarities are to `columns` (every process's) when given."""
        s, t = F.normalize(student, dim=-1), F.normalize(teacher, dim=-1)
        cols_s, offset = self.gather.columns(s if columns is None
                                             else F.normalize(columns, dim=-1))
        cols_t, _ = self.gather.columns(t)
        own = torch.zeros(len(s), len(cols_s), dtype=torch.bool, device=s.device)
        own[torch.arange(len(s)), torch.arange(offset, offset + len(s))] = True
        log_ps = F.log_softmax((s @ cols_s.T / self.temperature).masked_fill(own, MASKED), 1)
        log_pt = F.log_softmax((t @ cols_t.T / self.temperature).masked_fill(own, MASKED), 1)
        kl = (log_pt.exp() * (log_pt - log_ps)).masked_fill(own, 0).sum(1)
        # a batch of one row has no other column: its KL is 0 and it is not counted
        return kl.sum(), torch.tensor(len(s) if len(cols_s) > 1 else 0, device=s.device)


def teacher_rows(examples: pa.Table, table: Any) -> dict[str, torch.Tensor]:
    """Per split, the (N,) rows of the teacher's cache `table` (`index(text_ids)`) of its groups
    examples, in the order `simtune.examples` builds the split (the prepared table's)."""
    split_of = examples.column("split").to_pylist()
    ids = examples.column("text_id").to_pylist()
    return {split: table.index([t for t, s in zip(ids, split_of, strict=True) if s == split])
            for split in SPLIT_NAMES}


def add_unlabelled(examples: pa.Table, train: Split, q_table: Any, teacher: Any,
                   texts: dict[str, str]) -> Split | None:
    """The training split plus the examples of split `unlabelled` (a texts file's,
    `prepare.file.kind: texts`): their cache rows (`q_table`; None in full mode), label -1 (no
    loss reads it: `params.check_unlabelled`), teacher rows and, in full mode, texts. None
    when there are none (training fits on the train split)."""
    split_of = examples.column("split").to_pylist()
    ids = [t for t, s in zip(examples.column("text_id").to_pylist(), split_of, strict=True)
           if s == UNLABELLED]
    if not ids:
        return None
    more = {"labels": torch.full((len(ids),), -1, dtype=torch.long), "t_rows": teacher.index(ids)}
    if "rows" in train.tensors:
        more["rows"] = q_table.index(ids)
    tensors = {k: torch.cat([v, more[k]]) if k in more else v for k, v in train.tensors.items()}
    out = Split(tensors, dict(train.texts))
    if "texts" in train.texts:
        out.texts["texts"] = [*train.texts["texts"], *(texts[t] for t in ids)]
    return out


def build(d: DistillParams, teacher: torch.Tensor, train: Split, dim: int,
          label_loss: nn.Module | None) -> DistillLoss:
    """The loss of `d` for a student of `dim` dims; `teacher` (N, D_t) the teacher's cache
    table, `train` the training split (its `t_rows` give the projection's vectors)."""
    proj = None
    if d.loss != "kl":
        proj = projection(teacher[train.tensors["t_rows"]].float(), dim)
    return DistillLoss(d.loss, d.temperature, proj, label_loss, d.label_weight)
