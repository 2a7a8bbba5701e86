"""The GPU paths give the CPU's and the full batch's results: the cache fill on CUDA, the dense
top-k, and GradCache under fp16 (with a loss scaler) and bf16 autocast, directly and through the
train stage. They need a CUDA device and are skipped elsewhere (CI has none); `bench/gpu.py`
measures the same paths' speed and memory.

    pytest -m gpu tests/test_gpu.py      (on a machine with a GPU)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from simtune import heads
from simtune import params as P
from simtune.cache import stage as cache
from simtune.cache import vectors
from simtune.encoders import pool
from simtune.retrieval.topk import topk
from simtune.train import gradcache
from simtune.train.losses import GroupLoss
from tests.cache_helpers import make_prepared, params, sentences

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU")]


def _fill(root: Path, prepared: Path, p: P.Params, device: str,
          monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    monkeypatch.setenv("SIMTUNE_STORE", str(root / f"store-{device}"))  # no cache hit between
    cp = p.cache.model_copy(update={"device": device})
    cache.fill(prepared, root / f"cache-{device}", p.encoders, cp)
    table = vectors.load(root / f"cache-{device}" / "tiny")
    return table.vectors.float()


def test_fill_on_gpu_equals_cpu(tmp_path: Path, tiny_bert: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = make_prepared(tmp_path, sentences(300))
    p = params(tiny_bert)
    cpu = _fill(tmp_path, prepared, p, "cpu", monkeypatch)
    gpu = _fill(tmp_path, prepared, p, "cuda", monkeypatch)
    assert cpu.shape == gpu.shape and len(cpu) == 300
    assert (cpu - gpu).abs().max() <= 1e-5  # fp32 on both (TF32 off): kernel rounding only


def test_dense_topk_on_gpu_equals_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    q, c = torch.randn(700, 64, generator=g), torch.randn(20_000, 64, generator=g)
    exclude = torch.randint(-1, 20_000, (700,), generator=g)
    want_s, want_i = topk(q, c, 10, exclude=exclude)
    got_s, got_i = topk(q.cuda(), c.cuda(), 10, exclude=exclude.cuda())
    assert torch.allclose(got_s.cpu(), want_s, atol=1e-5)
    # indices equal except where two scores tie within float rounding
    differ = got_i.cpu() != want_i
    assert differ.float().mean() <= 1e-3
    if differ.any():
        assert (got_s.cpu()[differ] - want_s[differ]).abs().max() <= 1e-5
    assert not (got_i.cpu() == exclude[:, None]).any()


def _encoder_and_batch(tiny_bert: Path, n: int) -> tuple[torch.nn.Module, dict, torch.Tensor]:
    import transformers

    encoder = transformers.AutoModel.from_pretrained(tiny_bert, hidden_dropout_prob=0.1,
                                                     attention_probs_dropout_prob=0.1)
    tok = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    head = heads.build("mlp", 32, 2, 0.1)
    model = torch.nn.ModuleDict({"encoder": encoder, "head": head}).cuda().train()
    batch = {k: v.cuda() for k, v in tok(sentences(n), padding=True, return_tensors="pt").items()}
    return model, batch, torch.arange(n, device="cuda") % 4


def _grads(model: torch.nn.Module, scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer
           ) -> dict[str, torch.Tensor]:
    scaler.unscale_(opt)  # as Lightning's precision plugin does before the optimizer step
    return {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gradcache_under_autocast_and_loss_scaling_equals_the_full_batch(
        tiny_bert: Path, dtype: torch.dtype) -> None:
    """fp16 with a GradScaler (scale 2^16) and bf16: GradCache's unscaled gradients equal the
    full batch's under the same autocast (same chunk-wise forwards and dropout draws) to within
    a small fraction of how far autocast itself moves the gradient from fp32."""
    torch.manual_seed(0)
    n, chunk = 48, 8
    model, batch, labels = _encoder_and_batch(tiny_bert, n)
    loss_fn = GroupLoss("supcon", "cosine", 0.1, 0.2, "batch_hard", 1.0)
    chunks = [{k: v[s : s + chunk] for k, v in batch.items()} for s in range(0, n, chunk)]

    def encode(b: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model["encoder"](**b).last_hidden_state
        return model["head"](pool(out, b["attention_mask"], "mean").float())

    def run(how: str, amp: torch.dtype | None) -> dict[str, torch.Tensor]:
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16,
                                      enabled=amp is torch.float16)
        model.zero_grad()
        torch.manual_seed(7)
        autocast = (torch.autocast("cuda", dtype=amp) if amp is not None
                    else contextlib.nullcontext())
        with autocast:
            if how == "full":
                loss = loss_fn(torch.cat([encode(c) for c in chunks]), labels)
                scaler.scale(loss).backward()
            else:
                gradcache.step(encode, chunks, lambda reps: loss_fn(reps, labels),
                               backward=lambda t: scaler.scale(t).backward(),
                               devices=gradcache.cuda_devices(model))
        return _grads(model, scaler, opt)

    exact = run("full", None)
    full, cached = run("full", dtype), run("gradcache", dtype)
    for name, want in exact.items():
        scale = want.norm().clamp_min(1e-12)
        amp_err = float((full[name] - want).norm() / scale)
        gc_err = float((cached[name] - full[name]).norm() / scale)
        assert torch.isfinite(cached[name]).all(), name
        # a loss scale applied twice (or never undone) would be off by a factor of 2^16
        assert gc_err <= max(0.25 * amp_err, 1e-3), (name, gc_err, amp_err)


def test_train_stage_gradcache_gradient_equals_plain_under_fp16(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The train stage with precision 16-mixed on the GPU, full mode, dropout off: each step's
    gradients as the optimizer sees them (after Lightning's scaler unscaled them) are the same
    with GradCache (chunks of 3) as with the plain step, and the scaler skips the same steps.
    (Weights after several AdamW steps are no test under fp16: AdamW turns rounding noise in
    near-zero gradients into +-lr steps.)"""
    from tests.train.test_train import _edit
    from tests.train_helpers import dropout_free, project, relative_errors, step_gradients

    _, params_file = project(tmp_path, dropout_free(tiny_bert, tmp_path / "bert"))
    _edit(params_file, mode="full", precision="16-mixed", accelerator="gpu",
          schedule__full__max_epochs=2, schedule__full__batch_size=8, schedule__full__lr=0.001)
    steps = step_gradients(tmp_path, params_file, monkeypatch)

    def finite(step: dict[str, torch.Tensor]) -> bool:
        return all(bool(torch.isfinite(g).all()) for g in step.values())

    # a step whose scaled gradients overflowed is skipped (and the scale halved): both runs
    # must overflow at the same steps, so their kept steps start from equal weights
    pattern = {tag: [finite(s) for s in run] for tag, run in steps.items()}
    assert pattern["plain"] == pattern["gc"] and True in pattern["plain"], pattern
    at = pattern["plain"].index(True)
    worst = relative_errors(steps["gc"][at], steps["plain"][at])
    assert any("encoder" in n for n, _ in worst)
    # fp16 rounding of a differently chunked forward: ~1e-3; a loss scale applied twice or
    # never undone: 2^16
    assert worst[0][1] <= 2e-2, (at, pattern, worst[:3])


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_top_layers_mode_trains_and_evaluates_on_the_gpu(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    """Top-layers mode on the GPU (cached states of the lower layer, the top layer trained under
    autocast): GradCache's step gradients equal the plain step's, and evaluate reads the kept
    model (its test metrics are finite numbers in [0, 1])."""
    import yaml

    from simtune.evaluate import stage as evaluate
    from tests.train.test_top_layers import _top_project
    from tests.train_helpers import dropout_free, relative_errors, step_gradients

    params_file, _ = _top_project(tmp_path, dropout_free(tiny_bert, tmp_path / "bert"),
                                  max_epochs=1)
    raw = yaml.safe_load(params_file.read_text())
    raw["train"].update(precision=precision, accelerator="gpu")
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    steps = step_gradients(tmp_path, params_file, monkeypatch)
    kept = [i for i, s in enumerate(steps["plain"])
            if all(bool(torch.isfinite(g).all()) for g in s.values())]
    assert kept and len(steps["plain"]) == len(steps["gc"])
    worst = relative_errors(steps["gc"][kept[0]], steps["plain"][kept[0]])
    assert any(n.startswith("rep.") for n, _ in worst)
    # rounding of differently chunked forwards (bf16 keeps 8 mantissa bits to fp16's 11); a
    # loss scale applied twice or never undone would be off by 2^16
    assert worst[0][1] <= {"16-mixed": 5e-2, "bf16-mixed": 1e-1}[precision], (precision,
                                                                              worst[:3])
    p = P.load(params_file)
    out = evaluate.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "gc",
                       tmp_path / "metrics.json", tmp_path / "plot.json", tmp_path / "detail.json")
    assert all(0.0 <= v <= 1.0 for v in out["trained"].values() if isinstance(v, float))


