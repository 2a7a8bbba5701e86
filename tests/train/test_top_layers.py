"""Top-layers mode: cached states after layer k through the trainable top layers equal the whole
encoder; GradCache gives the full-batch gradient with dropout on; DDP on 2 processes equals 1;
the trained top layers + frozen bottom are one ordinary transformers model, served as exported."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from simtune import layers
from simtune import params as P
from simtune.cache import stage as cache
from simtune.cache.views import layer_for
from simtune.encoders import FrozenEncoder
from simtune.prepare.prepared import text_id
from simtune.train import gradcache, represent
from simtune.train.data import load_data
from simtune.train.losses import GroupLoss
from stages import app
from tests.cache_helpers import sentences
from tests.train_helpers import project, set_schedule, stage_args, trained_by_one_and_two_processes


def _top_project(root: Path, model: Path, **encoder) -> tuple[Path, P.Params]:
    raw, params_file = project(root, model, mode="top_layers")
    set_schedule(raw, "top_layers", **{"layers": 1, "lr": 0.001, "head_lr": 0.01,
                                       "batch_size": 8, "max_epochs": 3, "patience": 2,
                                       **encoder})
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = P.validate(raw)
    cache.fill(root / "prepared", root / "cache", p.encoders, p.cache,
               layer=layer_for(p.encoders, p.train))
    return params_file, p


def _brute_force_groups(lengths: list[int], overhead: int) -> float:
    """Cheapest padded cost over every split of the length-sorted rows into runs."""
    sl, n, best = sorted(lengths, reverse=True), len(lengths), float("inf")
    for mask in range(2 ** (n - 1)):
        cuts = [0] + [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
        best = min(best, sum(sl[a] * (b - a) + overhead for a, b in itertools.pairwise(cuts)))
    return best


@pytest.mark.parametrize("overhead", [0, 7, 40, 1000])
def test_length_groups_are_the_cheapest_partition(overhead: int) -> None:
    gen = torch.Generator().manual_seed(overhead)
    for _ in range(20):
        lengths = torch.randint(1, 60, (int(torch.randint(1, 10, (1,), generator=gen)),),
                                generator=gen)
        groups = layers.length_groups(lengths, overhead)
        assert sorted(torch.cat(groups).tolist()) == list(range(len(lengths)))  # a partition
        cost = sum(int(lengths[g].max()) * len(g) + overhead for g in groups)
        assert cost == _brute_force_groups(lengths.tolist(), overhead)
    assert len(layers.length_groups(torch.tensor([40, 10, 40, 10]), 0)) == 2
    assert len(layers.length_groups(torch.tensor([40, 10, 40, 10]), 100)) == 1


@pytest.mark.parametrize(("tokens_per_chunk", "overhead"), [(4096, 256), (50, 256), (4096, 0)])
def test_cached_states_through_the_top_layers_equal_the_whole_encoder(
        tmp_path: Path, tiny_bert: Path, tokens_per_chunk: int, overhead: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 50 tokens: length-sorted chunks of a few rows each, put back in the split's order;
    # overhead 0: every forward runs as many length groups, put back in the batch's order
    monkeypatch.setattr(layers, "TOKENS_PER_CHUNK", tokens_per_chunk)
    monkeypatch.setattr(layers, "GROUP_OVERHEAD", {"cpu": overhead, "other": overhead})
    _, p = _top_project(tmp_path, tiny_bert)
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    rep = represent.build("top_layers", p.encoders, data.tables, p.train.lora, True).eval()
    split = data.splits["train"]
    with torch.no_grad():
        got = rep.embed_split(split, "text")
    frozen = FrozenEncoder("tiny", p.encoders.models["tiny"], torch.device("cpu"))
    ids = data.tables["query"].ids.take(split.tensors["rows"].numpy()).to_pylist()
    texts = {text_id(t): t for t in sentences(80)}
    want = frozen.encode([texts[i] for i in ids], 7)
    assert got.shape == want.shape == (len(split), 32)
    assert torch.allclose(got, want, atol=2e-5), float((got - want).abs().max())
    # a training batch in random order (length groups inside forward) gives the same rows
    perm = torch.randperm(len(split), generator=torch.Generator().manual_seed(3))[:40]
    with torch.no_grad():
        batch = rep(split, {"idx": perm}, "text")
    assert torch.allclose(batch, want[perm], atol=2e-5), float((batch - want[perm]).abs().max())
    # and the frozen top layers give exactly the cached vectors too
    cached = data.tables["query"].vectors[split.tensors["rows"]]
    assert torch.allclose(got, cached, atol=2e-5)


def test_streamed_states_train_exactly_as_the_table_loaded_in_memory(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # before, the layer cache was one (sum T, H) tensor in memory, gathered per batch; that is
    # still the resident table (`StatesTable.resident`): training reads the same batches, so
    # it gives the very same weights and validation metrics
    from simtune.train import stage as train_stage

    _, p = _top_project(tmp_path, tiny_bert, max_epochs=2)

    def train(tag: str) -> tuple[dict, dict]:
        report = train_stage.run(p, tmp_path / "prepared", tmp_path / "cache",
                                 tmp_path / f"head{tag}", tmp_path / f"train{tag}.json",
                                 tmp_path / f"live{tag}")
        return report, load_file(str(tmp_path / f"head{tag}" / "encoder" / "model.safetensors"))

    streamed, weights = train("streamed")

    def in_memory(self: represent.CachedStates, device: torch.device, cache_type) -> None:
        self.table = self.doc_table = self.table.resident("cpu")

    monkeypatch.setattr(represent.CachedStates, "place", in_memory)
    loaded, weights2 = train("loaded")
    assert streamed["best_val"] == loaded["best_val"]
    assert streamed["full_validations"] == loaded["full_validations"]
    assert weights.keys() == weights2.keys()
    assert all(torch.equal(weights[k], weights2[k]) for k in weights)


LORA = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": "all-linear"}


@pytest.mark.parametrize(("chunk", "lora"), [(1, False), (3, False), (12, False), (3, True)])
def test_gradcache_equals_the_full_batch_for_the_top_layers(tmp_path: Path, tiny_bert: Path,
                                                             chunk: int, lora: bool) -> None:
    # LoRA: the adapters' own dropout is replayed too; B starts at zero (then A's gradient is
    # zero), so it is drawn at random here, as after some training
    _, p = _top_project(tmp_path, tiny_bert, **({"lora": LORA} if lora else {}))
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    rep = represent.build("top_layers", p.encoders, data.tables, p.train.lora, True)
    rep.train()  # dropout on
    with torch.no_grad():
        for name, q in rep.named_parameters():
            if "lora_B" in name:
                q.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    split = data.splits["train"]
    labels = split.tensors["labels"][:12]
    loss_fn = GroupLoss("supcon", "cosine", 0.1, 0.2, "batch_hard", 1.0)
    chunks = [{"idx": torch.arange(s, min(s + chunk, 12))} for s in range(0, 12, chunk)]

    def encode(part):
        return rep(split, part, "text")

    torch.manual_seed(5)
    rep.zero_grad()
    full = loss_fn(torch.cat([encode(c) for c in chunks]), labels)
    full.backward()
    want = {n: q.grad.clone() for n, q in rep.named_parameters() if q.grad is not None}
    torch.manual_seed(5)
    rep.zero_grad()
    got_loss = gradcache.step(encode, chunks, lambda reps: loss_fn(reps, labels))
    assert got_loss.item() == pytest.approx(full.item(), rel=1e-6)
    got = {n: q.grad for n, q in rep.named_parameters() if q.grad is not None}
    assert got.keys() == want.keys() and len(want) > 10
    assert all(("lora_" in n) == lora for n in want)  # LoRA: the adapters alone train
    for name in want:
        err = (got[name] - want[name]).norm() / want[name].norm().clamp_min(1e-12)
        assert err <= 1e-5, (name, float(err))


def _evaluate(root: Path, params_file: Path) -> dict:
    result = CliRunner().invoke(app, [
        "evaluate", "--params", str(params_file), "--prepared", str(root / "prepared"),
        "--cache", str(root / "cache"), "--head", str(root / "head"),
        "--out", str(root / "metrics.json"),
        "--metrics", str(root / "headline.json"), "--plot", str(root / "recall.json"),
        "--detail", str(root / "detail.json"), "--run-trained", str(root / "trained.trec"),
        "--run-baseline", str(root / "baseline.trec")])
    assert result.exit_code == 0, result.output
    return json.loads((root / "metrics.json").read_text())


def test_trains_saves_an_ordinary_model_and_export_gives_the_pipeline_vectors(
        tmp_path: Path, tiny_bert: Path) -> None:
    params_file, p = _top_project(tmp_path, tiny_bert, max_epochs=2)
    result = CliRunner().invoke(app, stage_args(tmp_path, params_file))
    assert result.exit_code == 0, result.output
    saved = load_file(str(tmp_path / "head" / "encoder" / "model.safetensors"))
    original = load_file(str(tiny_bert / "model.safetensors"))
    changed = {k for k in original if not torch.equal(saved[k], original[k])}
    # the bottom (embeddings, layer 0) is frozen, the top layer trained
    assert changed and all(".layer.1." in k for k in changed), sorted(changed)[:5]
    metrics = _evaluate(tmp_path, params_file)
    assert metrics["trained"] != metrics["baseline"]
    # the pipeline's vectors (cached states -> trained top layer -> head) == the export's
    from simtune import heads
    from simtune.export.stage import export
    from simtune.model import load_model

    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    rep = represent.build("top_layers", p.encoders, data.tables, p.train.lora, True)
    state = load_file(str(tmp_path / "head" / "encoder" / "model.safetensors"))
    for i, layer in enumerate(rep.top.encoder.layer):
        prefix = f"encoder.layer.{1 + i}."
        layer.load_state_dict({k[len(prefix):]: v for k, v in state.items()
                               if k.startswith(prefix)})
    head = heads.load(tmp_path / "head").eval()
    split = data.splits["test"]
    with torch.no_grad():
        pipeline = torch.nn.functional.normalize(head(rep.eval().embed_split(split, "text")),
                                                 dim=-1)
    export(tmp_path / "head", tmp_path / "export")
    texts = {text_id(t): t for t in sentences(80)}
    ids = data.tables["query"].ids.take(split.tensors["rows"].numpy()).to_pylist()
    served = load_model(tmp_path / "export", "cpu").encode([texts[i] for i in ids])
    assert torch.allclose(served, pipeline, atol=1e-5), float((served - pipeline).abs().max())
    st = pytest.importorskip("sentence_transformers")  # and plain sentence-transformers, no code
    plain = st.SentenceTransformer(str(tmp_path / "export"), device="cpu").encode(
        [texts[i] for i in ids], convert_to_tensor=True)
    assert torch.allclose(plain, pipeline, atol=1e-5), float((plain - pipeline).abs().max())


@pytest.mark.integration
@pytest.mark.parametrize("lora", [False, True])
def test_ddp_two_cpu_processes_equal_one_for_the_top_layers(tmp_path: Path, lora: bool) -> None:
    # dropout off in the encoder (and the adapters): each process draws its own masks, so with
    # dropout on the two runs differ by design (GradCache's equality with dropout on is above)
    from tests.conftest import save_tiny_bert

    model = save_tiny_bert(tmp_path / "bert-no-dropout")
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
    params_file, _ = _top_project(tmp_path, model, max_epochs=2, patience=5, batch_size=16,
                                  **({"lora": {**LORA, "dropout": 0.0}} if lora else {}))
    trained_by_one_and_two_processes(tmp_path, params_file)
    # each process pads its half-batch to its own longest text: float sums in another order,
    # which Adam's normalised steps carry into the weights at ~1e-5 after 2 epochs
    for name in ("model.safetensors", "encoder/model.safetensors"):
        one = load_file(str(tmp_path / "headone" / name))
        two = load_file(str(tmp_path / "headtwo" / name))
        for k in one:
            diff = float((one[k] - two[k]).abs().max())
            assert diff <= 1e-4, (name, k, diff)


def test_epoch_0_validates_from_the_cached_vectors_as_the_top_layers_would(
        tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 51: epoch 0 (the frozen encoder) reads the cached vectors instead of running every
    validation text through the untouched top layers: the same vectors (float32 states here,
    2e-5), the same ranking metrics, and one validation pass fewer in the run."""
    from simtune import heads
    from simtune.train import stage as train_stage
    from simtune.train.validation import Validator, cached_encoder, validation_task

    _, p = _top_project(tmp_path, tiny_bert, max_epochs=1, patience=1)
    data = load_data(p.train, p.encoders, p.cache, tmp_path / "prepared", tmp_path / "cache")
    rep = represent.build("top_layers", p.encoders, data.tables, p.train.lora, True).eval()
    head = heads.build("mlp", data.dim, 2, 0.0)
    head.load_state_dict(head.identity_state())
    task = validation_task(data, "both", p.evaluate.corpus)
    validator = Validator(data, task, rep.embed_split, head, False)
    cached = cached_encoder(data, rep)
    assert cached is not None
    with torch.inference_mode():
        long_way, _ = validator(True)
        with validator.representing(cached):
            short, _ = validator(True)
        for split in ("train", "val"):
            sp = data.splits[split]
            assert torch.allclose(cached(sp, "text"), rep.embed_split(sp, "text"), atol=2e-5)
    assert validator.rep == rep.embed_split  # put back after the block
    separation = short.pop("separation")
    assert separation == pytest.approx(long_way.pop("separation"), abs=1e-5)
    assert short == long_way and "p@1" in short
    head = represent.build("head", p.encoders, data.tables, None, True)
    assert cached_encoder(data, head) is None
    # the run: epoch 1's validation embeds its two splits through the top layers; epoch 0 none
    calls: list[int] = []
    real = represent.CachedStates.embed_split

    def counted(self: represent.CachedStates, split: object, role: str) -> torch.Tensor:
        calls.append(len(split))  # type: ignore[arg-type]
        return real(self, split, role)

    monkeypatch.setattr(represent.CachedStates, "embed_split", counted)
    caplog.set_level("INFO", logger="simtune.train")
    report = train_stage.run(p, tmp_path / "prepared", tmp_path / "cache", tmp_path / "head",
                             tmp_path / "train.json", None)
    assert report["epochs"] == 1
    assert sorted(calls) == sorted(len(data.splits[s]) for s in ("train", "val"))
    # the train log's estimate, once, from the first steps (40 texts, batch 8: steps 2-5)
    (line,) = [r.getMessage() for r in caplog.records if "run estimate" in r.getMessage()]
    assert line.startswith("run estimate from the first 4 steps (") and "5 steps an epoch" in line
    assert "~1 epochs x " in line
