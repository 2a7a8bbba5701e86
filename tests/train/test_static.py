"""The static student (`train.mode: static`, issue 45): folding the map into the table, the
plain sentence-transformers folder, epoch 0 as a candidate, unlabelled texts in the fit."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from simtune import static
from simtune.errors import UserError
from simtune.model import load_model
from simtune.train import static as st
from simtune.train import static_init
from tests.conftest import WORDS

TEXTS = [f"{a} {b} {c}" for a, b, c in zip(WORDS, WORDS[3:] + WORDS[:3],
                                           WORDS[7:] + WORDS[:7], strict=True)]


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> static.StaticEncoder:
    """model2vec's distill of a tiny random BERT (the student's start), PCA to 8 dims."""
    from tests.conftest import save_tiny_bert

    return static_init.distilled_init(save_tiny_bert(tmp_path_factory.mktemp("bert")), 8, None)


def _settings(**schedule: float) -> st.FitSettings:
    """A short schedule, the labels unused unless `label_weight` says."""
    return st.FitSettings(**{"label_weight": 0.0, "temperature": 0.05, "seed": 0,
                             "monitor": "p@1", **schedule})  # type: ignore[arg-type]


def _random_student(init: static.StaticEncoder, out: int = 12) -> st.StaticStudent:
    torch.manual_seed(1)
    return st.StaticStudent(torch.randn_like(init.weight), torch.randn(init.dim, out))


def test_folding_the_map_into_the_table_gives_the_same_vectors(
        init: static.StaticEncoder) -> None:
    """mean(E[t]) @ W == mean((E @ W)[t]) up to float rounding: the trained student and the
    served folded table give the same unit vectors (and a changed map would not)."""
    student = _random_student(init)
    tokens = st.Tokens.of(init, TEXTS)
    trained = F.normalize(student.encode(tokens), dim=1)
    served = F.normalize(static.StaticEncoder(init.tokenizer, student.fold()).encode(TEXTS),
                         dim=1)
    assert served.shape == (len(TEXTS), 12)
    assert float((trained - served).abs().max()) < 1e-6
    other = static.StaticEncoder(init.tokenizer, student.table.detach() @ torch.eye(8, 12))
    assert float((F.normalize(other.encode(TEXTS), dim=1) - served).abs().max()) > 0.1


def test_learned_token_weights_fold_into_the_rows(init: static.StaticEncoder) -> None:
    """With a weight per row, the student's weighted mean sum(w E[t]) / sum(w) @ W and the
    served plain mean of the folded rows (w E) @ W give the same unit vectors (by hand for one
    text); weights at their start (a = 0) change nothing."""
    student = _random_student(init)
    weighted = st.StaticStudent(student.table.detach(), student.map.detach(), weight_rate=2.0)
    tokens = st.Tokens.of(init, TEXTS)
    assert torch.allclose(weighted.encode(tokens), student.encode(tokens), atol=1e-6)
    with torch.no_grad():
        weighted.log_weight.copy_(torch.randn(len(init.weight)))
    trained = F.normalize(weighted.encode(tokens), dim=1)
    served = F.normalize(static.StaticEncoder(init.tokenizer, weighted.fold()).encode(TEXTS),
                         dim=1)
    assert float((trained - served).abs().max()) < 1e-5
    ids = torch.tensor(init.tokenizer.encode(TEXTS[0], add_special_tokens=False).ids)
    w = torch.exp(2.0 * weighted.log_weight.detach()[ids])
    by_hand = (w[:, None] * weighted.table.detach()[ids]).sum(0) / w.sum() @ weighted.map.detach()
    assert torch.allclose(weighted.encode(tokens)[0], by_hand, atol=1e-5)
    assert float((trained - F.normalize(student.encode(tokens), dim=1)).abs().max()) > 1e-2
    # k a far past float32's exp range (~88): finite vectors, the fold still equal
    far = st.StaticStudent(student.table.detach(), student.map.detach(), weight_rate=1000.0)
    with torch.no_grad():
        far.log_weight.copy_(torch.linspace(0.0, 1.0, len(init.weight)))
    mean = far.encode(tokens)
    assert torch.isfinite(mean).all() and torch.isfinite(far.fold()).all()
    served = static.StaticEncoder(init.tokenizer, far.fold()).encode(TEXTS)
    assert torch.allclose(F.normalize(mean, dim=1), F.normalize(served, dim=1), atol=1e-5)


def test_a_learned_weight_rises_on_the_word_the_labels_hinge_on(
        init: static.StaticEncoder) -> None:
    """Texts "<q> <content>" labelled by q alone ("who" or "where"), the teacher's vectors
    following the content word alone: with the label term the weights of "who" and "where"
    rise and the content words' fall (mean over them), the rows' directions aside."""
    vocab = init.tokenizer.get_vocab()
    content = [w for w in WORDS[22:] if w in vocab][:12]
    assert "who" in vocab and "where" in vocab and len(content) >= 8, content
    texts = [f"{q} {c}" for q in ("who", "where") for c in content]
    labels = torch.tensor([0] * len(content) + [1] * len(content))
    torch.manual_seed(0)
    by_word = torch.randn(len(content), 6)
    teacher = torch.cat([by_word, by_word])  # the teacher ignores q
    tokens = st.Tokens.of(init, texts)
    student = st.StaticStudent(init.weight, torch.randn(init.dim, 6), weight_rate=10.0)
    calls = iter(range(100))  # validation that always improves: the last epoch is kept
    st.fit(student, tokens, teacher, lambda embed: {"val/p@1": float(next(calls))},
           _settings(lr=0.02, max_epochs=15, patience=20, batch_size=len(texts),
                     label_weight=1.0), labels=labels)
    a = student.log_weight.detach()
    q_ids = [vocab["who"], vocab["where"]]
    c_ids = [vocab[c] for c in content]
    assert float(a[q_ids].min()) > 0 > float(a[c_ids].mean()), (a[q_ids], a[c_ids])


def test_the_folder_loads_in_plain_sentence_transformers_with_equal_vectors(
        init: static.StaticEncoder, tmp_path: Path) -> None:
    """The written folder: StaticEmbedding + Normalize, loaded by plain SentenceTransformer
    (no model2vec, no remote code) with simtune's vectors to 1e-6; empty and long texts too."""
    from sentence_transformers import SentenceTransformer

    student = _random_student(init)
    static.write(tmp_path / "m", init.tokenizer, student.fold(), "teacher-x")
    texts = [*TEXTS, "", "the " * 600]
    ours = load_model(tmp_path / "m", "cpu").encode(texts)
    plain = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert [type(m).__name__ for m in plain] == ["StaticEmbedding", "Normalize"]
    theirs = torch.from_numpy(plain.encode(texts, batch_size=7))
    assert ours.shape == theirs.shape == (len(texts), 12)
    assert float((ours - theirs).abs().max()) < 1e-6
    assert torch.allclose(ours[:-2].norm(dim=1), torch.ones(len(TEXTS)))
    assert float(ours[-2].abs().max()) == 0.0  # no tokens: the zero vector, in both


