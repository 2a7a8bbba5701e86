"""Word n-grams in the static student's vocabulary (`train.schedule.static.ngrams`, issue 54):
which n-grams are chosen, the one token each becomes, its row's start, and the folder plain
sentence-transformers loads with the n-grams in its tokenizer and simtune's vectors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from simtune import static
from simtune.model import load_model
from simtune.train import static as st
from simtune.train import static_init, static_ngrams

TEXTS = ["How many cities?", "how many rivers are there", "How much water, how many",
         "how much money", "who is the king", "who is the queen", "the king of the city",
         "who was the first king"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, static.StaticEncoder]:
    """A tiny random BERT teacher and its token table (`init: teacher`)."""
    from simtune.encoders import FrozenEncoder
    from simtune.params import EncoderParams
    from tests.cache_helpers import encoder_params
    from tests.conftest import save_tiny_bert

    folder = save_tiny_bert(tmp_path_factory.mktemp("teacher"), seed=3, hidden=16)
    spec = EncoderParams(**encoder_params(folder)["models"]["tiny"])
    encoder = FrozenEncoder("teacher", spec, torch.device("cpu"))
    return encoder, static_init.teacher_init(encoder, folder, None)


def test_the_ngrams_found_in_the_most_texts_are_chosen(
        teacher: tuple[object, static.StaticEncoder]) -> None:
    """Counted once per text, on the normalised (lowercased) text, words one space apart
    (a comma between two words makes no n-gram), in 2 texts at least; ties by text."""
    tok = teacher[1].tokenizer
    assert static_ngrams.runs(tok, "How much water, how many") == [
        ["how", "much", "water"], ["how", "many"]]
    assert static_ngrams.choose(tok, TEXTS, 5, 2) == ["how many", "how much", "is the",
                                                      "the king", "who is"]
    # "water how" (the comma) and "many cities" (one text) never count
    every = static_ngrams.choose(tok, TEXTS, 100, 2)
    assert "water how" not in every and "many cities" not in every
    assert static_ngrams.choose(tok, TEXTS, 100, 3)[:3] == ["how many", "how much", "is the"]
    assert "who is the" in static_ngrams.choose(tok, TEXTS, 100, 3)


def test_an_ngram_is_one_token_starting_at_the_teachers_vector_of_it(
        teacher: tuple[object, static.StaticEncoder]) -> None:
    """The n-gram's one id replaces its words' pieces (matched whole: "how manyx" is not it);
    its row is the teacher's vector of the n-gram as a text x its pieces' SIF weights summed;
    every other row and token is the start's."""
    encoder, start = teacher
    grams = ["how many", "who is"]
    weights = static_init.sif_weights(len(start.weight))
    got = static_ngrams.extend(start, grams, lambda t: encoder.encode(t, 8), weights)
    v = len(start.weight)
    assert got.weight.shape == (v + 2, start.weight.shape[1])
    assert torch.equal(got.weight[:v], start.weight)
    ids = got.tokenizer.encode("How many kings?", add_special_tokens=False).ids
    assert ids[0] == v and len(ids) == 1 + len(start.tokenizer.encode(
        "kings?", add_special_tokens=False).ids)
    assert v not in got.tokenizer.encode("how manyx", add_special_tokens=False).ids
    assert got.tokenizer.encode("who is", add_special_tokens=False).ids == [v + 1]
    pieces = start.tokenizer.encode("how many", add_special_tokens=False).ids
    want = encoder.encode(["how many"], 8)[0] * weights[pieces].sum()
    assert float((got.weight[v] - want).abs().max()) < 1e-6
    # the start's own tokenizer is untouched
    assert start.tokenizer.get_vocab_size() == v


def test_the_student_with_ngrams_loads_in_plain_sentence_transformers_with_equal_vectors(
        teacher: tuple[object, static.StaticEncoder], tmp_path: Path) -> None:
    """A fitted student with n-gram rows: written as the train stage writes it, plain
    `SentenceTransformer` splits a text into the n-gram's id too and gives simtune's vectors
    to 1e-6; the fit moved the n-gram rows from their start."""
    from sentence_transformers import SentenceTransformer

    encoder, start = teacher
    grams = static_ngrams.choose(start.tokenizer, TEXTS, 3, 2)
    init = static_ngrams.extend(start, grams, lambda t: encoder.encode(t, 8),
                                static_init.sif_weights(len(start.weight)))
    tokens = st.Tokens.of(init, TEXTS)
    torch.manual_seed(0)
    target = torch.randn(len(TEXTS), init.dim)
    settings = st.FitSettings(lr=0.05, batch_size=4, max_epochs=2, patience=2,
                              label_weight=0.0, temperature=0.05, seed=0, monitor="p@1")
    epoch = [0]

    def later_is_better(embed: object) -> dict[str, float]:
        epoch[0] += 1
        return {"val/p@1": float(epoch[0])}

    result = st.fit(st.StaticStudent(init.weight), tokens, target, later_is_better, settings)
    v = len(start.weight)
    assert result.best_epoch == 2
    assert float((result.table[v:] - init.weight[v:]).abs().max()) > 1e-3
    static.write(tmp_path / "m", init.tokenizer, result.table, "teacher")
    texts = [*TEXTS, "how many", "", "unknownword how much"]
    ours = load_model(tmp_path / "m", "cpu").encode(texts)
    plain = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert plain[0].tokenizer.encode("how many", add_special_tokens=False).ids == [v]
    theirs = torch.from_numpy(plain.encode(texts, batch_size=3))
    assert ours.shape == theirs.shape == (len(texts), init.dim)
    assert float((ours - theirs).abs().max()) < 1e-6
    # "how many" alone is its n-gram's row, normalised
    row = torch.nn.functional.normalize(result.table[v], dim=0)
    assert float((ours[len(TEXTS)] - row).abs().max()) < 1e-6
