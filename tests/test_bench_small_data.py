"""Smoke test of bench/small_data.py (issues 34 and 43): its draws (one fixed held-out test set
per data set, train and validation from the rest) and summary by hand, the draws written through
prepare's own code, and the tiniest run (TREC coarse at 8 per label, one seed, a tiny random
BERT for MiniLM): the simtune rows always, SetFit where `.[bench]` installed it (else the note
that says why not)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
from pathlib import Path

import pytest

from bench import small_data
from bench import small_data_split as split

# 1,000 texts in three labels of 600, 300 and 100: 500 held out, 300 / 150 / 50
LABELS = {"A": [f"a{i}" for i in range(600)], "B": [f"b{i}" for i in range(300)],
          "C": [f"c{i}" for i in range(100)]}


def _args(*sets: str) -> argparse.Namespace:
    return argparse.Namespace(model="", max_length=0,
                              set=[small_data._override(s) for s in sets])


def test_the_test_set_is_min_500_or_20_percent_stratified_and_order_free() -> None:
    """500 of 1,000 texts (min(500, half)), 20 % of 3,000, half of 100; per label in
    proportion (largest remainder), a label giving at most half its texts (the rest stays to
    draw from); the same keys in any order give the same test set."""
    assert [split.test_count(n) for n in (100, 1000, 2225, 3000, 5952)] == [50, 500, 500, 600,
                                                                           1191]
    test = split.held_out(LABELS)
    assert len(test) == 500
    assert [sum(k.startswith(p) for k in test) for p in "abc"] == [300, 150, 50]
    shuffled = {lab: random.Random(7).sample(keys, len(keys)) for lab, keys in LABELS.items()}
    assert split.held_out(dict(reversed(shuffled.items()))) == test
    # 3 of 6 wanted, 1.5 per label by share: each label gives at most half its 3 texts, 1
    few = split.held_out({"A": ["a0", "a1", "a2"], "B": ["b0", "b1", "b2"]})
    assert sorted(k[0] for k in few) == ["a", "b"]


def test_each_size_and_seed_draws_train_and_val_from_the_rest_around_one_test_set() -> None:
    """Every size and seed has the same test keys, disjoint from its train and val; `size` per
    label to train, max(2, size // 4) to val; a seed draws the same again, another seed others;
    `all`: the whole rest, a ninth of each label to val; pairs: max(8, size // 4) val."""
    test = split.held_out(LABELS)
    draws = {(size, seed): split.draw(LABELS, test, size, seed)
             for size in (8, 16, 32) for seed in (1, 2, 3)}
    for (size, _), d in draws.items():
        assert {k for k, s in d.items() if s == "test"} == test
        for prefix in "abc":
            mine = [s for k, s in d.items() if k.startswith(prefix)]
            assert mine.count("train") == size
            assert mine.count("val") == max(2, size // 4)
    assert draws[16, 1] == split.draw(LABELS, test, 16, 1)
    trains = [{k for k, s in draws[16, seed].items() if s == "train"} for seed in (1, 2, 3)]
    assert trains[0] != trains[1] != trains[2]
    everything = split.draw(LABELS, test, None, 1)
    assert sum(s == "val" for k, s in everything.items() if k.startswith("c")) == 50 // 9
    assert sum(s == "train" for k, s in everything.items() if k.startswith("c")) == 50 - 5
    assert len(everything) == 1000
    queries = {"": [f"q{i}" for i in range(2000)]}
    pairs = split.draw(queries, split.held_out(queries), 50, 1, "pairs")
    assert sorted(pairs.values()).count("val") == 12 and list(pairs.values()).count(
        "test") == 500


def test_a_draw_is_written_through_prepare_as_a_prepared_folder(tmp_path: Path) -> None:
    """The set prepared whole by prepare's own code (a case twin is one text, a text of two
    labels none), then one draw written with its splits: load() reads back exactly the drawn
    examples and only their texts; two sizes share the test split."""
    from simtune import params as P
    from simtune.prepare import stage as prepare
    from simtune.prepare.prepared import load

    rows = [(f"text {lab} number {i}", lab) for lab in "xyz" for i in range(40)]
    rows += [("TEXT x number 0", "x"), ("clash", "x"), ("clash", "y")]
    data = small_data.write_data(rows, "groups", tmp_path / "all.jsonl")
    p = P.validate(small_data.run_params(small_data.base_params(), data, "groups", tmp_path,
                                         1, "default", _args()))
    full = prepare.build(p.prepare)
    by = split.strata(full)
    assert sorted(len(v) for v in by.values()) == [40, 40, 40]  # twin folded, clash dropped
    test = split.held_out(by)
    assert len(test) == 60  # min(500, 120 // 2)
    seen = {}
    for size in (4, 8):
        d = split.draw(by, test, size, seed=1)
        out = tmp_path / f"prepared-{size}"
        split.write_subset(full, d, out, tmp_path / f"prepare-{size}.json")
        back = load(out).examples.to_pydict()
        assert dict(zip(back["text_id"], back["split"], strict=True)) == d
        assert set(load(out).texts.column("text_id").to_pylist()) == set(d)
        report = json.loads((tmp_path / f"prepare-{size}.json").read_text())
        assert report["examples"] == {"train": 3 * size, "val": 3 * 2, "test": 60}
        seen[size] = {t for t, s in zip(back["text_id"], back["split"], strict=True)
                      if s == "test"}
    assert seen[4] == seen[8] == test


def test_pairs_draws_keep_a_querys_pairs_together(tmp_path: Path) -> None:
    """Pairs: queries are the keys; every pair of a drawn query comes along, its document too."""
    from simtune import params as P
    from simtune.prepare import stage as prepare
    from simtune.prepare.prepared import load

    rows = [(f"query {i}", f"document {i} {j}") for i in range(60) for j in range(2)]
    data = small_data.write_data(rows, "pairs", tmp_path / "pairs.jsonl")
    p = P.validate(small_data.run_params(small_data.base_params(), data, "pairs", tmp_path,
                                         1, "default", _args()))
    full = prepare.build(p.prepare)
    by = split.strata(full)
    d = split.draw(by, split.held_out(by), 10, 2, "pairs")
    split.write_subset(full, d, tmp_path / "prepared", tmp_path / "prepare.json")
    back = load(tmp_path / "prepared")
    ex = back.examples.to_pydict()
    assert sorted(ex["split"]).count("test") == 2 * 30  # 30 queries held out, both pairs
    assert sorted(ex["split"]).count("train") == 2 * 10
    assert sorted(ex["split"]).count("val") == 2 * 8
    assert set(back.texts.column("text_id").to_pylist()) == set(ex["query_id"]) | set(
        ex["doc_id"])


def test_the_summary_is_the_mean_and_sd_over_seeds_by_hand() -> None:
    """Default P@1 0.5 and 0.7 over two seeds: mean 0.6, sd sqrt(0.02) (n - 1); frozen 0.6
    both: sd 0 over the seeds, so the target's standard error is the fixed test set's, which
    seeds do not shrink: sqrt(0.6 * 0.4 / 10) = 0.155; SetFit 0.61 in 40 s against the default's
    2 s mean: -0.010 in 5 % of its time; without the query counts, a lift of at least 0."""
    runs = [{"set": "s", "size": 8, "seed": k, "vectors_s": 1.0,
             "default": {"trained": t, "frozen": 0.6, "seconds": 2.0 * k - 1.0, "queries": 10,
                         "mode": "top_layers"},
             "setfit": {"p@1": 0.61, "accuracy": 0.7, "seconds": 40.0}}
            for k, t in ((1, 0.5), (2, 0.7))]
    summed = small_data.summary(runs)
    default = next(s for s in summed if s["row"] == "default")
    assert default["p@1"]["mean"] == pytest.approx(0.6)
    assert default["p@1"]["sd"] == pytest.approx(0.02 ** 0.5) and default["p@1"]["n"] == 2
    assert default["seconds"] == {"mean": 2.0, "sd": pytest.approx(2 ** 0.5), "n": 2}
    assert default["modes"] == {"top_layers": 2}
    frozen, setfit = small_data.headline(summed)
    assert (frozen["ours"], frozen["peer"], frozen["ratio"]) == (pytest.approx(0.6), 0.6,
                                                                 "+0.000")
    assert frozen["target"] == ">= -0.155 (1 SE of frozen)"
    assert (setfit["peer name"], setfit["ratio"]) == ("SetFit", "-0.010 in 5.0% of its time")
    assert "| s   | 8    | default | top_layers | 0.600 ± 0.141 |" in small_data.rendered(summed)
    for r in runs:
        del r["default"]["queries"]
    frozen, _ = small_data.headline(small_data.summary(runs))
    assert frozen["target"] == ">= 0 (1 SE of frozen)"  # sd 0: the lift itself must be >= 0


def test_each_row_gets_its_mode_and_set_overrides_them_all(tmp_path: Path) -> None:
    """default keeps params.yaml's mode (auto), head/top2/full set theirs; `--set` reaches
    every trained row after that (`train.mode=full` too), a value read as YAML (3 an int,
    `false` a bool); a text without `=` is refused, as is a section params.yaml lacks."""
    raw = small_data.base_params()
    modes = {row: small_data.run_params(raw, tmp_path / "d.jsonl", "groups", tmp_path, 1, row,
                                        _args())["train"]["mode"]
             for row in small_data.TRAINED}
    assert modes == {"default": raw["train"]["mode"], "head": "head", "top2": "top_layers",
                     "full": "full"}
    assert raw["train"]["mode"] == "auto"
    args = _args("train.mode=full", "train.schedule.top_layers.layers=3",
                 "train.frozen_candidate=false")
    for row in small_data.TRAINED:
        t = small_data.run_params(raw, tmp_path / "d.jsonl", "groups", tmp_path, 1, row,
                                  args)["train"]
        assert (t["mode"], t["schedule"]["top_layers"]["layers"], t["frozen_candidate"]) == (
            "full", 3, False)
    assert raw["train"]["mode"] == "auto"  # params.yaml's own copy untouched
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        small_data._override("train.mode")
    with pytest.raises(SystemExit, match=re.escape("--set train.nothing.here: params.yaml "
                                                   "has no section 'nothing'")):
        small_data.run_params(raw, tmp_path / "d.jsonl", "groups", tmp_path, 1, "head",
                              _args("train.nothing.here=1"))


def test_tiny_run(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "small_data.json"
    setfit = importlib.util.find_spec("setfit") is not None
    # --tiny: frozen, default, head, top2, logreg and setfit rows (SetFit for 2 steps)
    small_data.main(["--tiny", "--model", str(tiny_bert), "--max-length", "32", "--out",
                     str(out)])
    got = json.loads(out.read_text())
    assert got["complete"] and re.fullmatch(r"[0-9a-f]{40}", got["git"]["commit"])
    schedule = got["train_params"]["schedule"]  # --tiny's schedule, recorded as it ran
    assert (schedule["head"]["max_epochs"], schedule["top_layers"]["max_epochs"]) == (3, 1)
    [run] = got["runs"]
    assert (run["set"], run["size"], run["seed"]) == ("trec-coarse", 8, 1)
    held = got["test_sets"]["trec-coarse"]
    # TREC coarse as prepare keeps it: 5,380 texts, 20 % of them held out
    assert (held["keys"], held["test"]) == (5380, split.test_count(5380)) == (5380, 1076)
    # 6 labels: 8 each to train, 2 each to validate, the fixed test set
    assert run["examples"] == {"train": 48, "val": 12, "test": 1076}
    assert run["default"]["queries"] == 1076 and run["test_digest"] == held["digest"]
    d = run["default"]
    assert 0 <= d["frozen"] <= 1 and 0 <= d["trained"] <= 1
    assert d["verdict"] in ("better", "no better", "worse")
    # auto on ~1,250 short texts: the top layers (the tiny BERT's 2), and top2 is that run
    assert d["mode"] == "top_layers" and d["mode_reason"].startswith("auto: top_layers")
    assert run["top2"] == {**d, "same_as": "default"}
    assert run["head"]["mode"] == "head" and "same_as" not in run["head"]
    assert 0 <= run["logreg"]["accuracy"] <= 1
    rows = {s["row"] for s in got["summary"]}
    assert {"frozen", "default", "head", "top2", "logreg"} <= rows
    if setfit:
        assert "setfit" in rows and 0 <= run["setfit"]["p@1"] <= 1
        assert run["setfit"]["trained_on"] == 60  # train + val: every row's labelled examples
        assert got["args"]["setfit_max_steps"] == 2
    else:
        assert any(n.startswith("setfit: not installed") for n in got["skipped"])
    assert re.search(r"\| trec-coarse \| 8 +\| default \| top_layers \|", got["table"])
