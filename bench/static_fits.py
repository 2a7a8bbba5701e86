"""bench.static's fitted rows: our static student (`simtune.train.static.fit`, the train stage's
code) and model2vec's own similarity fit, on one set's fit texts and a teacher's vectors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from bench.static_data import SetData, score, validator

ROOT = Path(__file__).resolve().parents[1]


def news_texts(n: int) -> list[str]:
    """`n` unlabelled texts: news titles, then their sentences (bench.layers' articles)."""
    from bench.layers import _news_articles

    out: list[str] = []
    for a in _news_articles():
        out.append(a["title"].strip())
        out += [s.strip() + "." for s in a["text"].split(". ") if 20 < len(s) < 200]
        if len(out) >= n:
            break
    return out[:n]


def fit_settings(label_weight: float, epochs: int) -> Any:
    """params.yaml's static schedule (`train.schedule.static`, `train.loss.temperature`,
    `train.seed`, `train.monitor`) with `label_weight` and `epochs` (max_epochs)."""
    from simtune import params as P
    from simtune.train import static as st

    t = P.read_yaml(ROOT / "params.yaml")["train"]
    s = t["schedule"]["static"]
    return st.FitSettings(lr=s["lr"], batch_size=s["batch_size"], max_epochs=epochs,
                          patience=s["patience"], label_weight=label_weight,
                          temperature=t["loss"]["temperature"], seed=t["seed"],
                          # `auto` as on the bench's sets (TREC, bbc...: 64+ validation
                          # queries; a tiny smoke run's fewer select by map@r as the stage's)
                          monitor=P.monitor_for(t["monitor"], 64, t["auto"]["map_r_below"]))


def ours(s: SetData, init: Any, target: torch.Tensor, extra: list[str], label_weight: float,
         epochs: int, out: Path, lsq: bool = False, weight_rate: float = 0.0
         ) -> dict[str, Any]:
    """Fit our student on the set's fit texts + `extra` unlabelled ones (`target`: the
    teacher's vectors of those texts, in that order; the label term: SupCon on groups'
    labels, MNRL on the train pairs) from the table `init` (`lsq`: the map by least squares,
    as the stage starts a distilled table; else at identity, as it starts the teacher's token
    vectors; `weight_rate`: learned token weights, `token_weights`), write its folder; the
    fit's seconds include tokenising the fit texts."""
    from simtune import static
    from simtune.train import static as st

    validate = validator(s, init)
    t0 = time.perf_counter()
    tokens = st.Tokens.of(init, [t for t, _ in s.fit] + extra)
    labels = None if s.labels is None else torch.cat(
        [s.labels, torch.full((len(extra),), -1, dtype=torch.long)])
    # as the train stage starts it (simtune.train.static_run.start_table)
    student = st.StaticStudent(init.weight, st.least_squares_map(
        st.StaticStudent(init.weight), tokens, target) if lsq else None,
        weight_rate=weight_rate)
    result = st.fit(student, tokens, target, validate, fit_settings(label_weight, epochs),
                    labels=labels, pairs=s.pairs)
    fit_s = time.perf_counter() - t0
    static.write(out, init.tokenizer, result.table, "teacher")
    return {"folder": out, "fit_s": fit_s, "epoch": result.best_epoch,
            "history": result.history}


def m2v_fit(s: SetData, own: Path, target: torch.Tensor, val_target: torch.Tensor,
            settings: list[dict[str, Any]], epochs: int) -> dict[str, Any]:
    """model2vec's own similarity fit (its MLP head on the distilled table `own`) to the
    teacher's vectors of the fit texts (`target`; validation: `val_target` of the val texts)
    at each of `settings`, the best by val P@1."""
    from model2vec import StaticModel
    from model2vec.train import StaticModelForSimilarity

    best: dict[str, Any] = {}
    for setting in settings:
        t0 = time.perf_counter()
        model = StaticModelForSimilarity.from_static_model(
            model=StaticModel.from_pretrained(str(own)), **setting["model"])
        model.fit([t for t, _ in s.fit], target, X_val=[t for t, _ in s.val_fit],
                  y_val=val_target, max_epochs=epochs, device="cpu", **setting["fit"])
        fit_s = time.perf_counter() - t0

        def enc(texts: list[str], role: str = "query", m: Any = model) -> torch.Tensor:
            return torch.from_numpy(m.encode(texts)).float()
        p1 = score(s, s.val, enc, (1,))["p@1"]
        if not best or p1 > best["val_p1"]:
            best = {"val_p1": p1, "encode": enc, "fit_s": fit_s, "setting": setting}
    return best


def peer_settings(spec: str) -> list[dict[str, Any]]:
    """`--peer` ("lr3e-3,lr1e-3,nolayer") as model2vec settings."""
    return [{"model": {"n_layers": 0 if "nolayer" in x else 1},
             "fit": {"learning_rate": float(x.replace("nolayer", "").replace("lr", "") or 1e-3)}}
            for x in spec.split(",")]
