"""Hard negatives: the miner against hand-made and brute-force N x N answers, the stage's output,
MNRL with mined negatives against a hand-computed cross-entropy, GradCache equivalence (loss and
training), and the one-line refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import yaml
from typer.testing import CliRunner

from simtune import heads
from simtune import params as P
from simtune.cache import stage as cache
from simtune.cache.views import open_cache
from simtune.negatives.mining import mine
from simtune.negatives.stage import run as run_negatives
from simtune.prepare import stage as prepare
from simtune.prepare.prepared import write as write_prepared
from simtune.train import gradcache
from simtune.train.data import load_data
from simtune.train.losses import PairLoss
from simtune.train.module import SimilarityModule
from stages import app
from tests.cache_helpers import cache_params, encoder_params, sentences
from tests.conftest import repo_params

exp, log = math.exp, math.log


def _angles(*theta: float) -> torch.Tensor:
    return torch.tensor([[math.cos(t), math.sin(t)] for t in theta])


# documents d0..d6 at these angles; q0 = (1, 0) scores cos(theta), q1 = (0, 1) sin(theta)
DOCS = _angles(0.3, 0.5, 0.7, 0.9, 1.2, 2.0, 3.0)
QUERIES = _angles(0.0, math.pi / 2, 1.0)
# q0: positive d2; q1: positives d4, d5; q2: d0 listed with score 0 (no positive)
LISTED = torch.tensor([[0, 2], [1, 4], [1, 5], [2, 0]])
POSITIVE = torch.tensor([True, True, True, False])


def test_relative_margin_by_hand() -> None:
    got = mine(QUERIES, DOCS, LISTED, POSITIVE, 2, 0.05, relative=True)
    # q0: cos d0 .955, d1 .878 (above .765 - .05 * .765 = .727: skipped), d2 listed, then
    # d3 .622, d4 .362; q1: lowest positive sin(2.0) = .909, threshold .864: d3 .783, d2 .644
    assert got.index.tolist() == [[3, 4], [3, 2], [-1, -1]]
    assert got.skipped.tolist() == [2, 0, 0]
    want = [math.cos(0.9), math.cos(1.2), math.sin(0.9), math.sin(0.7)]
    assert got.score[:2].flatten().tolist() == pytest.approx(want, abs=1e-6)
    assert bool(got.score[2].isnan().all())
    assert got.threshold[:2].tolist() == pytest.approx(
        [0.95 * math.cos(0.7), 0.95 * math.sin(2.0)], abs=1e-6)
    assert got.threshold[2] == -math.inf


def test_absolute_margin_by_hand() -> None:
    got = mine(QUERIES, DOCS, LISTED, POSITIVE, 2, 0.2, relative=False)
    # q0: threshold .765 - .2 = .565 also skips d3 (.622); q1: .909 - .2 = .709 skips d3 (.783)
    assert got.index.tolist() == [[4, 5], [2, 1], [-1, -1]]
    assert got.skipped.tolist() == [3, 1, 0]


def test_fewer_documents_than_asked() -> None:
    got = mine(QUERIES, DOCS, LISTED, POSITIVE, 6, 0.05, relative=True)
    assert got.index.tolist()[0] == [3, 4, 5, 6, -1, -1]  # 7 docs - 1 listed - 2 skipped


def _brute_force(q: torch.Tensor, c: torch.Tensor, listed: torch.Tensor, positive: torch.Tensor,
                 count: int, margin: float, relative: bool) -> list[list[int]]:
    sim = F.normalize(q, dim=-1) @ F.normalize(c, dim=-1).T  # the whole N x N matrix
    out = []
    for qi in range(len(q)):
        own = {int(d) for qq, d in listed.tolist() if qq == qi}
        pos = [float(sim[qi, d]) for (qq, d), p in zip(listed.tolist(), positive, strict=True)
               if qq == qi and p]
        if not pos:
            out.append([-1] * count)
            continue
        low = min(pos)
        thr = low - (abs(low) * margin if relative else margin)
        order = sorted(range(len(c)), key=lambda j: (-float(sim[qi, j]), j))
        kept = [j for j in order if j not in own and float(sim[qi, j]) <= thr][:count]
        out.append(kept + [-1] * (count - len(kept)))
    return out


@pytest.mark.parametrize(("margin", "relative"), [(0.05, True), (0.0, True), (0.1, False)])
def test_equals_brute_force_with_deeper_searches(margin: float, relative: bool) -> None:
    torch.manual_seed(0)
    q, c = torch.randn(60, 8), torch.randn(150, 8)
    # random positives, often ranked low: many documents score above them, so the first
    # top-k is too shallow and the query is searched again deeper
    listed = torch.stack([torch.arange(60).repeat(2), torch.randint(0, 150, (120,))], 1)
    positive = torch.rand(120) > 0.2
    got = mine(q, c, listed, positive, 5, margin, relative, chunk=7)
    assert got.index.tolist() == _brute_force(q, c, listed, positive, 5, margin, relative)
    assert int(got.skipped.max()) > 2 * 5 + 2  # the deeper search really happened


# --- MNRL with mined negatives ----------------------------------------------------------------

A, B, C, D = (1.0, 0.0), (0.6, 0.8), (0.0, 1.0), (-1.0, 0.0)
N1, N2 = (0.8, 0.6), (0.0, -1.0)


def _mnrl(**kw: Any) -> PairLoss:
    return PairLoss("mnrl", "cosine", kw.get("scale", 1.0), kw.get("symmetric", False), 0.5)


def test_mnrl_with_negatives_by_hand() -> None:
    q, d = torch.tensor([A, C]), torch.tensor([B, D])
    negs = torch.tensor([[N1, N2], [N2, N2]])
    neg_ids = torch.tensor([[20, 21], [21, -1]])  # row 1's second negative: none
    got = _mnrl()(q, d, torch.tensor([0, 1]), torch.tensor([10, 11]), torch.ones(2), negs,
                  neg_ids)
    # every row's negatives are candidates for every query: N1, N2, N2 (the -1 slot masked);
    # cosines with A: B .6, D -1, N1 .8, N2 0, N2 0; with C: B .8, D 0, N1 .6, N2 -1, N2 -1
    row0 = -(0.6 - log(exp(0.6) + exp(-1) + exp(0.8) + 1 + 1))
    row1 = -(0 - log(exp(0.8) + 1 + exp(0.6) + exp(-1) + exp(-1)))
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)


def test_mnrl_masks_a_negative_listed_with_the_query_in_the_batch() -> None:
    # both rows are query 0's; row 1's mined negative is row 0's document (id 10): masked for
    # both anchors, like the in-batch documents of the same query
    q, d = torch.tensor([A, A]), torch.tensor([B, D])
    negs, neg_ids = torch.tensor([[N1], [B]]), torch.tensor([[20], [10]])
    got = _mnrl(scale=2.0)(q, d, torch.tensor([0, 0]), torch.tensor([10, 11]), torch.ones(2),
                           negs, neg_ids)
    row0 = -(2 * 0.6 - log(exp(2 * 0.6) + exp(2 * 0.8)))
    row1 = -(2 * -1 - log(exp(2 * -1) + exp(2 * 0.8)))
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 4])
def test_gradcache_with_negatives_gives_the_full_batch_gradient(chunk: int) -> None:
    torch.manual_seed(0)
    b, n = 6, 3
    head = heads.build("mlp", 16, 2, 0.3).train()  # dropout on: replayed per chunk
    with torch.no_grad():
        head.net[-1].weight.normal_(0, 0.1)
    x = torch.randn(b * (2 + n), 16)  # b queries, b documents, b * n negatives
    ids = torch.arange(b)
    neg_ids = 100 + torch.arange(b * n).view(b, n)
    neg_ids[0, 1] = -1
    loss_fn = _mnrl(scale=20.0, symmetric=True)

    def loss_of(reps: torch.Tensor) -> torch.Tensor:
        return loss_fn(reps[:b], reps[b : 2 * b], ids, ids + 50, torch.ones(b),
                       reps[2 * b :].view(b, n, 16), neg_ids)

    chunks = [x[s : s + chunk] for s in range(0, len(x), chunk)]
    torch.manual_seed(1)
    head.zero_grad()
    want_loss = loss_of(torch.cat([head(c) for c in chunks]))
    want_loss.backward()
    want = {k: p.grad.clone() for k, p in head.named_parameters()}
    torch.manual_seed(1)
    head.zero_grad()
    got_loss = gradcache.step(head, chunks, loss_of)
    assert got_loss.item() == pytest.approx(want_loss.item(), rel=1e-6)
    for k, p in head.named_parameters():
        assert p.grad is not None
        assert (p.grad - want[k]).norm() / want[k].norm() <= 1e-5, k


# --- the stage and training -------------------------------------------------------------------

def _pairs_project(root: Path, model: Path, **train: Any) -> Path:
    """40 queries (4 with a second document), prepared and cached; returns the params file."""
    root.mkdir(parents=True, exist_ok=True)
    qs, ds = sentences(40), sentences(44, 200)
    rows = [{"q": q, "d": d} for q, d in zip(qs, ds, strict=False)]
    rows += [{"q": qs[i], "d": ds[40 + i]} for i in range(4)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = repo_params()
    raw["prepare"].update(source="file")
    raw["prepare"]["file"].update(path=str(root / "pairs.jsonl"), kind="pairs")
    raw["prepare"]["file"]["columns"].update(query="q", positive="d")
    raw["prepare"]["split"]["fractions"] = {"train": 0.6, "val": 0.2, "test": 0.2}
    raw["encoders"] = encoder_params(model)
    raw["cache"] = cache_params()
    raw["negatives"].update(count=3)
    # the head's schedule keywords (`train_helpers.SCHEDULE_KEYS`) under train.schedule.head
    from tests.train_helpers import SCHEDULE_KEYS

    schedule = {k: train.pop(k) for k in list(train) if k in SCHEDULE_KEYS}
    raw["train"]["schedule"]["head"].update(
        {"batch_size": 8, "max_epochs": 2, "patience": 5, "lr": 0.01, **schedule})
    raw["train"].update({"hard_negatives": 2, **train})
    assert raw["train"]["loss"]["name"] == "auto"  # mnrl on pairs: mined negatives apply
    raw["train"]["head"]["dropout"] = 0.0
    p = P.validate(raw)
    write_prepared(prepare.build(p.prepare), root / "prepared", root / "prepare.json")
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache)
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root / "params.yaml"


def _stage(root: Path, params_file: Path) -> Any:
    return CliRunner().invoke(app, ["negatives", "--params", str(params_file), "--prepared",
                                    str(root / "prepared"), "--cache", str(root / "cache"),
                                    "--out", str(root / "negatives"), "--report",
                                    str(root / "negatives.json")])


@pytest.fixture
def pairs(tmp_path: Path, tiny_bert: Path) -> tuple[Path, Path]:
    params_file = _pairs_project(tmp_path, tiny_bert)
    result = _stage(tmp_path, params_file)
    assert result.exit_code == 0, result.output
    return tmp_path, params_file


def test_stage_writes_the_brute_force_negatives_of_the_cached_vectors(
        pairs: tuple[Path, Path]) -> None:
    root, params_file = pairs
    p = P.load(params_file)
    ex = pq.read_table(root / "prepared" / "examples.parquet").to_pylist()
    train_ex = [r for r in ex if r["split"] == "train"]
    q_ids = list(dict.fromkeys(r["query_id"] for r in train_ex))
    d_ids = list(dict.fromkeys(r["doc_id"] for r in train_ex))
    table = open_cache(root / "cache", "tiny", p.encoders.models["tiny"], p.cache)
    q, c = table.vectors[table.index(q_ids)], table.vectors[table.index(d_ids)]
    listed = torch.tensor([[q_ids.index(r["query_id"]), d_ids.index(r["doc_id"])]
                           for r in train_ex])
    want = _brute_force(q, c, listed, torch.ones(len(listed), dtype=torch.bool), 3, 0.05, True)
    got = pq.read_table(root / "negatives" / "negatives.parquet").to_pylist()
    assert [r["query_id"] for r in got] == q_ids
    assert [r["doc_ids"] for r in got] == [[d_ids[j] for j in row if j >= 0] for row in want]
    report = json.loads((root / "negatives.json").read_text())
    assert (report["queries"], report["corpus"]) == (len(q_ids), len(d_ids))
    assert report["negatives"] == sum(len(r["doc_ids"]) for r in got)
    before = (root / "negatives" / "negatives.parquet").read_bytes()
    assert _stage(root, params_file).exit_code == 0  # same inputs, same bytes (DVC output)
    assert (root / "negatives" / "negatives.parquet").read_bytes() == before


def test_training_rows_get_their_querys_negatives_from_the_cache(pairs: tuple[Path, Path]
                                                                  ) -> None:
    root, params_file = pairs
    p = P.load(params_file)
    data = load_data(p.train, p.encoders, p.cache, root / "prepared", root / "cache",
                     negatives_dir=root / "negatives")
    tr = data.splits["train"].tensors
    assert tr["neg_ids"].shape == tr["neg_rows"].shape == (len(tr["q_ids"]), 2)
    mined = {r["query_id"]: r["doc_ids"] for r in
             pq.read_table(root / "negatives" / "negatives.parquet").to_pylist()}
    doc_ids = data.row_ids["doc"]
    q_row_ids = data.row_ids["query"]
    for qr, rows in zip(tr["q_rows"].tolist(), tr["neg_rows"].tolist(), strict=True):
        assert [doc_ids[r] for r in rows if r >= 0] == mined[q_row_ids[qr]][:2]
    # the module's batch: negatives are cache rows through the head, and the loss uses them
    module = SimilarityModule(data, p.train, p.encoders, p.cache)
    idx = torch.arange(6)
    reps = module.encode({"idx": idx})
    assert module.roles() == ["query", "doc", "neg"] and reps.shape[1] == 4
    neg = module.head(data.d_vectors[tr["neg_rows"][idx].clamp_min(0)].float())
    assert torch.equal(reps[:, 2:], neg)
    want = PairLoss("mnrl", "cosine", p.train.loss.scale, False, 0.5)(
        reps[:, 0], reps[:, 1], tr["q_ids"][idx], tr["d_ids"][idx], tr["scores"][idx], neg,
        tr["neg_ids"][idx])
    assert module.loss_of(reps, idx).item() == pytest.approx(want.item(), rel=1e-6)


def _train(root: Path, params_file: Path, tag: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from tests.train_helpers import stage_args

    args = [*stage_args(root, params_file, tag), "--negatives", str(root / "negatives")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return load_file(str(root / f"head{tag}" / "model.safetensors"))


def _edit(params_file: Path, section: str, **values: Any) -> None:
    raw = yaml.safe_load(params_file.read_text())
    raw[section].update(values)
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))


def test_gradcache_training_with_negatives_equals_plain(pairs: tuple[Path, Path]) -> None:
    root, params_file = pairs
    # the trained weights are compared, so a trained epoch is kept (on this tiny set's validation
    # no epoch beats the frozen encoder on a rank metric: each run would save the identity)
    _edit(params_file, "train", frozen_candidate=False)
    plain = _train(root, params_file, "plain")
    _edit(params_file, "train", gradcache={"chunk_size": 3})  # negatives: 1 row per chunk
    gc = _train(root, params_file, "gc")
    _edit(params_file, "train", gradcache={"chunk_size": 0}, hard_negatives=0)
    without = _train(root, params_file, "without")
    for k in plain:
        assert torch.allclose(plain[k], gc[k], atol=1e-5), k
    assert any(not torch.allclose(plain[k], without[k], atol=1e-4) for k in plain)


def _error(root: Path, params_file: Path) -> str:
    from tests.train_helpers import stage_args

    result = CliRunner().invoke(app, [*stage_args(root, params_file),
                                      "--negatives", str(root / "negatives")])
    assert result.exit_code == 1, result.output
    # the log's INFO lines may come first (a set mode auto picks too says so): one error line
    lines = [ln for ln in result.output.strip().splitlines() if not ln.startswith("INFO ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_refusals(pairs: tuple[Path, Path]) -> None:
    root, params_file = pairs
    _edit(params_file, "train", hard_negatives=4)
    assert "train.hard_negatives: 4 per query, but" in _error(root, params_file)
    _edit(params_file, "train", hard_negatives=2, mode="top_layers")
    assert "train.hard_negatives: head mode only" in _error(root, params_file)
    raw = yaml.safe_load(params_file.read_text())
    raw["train"]["mode"] = "head"
    raw["train"]["loss"]["name"] = "contrastive"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert "only the mnrl loss uses mined negatives" in _error(root, params_file)
    raw["train"]["loss"]["name"] = "mnrl"
    raw["encoders"]["models"]["tiny"]["pooling"] = "max"  # other vectors: refill the cache
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.load(params_file)
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache)
    assert "mined from other vectors than the cache holds now; run the negatives stage" in (
        _error(root, params_file))


def test_groups_data_gets_an_empty_table_and_training_refuses(tmp_path: Path,
                                                              tiny_bert: Path) -> None:
    from tests.train_helpers import project

    _, params_file = project(tmp_path, tiny_bert, hard_negatives=2)
    assert _stage(tmp_path, params_file).exit_code == 0
    assert pq.read_table(tmp_path / "negatives" / "negatives.parquet").num_rows == 0
    assert "mined negatives are for pairs data, the prepared data is groups" in _error(
        tmp_path, params_file)


@pytest.mark.parametrize("count", [8, 0])
def test_item12_nothing_mined_log_names_the_real_reason(tmp_path: Path, tiny_bert: Path,
                                                         caplog: pytest.LogCaptureFixture,
                                                         count: int) -> None:
    from tests.train_helpers import project

    _, params_file = project(tmp_path, tiny_bert)
    raw = yaml.safe_load(params_file.read_text())
    raw["negatives"]["count"] = count
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    caplog.set_level("INFO", logger="simtune")
    run_negatives(P.load(params_file), tmp_path / "prepared", tmp_path / "cache",
                  tmp_path / "negatives", tmp_path / "negatives.json")
    [line] = [r.getMessage() for r in caplog.records if "nothing mined" in r.getMessage()]
    reason = ("negatives.count is 0" if count == 0 else
              "the data is groups: hard negatives are mined for pairs")
    assert line == f"{tmp_path / 'negatives'}: nothing mined ({reason})"
