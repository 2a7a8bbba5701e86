"""`train.mode: auto` (issue 43): the mode resolved from the data at the size boundaries, each
mode's own schedule in force, moved keys refused in one line, patience counted from the first
trained epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from simtune import params as P
from simtune.cache import modes
from simtune.errors import UserError
from simtune.train.validation import Schedule
from tests.cache_helpers import encoder_params
from tests.conftest import repo_params

TEXTS = [f"what is the name of the {w} river" for w in
         ("first", "largest", "city", "country", "ocean", "island")] * 5


def _train(tiny_bert: Path, **auto: float) -> tuple[P.TrainParams, P.EncodersParams]:
    raw = repo_params()
    raw["encoders"] = encoder_params(tiny_bert)
    raw["train"]["mode"] = "auto"
    raw["train"]["auto"].update({"full_max_tokens": 0, **auto})  # these test the top layers
    p = P.validate(raw)
    return p.train, p.encoders


def test_auto_takes_the_top_layers_up_to_the_token_bound_and_the_head_beyond(
        tiny_bert: Path) -> None:
    _, enc = _train(tiny_bert)
    e = modes.estimate(enc, TEXTS)
    # every text is one of six (each appears 5 times): the tokens counted by hand
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    assert e.total == sum(len(tok(x)["input_ids"]) for x in TEXTS)
    assert e.gb == pytest.approx(e.total * 32 * 4 / 1e9)  # hidden 32, states float32
    at, _ = _train(tiny_bert, max_tokens=e.total)
    below, _ = _train(tiny_bert, max_tokens=e.total - 1)
    assert modes.choose(at, enc, TEXTS)[0] == "top_layers"
    mode, why = modes.choose(below, enc, TEXTS)
    assert mode == "head"
    assert f"{e.total:,} tokens > train.auto.max_tokens {e.total - 1:,}" in why


def test_auto_takes_the_head_when_the_layer_cache_is_over_its_bound(tiny_bert: Path) -> None:
    _, enc = _train(tiny_bert)
    gb = modes.estimate(enc, TEXTS).gb
    fits, _ = _train(tiny_bert, max_layer_gb=gb * 1.001)
    over, _ = _train(tiny_bert, max_layer_gb=gb * 0.999)
    assert modes.choose(fits, enc, TEXTS)[0] == "top_layers"
    assert modes.choose(over, enc, TEXTS)[0] == "head"


def test_auto_takes_the_head_for_two_encoders_mined_negatives_and_too_many_layers(
        tiny_bert: Path) -> None:
    t, enc = _train(tiny_bert)
    two = enc.model_copy(update={"document": "other", "models": {**enc.models,
                                                                 "other": enc.models["tiny"]}})
    assert modes.choose(t, two, TEXTS)[0] == "head"
    mined = t.model_copy(update={"hard_negatives": 4})
    assert modes.choose(mined, enc, TEXTS) == (
        "head", "auto: head (train.hard_negatives 4: mined negatives train the head only)")
    deep = t.model_copy(update={"schedule": t.schedule.model_copy(update={
        "top_layers": t.schedule.top_layers.model_copy(update={"layers": 3})})})
    mode, why = modes.choose(deep, enc, TEXTS)  # the tiny BERT has 2 layers
    assert mode == "head" and "layers 3 > the encoder's 2 layers" in why


def test_auto_trains_the_whole_encoder_up_to_its_own_token_bound(tiny_bert: Path) -> None:
    _, enc = _train(tiny_bert)
    total = modes.estimate(enc, TEXTS).total
    at, _ = _train(tiny_bert, full_max_tokens=total)
    above, _ = _train(tiny_bert, full_max_tokens=total - 1)
    mode, why = modes.choose(at, enc, TEXTS)
    assert mode == "full"
    assert f"{total:,} tokens <= train.auto.full_max_tokens {total:,}" in why
    assert modes.choose(above, enc, TEXTS)[0] == "top_layers"
    # full needs one shared encoder as the top layers do
    two = enc.model_copy(update={"document": "other", "models": {**enc.models,
                                                                 "other": enc.models["tiny"]}})
    assert modes.choose(at, two, TEXTS)[0] == "head"


def test_each_mode_trains_with_its_own_schedule_section(tiny_bert: Path) -> None:
    t, _ = _train(tiny_bert)
    s = t.schedule
    head = P.effective(t, "head").run
    top = P.effective(t, "top_layers", "why").run
    full = P.effective(t, "full").run
    assert (head.lr, head.encoder_lr, head.batch_size, head.max_epochs, head.patience) == (
        s.head.lr, None, s.head.batch_size, s.head.max_epochs, s.head.patience)
    assert (top.lr, top.encoder_lr, top.layers, top.batch_size, top.reason) == (
        s.top_layers.head_lr, s.top_layers.lr, s.top_layers.layers, s.top_layers.batch_size,
        "why")
    assert (full.lr, full.encoder_lr, full.layers) == (s.full.head_lr, s.full.lr, 0)
    shown = top.shown()
    assert shown["train.schedule.top_layers.lr"] == s.top_layers.lr
    assert shown["train.mode"] == "top_layers"
    assert not any(k.startswith("train.schedule.head") for k in shown)
    with pytest.raises(ValueError, match="resolve it first"):
        P.effective(t)  # auto is resolved from the data, never guessed


@pytest.mark.parametrize(("path", "new"), [
    (("lr",), "train.schedule.head.lr"),
    (("max_epochs",), "train.schedule.head.max_epochs"),
    (("encoder", "top_layers"), "train.schedule.top_layers.layers"),
    (("encoder", "lora"), "train.lora"),
])
def test_a_moved_key_is_one_line_naming_the_new_key(path: tuple[str, ...], new: str) -> None:
    raw = repo_params()
    node = raw["train"]
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = 1
    with pytest.raises(UserError) as e:
        P.validate(raw)
    old = "train." + ".".join(path)
    assert str(e.value).startswith(f"params.yaml: {old}: moved to {new}")
    assert "\n" not in str(e.value)


def test_a_sweep_key_that_moved_names_the_new_one() -> None:
    raw = repo_params()
    raw["sweep"]["space"] = {"train.lr": {"low": 0.001, "high": 0.01}}
    with pytest.raises(UserError, match=r"sweep: space.train.lr: moved to "
                       r"train.schedule.head.lr"):
        P.validate(raw)


def test_patience_counts_from_the_first_trained_epoch() -> None:
    """A slow starter below the frozen encoder trains on while it improves; it stops
    `patience` epochs after its last improvement; still below the frozen encoder, it is not
    "still rising" (issue 52, item 8: the last epoch must beat epoch 0 too)."""
    s = Schedule(1, 2, 10)
    s.record(0, 0.84)  # the frozen encoder
    stops = [s.record(e, v)[1] for e, v in enumerate((0.60, 0.70, 0.80, 0.81), start=1)]
    assert stops == [False] * 4 and s.best_epoch == 0 and s.trained_best == 4 and not s.rising
    # counted from epoch 0, patience 2 would have stopped at epoch 2 (0.70, still rising)
    assert s.record(5, 0.805) == (False, False)
    assert s.record(6, 0.80) == (False, True)  # two epochs after the best trained (4)
    assert not s.rising
    # a trained epoch that beats the frozen encoder is kept, patience counts from it
    s = Schedule(1, 1, 10)
    s.record(0, 0.5)
    assert s.record(1, 0.6) == (True, False)
    assert s.record(2, 0.55) == (False, True)


def test_a_set_mode_that_auto_picks_too_is_said_in_one_line(
        tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """`dvc exp run -S train.mode=top_layers` where auto picks the top layers anyway: the cache
    and train stages' logs say so in one line first (issue 53: a quickstart experiment repeated
    the default run for 21.6 min); a mode auto would not pick gets no such line."""
    import types

    import pyarrow as pa

    monkeypatch.setattr("simtune.prepare.prepared.load",
                        lambda _: types.SimpleNamespace(texts=pa.table({"text": TEXTS})))
    t, enc = _train(tiny_bert)
    picked, why = modes.choose(t, enc, TEXTS)
    assert picked == "top_layers"
    said = {}
    for mode in ("top_layers", "head"):
        caplog.clear()
        with caplog.at_level("INFO", logger="simtune.cache.modes"):
            assert modes.resolve(t.model_copy(update={"mode": mode}), enc, tmp_path,
                                 note_auto=True).mode == mode
        said[mode] = [r.getMessage() for r in caplog.records]
    assert said == {"top_layers": [f"train.mode top_layers: the mode auto picks for this data "
                                   f"too ({why}): the default run's mode, not another"],
                    "head": []}