@pytest.mark.parametrize("mode", ["top_layers", "full"])
@pytest.mark.parametrize("loss", ["mse", "kl"])
def test_distillation_on_the_gpu_under_fp16_steps_as_without_gradcache(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch, mode: str, loss: str
        ) -> None:
    """`train.objective: distill` on the GPU under 16-mixed (the loss itself in float32: kl's
    masked logits overflow float16): GradCache's step gradients equal the plain step's and the
    encoder's layers learn from the teacher. Passed on a lent H100 (11 of 11 GPU tests)."""
    import yaml

    from tests.train.distill_helpers import distill_raw, fill
    from tests.train_helpers import dropout_free, relative_errors, step_gradients

    raw = distill_raw(tmp_path, dropout_free(tiny_bert, tmp_path / "bert"), loss=loss)
    raw["train"].update(mode=mode, precision="16-mixed", accelerator="gpu")
    raw["train"]["schedule"][mode].update(max_epochs=1, batch_size=8)
    raw["train"]["schedule"]["top_layers"]["layers"] = 1
    fill(tmp_path, raw)
    params_file = tmp_path / "params.yaml"
    assert yaml.safe_load(params_file.read_text())["train"]["accelerator"] == "gpu"
    steps = step_gradients(tmp_path, params_file, monkeypatch)
    kept = [i for i, s in enumerate(steps["plain"])
            if all(bool(torch.isfinite(g).all()) for g in s.values())]
    assert kept and len(steps["plain"]) == len(steps["gc"])
    worst = relative_errors(steps["gc"][kept[0]], steps["plain"][kept[0]])
    assert any(n.startswith(("rep.encoder", "rep.top")) for n, _ in worst)
    # fp16 rounding of differently chunked forwards; a loss scale applied twice or never
    # undone would be off by 2^16
    assert worst[0][1] <= 5e-2, worst[:3]


