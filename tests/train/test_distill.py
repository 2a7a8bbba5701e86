"""Distillation (`train.objective: distill`): each loss against a by-hand computation, the fixed
projection of a teacher of another width, GradCache equal to the full batch, a teacher from a
simtune export folder, the teacher's cache reused with nothing embedded, and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from simtune import heads
from simtune import params as P
from simtune.cache.views import open_cache
from simtune.errors import UserError
from simtune.export.stage import export
from simtune.model import load_model
from simtune.prepare.prepared import load as load_prepared
from simtune.train import gradcache
from simtune.train import stage as train
from simtune.train.distill import DistillLoss, projection
from simtune.train.losses import GroupLoss
from tests.cache_helpers import count_forward, encoder_params, sentences, two_encoder_pairs
from tests.conftest import repo_params, write_params
from tests.train.distill_helpers import cache_stage_refusal, distill_raw, fill
from tests.train_helpers import relative_errors, step_gradients

# student rows normalise to (1,0,0), (0,1,0); teacher rows to (.6,.8,0), (0,0,-1)
S = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
T = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, -2.0]])


def test_mse_of_normalised_vectors() -> None:
    # row 1: ((1-.6)^2 + .8^2 + 0) / 3 = .8 / 3; row 2: (0 + 1 + 1) / 3
    want = (0.8 / 3 + 2 / 3) / 2
    assert DistillLoss("mse", 1.0)(S, T).item() == pytest.approx(want, abs=1e-6)


def test_cosine() -> None:
    # 1 - cos: row 1 1 - .6, row 2 1 - 0
    assert DistillLoss("cosine", 1.0)(S, T).item() == pytest.approx((0.4 + 1.0) / 2, abs=1e-6)


def test_kl_of_in_batch_similarities() -> None:
    """Student a=(1,0), b=(.6,.8), c=(0,1): cos ab .6, ac 0, bc .8; teacher a=(1,0),
    b=(0,1), c=(-1,0): ab 0, ac -1, bc 0; each row over the other two, temperature .5."""
    s = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    t = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])

    def kl(teacher: tuple[float, float], student: tuple[float, float]) -> float:
        zt = [math.exp(x / 0.5) for x in teacher]
        zs = [math.exp(x / 0.5) for x in student]
        pt = [z / sum(zt) for z in zt]
        ps = [z / sum(zs) for z in zs]
        return sum(p * math.log(p / q) for p, q in zip(pt, ps, strict=True))

    want = (kl((0, -1), (0.6, 0)) + kl((0, 0), (0.6, 0.8)) + kl((-1, 0), (0, 0.8))) / 3
    got = DistillLoss("kl", 0.5)(s, t).item()
    assert got == pytest.approx(want, abs=1e-6)
    assert want > 0.02  # the two similarity matrices really differ
    # a student that ranks as the teacher does, at any width and scale: zero
    assert DistillLoss("kl", 0.5)(3 * t, t).item() == pytest.approx(0, abs=1e-6)


def test_label_weight_adds_the_similarity_loss() -> None:
    labels = torch.tensor([0, 0])
    supcon = GroupLoss("supcon", "cosine", 1.0, 0.2, "batch_hard", 1.0)
    # two rows, one label, student rows orthogonal: supcon per anchor -(0 - log(e^0)) = 0;
    # with a third row of another label it is not: (1,0,0), (0,1,0), (1,1,0)/sqrt2 -> ...
    s3 = torch.cat([S, torch.tensor([[1.0, 1.0, 0.0]])])
    t3 = torch.cat([T, torch.tensor([[0.0, 5.0, 0.0]])])
    labels = torch.tensor([0, 0, 1])
    c = 1 / math.sqrt(2)
    # anchors with a positive: a (pos b: sim 0; others b 0, c .707), b (pos a 0; a 0, c .707)
    sup = 2 * -(0 - math.log(1 + math.exp(c))) / 2
    # mse rows: .8/3, 2/3, row 3: (c-0)^2 + (c-1)^2 over 3
    mse = (0.8 / 3 + 2 / 3 + (c**2 + (c - 1) ** 2) / 3) / 3
    got = DistillLoss("mse", 1.0, None, supcon, 0.5)(s3, t3, labels).item()
    assert got == pytest.approx(mse + 0.5 * sup, abs=1e-6)
    assert DistillLoss("mse", 1.0, None, supcon, 0.0)(s3, t3, labels).item() == pytest.approx(
        mse, abs=1e-6)


def test_projection_of_a_wider_teacher_keeps_its_top_directions() -> None:
    """Gram diag(9, 4, 1): the top two right singular vectors are e1, e2 (signs positive)."""
    t = torch.tensor([[3.0, 0.0, 0.0], [0.0, -2.0, 0.0], [0.0, 0.0, 1.0]])
    proj = projection(t, 2)
    assert proj is not None
    torch.testing.assert_close(proj, torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    # a rotated teacher: its projection keeps inner products of its top 2-d subspace exactly
    rot = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)))[0]
    rows = torch.tensor([[1.0, 2.0, 0.0], [2.0, -1.0, 0.0], [0.5, 0.5, 0.0]]) @ rot
    p2 = projection(rows, 2)
    assert p2 is not None
    torch.testing.assert_close((rows @ p2) @ (rows @ p2).T, rows @ rows.T, atol=1e-5, rtol=0)
    # narrower: zero padding; equal: none
    torch.testing.assert_close(projection(t[:, :2], 3), torch.eye(2, 3))
    assert projection(t, 3) is None


def test_mse_against_a_wider_teacher_uses_the_projection() -> None:
    s = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    t = torch.tensor([[3.0, 0.0, 4.0], [0.0, 1.0, 0.0]])
    proj = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])  # keeps dims 1 and 3
    # targets (3, 4) -> (.6, .8); (0, 0) -> normalised to 0; student (c, c), (0, 1)
    c = 1 / math.sqrt(2)
    want = (((c - 0.6) ** 2 + (c - 0.8) ** 2) / 2 + (0 + 1) / 2) / 2
    assert DistillLoss("mse", 1.0, proj)(s, t).item() == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("loss", ["mse", "cosine", "kl"])
@pytest.mark.parametrize("chunk", [1, 5, 12])
def test_gradcache_equals_the_full_batch(loss: str, chunk: int) -> None:
    torch.manual_seed(0)
    head = heads.build("mlp", 16, 2, 0.3).train()  # dropout on: the replay must redraw it
    with torch.no_grad():
        head.net[-1].weight.normal_(0, 0.1)
    x, teacher = torch.randn(12, 16), torch.randn(12, 24)
    proj = projection(teacher, 16) if loss != "kl" else None
    loss_fn = DistillLoss(loss, 0.1, proj)
    chunks = [x[s : s + chunk] for s in range(0, 12, chunk)]
    torch.manual_seed(1)
    head.zero_grad()
    full = loss_fn(torch.cat([head(c) for c in chunks]), teacher)
    full.backward()
    want = {n: q.grad.clone() for n, q in head.named_parameters()}
    torch.manual_seed(1)
    head.zero_grad()
    got = gradcache.step(head, chunks, lambda reps: loss_fn(reps, teacher))
    assert got.item() == pytest.approx(full.item(), rel=1e-6)
    for name, w in want.items():
        assert w.norm() > 0
        assert (head.get_parameter(name).grad - w).norm() <= 1e-5 * w.norm(), name


@pytest.mark.parametrize("loss", ["mse", "kl"])
def test_the_train_stage_with_gradcache_steps_as_without(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch, loss: str) -> None:
    """The module's distill step (teacher rows gathered per batch, 48-d teacher projected onto
    the 32-d student for mse) with GradCache chunks of 3 == without, every step."""
    raw = distill_raw(tmp_path, tiny_bert, loss=loss, label_weight=0.5)
    raw["train"]["schedule"]["head"]["max_epochs"] = 1
    fill(tmp_path, raw)
    steps = step_gradients(tmp_path, tmp_path / "params.yaml", monkeypatch)
    assert len(steps["plain"]) == len(steps["gc"]) == 3  # 20 training rows, batch 8
    for got, want in zip(steps["gc"], steps["plain"], strict=True):
        worst = relative_errors(got, want)
        assert worst[0][1] <= 1e-4, worst[:3]  # kl at T = .05: float32 rounding x 20


def test_head_mode_distillation_lowers_the_loss_and_saves_a_normalised_model(
        tmp_path: Path, tiny_bert: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    raw = distill_raw(tmp_path, tiny_bert, n=80)
    raw["train"]["schedule"]["head"].update(max_epochs=6, patience=6, lr=0.01)
    fill(tmp_path, raw)
    p = P.load(tmp_path / "params.yaml")
    live = tmp_path / "live"
    with caplog.at_level(logging.INFO):
        train.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                  tmp_path / "train.json", live)
    # issue 35 item 14: the log named `loss auto: supcon` while the distillation loss trained
    assert not [m for m in caplog.messages if m.startswith("loss auto")], caplog.messages
    assert "loss: distill mse (labels unused: train.distill.label_weight 0)" in caplog.messages
    curve = (live / "plots" / "metrics" / "train" / "loss.tsv").read_text().splitlines()[1:]
    losses = [float(line.split("\t")[-1]) for line in curve]
    assert len(losses) == 6
    assert losses[-1] < 0.7 * losses[0], losses
    meta = json.loads((tmp_path / "head" / "training.json").read_text())
    assert meta["normalize_output"] is True


def _export_teacher(root: Path, bert: Path) -> Path:
    """A simtune export of `bert` under a random (non-identity) linear head."""
    head = heads.build("linear", 32, 2, 0.0)
    torch.manual_seed(7)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    head_dir = root / "teacher-head"
    heads.save(head, head_dir)
    enc = encoder_params(bert)["models"]["tiny"]
    (head_dir / "training.json").write_text(json.dumps({
        "mode": "head", "kind": "groups", "query_encoder": "tiny", "document_encoder": "tiny",
        "encoder": enc, "normalize_output": True}))
    export(head_dir, root / "teacher-export", encoder=str(bert))
    return root / "teacher-export"


def test_a_teacher_from_an_export_folder_caches_the_exports_vectors(
        tmp_path: Path, tiny_bert: Path) -> None:
    teacher = _export_teacher(tmp_path, tiny_bert)
    raw = distill_raw(tmp_path, tiny_bert, teacher)
    results = fill(tmp_path, raw)
    assert {r.view for r in results} == {"tiny", "teacher"}
    p = P.validate(raw)
    table = open_cache(tmp_path / "cache", "teacher", p.encoders.models["teacher"], p.cache)
    texts = load_prepared(tmp_path / "prepared").text_map()
    ids = table.ids.to_pylist()
    want = load_model(teacher, "cpu").encode([texts[i] for i in ids])
    torch.testing.assert_close(table.vectors.float(), want, atol=1e-5, rtol=0)
    student = open_cache(tmp_path / "cache", "tiny", p.encoders.models["tiny"], p.cache)
    assert not torch.allclose(student.vectors[:, :32].float(), want, atol=1e-2)  # the head ran
    # its fingerprint covers the head: another head's export is another store entry
    (teacher / "head" / "model.safetensors").write_bytes(
        (tmp_path / "teacher-head" / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(UserError, match=r"fingerprint|changed|run the cache stage"):
        open_cache(tmp_path / "cache", "teacher", p.encoders.models["teacher"], p.cache)


def test_an_export_teacher_with_other_pooling_is_refused(tmp_path: Path, tiny_bert: Path
                                                         ) -> None:
    teacher = _export_teacher(tmp_path, tiny_bert)
    raw = distill_raw(tmp_path, tiny_bert, teacher)
    raw["encoders"]["models"]["teacher"]["pooling"] = "cls"
    with pytest.raises(UserError) as e:
        fill(tmp_path, raw)
    assert str(e.value) == (f"encoders.models.teacher.pooling: 'cls', but the export {teacher} "
                            "embeds with 'mean'; set it so")


def test_a_second_experiment_embeds_nothing(tmp_path: Path, tiny_bert: Path) -> None:
    """The teacher's vectors are in the machine's store: another workspace (its own cache
    dir) with another distillation set-up reuses them, and the student's, without a forward."""
    raw = distill_raw(tmp_path, tiny_bert)
    first = {r.view: r for r in fill(tmp_path, raw)}
    assert first["teacher"].embedded == first["teacher"].needed == 20 + 10 + 10
    raw["train"]["distill"].update(loss="kl", label_weight=1.0)
    raw["train"]["head"]["type"] = "linear"
    with count_forward() as counts:
        second = {r.view: r for r in fill(tmp_path, raw, cache_dir="cache-2")}
    assert counts["rows"] == 0
    assert second["teacher"].embedded == 0 and second["teacher"].cached == 40
    assert not second["teacher"].model_loaded
    p = P.validate(raw)
    a = open_cache(tmp_path / "cache", "teacher", p.encoders.models["teacher"], p.cache)
    b = open_cache(tmp_path / "cache-2", "teacher", p.encoders.models["teacher"], p.cache)
    assert torch.equal(a.vectors, b.vectors) and a.vectors.shape == (40, 48)


