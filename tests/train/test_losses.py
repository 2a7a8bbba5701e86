"""Each loss against values computed by hand on four 2-d vectors.

a=(1,0), b=(.6,.8), c=(0,1), d=(-1,0); labels a,b -> 0 and c,d -> 1. Cosine similarities:
ab .6, ac 0, ad -1, bc .8, bd -.6, cd 0; cosine distances (1 - cos): ab .4, ac 1, ad 2, bc .2,
bd 1.6, cd 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from simtune.train import losses
from simtune.train.losses import GroupLoss, PairLoss

E = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]])
LABELS = torch.tensor([0, 0, 1, 1])
exp, log = math.exp, math.log


def group(name: str, **kw: float | str) -> GroupLoss:
    args = {"distance": "cosine", "temperature": 1.0, "margin": 0.5, "mining": "batch_hard",
            "scale": 1.0, **kw}
    return GroupLoss(name, **args)  # type: ignore[arg-type]


def test_supcon() -> None:
    want = (-(0.6 - log(exp(0.6) + 1 + exp(-1)))
            - (0.6 - log(exp(0.6) + exp(0.8) + exp(-0.6)))
            - (0 - log(1 + exp(0.8) + 1))
            - (0 - log(exp(-1) + exp(-0.6) + 1))) / 4
    assert group("supcon")(E, LABELS).item() == pytest.approx(want, abs=1e-6)


def test_supcon_temperature_and_anchor_without_positive() -> None:
    # a third label with a single member: that anchor has no positive and is not averaged
    e = torch.cat([E, torch.tensor([[0.0, -1.0]])])
    labels = torch.tensor([0, 0, 1, 1, 2])
    t = 0.5
    s = {("a", "b"): 0.6, ("a", "c"): 0.0, ("a", "d"): -1.0, ("a", "e"): 0.0,
         ("b", "c"): 0.8, ("b", "d"): -0.6, ("b", "e"): -0.8, ("c", "d"): 0.0, ("c", "e"): -1.0,
         ("d", "e"): 0.0}
    sim = lambda x, y: s.get((x, y), s.get((y, x)))  # noqa: E731

    def anchor(x: str, p: str) -> float:
        others = [o for o in "abcde" if o != x]
        return -(sim(x, p) / t - log(sum(exp(sim(x, o) / t) for o in others)))

    want = (anchor("a", "b") + anchor("b", "a") + anchor("c", "d") + anchor("d", "c")) / 4
    assert group("supcon", temperature=t)(e, labels).item() == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(("mining", "want"), [
    ("batch_hard", (0 + 0.7 + 1.3 + 0) / 4),
    ("batch_all", (0.7 + 0.5 + 1.3) / 3),   # mean over triplets with a positive loss
    ("semi_hard", (0 + 0 + 0.5 + 0) / 4),   # (c,d) has no farther negative: farthest one
])
def test_triplet(mining: str, want: float) -> None:
    assert group("triplet", mining=mining)(E, LABELS).item() == pytest.approx(want, abs=1e-6)


def test_triplet_euclidean() -> None:
    e = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [0.0, 3.0]])
    # distances: ab 1, ac 2, ad 3, bc sqrt5, bd sqrt10, cd 1; batch_hard, margin .5
    want = (max(1 - 2 + 0.5, 0) + max(1 - math.sqrt(5) + 0.5, 0) + max(1 - 2 + 0.5, 0)
            + max(1 - 3 + 0.5, 0)) / 4
    got = group("triplet", distance="euclidean")(e, LABELS).item()
    assert got == pytest.approx(want, abs=1e-6)


def test_contrastive_groups() -> None:
    want = (2 * 0.5 * 0.4**2 + 2 * 0.5 * 1.0 + 2 * 0.5 * 0.3**2) / 12
    assert group("contrastive")(E, LABELS).item() == pytest.approx(want, abs=1e-6)


def test_cosine_mse_is_setfits_pair_loss_balanced_per_anchor() -> None:
    # per anchor: mean (cos - 1)^2 over its positives, mean cos^2 over its negatives, halved sum
    a = 0.5 * (0.4**2 + (0.0**2 + 1.0**2) / 2)
    b = 0.5 * (0.4**2 + (0.8**2 + 0.6**2) / 2)
    c = 0.5 * (1.0**2 + (0.0**2 + 0.8**2) / 2)
    d = 0.5 * (1.0**2 + (1.0**2 + 0.6**2) / 2)
    want = (a + b + c + d) / 4  # 0.54
    assert group("cosine_mse")(E, LABELS).item() == pytest.approx(want, abs=1e-6)
    # always cosine: the distance key changes nothing; scale-free: a vector's length neither
    assert group("cosine_mse", distance="euclidean")(3 * E, LABELS).item() == pytest.approx(
        want, abs=1e-6)
    # a label with one member has no positive: that anchor is not averaged
    e = torch.cat([E, torch.tensor([[0.0, -1.0]])])
    got = group("cosine_mse")(e, torch.tensor([0, 0, 1, 1, 2])).item()
    # e's cosines: a 0, b -.8, c -1, d 0: each other anchor gains a negative
    a5 = 0.5 * (0.4**2 + (0 + 1 + 0) / 3)
    b5 = 0.5 * (0.4**2 + (0.64 + 0.36 + 0.64) / 3)
    c5 = 0.5 * (1.0 + (0 + 0.64 + 1) / 3)
    d5 = 0.5 * (1.0 + (1 + 0.36 + 0) / 3)
    assert got == pytest.approx((a5 + b5 + c5 + d5) / 4, abs=1e-6)


def test_arcface() -> None:
    loss = group("arcface", scale=2.0, num_classes=2, dim=2)
    with torch.no_grad():
        loss.centers.copy_(torch.eye(2))
    s, m = 2.0, 0.5

    def ce(logits: list[float], target: int) -> float:
        return -(logits[target] - log(sum(exp(x) for x in logits)))

    want = (ce([s * math.cos(m), 0.0], 0)
            + ce([s * (0.6 * math.cos(m) - 0.8 * math.sin(m)), s * 0.8], 0)
            + ce([0.0, s * math.cos(m)], 1)
            + ce([-s, s * -math.sin(m)], 1)) / 4
    assert loss(E, LABELS).item() == pytest.approx(want, abs=1e-5)


def _pairs(name: str, **kw: float | bool) -> PairLoss:
    args = {"distance": "cosine", "scale": 1.0, "symmetric": False, "margin": 0.5, **kw}
    return PairLoss(name, **args)  # type: ignore[arg-type]


Q, D = E[[0, 2]], E[[1, 3]]  # queries a, c; their documents b, d


def test_mnrl_and_symmetric() -> None:
    ids_q, ids_d, scores = torch.tensor([0, 1]), torch.tensor([10, 11]), torch.ones(2)
    fwd = (-(0.6 - log(exp(0.6) + exp(-1))) - (0 - log(exp(0.8) + 1))) / 2
    assert _pairs("mnrl")(Q, D, ids_q, ids_d, scores).item() == pytest.approx(fwd, abs=1e-6)
    back = (-(0.6 - log(exp(0.6) + exp(0.8))) - (0 - log(exp(-1) + 1))) / 2
    got = _pairs("mnrl", symmetric=True)(Q, D, ids_q, ids_d, scores).item()
    assert got == pytest.approx((fwd + back) / 2, abs=1e-6)


def test_mnrl_masks_false_negatives() -> None:
    # both rows belong to the same query: the other document is a positive, not a negative
    got = _pairs("mnrl")(Q, D, torch.tensor([0, 0]), torch.tensor([10, 11]), torch.ones(2))
    assert got.item() == pytest.approx(0.0, abs=1e-7)


def test_contrastive_pairs_with_score() -> None:
    want = (0.5 * 0.4**2 + 0 + 0.5 * 0.3**2 + 0.5 * (0.5 * 1.0)) / 4
    got = _pairs("contrastive")(Q, D, torch.tensor([0, 1]), torch.tensor([10, 11]),
                                torch.tensor([1.0, 0.5]))
    assert got.item() == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("name", ["supcon", "triplet", "contrastive", "cosine_mse"])
def test_chunked_equals_unchunked_with_gradients(name: str, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    torch.manual_seed(0)
    x = torch.randn(40, 8, requires_grad=True)
    labels = torch.randint(0, 5, (40,))
    whole = group(name, mining="batch_all")(x, labels)
    (g_whole,) = torch.autograd.grad(whole, x)
    monkeypatch.setattr(losses, "CHUNK_ROWS", 7)  # 6 checkpointed chunks
    monkeypatch.setattr(losses, "WHOLE_ELEMENTS", 40 * 40 - 1)  # 40 x 40 no longer fits
    chunked = group(name, mining="batch_all")(x, labels)
    (g_chunked,) = torch.autograd.grad(chunked, x)
    assert chunked.item() == pytest.approx(whole.item(), rel=1e-6)
    assert torch.allclose(g_chunked, g_whole, atol=1e-6)