@pytest.mark.parametrize("side", ["both", "query"])
def test_head_mode_on_the_gpu_keeps_epoch_0_as_the_frozen_encoder_and_evaluates_as_trained(
        tmp_path: Path, tiny_bert: Path, side: str) -> None:
    """Issue 34 and 37 on the GPU under 16-mixed: epoch 0 of the loop is the frozen encoder
    (its validation equals the metrics recomputed on the CPU from the cache), and evaluate's
    P@1 equals a brute-force ranking of the saved head's test queries against the training
    corpus (transformed on both sides, or frozen for the query side)."""
    import json

    import torch.nn.functional as F

    from simtune.evaluate import stage as evaluate
    from simtune.train import headroom
    from simtune.train import stage as train
    from simtune.train.data import load_data
    from simtune.train.stage import validation_task
    from tests.conftest import write_params
    from tests.train_helpers import project

    raw, params_file = project(tmp_path, tiny_bert, n=96, max_epochs=3, patience=3, lr=0.05)
    raw["train"].update(precision="16-mixed", accelerator="gpu")
    raw["train"]["head"]["side"] = side
    write_params(params_file, raw)
    p = P.load(params_file)
    train.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
              tmp_path / "train.json", None)  # no dvclive (not on the GPU machine)
    report = json.loads((tmp_path / "train.json").read_text())
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    want = headroom.frozen_metrics(data, validation_task(data, p.train.head.side,
                                                         p.evaluate.corpus))
    assert want is not None
    got = {m: report["frozen_val"][f"val/{m}"] for m in want}
    # validation runs under the run's precision: fp16 cosines reorder a few near-ties of this
    # random tiny encoder (each trained epoch is ranked the same way, so selection is fair)
    assert got == pytest.approx(want, abs=1e-2)
    metrics = evaluate.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                           tmp_path / "metrics.json", tmp_path / "plot.json",
                           tmp_path / "detail.json")
    head = heads.load(tmp_path / "head")
    table = data.q_vectors
    test, train = data.splits["test"].tensors, data.splits["train"].tensors
    with torch.inference_mode():
        q = head(table[test["rows"]].float())
        c = table[train["rows"]].float()
        c = head(c) if side == "both" else c
    top = (F.normalize(q, dim=-1) @ F.normalize(c, dim=-1).T).argmax(1)
    p1 = float((train["labels"][top] == test["labels"]).float().mean())
    assert metrics["trained"]["p@1"] == pytest.approx(p1, abs=1e-9)


