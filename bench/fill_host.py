"""The cache fill's host cost: what a fill costs beyond the encoder's forward pass, on the CPU.

On a GPU the forward is fast and the fill waits on the host (tokenising, padding, copying rows
back, writing Arrow shards): `bench.gpu` measures that where a GPU is lent, this measures the
host's part anywhere. The encoder is MiniLM's tokenizer over a 1-layer, 32-wide BERT of its
vocabulary (random weights: a forward that costs next to nothing), on news texts of ~100 tokens
(`bench.gpu.news_texts`), in the same run:
  (a) the fill (`cache.fill_encoder` into a throwaway store), best of `--repeats`;
  (b) tokenising every text once (the backend's unpadded pass) and the trivial forward over
      pre-tokenised, length-sorted batches: the work (a) cannot avoid.
(a) tokenises in a background thread beside the forward: where cores are few (2 here) the two
share them, so (a) / (b) counts the host's whole work; a GPU machine's many cores overlap it.

    python -m bench.fill_host [--texts 20000] [--batch 512] [--repeats 3] [--out FILE]

Prints a Markdown table and writes bench/fill_host.json. The same command with
`PYTHONPATH=<an older checkout>/src` measures that checkout's fill (the bench's own code stays).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from bench.cache_fill import bound, ours
from bench.common import machine, table, write_results
from bench.gpu import news_texts
from simtune import params as P
from simtune.cache import store
from simtune.encoders import FrozenEncoder, model_dir, pool

ROOT = Path(__file__).resolve().parents[1]


def trivial_model(dest: Path, tokenizer_dir: Path) -> Path:
    """A 0-layer (embeddings only), 32-wide BERT of the tokenizer's vocabulary in `dest`, with
    its tokenizer."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.save_pretrained(dest)
    config = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=0,
                                     num_attention_heads=1, intermediate_size=32,
                                     max_position_embeddings=512)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(dest)
    return dest


def floor(encoder: FrozenEncoder, texts: list[str], batch: int) -> tuple[float, float]:
    """Seconds of (b): one tokenising pass, and the forward over pre-tokenised batches."""
    if not hasattr(encoder, "pieces"):  # an older checkout: lengths, then each batch
        forward, tokenise = bound(encoder, texts, batch)
        return tokenise, forward
    t0 = time.perf_counter()
    pieces = encoder.pieces(texts)
    tokenise = time.perf_counter() - t0
    assert pieces is not None, "MiniLM's tokenizer has the backend fast path"
    order = sorted(range(len(texts)), key=lambda i: len(pieces[i].ids))
    batches = [encoder.pad([pieces[j] for j in order[i : i + batch]])
               for i in range(0, len(order), batch)]
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            h = encoder.model(**b).last_hidden_state
            torch.nn.functional.normalize(pool(h, b["attention_mask"], "mean"), dim=-1)
    return tokenise, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="", help="write the JSON here (default bench/)")
    args = ap.parse_args()
    os.environ[store.ENV] = tempfile.mkdtemp(prefix="simtune-bench-store-")  # never the user's
    p = P.load(ROOT / "params.yaml")
    spec = p.encoders.models["minilm"]
    with tempfile.TemporaryDirectory() as d:
        spec = spec.model_copy(update={"model": str(trivial_model(Path(d) / "m",
                                                                   model_dir("minilm", spec)))})
        encoder = FrozenEncoder("minilm", spec, torch.device("cpu"))
        texts = news_texts(args.texts)
        listed = list(texts.values())
        cp = p.cache.model_copy(update={"device": "cpu", "batch_size": args.batch,
                                        "backend": "torch"})
        ours(encoder, texts, cp)  # warm-up
        fills, tok, fwd = [], [], []
        for _ in range(args.repeats):  # interleaved: a busy spell hits both
            fills.append(ours(encoder, texts, cp)[0])
            t, f = floor(encoder, listed, args.batch)
            tok.append(t)
            fwd.append(f)
    n, t_fill, t_tok, t_fwd = len(texts), min(fills), min(tok), min(fwd)
    tokens = sum(encoder.token_lengths(listed[:2000])) / min(n, 2000)
    us = 1e6 / n
    rows = [
        {"measure": f"fill, {n:,} news texts of ~{tokens:.0f} tokens, trivial forward, batch "
                    f"{args.batch} (us a text)", "ours": t_fill * us,
         "peer name": "tokenising once + the forward on pre-tokenised batches",
         "peer": (t_tok + t_fwd) * us, "ratio": t_fill / (t_tok + t_fwd), "target": ""},
        {"measure": "of which tokenising once (us a text)", "ours": t_tok * us, "peer name": "",
         "peer": "", "ratio": "", "target": ""},
    ]
    cols = ["measure", "ours", "peer name", "peer", "ratio", "target"]
    print(f"machine: {machine()}; torch threads {torch.get_num_threads()}; load average "
          f"{os.getloadavg()[0]:.2f} at the end\n")
    print(table(rows, cols))
    path = write_results("fill_host", {
        "machine": machine(), "texts": n, "batch_size": args.batch,
        "threads": torch.get_num_threads(), "load_average_1min_at_end": os.getloadavg()[0],
        "seconds": {"fill": fills, "tokenise": tok, "forward": fwd}, "rows": rows,
        "table": table(rows, cols)}, args.out or None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
