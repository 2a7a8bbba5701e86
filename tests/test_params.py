"""The params schema: the shipped file loads; every kind of mistake gives its exact one line."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import pytest

from simtune import params as P
from simtune.errors import UserError
from tests.conftest import ROOT, repo_params, write_params


def _error(raw: dict[str, Any]) -> str:
    with pytest.raises(UserError) as e:
        P.validate(raw, "params.yaml")
    return str(e.value)


def test_shipped_params_load(tmp_path: Path) -> None:
    """The project's params.yaml loads whole, as it is (the shipped one, or the user's after
    the quickstart's edit: issue 52, item 9), and so do the tests' params (`repo_params`: its
    keys and values, the tests' own data source)."""
    P.load(ROOT / "params.yaml")
    p = P.load(write_params(tmp_path / "params.yaml", repo_params()))
    assert (p.prepare.source, p.prepare.trec_labels, p.prepare.file.path) == ("trec", "fine",
                                                                            None)
    assert p.prepare.split.fractions.as_dict() == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert p.prepare.split.by == "row"


def test_unknown_key_names_key_and_section(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["split"]["sed"] = 3
    assert _error(params_raw) == (
        "params.yaml: unknown key 'sed' in section 'prepare.split' (allowed: seed, by, fractions)"
    )


def test_typo_reports_the_unknown_key_before_the_missing_one(params_raw: dict[str, Any]
                                                              ) -> None:
    """`lrr:` for `lr:` makes `train.schedule.head.lr` missing too; the typo is what to
    report."""
    head = params_raw["train"]["schedule"]["head"]
    head["lrr"] = head.pop("lr")
    allowed = ", ".join(P.HeadSchedule.model_fields)
    assert _error(params_raw) == (
        f"params.yaml: unknown key 'lrr' in section 'train.schedule.head' (allowed: {allowed}) "
        "(and 1 more)"
    )
    assert "lr, batch_size" in allowed  # the allowed list names the intended key


def test_unknown_section(params_raw: dict[str, Any]) -> None:
    params_raw["trian"] = {"lr": 0.1}
    assert _error(params_raw).startswith("params.yaml: unknown key 'trian' in the top level")


def test_wrong_type_names_key_expected_and_value(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["split"]["seed"] = "thirteen"
    assert _error(params_raw) == (
        "params.yaml: prepare.split.seed: expected an integer, got 'thirteen'"
    )
    params_raw["prepare"]["split"]["seed"] = 13
    params_raw["prepare"]["split"]["fractions"]["val"] = "0.1"
    assert _error(params_raw) == (
        "params.yaml: prepare.split.fractions.val: expected a number, got '0.1'"
    )


def test_bool_is_not_an_integer(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["split"]["seed"] = True
    assert _error(params_raw) == "params.yaml: prepare.split.seed: expected an integer, got True"


def test_choice_lists_the_options(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["source"] = "csv"
    assert _error(params_raw) == (
        "params.yaml: prepare.source: expected one of 'trec', 'news_pairs' or 'file', got 'csv'"
    )


def test_missing_key(params_raw: dict[str, Any]) -> None:
    del params_raw["prepare"]["split"]["seed"]
    assert _error(params_raw) == "params.yaml: missing key 'prepare.split.seed'"


def test_every_missing_key_is_named(params_raw: dict[str, Any]) -> None:
    """An encoder entry written with keys elided (issue 53: "missing key ... (and 4 more)")
    names every key it lacks in the one line, so one edit adds them all."""
    params_raw["encoders"]["models"]["teacher"] = {"model": "models/teacher", "pooling": "mean"}
    assert _error(params_raw) == (
        "params.yaml: missing keys 'encoders.models.teacher.normalize', "
        "'encoders.models.teacher.max_length', 'encoders.models.teacher.chunks', "
        "'encoders.models.teacher.dtype', 'encoders.models.teacher.states_dtype', "
        "'encoders.models.teacher.prompts'")
    params_raw["prepare"]["split"]["seed"] = "thirteen"  # another kind of error: counted
    assert _error(params_raw).endswith("'encoders.models.teacher.prompts' (and 1 more)")


def test_fractions_must_sum_to_one(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["split"]["fractions"] = {"train": 0.8, "val": 0.1, "test": 0.2}
    assert _error(params_raw) == (
        "params.yaml: prepare.split.fractions: fractions must sum to 1 (they sum to 1.1)"
    )


def test_file_source_needs_path_and_columns(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["source"] = "file"
    params_raw["prepare"]["file"]["path"] = None  # a user's params.yaml may name their file
    assert "file.path is required" in _error(params_raw)
    params_raw["prepare"]["file"]["path"] = "data/raw/x.csv"
    params_raw["prepare"]["file"]["kind"] = "pairs"
    assert "file.columns.query is required for kind 'pairs'" in _error(params_raw)


def test_section_of_wrong_shape(params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["split"] = [1, 2]
    assert _error(params_raw) == "params.yaml: prepare.split: expected a mapping, got [1, 2]"


def test_load_reports_yaml_syntax_line(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("prepare:\n  source: trec\n  split: [\n")
    with pytest.raises(UserError, match=r"params.yaml: invalid YAML at line 4"):
        P.load(bad)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="params file not found"):
        P.load(tmp_path / "nope.yaml")


def test_load_roundtrip_of_written_params(tmp_path: Path, params_raw: dict[str, Any]) -> None:
    params_raw["prepare"]["split"]["seed"] = 7
    p = P.load(write_params(tmp_path / "params.yaml", params_raw))
    assert p.prepare.split.seed == 7


def test_every_key_has_a_description() -> None:
    """The schema documents every key (the README table shows the same keys)."""
    keys = P.documented_keys()
    assert ("encoders.models.<name>.pooling", keys[[k for k, _ in keys].index(
        "encoders.models.<name>.pooling")][1]) in keys
    assert [k for k, d in keys if not d] == []


def _float_keys(model: type = P.Params, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every float field of the schema (mappings of named entries excluded: the
    encoder settings hold no float)."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, P.BaseModel):
            out += _float_keys(ann, (*prefix, name))
        elif ann is float or (typing.get_origin(ann) in (typing.Union, types.UnionType)
                              and any(float in (a, *typing.get_args(a))
                                      for a in typing.get_args(ann))):  # `float | None` too
            out.append((*prefix, name))
    return out


def test_float_keys_are_found() -> None:
    keys = {".".join(k) for k in _float_keys()}
    assert {"train.schedule.head.lr", "train.loss.temperature", "prepare.split.fractions.val",
            "train.head.dropout", "train.schedule.full.lr", "cache.store_max_gb",
            "negatives.margin", "sweep.timeout"} <= keys
    # train.lora.alpha and .dropout, train.distill.temperature and .label_weight,
    # evaluate.significance.alpha, the schedules' head_lr, train.auto.max_layer_gb and
    # .max_minutes, train.schedule.static.lr, .label_weight and .token_weights
    assert len(keys) == 27
    assert "cache.max_layer_gb" in keys  # null: no cap


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("key", _float_keys(), ids=".".join)
def test_every_float_key_rejects_non_finite(params_raw: dict[str, Any], key: tuple[str, ...],
                                            value: float) -> None:
    """`lr: .inf` (YAML's infinity) or `.nan` is refused, naming the key."""
    section = params_raw
    for part in key[:-1]:
        section = section[part]
    section[key[-1]] = value
    assert _error(params_raw) == (f"params.yaml: {'.'.join(key)}: expected a finite number, "
                                  f"got {value!r}")


def test_overflowing_exponent_is_not_finite(params_raw: dict[str, Any]) -> None:
    """YAML 1.1 reads `1e400` as a string; as a number it overflows to inf."""
    params_raw["train"]["loss"]["temperature"] = "1e400"
    assert _error(params_raw) == ("params.yaml: train.loss.temperature: expected a finite "
                                  "number, got inf")


def test_non_finite_from_yaml_text(tmp_path: Path) -> None:
    text = (ROOT / "params.yaml").read_text().replace("lr: 0.005", "lr: .inf", 1)
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(UserError) as e:
        P.load(tmp_path / "params.yaml")
    assert str(e.value) == (f"{tmp_path / 'params.yaml'}: train.schedule.head.lr: expected a "
                            "finite number, got inf")


@pytest.mark.parametrize(("name", "kind", "want"), [
    ("auto", "groups", "supcon"), ("auto", "pairs", "mnrl"),  # the shipped default
    ("triplet", "groups", "triplet"), ("contrastive", "pairs", "contrastive"),  # kept as named
])
def test_auto_loss_is_supcon_for_groups_and_mnrl_for_pairs(params_raw: dict[str, Any],
                                                           name: str, kind: str,
                                                           want: str) -> None:
    """`resolve_loss` sets the loss that runs and changes nothing else of `train`."""
    params_raw["train"]["loss"]["name"] = name
    t = P.validate(params_raw).train
    got = P.resolve_loss(t, kind)
    assert got.loss.name == want
    assert got.model_dump() == {**t.model_dump(), "loss": {**t.loss.model_dump(), "name": want}}
    assert P.resolve_loss(got, kind) == got  # resolving twice is resolving once


@pytest.mark.parametrize(("mode", "kind", "want"), [
    ("full", "groups", "cosine_mse"), ("top_layers", "groups", "supcon"),
    ("head", "groups", "supcon"), ("full", "pairs", "mnrl"),
])
def test_auto_loss_is_cosine_mse_for_groups_in_full_mode_only(params_raw: dict[str, Any],
                                                               mode: str, kind: str,
                                                               want: str) -> None:
    params_raw["train"]["loss"]["name"] = "auto"
    params_raw["train"]["mode"] = mode
    assert P.resolve_loss(P.effective(P.validate(params_raw).train), kind).loss.name == want
    named = "supcon" if kind == "groups" else "contrastive"  # stays, full mode or not
    params_raw["train"]["loss"]["name"] = named
    assert P.resolve_loss(P.effective(P.validate(params_raw).train), kind).loss.name == named


@pytest.mark.parametrize(("monitor", "queries", "want", "why"), [
    ("auto", 24, "map@r", "monitor auto: map@r (24 validation queries < train.auto.map_r_below "
                          "64)"),
    ("auto", 63, "map@r", None),
    ("auto", 64, "mrr@10", "monitor auto: mrr@10 (64 validation queries >= "
                           "train.auto.map_r_below 64)"),
    ("p@1", 10, "p@1", ""),  # a named monitor is kept, whatever the split's size
    ("mrr@10", 10, "mrr@10", ""),
])
def test_monitor_auto_is_map_r_on_a_small_validation_split(params_raw: dict[str, Any],
                                                           monitor: str, queries: int, want: str,
                                                           why: str | None) -> None:
    params_raw["train"]["monitor"] = monitor
    params_raw["train"]["auto"]["map_r_below"] = 64
    t = P.effective(P.validate(params_raw).train)
    got = P.resolve_monitor(t, queries)
    assert got.monitor == want
    if why is not None:
        assert got.run.monitor_reason == why
    # nothing else changes: the schedule in force is the same one
    assert got.run.model_dump(exclude={"monitor_reason"}) == t.run.model_dump(
        exclude={"monitor_reason"})
    assert got.model_dump(exclude={"monitor"}) == t.model_dump(exclude={"monitor"})


@pytest.mark.parametrize(("name", "kind", "message"), [
    ("supcon", "pairs", "train.loss.name: 'supcon' needs groups data, data/prepared is pairs "
                        "(use auto or one of mnrl, contrastive)"),
    ("mnrl", "groups", "train.loss.name: 'mnrl' needs pairs data, data/prepared is groups "
                       "(use auto or one of supcon, triplet, contrastive, arcface, cosine_mse)"),
])
def test_a_loss_the_data_kind_cannot_take_is_one_line(params_raw: dict[str, Any], name: str,
                                                       kind: str, message: str) -> None:
    params_raw["train"]["loss"]["name"] = name
    with pytest.raises(UserError) as e:
        P.resolve_loss(P.validate(params_raw).train, kind, "data/prepared")
    assert str(e.value) == message


def test_item10_unknown_prompt_key_lists_the_allowed_keys(params_raw: dict[str, Any]) -> None:
    """`prompts` is optional (`EncoderPrompts | None`): its allowed keys were an empty list
    (issue 28, item 10)."""
    params_raw["encoders"]["models"]["minilm"]["prompts"] = {
        "query": "q: ", "document": "", "include_prompt": True, "qurey": "x"}
    assert _error(params_raw) == (
        "params.yaml: unknown key 'qurey' in section 'encoders.models.minilm.prompts' "
        "(allowed: query, document, include_prompt)")
    params_raw["encoders"]["models"]["minilm"]["prompts"] = None
    params_raw["encoders"]["models"]["minilm"]["chunks"]["maxx"] = 2
    assert _error(params_raw).endswith("(allowed: max, overlap, pool)")


# --- issue 35 item 12: a key given twice is refused, naming the key and both lines ----------

def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path: Path) -> None:
    text = (ROOT / "params.yaml").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("      lr: "))
    lines.insert(at + 1, "      lr: 0.5")
    path = tmp_path / "params.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as e:
        P.load(path)
    assert str(e.value) == (f"{path}: key 'train.schedule.head.lr' is given twice (lines "
                            f"{at + 1} and {at + 2}); keep one")


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb:\n  c: 2\n  d:\n    e: 3\n    e: 4\n",
     "key 'b.d.e' is given twice (lines 5 and 6); keep one"),
    ("a: 1\na:\n  b: 2\n", "key 'a' is given twice (lines 1 and 2); keep one"),
    ("a:\n  - x: 1\n    x: 2\n", "key 'a.0.x' is given twice (lines 2 and 3); keep one"),
    ("1: a\n1: b\n", "key '1' is given twice (lines 1 and 2); keep one"),
])
def test_duplicate_keys_at_any_depth(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        P.read_yaml(path)
    assert str(e.value) == f"{path}: {message}"


def test_read_yaml_reads_what_safe_load_reads() -> None:
    import yaml

    text = (ROOT / "params.yaml").read_text()
    assert P.read_yaml(ROOT / "params.yaml") == yaml.safe_load(text)


# --- issue 44 item 12: YAML merge keys (`<<: *base`) are read as safe_load and DVC read them ---

@pytest.mark.parametrize("text, want", [
    # an anchored mapping merged, one of its keys set again: the explicit one wins
    ("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3\n",
     {"base": {"x": 1, "y": 2}, "c": {"x": 1, "y": 3}}),
    # the explicit key before the merge wins too; an inline mapping merged
    ("c:\n  y: 3\n  <<: {x: 1, y: 2}\n", {"c": {"x": 1, "y": 3}}),
    # several merged: the first one listed wins
    ("a: &a {x: 1}\nb: &b {x: 2, z: 3}\nc:\n  <<: [*a, *b]\n",
     {"a": {"x": 1}, "b": {"x": 2, "z": 3}, "c": {"x": 1, "z": 3}}),
])
def test_a_merge_key_is_read_as_safe_load_reads_it(text: str, want: dict[str, Any]) -> None:
    import yaml

    assert P.parse_yaml(text, "p.yaml") == yaml.safe_load(text) == want


@pytest.mark.parametrize("text, message", [
    # a key given twice next to a merge is still refused, and so is one inside a merged mapping
    ("base: &b {x: 1}\nc:\n  <<: *b\n  y: 3\n  y: 4\n",
     "key 'c.y' is given twice (lines 4 and 5); keep one"),
    ("c:\n  <<: {x: 1, x: 2}\n", "key 'c.<<.x' is given twice (lines 2 and 2); keep one"),
    ("base: &b\n  x: 1\n  x: 2\nc:\n  <<: *b\n",
     "key 'base.x' is given twice (lines 2 and 3); keep one"),
    # two merge keys in one mapping: which wins is not said (`<<: [*a, *b]` says it)
    ("a: &a {x: 1}\nb: &b {x: 2}\nc:\n  <<: *a\n  <<: *b\n",
     "key 'c.<<' is given twice (lines 4 and 5); keep one"),
])
def test_duplicates_are_refused_next_to_and_inside_merges(tmp_path: Path, text: str,
                                                          message: str) -> None:
    with pytest.raises(UserError) as e:
        P.parse_yaml(text, "p.yaml")
    assert str(e.value) == f"p.yaml: {message}"


def test_params_sharing_settings_by_a_merge_key_load(tmp_path: Path) -> None:
    """A second encoder that differs from the first in one setting, written as a merge: `check`
    accepts it and each encoder gets its own values."""
    text = (ROOT / "params.yaml").read_text()
    assert "\n    minilm:\n" in text and "\n  query: minilm " in text
    text = text.replace("\n    minilm:\n", "\n    minilm: &minilm\n", 1).replace(
        "\ncache:", "\n    minilm_short:\n      <<: *minilm\n      max_length: 128\ncache:", 1)
    path = tmp_path / "params.yaml"
    path.write_text(text)
    p = P.load(path)
    models = p.encoders.models
    assert set(models) == {"minilm", "minilm_short"}
    assert models["minilm"].max_length == 256 and models["minilm_short"].max_length == 128
    assert models["minilm_short"].model_copy(update={"max_length": 256}) == models["minilm"]


def test_every_reader_of_params_yaml_uses_the_checked_loader() -> None:
    """No module of the program or its benches reads a params file with plain `yaml.safe_load`
    of a file (a duplicate key would be taken silently, the last one winning)."""
    import re

    readers = []
    for folder in ("src", "stages", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"safe_load\([^)]*(params|read_text)", line) or \
                        re.search(r"YAML\(\)\.load|\byaml\.load\(path", line):
                    readers.append(f"{path.relative_to(ROOT)}:{n}")
    assert readers == []


def test_sweep_apply_refuses_a_duplicate_key_in_one_line(tmp_path: Path) -> None:
    from simtune.train.space import write_yaml

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text().replace(
        "\n      lr: ", "\n      lr: 0.5\n      lr: ", 1))
    before = path.read_bytes()
    with pytest.raises(UserError, match=r"key 'train.schedule.head.lr' is given twice "
                                        r"\(lines \d+ and \d+\)"):
        write_yaml(path, {"train.schedule.head.lr": 0.01})
    assert path.read_bytes() == before


# --- issue 35 item 7: rrf_k is bounded where ranks stay distinguishable in float64 ----------

@pytest.mark.parametrize("k", [2 ** 70, 10 ** 17, 10 ** 9])
def test_rrf_k_too_large_is_refused_in_one_line(params_raw: dict[str, Any], k: Any) -> None:
    params_raw["evaluate"]["hybrid"]["rrf_k"] = k
    message = _error(params_raw)
    assert message.startswith(
        "params.yaml: evaluate.hybrid.rrf_k: at most 1000000: above it, 1 / (k + rank) of "
        "neighbouring ranks round to one float64"), message
    assert "\n" not in message


@pytest.mark.parametrize("k", [1e17, "1e17"])
def test_rrf_k_as_a_float_is_refused_in_one_line(params_raw: dict[str, Any], k: Any) -> None:
    params_raw["evaluate"]["hybrid"]["rrf_k"] = k
    assert _error(params_raw) == (
        f"params.yaml: evaluate.hybrid.rrf_k: expected an integer, got {k!r}")


def test_rrf_k_a_large_sane_value_keeps_every_rank_apart(params_raw: dict[str, Any]) -> None:
    import torch

    from simtune.retrieval.lexical import rrf

    params_raw["evaluate"]["hybrid"]["rrf_k"] = 10 ** 6
    k = P.validate(params_raw).evaluate.hybrid.rrf_k
    # two rankings of 2,000 items: the fused order is the exact (rational) one
    gen = torch.Generator().manual_seed(0)
    n = 2000
    a, b = torch.randperm(n, generator=gen), torch.randperm(n, generator=gen)
    fused = rrf([a[None], b[None]], k, n)[0]
    from fractions import Fraction

    rank_a = {int(j): r + 1 for r, j in enumerate(a)}
    rank_b = {int(j): r + 1 for r, j in enumerate(b)}
    exact = sorted(range(n), key=lambda j: (-(Fraction(1, k + rank_a[j]) +
                                              Fraction(1, k + rank_b[j])), j))
    got = torch.sort(fused, descending=True, stable=True).indices.tolist()
    assert got == exact


def test_rrf_refuses_a_k_beyond_the_bound() -> None:
    import torch

    from simtune.retrieval.lexical import rrf

    with pytest.raises(ValueError, match="at most 1000000"):
        rrf([torch.arange(3)[None]], 2 ** 70, 3)


# --- issue 35 item 13: `simtune check`, the DVC stage every other stage follows -------------

def test_the_check_command_refuses_a_typo_and_writes_the_same_bytes_for_any_valid_file(
        tmp_path: Path, params_raw: dict[str, Any]) -> None:
    from typer.testing import CliRunner

    from stages import app

    out = tmp_path / "reports" / "params_checked.json"
    params = write_params(tmp_path / "params.yaml", params_raw)
    assert CliRunner().invoke(app, ["check", "--params", str(params), "--out", str(out)]
                              ).exit_code == 0
    first = out.read_bytes()
    # another valid file: the same output (nothing reruns)
    params_raw["train"]["schedule"]["head"]["lr"] = 0.123
    write_params(params, params_raw)
    assert CliRunner().invoke(app, ["check", "--params", str(params), "--out", str(out)]
                              ).exit_code == 0
    assert out.read_bytes() == first
    out.unlink()
    params_raw["train"]["learning_rate"] = params_raw["train"].pop("m_per_label")
    write_params(params, params_raw)
    result = CliRunner().invoke(app, ["check", "--params", str(params), "--out", str(out)])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(
        f"error: {params}: unknown key 'learning_rate' in section 'train'")
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_the_export_teacher_is_the_query_encoder_on_the_cache_stages_copy(
        params_raw: dict[str, Any]) -> None:
    """`train.distill.teacher: export` (issue 53): with train.mode static, an encoder entry
    `export` with the query encoder's settings on `cache/export.model` (the cache stage's copy
    of models/export); unused in other modes (no entry); refused for a distillation, whose
    student's export replaces models/export; an entry of that name the user wrote is theirs."""
    params_raw["train"]["distill"]["teacher"] = "export"
    assert "export" not in P.validate(params_raw).encoders.models  # head mode: not read
    params_raw["train"]["mode"] = "static"
    p = P.validate(params_raw)
    assert p.encoders.models["export"] == p.encoders.models["minilm"].model_copy(
        update={"model": "cache/export.model"})
    params_raw["train"]["mode"] = "head"
    params_raw["train"]["objective"] = "distill"
    assert _error(params_raw) == (
        "params.yaml: train.distill.teacher: 'export' (this project's models/export) teaches "
        "train.mode static only: a distilled student's export replaces models/export; name an "
        "encoder of encoders.models (docs/distillation.md#the-teacher)")
    params_raw["encoders"]["models"]["export"] = {
        **params_raw["encoders"]["models"]["minilm"], "model": "/teachers/trec"}
    assert P.validate(params_raw).encoders.models["export"].model == "/teachers/trec"
