"""Smoke test of bench/small_data.py (issue 34): its subsets and summary by hand, and the
tiniest run (TREC coarse at 8 per label, one seed, a tiny random BERT for MiniLM): the simtune
rows always, SetFit where `.[bench]` installed it (else the note that says why not)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from bench import small_data

RECS = [(f"a{i}", "A") for i in range(10)] + [(f"b{i}", "B") for i in range(3)]


def test_a_subset_keeps_size_over_the_train_fraction_per_label_seeded() -> None:
    """8 per label to train at a train fraction 0.8: ceil(8 / 0.8) = 10 texts per label, all
    of a label that has fewer (B: 3); a seed picks the same texts again, another seed others."""
    one = small_data.subset(RECS, "groups", 4, seed=1, train_fraction=0.8, cap=0)
    assert sorted(lab for _, lab in one) == ["A"] * 5 + ["B"] * 3  # ceil(4 / 0.8) = 5
    assert one == small_data.subset(RECS, "groups", 4, 1, 0.8, 0)
    assert {t for t, _ in one} != {t for t, _ in small_data.subset(RECS, "groups", 4, 2, 0.8, 0)}
    assert len(small_data.subset(RECS, "groups", None, 1, 0.8, 0)) == 13  # all
    assert sorted(lab for _, lab in small_data.subset(RECS, "groups", None, 1, 0.8, 2)) == [
        "A", "A", "B", "B"]  # all, capped at 2 per label
    assert len(small_data.subset(RECS, "pairs", 4, 1, 0.8, 0)) == 5  # pairs: 5 of the 13
    twice = [("x", "A"), ("X ", "A"), ("y", "A")]  # equal texts (as prepare folds them) once
    assert sorted(small_data.subset(twice, "groups", 8, 1, 0.8, 0)) == [("x", "A"), ("y", "A")]


def test_the_summary_is_the_mean_and_sd_over_seeds_by_hand() -> None:
    """Head P@1 0.5 and 0.7 over two seeds: mean 0.6, sd sqrt(0.02) (n - 1); frozen 0.6 both:
    sd 0 over the seeds, so the target's standard error is the test draw's: 10 queries a seed,
    sqrt(0.6 * 0.4 / 10 * 2) / 2 = 0.1095; without the query counts, a lift of at least 0."""
    runs = [{"set": "s", "size": 8, "seed": k, "head": {
        "trained": t, "frozen": 0.6, "fill_s": 1.0, "seconds": 2.0 * k, "queries": 10}}
        for k, t in ((1, 0.5), (2, 0.7))]
    summed = small_data.summary(runs)
    head = next(s for s in summed if s["row"] == "head")
    assert head["p@1"]["mean"] == pytest.approx(0.6)
    assert head["p@1"]["sd"] == pytest.approx(0.02 ** 0.5) and head["p@1"]["n"] == 2
    assert head["seconds"] == {"mean": 3.0, "sd": pytest.approx(2 ** 0.5), "n": 2}
    [row] = small_data.headline(summed)
    assert (row["ours"], row["peer"], row["ratio"]) == (pytest.approx(0.6), 0.6, "+0.000")
    assert row["target"] == ">= -0.110 (1 SE of frozen)"
    assert "| s   | 8    | head   | 0.600 ± 0.141 |" in small_data.rendered(summed)
    for r in runs:
        del r["head"]["queries"]
    [row] = small_data.headline(small_data.summary(runs))
    assert row["target"] == ">= 0 (1 SE of frozen)"  # sd 0: the lift itself must be >= 0


def test_set_overrides_the_trained_rows_params_and_reads_yaml_values(tmp_path: Path) -> None:
    """`--set train.mode=full --set train.encoder.top_layers=3` reach both trained rows'
    params; a value is YAML (3 an int, `false` a bool); a text without `=` is refused."""
    import argparse

    args = argparse.Namespace(
        model="", max_length=0, set=[small_data._override("train.mode=full"),
                                     small_data._override("train.encoder.top_layers=3"),
                                     small_data._override("train.frozen_candidate=false")])
    raw = small_data.base_params()
    for mode in ("head", "top2"):
        t = small_data.run_params(raw, tmp_path / "d.jsonl", "groups", tmp_path, 1, mode,
                                  args)["train"]
        assert (t["mode"], t["encoder"]["top_layers"], t["frozen_candidate"]) == ("full", 3,
                                                                                    False)
    assert raw["train"]["mode"] == "head"  # params.yaml's own copy untouched
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        small_data._override("train.mode")
    args.set = [small_data._override("train.nothing.here=1")]
    with pytest.raises(SystemExit, match=re.escape("--set train.nothing.here: params.yaml "
                                                   "has no section 'nothing'")):
        small_data.run_params(raw, tmp_path / "d.jsonl", "groups", tmp_path, 1, "head", args)


def test_tiny_run(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "small_data.json"
    setfit = importlib.util.find_spec("setfit") is not None
    # --tiny: frozen, head, logreg and setfit rows (SetFit for 2 steps: seconds, not minutes)
    small_data.main(["--tiny", "--model", str(tiny_bert), "--max-length", "32", "--out",
                     str(out)])
    got = json.loads(out.read_text())
    assert got["complete"] and re.fullmatch(r"[0-9a-f]{40}", got["git"]["commit"])
    assert got["train_params"]["max_epochs"] == 3  # --tiny's schedule, recorded as it ran
    [run] = got["runs"]
    assert (run["set"], run["size"], run["seed"]) == ("trec-coarse", 8, 1)
    # 6 labels, 10 distinct texts each (TREC repeats a question: drawn once), 8 to train
    assert run["examples"]["train"] == 48
    assert 0 <= run["head"]["frozen"] <= 1 and 0 <= run["head"]["trained"] <= 1
    assert run["head"]["verdict"] in ("better", "no better", "worse")
    assert 0 <= run["logreg"]["accuracy"] <= 1
    rows = {s["row"] for s in got["summary"]}
    assert {"frozen", "head", "logreg"} <= rows
    if setfit:
        assert "setfit" in rows and 0 <= run["setfit"]["p@1"] <= 1
        assert got["args"]["setfit_max_steps"] == 2
    else:
        assert any(n.startswith("setfit: not installed") for n in got["skipped"])
    assert "| trec-coarse | 8    | head   |" in got["table"]