def test_a_changed_table_is_refused_in_one_line(init: static.StaticEncoder,
                                                tmp_path: Path) -> None:
    """The table's files are hashed in simtune.json and checked on every load."""
    static.write(tmp_path / "m", init.tokenizer, init.weight, None)
    path = tmp_path / "m" / static.TABLE / "model.safetensors"
    from safetensors.torch import save_file

    save_file({"embedding.weight": init.weight * 2}, str(path))
    with pytest.raises(UserError, match="changed since it was written"):
        load_model(tmp_path / "m", "cpu")
    shutil.rmtree(tmp_path / "m" / static.TABLE)
    with pytest.raises(UserError, match="missing"):
        load_model(tmp_path / "m", "cpu")


def test_epoch_0_is_a_candidate_and_kept_when_training_only_hurts(
        init: static.StaticEncoder) -> None:
    """Validation that scores the initial vectors best keeps epoch 0: the returned table is
    the initial fold exactly, though every epoch trained; the opposite score keeps a later
    epoch (the selection follows validation, not the last or first epoch)."""
    tokens = st.Tokens.of(init, TEXTS)
    torch.manual_seed(0)
    teacher, mapping = torch.randn(len(TEXTS), 4), torch.randn(init.dim, 4)
    start = st.StaticStudent(init.weight, mapping).encode(tokens)

    def moved(embed: Callable[[st.Tokens], torch.Tensor]) -> float:
        return float((embed(tokens) - start).abs().sum())

    student = st.StaticStudent(init.weight, mapping)
    kept = st.fit(student, tokens, teacher, lambda e: {"val/p@1": -moved(e)},
                  _settings(lr=0.05, max_epochs=3, patience=3, batch_size=8))
    assert kept.best_epoch == 0
    assert [h["epoch"] for h in kept.history] == [0, 1, 2, 3]
    assert torch.equal(kept.table, st.StaticStudent(init.weight, mapping).fold())
    assert not torch.equal(student.fold(), kept.table)  # it did train
    later = st.fit(st.StaticStudent(init.weight, mapping), tokens, teacher,
                   lambda e: {"val/p@1": moved(e)},
                   _settings(lr=0.05, max_epochs=3, patience=3, batch_size=8))
    assert later.best_epoch > 0