@pytest.mark.parametrize("objective", ["similarity", "distill"])
def test_a_query_tower_trains_on_the_gpu_against_the_frozen_corpus(
        tmp_path: Path, tiny_bert: Path, objective: str) -> None:
    """Issue 37's query tower on the GPU under 16-mixed (`train.head.side: query` in top_layers
    mode; distilled with `kl` too): epoch 0's validation is the frozen encoder's (recomputed on
    the CPU from the cache), and evaluate's P@1 equals a brute-force ranking of the tower's test
    queries (`load_model` on the GPU) against the frozen cached training corpus."""
    import json

    import torch.nn.functional as F

    from simtune.cache.views import layer_for
    from simtune.evaluate import stage as evaluate
    from simtune.model import load_model
    from simtune.prepare.prepared import load as load_prepared
    from simtune.train import headroom
    from simtune.train import stage as train
    from simtune.train.data import load_data
    from simtune.train.stage import validation_task
    from tests.conftest import write_params
    from tests.train.distill_helpers import distill_raw, fill
    from tests.train_helpers import project

    if objective == "distill":
        raw = distill_raw(tmp_path, tiny_bert, n=96, loss="kl")
        params_file = tmp_path / "params.yaml"
    else:
        raw, params_file = project(tmp_path, tiny_bert, n=96)
    raw["train"].update(mode="top_layers", precision="16-mixed", accelerator="gpu",
                        frozen_candidate=False)
    raw["train"]["head"]["side"] = "query"
    raw["train"]["schedule"]["top_layers"].update(layers=1, max_epochs=2, patience=2,
                                                  batch_size=16, lr=0.01, head_lr=0.05)
    write_params(params_file, raw)
    p = P.load(params_file)
    if objective == "distill":  # the teacher's vectors and the student's layer states
        fill(tmp_path, raw)
    else:
        cache.fill(tmp_path / "prepared", tmp_path / "cache", p.encoders, p.cache,
                   layer=layer_for(p.encoders, p.train))
    train.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
              tmp_path / "train.json", None)
    report = json.loads((tmp_path / "train.json").read_text())
    assert report["best_epoch"] >= 1
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    want = headroom.frozen_metrics(data, validation_task(data, p.train.head.side,
                                                         p.evaluate.corpus))
    assert want is not None
    got = {m: report["frozen_val"][f"val/{m}"] for m in want}
    assert got == pytest.approx(want, abs=1e-2)  # fp16 reorders a few near-ties
    metrics = evaluate.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                           tmp_path / "metrics.json", tmp_path / "plot.json",
                           tmp_path / "detail.json")
    texts = load_prepared(tmp_path / "prepared").text_map()
    test, train_rows = data.splits["test"].tensors, data.splits["train"].tensors
    model = load_model(tmp_path / "head", p.cache.device, encoder=str(tiny_bert))
    q = model.encode([texts[data.row_ids["query"][r]] for r in test["rows"].tolist()], 8)
    c = data.q_vectors[train_rows["rows"]].float()
    top = (F.normalize(q, dim=-1) @ F.normalize(c, dim=-1).T).argmax(1)
    p1 = float((train_rows["labels"][top] == test["labels"]).float().mean())
    assert metrics["trained"]["p@1"] == pytest.approx(p1, abs=1e-9)