def test_params_refusals(tiny_bert: Path) -> None:
    raw = repo_params()
    raw["train"]["objective"] = "distill"
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == ("params.yaml: train: distill.teacher: objective distill needs a "
                            "teacher (a name in encoders.models)")
    raw["train"]["distill"]["teacher"] = "mpnet"
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == ("params.yaml: train.distill.teacher: encoder 'mpnet' is not "
                            "defined in encoders.models (defined: minilm)")
    raw["train"]["distill"]["teacher"] = "minilm"
    raw["train"]["distill"]["loss"] = "l1"
    with pytest.raises(UserError, match=r"train.distill.loss: expected one of 'mse', 'cosine' "
                       r"or 'kl', got 'l1'"):
        P.validate(raw)


def test_distillation_on_pairs_is_refused_before_the_cache_fills(tmp_path: Path,
                                                                  tiny_bert: Path) -> None:
    p = two_encoder_pairs(tmp_path, tiny_bert)
    raw = json.loads(p.model_dump_json())
    raw["train"].update(objective="distill")
    raw["train"]["distill"]["teacher"] = "docs"
    params_file = write_params(tmp_path / "params.yaml", raw)
    assert cache_stage_refusal(tmp_path, params_file) == [
        f"error: train.objective: distill needs groups data (texts with labels), the prepared "
        f"data ({tmp_path / 'prepared'}) is pairs"]
    assert not (tmp_path / "cache").exists()