def test_the_log_says_epoch_0_has_no_training_loss(init: static.StaticEncoder,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Epoch 0 is the start, trained by no step: its log line says it has no training loss
    (it printed `loss nan`), and a trained epoch's line prints its mean loss."""
    tokens = st.Tokens.of(init, TEXTS)
    torch.manual_seed(0)
    teacher, mapping = torch.randn(len(TEXTS), 4), torch.randn(init.dim, 4)
    with caplog.at_level("INFO", logger="simtune.train.static"):
        fitted = st.fit(st.StaticStudent(init.weight, mapping), tokens, teacher,
                        lambda e: {"val/p@1": 0.5},
                        _settings(lr=0.05, max_epochs=1, patience=1, batch_size=8))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("static epoch")]
    assert lines == [
        "static epoch 0: the start, no training loss, val p@1 0.5000 (best epoch 0)",
        f"static epoch 1: loss {fitted.history[1]['loss']:.4f}, val p@1 0.5000 (best epoch 0)"]


def test_unlabelled_texts_enter_the_fit(init: static.StaticEncoder) -> None:
    """Rows of tokens that only unlabelled texts hold move when those texts are in the fit,
    and stay as they started without them."""
    train, extra = TEXTS[:20], ["mountain ocean island king", "queen music art science"]
    only = {i for t in extra for i in init.tokenizer.encode(t, add_special_tokens=False).ids}
    only -= {i for t in train for i in init.tokenizer.encode(t, add_special_tokens=False).ids}
    assert only
    rows = torch.tensor(sorted(only))

    def run(texts: list[str]) -> torch.Tensor:
        tokens = st.Tokens.of(init, texts)
        torch.manual_seed(0)
        teacher = torch.randn(len(texts), 6)
        student = st.StaticStudent(init.weight, torch.randn(init.dim, 6))
        # validation that always improves: the last epoch is kept
        calls = iter(range(100))
        st.fit(student, tokens, teacher, lambda embed: {"val/p@1": float(next(calls))},
               _settings(lr=0.05, max_epochs=2, patience=5, batch_size=4))
        return student.table.detach()[rows]

    assert torch.equal(run(train), init.weight[rows])
    assert float((run(train + extra) - init.weight[rows]).abs().max()) > 1e-3


def test_labelled_and_unlabelled_texts_share_each_batch_equally() -> None:
    """With the label term on, each batch holds as many labelled rows as unlabelled ones
    (labelled first); an epoch runs once over the larger set; the smaller one's rows come in
    turn from a shuffle, each once before any comes again; one kind alone: no mixing."""
    gen = torch.Generator().manual_seed(0)

    def epochs(labels: list[int], batch: int, n: int) -> tuple[list[list[int]], list[int]]:
        mixed = st._Mixed.of(torch.tensor(labels), gen)
        assert mixed is not None
        major, minor = [], []
        for _ in range(n):
            for b in mixed.batches(batch):
                half = len(b) // 2
                lab, unl = b[:half].tolist(), b[half:].tolist()
                assert all(labels[i] >= 0 for i in lab) and all(labels[i] < 0 for i in unl)
                big, small = (lab, unl) if labels.count(-1) <= len(labels) / 2 else (unl, lab)
                major.append(big)
                minor += small
        return major, minor

    # 8 unlabelled beside 5 labelled: each epoch the 8 in 4 batches, each + 2 labelled
    labels = [0, -1, 1, -1, -1, 0, -1, 1, -1, -1, -1, 2, -1]
    major, minor = epochs(labels, 2, 3)
    assert [len(b) for b in major] == [2] * 12
    for e in range(3):
        assert sorted(i for b in major[4 * e:4 * e + 4] for i in b) == [1, 3, 4, 6, 8, 9, 10, 12]
    assert sorted(minor[:5]) == [0, 2, 5, 7, 11] and sorted(minor[5:10]) == [0, 2, 5, 7, 11]
    # 5 labelled beside 2 unlabelled: each epoch the 5 in batches of 2, 2, 1
    major, minor = epochs([0, 1, -1, 0, 1, -1, 2], 2, 2)
    assert [len(b) for b in major] == [2, 2, 1] * 2
    assert sorted(minor[:2]) == [2, 5] and sorted(minor[2:4]) == [2, 5]
    assert st._Mixed.of(torch.tensor([0, 1, 1]), gen) is None
    assert st._Mixed.of(torch.tensor([-1, -1]), gen) is None
    few = st._Mixed.of(torch.tensor([0, 1, 0, 1, -1]), gen)  # one unlabelled row
    assert few is not None and [len(b) for b in few.batches(4)] == [5]


