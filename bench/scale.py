"""The top_layers cache at scale: fill speed, bytes on disk, DVC bookkeeping, peak RSS and
training speed, for synthetic corpora of N texts x L tokens (MiniLM, top 2: the states after
layer 4), in this layout and in the layout before issue 27.

Texts are drawn from MiniLM's own word list (whole-word WordPiece tokens: one token per word),
L - 2 words each, so every text is exactly L tokens (nothing downloaded). Per size:

- fill: a head-mode fill and a top_layers fill (one encoder pass: vectors and states) of the
  first `--fill-texts` texts, each into an empty store; with `--old-fill`, also the states alone
  (the second pass the pre-change top_layers fill ran): texts/s, and top_layers / head;
- the layer cache of all N texts: the store entries are written with random states (the bytes,
  the bookkeeping and the reading do not depend on the values; the fill's speed is measured
  above), then the views exactly as the fill writes them; bytes on disk (store + workspace +
  DVC cache, each inode counted once), `dvc add cache` (DVC hashing and caching the stage's
  output: its bookkeeping after the stage) and `dvc status`;
- reading and training, each in a fresh process: a read of every row in shuffled batches of 64
  (its peak RSS, VmHWM, and RssAnon / RssFile after it: what the table costs in memory), then
  `--steps` top-2 training steps (batch 64, shuffled rows, supcon over random labels, AdamW:
  steps/s, and the peak RSS with training's own activations);
- the pre-change layout: the layer view a float32 copy of the states (as the fill wrote it),
  `dvc add` of it, its bytes (its store entry held the same float32 bytes again: counted, not
  written) and training over the table loaded into memory (as `states.assemble` did).

Every figure is also projected linearly to 1M texts (RSS: streamed stays as measured, the
loaded table grows with the bytes), said so in the table.

    python -m bench.scale [--sizes 10000x128,30000x128,100000x128,10000x512]
                          [--fill-texts 200] [--steps 10]

Prints a Markdown table and writes bench/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import HERE, machine, run_under, table

ROOT = HERE.parent
TOP, BATCH, HIDDEN, MILLION = 2, 64, 384, 1_000_000


def spec_for(length: int, states_dtype: str = "float16") -> Any:
    from simtune import params as P

    raw = json.loads(json.dumps(P.load(ROOT / "params.yaml").model_dump()))
    spec = dict(raw["encoders"]["models"]["minilm"], max_length=length,
                states_dtype=states_dtype, model="minilm")
    return P.EncoderParams(**spec)


def cache_params(store_root: Path, device: str = "cpu") -> Any:
    from simtune import params as P

    raw = P.load(ROOT / "params.yaml").cache.model_dump()
    return P.CacheParams(**{**raw, "store": str(store_root), "device": device,
                            "store_max_gb": 1e6, "max_layer_gb": None})


def texts(n: int, length: int, seed: int = 0) -> dict[str, str]:
    """n distinct texts of `length` tokens (CLS + length - 2 one-token words + SEP)."""
    from simtune.encoders import model_dir
    from simtune.prepare.prepared import text_id

    vocab = (model_dir("minilm", spec_for(length)) / "vocab.txt").read_text().split()
    words = [w for w in vocab if w.isalpha() and w.isascii() and len(w) >= 3]
    rng = random.Random(seed)
    out = [" ".join(rng.choices(words, k=length - 2)) for _ in range(n)]
    return {text_id(t): t for t in out}


def du(*paths: Path) -> int:
    """Bytes of the regular files under `paths`, each inode once (hardlinks counted once)."""
    seen, total = set(), 0
    for p in paths:
        for parent, _, files in os.walk(p):
            for name in files:
                st = os.lstat(os.path.join(parent, name))
                if st.st_ino not in seen and os.path.isfile(os.path.join(parent, name)):
                    seen.add(st.st_ino)
                    total += st.st_size
    return total


def fill_speed(n_texts: dict[str, str], length: int, work: Path, old_fill: bool,
               device: str = "cpu") -> dict[str, float]:
    """Seconds of a head fill, a one-pass top_layers fill (and the states-only second pass of
    before) of `n_texts`, each into an empty store, the encoder on `device`."""
    from simtune.cache import stage as cache
    from simtune.cache.formats import Format
    from simtune.encoders import FrozenEncoder

    spec = spec_for(length)
    layer = 6 - TOP
    encoder = FrozenEncoder("minilm", spec, torch.device(device))
    factory = lambda *a: encoder  # noqa: E731  (loaded once, outside the timings)
    out: dict[str, float] = {}
    runs = {"head": lambda cp, w: cache.fill_encoder("minilm", spec, n_texts, w / "v", cp,
                                                     cache.Dist(), encoder_factory=factory),
            "top_layers": lambda cp, w: cache.fill_with_states(
                "minilm", spec, n_texts, w / "v", w / "s", cp, cache.Dist(), layer,
                encoder_factory=factory)}
    if old_fill:
        runs["states_pass"] = lambda cp, w: cache.fill_encoder(
            "minilm", spec, n_texts, w / "s", cp, cache.Dist(), encoder_factory=factory,
            fmt=Format(layer))
    for name, run in runs.items():
        d = Path(tempfile.mkdtemp(dir=work))
        os.environ["SIMTUNE_STORE"] = str(d / "store")
        _sync(device)
        t0 = time.perf_counter()
        run(cache_params(d / "store", device), d)
        _sync(device)
        out[name] = time.perf_counter() - t0
        shutil.rmtree(d)
    return out


def synthetic_cache(ids: list[str], length: int, work: Path, seed: int = 0) -> Path:
    """The store entries (vectors and float16 states after layer 4, random values) and the
    workspace views `work/ws/cache/minilm` and `minilm@layer4`, as the fill writes them.
    Returns the workspace."""
    from simtune.cache import reference, states, store, vectors, views
    from simtune.encoders import describe, fingerprint

    spec, layer = spec_for(length), 6 - TOP
    root = work / "store"
    os.environ["SIMTUNE_STORE"] = str(root)
    ws = work / "ws"
    rng = np.random.default_rng(seed)
    for fmt_layer in (None, layer):
        d = describe("minilm", spec, fmt_layer)
        fp = fingerprint(d)
        entry = store.fingerprint_dir(root, fp)
        entry.mkdir(parents=True)
        m = vectors.Manifest("minilm", fp, d, d["dtype"], HIDDEN)
        per = max(1, (256 << 20) // (length * HIDDEN * 2)) if fmt_layer else 16384
        for a in range(0, len(ids), per):
            chunk = ids[a:a + per]
            if fmt_layer is None:
                m.shards.append(vectors.write_shard(entry, 0, chunk, chunk, rng.standard_normal(
                    (len(chunk), HIDDEN), dtype=np.float32), m))
            else:
                rows = [rng.standard_normal((length, HIDDEN), dtype=np.float32).astype(
                    np.float16) for _ in chunk]
                m.shards.append(states.write_shard(entry, 0, chunk, chunk, rows, m))
        vectors.write_manifest(entry, m)
        view = ws / "cache" / views.view_name("minilm", spec, "query", fmt_layer)
        if fmt_layer is None:
            views.write_view(view, entry, m, {i: [i] for i in ids}, 16384)
        else:
            reference.write(view, entry, m, {i: [i] for i in ids}, root)
    return ws


def old_layer_view(ws: Path, old: Path, length: int) -> None:
    """The pre-change workspace `old`: the same vector view, and the layer view a float32 copy
    of the states in `part-NNNNN.arrow` shards of 16384 rows (as the fill wrote them)."""
    from simtune.cache import states, vectors, views

    spec, layer = spec_for(length, "float32"), 6 - TOP
    shutil.copytree(ws / "cache" / "minilm", old / "cache" / "minilm")
    table = views.open_states(ws / "cache", "minilm", spec_for(length), layer,
                              cache_params(Path(os.environ["SIMTUNE_STORE"])))
    from simtune.encoders import describe, fingerprint

    d = describe("minilm", spec, layer)
    m = vectors.Manifest("minilm", fingerprint(d), d, "float32", HIDDEN)
    view = old / "cache" / f"minilm@layer{layer}"
    view.mkdir(parents=True)
    ids = table.ids.to_pylist()
    per = min(16384, max(1, (1 << 30) // (length * HIDDEN * 4)))  # bounded memory here
    for n, a in enumerate(range(0, len(ids), per)):
        rows = table.read(torch.arange(a, min(a + per, len(ids))))
        m.shards.append(states.write_shard(view, 0, ids[a:a + per], ids[a:a + per],
                                           [r.astype(np.float32) for r in rows], m,
                                           name=f"part-{n:05d}.arrow"))
    vectors.write_manifest(view, m)


def dvc_bookkeeping(ws: Path) -> dict[str, float]:
    """`dvc add cache` (hash + cache: what `dvc repro` does after a stage), `dvc status`, and
    DVC's start-up alone (`dvc version`: what no size changes)."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
    subprocess.run([*dvc, "init", "-q"], cwd=ws, check=True, env=env)
    out = {}
    for name, cmd in (("add", ["add", "-q", "cache"]), ("status", ["status", "-q"]),
                      ("startup", ["version"])):
        t0 = time.perf_counter()
        subprocess.run([*dvc, *cmd], cwd=ws, check=name == "add", env=env,
                       capture_output=True)
        out[name] = time.perf_counter() - t0
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def train_child(ws: Path, length: int, steps: int, mode: str, device: str = "cpu"
                ) -> dict[str, float]:
    """Run `train_main` in a fresh process (its own peak RSS)."""
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "--child", str(ws),
                           str(length), str(steps), mode, device], cwd=ROOT, check=True,
                          capture_output=True, text=True, env=os.environ)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def train_main(ws: Path, length: int, steps: int, mode: str, device: str = "cpu") -> None:
    """A read of every row in shuffled batches, then `steps` top-2 training steps over the
    workspace's layer view on `device`; `mode` streamed (this layout: each batch read from the
    store's shards, then copied to `device`), loaded (the table in memory, as before) or
    resident (the table on the GPU: `cache_type: gpu`). Prints a JSON line."""
    from simtune.cache import views
    from simtune.encoders import model_dir
    from simtune.train.losses import GroupLoss
    from simtune.train.represent import CachedStates

    spec, layer = spec_for(length), 6 - TOP
    table = views.open_states(ws / "cache", "minilm", spec, layer,
                              cache_params(Path(os.environ["SIMTUNE_STORE"])))
    t0 = time.perf_counter()
    if mode == "loaded":
        table = table.resident("cpu")
    elif mode == "resident":
        table = table.to(device)
    load_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()  # an epoch's reads first, alone: what the table costs in memory
    for rows in torch.randperm(len(table), generator=gen).split(BATCH):
        table.batch(rows, device)
    _sync(device)
    read_s = time.perf_counter() - t0
    read = {"read_peak_rss_gb": _status("VmHWM") / 1024, "rss_anon_gb": _status("RssAnon") / 1024,
            "rss_file_gb": _status("RssFile") / 1024}
    rep = CachedStates(table, model_dir("minilm", spec), layer, spec).to(device).train()
    opt = torch.optim.AdamW(rep.parameters(), lr=1e-4)
    loss_fn = GroupLoss("supcon", "cosine", 0.05, 0.2, "batch_hard", 20.0)
    split = type("Split", (), {"tensors": {"rows": torch.arange(len(table))}})()

    def step() -> None:
        idx = torch.randint(len(table), (BATCH,), generator=gen)
        labels = torch.randint(8, (BATCH,), generator=gen).to(device)
        loss = loss_fn(rep(split, {"idx": idx}, "text"), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if device != "cpu":
        step()  # kernels and the allocator warm up outside the timing
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    step_s = (time.perf_counter() - t0) / max(steps, 1)
    gpu = ({"gpu_peak_gb": torch.cuda.max_memory_allocated() / 2**30}
           if device.startswith("cuda") else {})
    print(json.dumps({"steps_per_s": 1 / step_s, "load_s": load_s, "read_epoch_s": read_s,
                      **read, **gpu, "peak_rss_gb": _status("VmHWM") / 1024}))


def check_cost(n: int, length: int, device: str = "cpu") -> dict[str, Any]:
    """What checking the store shards' sha256 when training opens a layer view costs (issue 35
    item 2), in this one process: the hash alone (`check_sums`, waited for), then twice the
    way train goes (open the view, build the top-2 model, one epoch of steps over every row,
    batch 64, as `train_main`), without the check and with it (hashed in the background from
    the open on; the first batch waits for what is left). The files are read once first: the
    page cache is warm for every timing."""
    from simtune.cache import reference

    work = Path(tempfile.mkdtemp(prefix="simtune-check-"))
    try:
        ws = synthetic_cache(list(texts(n, length)), length, work)
        view, root = ws / "cache" / f"minilm@layer{6 - TOP}", work / "store"
        table = reference.open_view(view, root, checksums=False)
        gb = sum(f.stat().st_size for f in table.files) / 1e9
        table.check_sums()  # the files read once: the page cache warm for every timing
        t0 = time.perf_counter()
        table.check_sums()
        hash_s = time.perf_counter() - t0
        epochs = {check: _open_and_epoch(view, root, length, check, device)
                  for check in (False, True)}
        return {"size": f"{n} x {length}", "shards GB": gb, "hash s": hash_s,
                "hash GB/s": gb / max(hash_s, 1e-9), "epoch s, no check": epochs[False],
                "epoch s, checked": epochs[True],
                "cost % of an epoch": 100 * (epochs[True] - epochs[False]) / epochs[False],
                "hash alone % of an epoch": 100 * hash_s / epochs[False]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _open_and_epoch(view: Path, root: Path, length: int, check: bool, device: str) -> float:
    """Seconds from opening the layer view (with or without the shard check) to the end of one
    epoch of top-2 training steps over every row."""
    from simtune.cache import reference
    from simtune.encoders import model_dir
    from simtune.train.losses import GroupLoss
    from simtune.train.represent import CachedStates

    gen = torch.Generator().manual_seed(0)
    _sync(device)
    t0 = time.perf_counter()
    table = reference.open_view(view, root, checksums=check)
    spec = spec_for(length)
    rep = CachedStates(table, model_dir("minilm", spec), 6 - TOP, spec).to(device).train()
    opt = torch.optim.AdamW(rep.parameters(), lr=1e-4)
    loss_fn = GroupLoss("supcon", "cosine", 0.05, 0.2, "batch_hard", 20.0)
    split = type("Split", (), {"tensors": {"rows": torch.arange(len(table))}})()
    for idx in torch.randperm(len(table), generator=gen).split(BATCH):
        labels = torch.randint(8, (len(idx),), generator=gen).to(device)
        loss = loss_fn(rep(split, {"idx": idx}, "text"), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    _sync(device)
    return time.perf_counter() - t0


def measure(n: int, length: int, fill_texts: int, steps: int, old: bool, old_fill: bool
            ) -> list[dict[str, Any]]:
    from simtune.cache import reference

    work = Path(tempfile.mkdtemp(prefix="simtune-scale-"))
    try:
        corpus = texts(n, length)
        sample = dict(list(corpus.items())[:fill_texts])
        fill = fill_speed(sample, length, work, old_fill)
        ws = synthetic_cache(list(corpus), length, work / "new")
        view = ws / "cache" / f"minilm@layer{6 - TOP}"
        ref = reference.read(view)
        one_copy = int(ref.tokens) * HIDDEN * 2  # one 16-bit copy
        books = dvc_bookkeeping(ws)
        disk = {"store": du(work / "new" / "store"), "workspace": du(ws / "cache"),
                "dvc_cache": du(ws / ".dvc" / "cache")}
        disk["total"] = du(work / "new" / "store", ws / "cache", ws / ".dvc" / "cache")
        entry = work / "new" / "store" / "vectors" / ref.fingerprint
        disk["layer"] = du(entry) + 2 * du(view)  # its entry, the view and DVC's copy of it
        rows = [{"size": f"{n} x {length}", "layout": "store once, reference view",
                 "fill texts/s": len(sample) / fill["top_layers"],
                 "fill vs head": fill["top_layers"] / fill["head"],
                 **_disk_cells(disk, one_copy), **_dvc_cells(books),
                 **_train_cells(train_child(ws, length, steps, "streamed"))}]
        if old:
            old_ws = work / "old"
            old_layer_view(ws, old_ws, length)
            shutil.rmtree(ws / ".dvc" / "cache")  # room on the disk for the old copies
            books = dvc_bookkeeping(old_ws)
            copy = du(old_ws / "cache" / f"minilm@layer{6 - TOP}")
            odisk = {"store": disk["store"] - one_copy + copy,  # its entry held float32 too
                     "workspace": du(old_ws / "cache"), "dvc_cache": du(old_ws / ".dvc" / "cache")}
            odisk["total"] = odisk["store"] + odisk["workspace"] + odisk["dvc_cache"]
            odisk["layer"] = 3 * copy  # the entry, the view and DVC's copy
            two = fill.get("states_pass")
            rows.append({"size": f"{n} x {length}", "layout": "before: f32 copies in view, DVC",
                         "fill texts/s": len(sample) / (fill["head"] + two) if two else "",
                         "fill vs head": (fill["head"] + two) / fill["head"] if two else "",
                         **_disk_cells(odisk, one_copy), **_dvc_cells(books),
                         **_train_cells(train_child(ws, length, steps, "loaded"))})
        for r in rows:
            r.update(_projected(r, n, books["startup"], rows[0]["read peak RSS GB"]))
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _disk_cells(disk: dict[str, int], one_copy: int) -> dict[str, Any]:
    return {"store GB": disk["store"] / 1e9, "workspace GB": disk["workspace"] / 1e9,
            "DVC cache GB": disk["dvc_cache"] / 1e9, "on disk GB": disk["total"] / 1e9,
            "layer cache x one 16-bit copy": disk["layer"] / one_copy}


def _dvc_cells(books: dict[str, float]) -> dict[str, Any]:
    return {"dvc add s": books["add"], "dvc status s": books["status"]}


def _train_cells(t: dict[str, float]) -> dict[str, Any]:
    return {"read epoch s": t["read_epoch_s"], "read peak RSS GB": t["read_peak_rss_gb"],
            "RssAnon GB": t["rss_anon_gb"], "RssFile GB": t["rss_file_gb"],
            "steps/s": t["steps_per_s"], "peak RSS GB": t["peak_rss_gb"]}


def _projected(r: dict[str, Any], n: int, startup: float, streamed_rss: float
               ) -> dict[str, Any]:
    """Linear projections to 1M texts: bytes; `dvc add` beyond DVC's start-up; the read
    epoch's peak RSS of the loaded table beyond the streamed one's, which does not grow."""
    k = MILLION / n
    loaded = r["layout"].startswith("before")
    peak = r["read peak RSS GB"]
    rss = streamed_rss + (peak - streamed_rss) * k if loaded else peak
    return {"1M: on disk GB": r["on disk GB"] * k,
            "1M: dvc add s": startup + max(0.0, r["dvc add s"] - startup) * k,
            "1M: read peak RSS GB": rss}


def measure_gpu(n: int, length: int, fill_texts: int, steps: int, device: str
                ) -> list[dict[str, Any]]:
    """The figures that depend on the device, on `device`: the fills of the first `fill_texts`
    texts, a read epoch and `steps` top-2 training steps with the states streamed from the
    store (read on the CPU, copied per batch) and resident on the GPU. Bytes and DVC's
    bookkeeping are the CPU rows' (they do not depend on the device)."""
    work = Path(tempfile.mkdtemp(prefix="simtune-scale-gpu-"))
    try:
        corpus = texts(n, length)
        fill = fill_speed(dict(list(corpus.items())[:fill_texts]), length, work, False, device)
        ws = synthetic_cache(list(corpus), length, work / "new")
        rows = []
        for mode, where in (("streamed", "streamed from the store"),
                            ("resident", "resident on the GPU")):
            t = train_child(ws, length, steps, mode, device)
            rows.append({"size": f"{n} x {length}", "states": where,
                         "fill texts/s": fill_texts / fill["top_layers"],
                         "head fill texts/s": fill_texts / fill["head"],
                         "fill vs head": fill["top_layers"] / fill["head"],
                         "read epoch s": t["read_epoch_s"], "steps/s": t["steps_per_s"],
                         "GPU peak GB": t.get("gpu_peak_gb", ""), "peak RSS GB": t["peak_rss_gb"]})
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


GPU_COLUMNS = ["size", "states", "fill texts/s", "head fill texts/s", "fill vs head",
               "read epoch s", "steps/s", "GPU peak GB", "peak RSS GB"]


COLUMNS = ["size", "layout", "fill texts/s", "fill vs head", "store GB", "workspace GB",
           "DVC cache GB", "on disk GB", "layer cache x one 16-bit copy", "dvc add s",
           "dvc status s", "read epoch s", "read peak RSS GB", "RssAnon GB", "RssFile GB",
           "steps/s", "peak RSS GB", "1M: on disk GB", "1M: dvc add s",
           "1M: read peak RSS GB"]


def old_fits(n: int, length: int, max_gb: float | None) -> bool:
    """Whether the pre-change layout's three float32 copies (store entry, view, DVC cache) of
    n x length states fit on the disk (or in `max_gb`), beside this layout's 16-bit copy."""
    need = 3 * n * length * HIDDEN * 4 + n * length * HIDDEN * 2
    room = max_gb * 1e9 if max_gb is not None else 0.8 * shutil.disk_usage(
        tempfile.gettempdir()).free
    if need > room:
        print(f"{n} x {length}: the pre-change layout needs {need / 1e9:.0f} GB of disk, "
              f"{room / 1e9:.0f} GB allowed: measured in this layout only", flush=True)
    return need <= room


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000x128,30000x128,100000x128,10000x512",
                    help="comma-separated NxL: N texts of L tokens")
    ap.add_argument("--fill-texts", type=int, default=200, help="texts each timed fill embeds")
    ap.add_argument("--steps", type=int, default=10, help="training steps timed")
    ap.add_argument("--no-old", action="store_true", help="skip the pre-change layout")
    ap.add_argument("--old-max-gb", type=float, default=None,
                    help="measure the pre-change layout only where its three float32 copies "
                         "fit in this many GB (default: 80 %% of the free disk)")
    ap.add_argument("--old-fill", action="store_true",
                    help="also time the states-only second pass of the pre-change fill")
    ap.add_argument("--out", type=Path, default=HERE / "scale.json", help="the results file")
    ap.add_argument("--device", default="cpu",
                    help="cuda: the device-dependent figures on the GPU (fill, reads, training "
                         "steps), kept in the results file beside the CPU rows")
    ap.add_argument("--check-cost", action="store_true",
                    help="only what the shards' sha256 check at a train's open costs beside "
                         "one epoch (printed; the results file is not written)")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        ws, length, steps, mode, device = args.child
        train_main(Path(ws), int(length), int(steps), mode, device)
        return
    torch.set_num_threads(os.cpu_count() or 1)
    if args.check_cost:
        rows = [check_cost(*(int(x) for x in size.lower().split("x")), args.device)
                for size in args.sizes.split(",")]
        print(table(rows, list(rows[0])), flush=True)
        return
    if args.device != "cpu":
        gpu_main(args)
        return
    rows = []
    for size in args.sizes.split(","):
        n, length = (int(x) for x in size.lower().split("x"))
        old = not args.no_old and old_fits(n, length, args.old_max_gb)
        rows += measure(n, length, min(args.fill_texts, n), args.steps, old, args.old_fill)
        print(table(rows[-2:] if old else rows[-1:], COLUMNS), flush=True)
    rendered = table(rows, COLUMNS)
    command = _command()
    note = ("The pre-change layout is measured only where its float32 copies fit on the disk. "
            "1M columns: the measured figures projected linearly to 1,000,000 texts (the "
            "streamed read's peak RSS does not grow with the corpus; the loaded table's does; "
            "training's activations add the same at any corpus size). Fill speed on "
            f"the first {args.fill_texts} texts of each size; the layer cache itself holds "
            "random states (bytes, bookkeeping and reads do not depend on the values).")
    print(f"\n{rendered}\n\n{note}")
    write(args.out, {"machine": machine(), "command": command, "rows": [], "scale_rows": rows,
                     "table": rendered, "note": note})


def gpu_main(args: argparse.Namespace) -> None:
    rows = []
    for size in args.sizes.split(","):
        n, length = (int(x) for x in size.lower().split("x"))
        rows += measure_gpu(n, length, min(args.fill_texts, n), args.steps, args.device)
        print(table(rows[-2:], GPU_COLUMNS), flush=True)
        # after each size: a run cut off keeps what it measured
        write(args.out, {"gpu": {"machine": machine(), "rows": rows,
                                 "table": table(rows, GPU_COLUMNS),
                                 "command": _command()}})
    print(f"\n{table(rows, GPU_COLUMNS)}")


def _command() -> str:
    """This run's command line as a reader reruns it: without `--out` (a path of the machine
    that ran it)."""
    argv, kept = sys.argv[1:], []
    while argv:
        arg = argv.pop(0)
        if arg == "--out":
            argv = argv[1:]
        elif not arg.startswith("--out="):
            kept.append(arg)
    return " ".join(["python -m bench.scale", *kept])


def write(out: Path, results: dict[str, Any]) -> None:
    """Write `results` into `out`, keeping the other device's figures already there (a CPU run
    keeps the kept GPU rows and the other way round)."""
    old = json.loads(out.read_text()) if out.is_file() else {}
    if "gpu" in results:
        results = {**old, **results}
    elif "gpu" in old:
        results = {**results, "gpu": old["gpu"]}
    out.write_text(json.dumps({**results, "run_under": run_under()}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