def test_the_default_pipeline_is_untouched(tmp_path: Path, tiny_bert: Path) -> None:
    """params.yaml's default objective trains `train.loss` (no teacher is filled or read),
    and a distill set-up left with a teacher but objective similarity fills no teacher."""
    from simtune.cache.stage import texts_per_encoder
    from simtune.train.module import SimilarityModule

    p = P.validate(repo_params())
    assert p.train.objective == "similarity" and p.train.distill.teacher is None
    raw = distill_raw(tmp_path, tiny_bert)
    raw["train"]["objective"] = "similarity"
    assert {r.view for r in fill(tmp_path, raw)} == {"tiny"}
    q = P.validate(raw)
    needs = texts_per_encoder(load_prepared(tmp_path / "prepared"), q.encoders)
    assert [t.name for t in needs] == ["tiny"]
    from simtune.train.data import load_data

    data = load_data(q.train, q.encoders, q.cache, tmp_path / "prepared", tmp_path / "cache")
    assert "teacher" not in data.tables and data.fit is None
    assert isinstance(SimilarityModule(data, q.train, q.encoders, q.cache).loss_fn, GroupLoss)


def test_the_model_card_names_the_distillation_not_an_unused_loss() -> None:
    from simtune.export.model_card import key_params

    raw = repo_params()
    raw["encoders"]["models"]["mpnet"] = {**raw["encoders"]["models"]["minilm"],
                                          "model": "mpnet"}
    raw["train"].update(objective="distill")
    raw["train"]["distill"].update(teacher="mpnet", loss="kl")
    keys = dict(key_params(P.validate(raw), "groups"))
    assert (keys["train.objective"], keys["train.distill.loss"]) == ("distill", "kl")
    assert keys["train.distill.temperature"] == 0.05
    assert "train.loss.name" not in keys  # label_weight 0: no similarity loss ran
    raw["train"]["distill"].update(loss="mse", label_weight=0.5)
    keys = dict(key_params(P.validate(raw), "groups"))
    assert "train.distill.temperature" not in keys and keys["train.loss.name"] == "auto"
    assert "train.objective" not in dict(key_params(P.validate(repo_params()), "groups"))