def test_a_file_of_texts_is_encoded_streaming_with_the_models_vectors(
        init: static.StaticEncoder, tmp_path: Path) -> None:
    """`simtune.static.encode_file`: row i is line i's vector (batches of 7 over 58 lines),
    equal to `Model.encode`'s; the export (model card) loads with the same vectors."""
    import numpy as np

    from simtune.export import static as export

    static.write(tmp_path / "m", init.tokenizer, init.weight, "teacher-x")
    out = export.export(tmp_path / "m", tmp_path / "e", {"share": 0.9, "speed_x": 120.0})
    assert "share of the teacher's lift over the frozen encoder: 90%" in (
        out / "README.md").read_text()
    model = load_model(out, "cpu")
    (tmp_path / "t.txt").write_text("\n".join(TEXTS) + "\n")
    n = static.encode_file(model, tmp_path / "t.txt", tmp_path / "v.npy", 7, False)
    assert n == len(TEXTS) == 58
    got = torch.from_numpy(np.load(tmp_path / "v.npy"))
    assert float((got - load_model(tmp_path / "m", "cpu").encode(TEXTS)).abs().max()) < 1e-6
    with pytest.raises(UserError, match="no such file"):
        static.encode_file(model, tmp_path / "none.txt", tmp_path / "w.npy")
    assert not (tmp_path / "w.npy").exists()


def test_a_file_is_cut_into_lines_at_newlines_alone(init: static.StaticEncoder,
                                                    tmp_path: Path) -> None:
    """Line i is the text before the i-th "\\n" (a "\\r\\n" ending dropped, a lone "\\r" kept
    as text), so the rows are the lines counted: universal newlines would make 3 of 2."""
    import numpy as np

    static.write(tmp_path / "m", init.tokenizer, init.weight, None)
    model = load_model(tmp_path / "m", "cpu")
    (tmp_path / "t.txt").write_bytes(b"the city\r\nriver\rking queen\n")
    assert static.encode_file(model, tmp_path / "t.txt", tmp_path / "v.npy", 1, False) == 2
    got = torch.from_numpy(np.load(tmp_path / "v.npy"))
    assert float((got - model.encode(["the city", "river\rking queen"])).abs().max()) < 1e-6


def _tiny_teacher(tmp_path: Path, prompt: str = "") -> tuple[Path, object]:
    """A tiny random BERT (mean pooling) as the cache fill loads a teacher."""
    from simtune.encoders import FrozenEncoder
    from simtune.params import EncoderParams
    from tests.cache_helpers import encoder_params
    from tests.conftest import save_tiny_bert

    folder = save_tiny_bert(tmp_path / "teacher", seed=3, hidden=16)
    prompts = {"query": prompt, "document": "", "include_prompt": False} if prompt else None
    spec = EncoderParams(**encoder_params(folder, prompts=prompts)["models"]["tiny"])
    return folder, FrozenEncoder("teacher", spec, torch.device("cpu"))


@pytest.mark.parametrize("prompt", ["", "what is "])
def test_the_teacher_start_is_its_vector_of_each_token_alone(tmp_path: Path,
                                                               prompt: str) -> None:
    """`init: teacher`: row i is the teacher's own vector of the one-token text i (its
    `encode`, through its tokenizer and prompt: the long way) times model2vec's SIF weight of
    id i; the tokenizer is the teacher's, splitting a text into its ids with no special
    tokens; a second call reads the store's copy, identical."""
    folder, teacher = _tiny_teacher(tmp_path, prompt)
    table = static_init.teacher_init(teacher, folder, tmp_path / "store")
    hf = teacher.tokenizer
    assert table.weight.shape == (len(hf), 16)
    words = ["city", "river", "?"]
    ids = [hf.convert_tokens_to_ids(w) for w in words]
    assert hf.unk_token_id not in ids
    from model2vec.distill.inference import compute_weights

    want = teacher.encode(words, 8).float() * torch.from_numpy(
        compute_weights(len(hf), 1e-4)[ids]).float()[:, None]
    assert float((table.weight[ids] - want).abs().max()) < 1e-5
    text = "what city, river?"
    assert table.tokenizer.encode(text, add_special_tokens=False).ids == hf(
        text, add_special_tokens=False)["input_ids"]
    again = static_init.teacher_init(teacher, folder, tmp_path / "store")
    assert torch.equal(again.weight, table.weight)
    assert len(list((tmp_path / "store" / "static-init").iterdir())) == 1
    # a cached table that does not hold a row per token is refused, naming its folder
    import numpy as np

    cached = next((tmp_path / "store" / "static-init").iterdir())
    np.save(cached / "table.npy", table.weight.numpy()[:5])
    with pytest.raises(UserError, match="cached start table"):
        static_init.teacher_init(teacher, folder, tmp_path / "store")