def test_an_export_teacher_embeds_with_the_params_window(tmp_path: Path, tiny_bert: Path
                                                         ) -> None:
    """max_length is the params' (the export was written with 32): texts cut at 6 tokens."""
    from simtune.encoders import FrozenEncoder
    from simtune.model import load_encoder

    teacher = _export_teacher(tmp_path, tiny_bert)
    spec = P.EncoderParams(**{**encoder_params(teacher)["models"]["tiny"], "max_length": 6})
    texts = sentences(6)
    got = load_encoder("teacher", spec, torch.device("cpu"), "document").encode(texts, 4)
    model = load_model(teacher, "cpu")
    cut = FrozenEncoder("t", model.encoder.spec.model_copy(update={"max_length": 6}),
                        torch.device("cpu")).encode(texts, 4)
    with torch.inference_mode():
        want = torch.nn.functional.normalize(model.head(cut), dim=-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert not torch.allclose(got, model.encode(texts), atol=1e-3)  # the export's own window


@pytest.mark.parametrize("loss", ["mse", "kl"])
def test_the_loss_runs_in_float32_under_half_precision_autocast(loss: str) -> None:
    """Under 16-mixed a matmul would run in float16 (and kl's masked logits -1e9 overflow
    it to -inf): the loss is computed in float32, equal to the plain one."""
    torch.manual_seed(0)
    s, t = torch.randn(16, 8, requires_grad=True), torch.randn(16, 12)
    fn = DistillLoss(loss, 0.05, projection(t, 8) if loss == "mse" else None)
    want = fn(s, t)
    with torch.autocast("cpu", dtype=torch.float16):
        got = fn(s, t)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    got.backward()
    assert s.grad is not None and bool(torch.isfinite(s.grad).all())


@pytest.mark.parametrize("mode", ["head", "full"])
def test_probe_kl_over_batches_of_two_is_refused(tmp_path: Path, tiny_bert: Path,
                                                 mode: str) -> None:
    """kl over a batch of 2 softmaxes over one other text: p = 1 for teacher and student, a
    loss of exactly 0 every step (it trained nothing, silently). Refused in one line naming
    the mode's batch key, before anything is written; 3 trains."""
    from typer.testing import CliRunner

    from stages import app
    from tests.train_helpers import stage_args

    raw = distill_raw(tmp_path, tiny_bert, loss="kl")
    head = mode == "head"  # the other mode's batch key at 8: the mode's own key is read
    raw["train"]["mode"] = mode
    raw["train"]["schedule"]["head"].update(batch_size=2 if head else 8, max_epochs=1)
    raw["train"]["schedule"]["full"].update(batch_size=8 if head else 2, max_epochs=1)
    fill(tmp_path, raw)
    result = CliRunner().invoke(app, stage_args(tmp_path, tmp_path / "params.yaml"))
    assert result.exit_code != 0
    key = f"train.schedule.{mode}.batch_size"
    assert result.output.strip().splitlines()[-1] == (
        f"error: {key}: 2 gives batches of 2 texts (of 20); train.distill.loss kl softmaxes "
        "each text's similarities over the batch's other texts, and over one other it is 1 "
        "whatever the student (nothing to learn): use batches of 3 or more")
    assert not (tmp_path / "head").exists()
    assert DistillLoss("kl", 0.05)(torch.randn(2, 4), torch.randn(2, 6)).item() == 0.0


def test_probe_a_teacher_that_is_the_student_is_refused() -> None:
    """The student's own encoder (by name, or another name with the same settings) as the
    teacher gives the student's own vectors: nothing to learn (head mode's loss was 0 at every
    step). One line naming the key; objective similarity leaves the unused key alone."""
    raw = repo_params()
    raw["train"].update(objective="distill")
    raw["train"]["distill"]["teacher"] = "minilm"
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == ("params.yaml: train.distill.teacher: 'minilm' is the student "
                            "(encoders.query 'minilm'): its vectors are the student's own "
                            "(nothing to learn); name another encoder")
    raw["encoders"]["models"]["copy"] = dict(raw["encoders"]["models"]["minilm"])
    raw["train"]["distill"]["teacher"] = "copy"
    with pytest.raises(UserError) as e:
        P.validate(raw)
    assert str(e.value) == ("params.yaml: train.distill.teacher: 'copy' has the settings of "
                            "the student (encoders.query 'minilm'): its vectors are the "
                            "student's own (nothing to learn); name another encoder")
    raw["encoders"]["models"]["copy"]["max_length"] += 1  # another window: another teacher
    assert P.validate(raw).train.distill.teacher == "copy"
    raw["train"].update(objective="similarity", distill={**raw["train"]["distill"],
                                                         "teacher": "minilm"})
    assert P.validate(raw).train.objective == "similarity"


def test_probe_a_teacher_named_by_its_trained_head_folder_is_one_clear_line(
        tmp_path: Path, tiny_bert: Path) -> None:
    """`models/head` (a head's config.json, training.json, no tokenizer) as the teacher read
    'cannot load: Couldn't instantiate the backend tokenizer from one of:'. One line saying
    what the folder is and what to name instead; its export loads."""
    teacher = _export_teacher(tmp_path, tiny_bert)
    head = tmp_path / "teacher-head"
    with pytest.raises(UserError) as e:
        fill(tmp_path, distill_raw(tmp_path, tiny_bert, head))
    assert str(e.value) == (f"encoders.models.teacher.model: {head}: a trained head folder "
                            "(the train stage's output), not a model; export it (simtune "
                            "export) and name the export folder")
    assert {r.view for r in fill(tmp_path, distill_raw(tmp_path, tiny_bert, teacher))} == {
        "tiny", "teacher"}


def test_probe_an_export_folder_as_the_student_is_refused_before_the_cache_fills(
        tmp_path: Path, tiny_bert: Path) -> None:
    """An export folder (encoder and head) as encoders.query was filled and trained on, then
    evaluate's speed failed ('cannot load: Couldn't instantiate the backend tokenizer') and
    export wrote a folder nesting the whole export in encoder/ (which loads nowhere). One line
    at the cache stage, nothing written; the export's encoder/ is a student."""
    teacher = _export_teacher(tmp_path, tiny_bert)
    raw = distill_raw(tmp_path, tiny_bert)
    raw["encoders"]["models"]["tiny"]["model"] = str(teacher)
    with pytest.raises(UserError) as e:
        fill(tmp_path, raw)
    assert str(e.value) == (
        f"encoders.models.tiny.model: {teacher}: a simtune export folder (encoder and head) "
        "is a teacher only (train.distill.teacher); the student ('tiny' is encoders.query or "
        ".document) needs a model folder (e.g. the export's encoder/, without its head)")
    assert not (tmp_path / "cache").exists()
    raw["encoders"]["models"]["tiny"]["model"] = str(teacher / "encoder")
    assert {r.view for r in fill(tmp_path, raw)} == {"tiny", "teacher"}


def test_a_teacher_that_is_a_copy_of_the_students_folder_is_refused(tmp_path: Path,
                                                                      tiny_bert: Path) -> None:
    """A byte-identical copy of the student's model folder, with the student's settings, as
    the teacher: other settings by path, one fingerprint (the same vectors, from one store
    entry; train's loss was 0). Refused by content, in one line, before the cache fills; and
    by train, over views filled before the check existed (issue 35 item 6)."""
    import shutil

    copy = tmp_path / "copy-of-student"
    shutil.copytree(tiny_bert, copy)
    raw = distill_raw(tmp_path, tiny_bert, copy)
    want = (f"train.distill.teacher: 'teacher' ({copy}) is the student's model (encoders.query "
            f"'tiny', {tiny_bert}): the same files and settings give the same vectors "
            "(nothing to learn); name another encoder")
    with pytest.raises(UserError) as e:
        fill(tmp_path, raw)
    assert str(e.value) == want
    assert not (tmp_path / "cache").exists()
    # a view of each filled (as before the check): train refuses them
    p = P.validate(raw)
    from simtune.cache import stage as cache

    cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache)
    cache.fill_encoder("teacher", p.encoders.models["teacher"],
                       load_prepared(tmp_path / "prepared").text_map(),
                       tmp_path / "cache" / "teacher", p.cache, cache.Dist())
    with pytest.raises(UserError) as e:
        train.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                  tmp_path / "train.json", tmp_path / "live")
    assert str(e.value) == want
    assert not (tmp_path / "head").exists()
    # another window makes another teacher (its vectors differ): accepted
    raw["encoders"]["models"]["teacher"]["max_length"] = 8
    assert {r.view for r in fill(tmp_path, raw)} == {"tiny", "teacher"}
