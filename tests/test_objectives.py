"""The 2026 objectives on cases small enough to work out by hand: D-PACE position weights, the LK losses
(TV, NLA, LK hybrid) and weighted mixes of losses."""

import math

import pytest
import torch

from spec_drafters.registry import entries, load_components
from spec_drafters.train.losses import (
    HardCE,
    LKHybrid,
    LossMix,
    NegativeLogAcceptance,
    SlotBatch,
    TotalVariation,
)
from spec_drafters.train.weights import DPACE, ExpDecay


def test_dpace_weights_by_hand():
    # Block 1: slots 1..3 supervised, CE ln 2, ln 4, 0 -> exp(-CE) .5, .25, 1 -> q (alpha .5) .75, .625, 1.
    # Block 2: slot 2's label is outside the draft vocabulary (not supervised, scores alpha), CE 0, ln 2.
    supervised = torch.tensor([[[False, True, True, True], [False, True, False, True]]])
    ce = torch.tensor([math.log(2), math.log(4), 0.0, 0.0, math.log(2)])
    slots = torch.tensor([1, 2, 3, 1, 3])
    w = DPACE(alpha=0.5)(slots, supervised, ce)
    p1 = [0.75, 0.75 * 0.625, 0.75 * 0.625 * 1.0]  # prefix products of block 1
    p2 = [1.0, 1.0 * 0.5, 1.0 * 0.5 * 0.75]  # block 2: q = 1, alpha, .75
    want = [sum(p1), p1[1] + p1[2], p1[2], p2[0] + p2[2], p2[2]]  # w_j = sum over supervised m >= j
    assert w.tolist() == pytest.approx(want)
    assert DPACE(alpha=1.0)(slots, supervised, ce).tolist() == pytest.approx([3, 2, 1, 2, 1])  # counts


def _batch(logits, labels, slots, supervised, teacher=None, chunk_rows=None):
    hidden = logits.clone().requires_grad_(True)  # the head is the identity: hidden are the logits
    return SlotBatch(
        hidden, labels, slots, supervised, head=lambda x: x,
        teacher=None if teacher is None else (lambda rows: teacher[rows]), chunk_rows=chunk_rows,
    )  # fmt: skip


def _one_block(m=3):
    supervised = torch.zeros((1, 1, m + 1), dtype=torch.bool)
    supervised[0, 0, 1:] = True
    return torch.arange(1, m + 1), supervised


def test_dpace_weighted_ce_is_the_weighted_mean_with_detached_weights():
    torch.manual_seed(0)
    slots, sup = _one_block()
    logits, labels = torch.randn(3, 5), torch.tensor([1, 4, 0])
    batch = _batch(logits, labels, slots, sup)
    loss = HardCE(weights=DPACE(0.5))(batch)["loss"]
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    w = DPACE(0.5)(slots, sup, ce)
    assert loss.item() == pytest.approx((w * ce).sum().item() / w.sum().item(), rel=1e-6)
    loss.backward()  # the weights carry no gradient: d loss / d logits = w_i/sum(w) * d ce_i
    ref = logits.clone().requires_grad_(True)
    ((w * torch.nn.functional.cross_entropy(ref, labels, reduction="none")).sum() / w.sum()).backward()
    assert torch.allclose(batch.hidden.grad, ref.grad, atol=1e-6)


P, Q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])  # target, drafter


def _lk(loss_cls):
    slots, sup = torch.tensor([1]), torch.tensor([[[False, True]]])
    batch = _batch(Q.log()[None], torch.tensor([0]), slots, sup, teacher=P.log()[None])
    return loss_cls(gamma=None)(batch), batch


def test_lk_losses_by_hand():
    alpha = 0.2 + 0.3 + 0.2  # sum of the smaller probability per token
    kl = sum(p * math.log(p / q) for p, q in zip(P.tolist(), Q.tolist(), strict=True))
    lam = math.exp(-3 * alpha)
    assert _lk(TotalVariation)[0]["loss"].item() == pytest.approx(1 - alpha, rel=1e-6)
    assert _lk(NegativeLogAcceptance)[0]["loss"].item() == pytest.approx(-math.log(alpha), rel=1e-6)
    out = _lk(LKHybrid)[0]
    assert out["loss"].item() == pytest.approx(lam * kl + (1 - lam) * (1 - alpha), rel=1e-6)
    assert out["lambda"].item() == pytest.approx(lam) and out["tv"].item() == pytest.approx(1 - alpha)


def test_nla_gradient_is_tv_gradient_over_alpha():
    tv, tv_batch = _lk(TotalVariation)
    nla, nla_batch = _lk(NegativeLogAcceptance)
    tv["loss"].backward()
    nla["loss"].backward()
    assert torch.allclose(nla_batch.hidden.grad, tv_batch.hidden.grad / 0.7, atol=1e-6)


def test_a_mix_is_the_weighted_sum_of_its_terms_and_chunking_changes_nothing():
    torch.manual_seed(1)
    m = 5
    slots, sup = _one_block(m)
    logits, teacher, labels = torch.randn(m, 7), torch.randn(m, 7), torch.randint(0, 7, (m,))
    mix = LossMix([HardCE(), TotalVariation()], [0.1, 0.9], gamma=4.0, weights=DPACE(0.5))
    whole = mix(_batch(logits, labels, slots, sup, teacher))
    chunked = mix(_batch(logits, labels, slots, sup, teacher, chunk_rows=2))
    for key in ("loss", "hard_ce", "tv"):
        assert chunked[key].item() == pytest.approx(whole[key].item(), rel=1e-6)
    ce = HardCE(weights=DPACE(0.5))(_batch(logits, labels, slots, sup, teacher))["loss"]
    tv = TotalVariation(weights=DPACE(0.5))(_batch(logits, labels, slots, sup, teacher))["loss"]
    assert whole["hard_ce"].item() == pytest.approx(ce.item(), rel=1e-6)
    assert whole["loss"].item() == pytest.approx(0.1 * ce.item() + 0.9 * tv.item(), rel=1e-6)
    assert mix.needs_distribution and not HardCE().needs_distribution


def test_bad_mixes_and_weights_are_refused():
    with pytest.raises(ValueError, match="pair up"):
        LossMix([HardCE()], [0.5, 0.5])
    with pytest.raises(ValueError, match="per-slot losses"):
        LossMix([LossMix([HardCE()], [1.0])], [1.0])
    with pytest.raises(ValueError, match="alpha"):
        DPACE(alpha=1.5)
    with pytest.raises(ValueError, match="gamma"):
        ExpDecay(gamma=0)


def test_the_registry_lists_the_new_objectives():
    load_components()
    assert {"tv", "nla", "lk_hybrid", "mix"} <= {e.name for e in entries("loss")}
    assert {e.name for e in entries("slot_weights")} >= {"dpace", "exp_decay"}


def test_a_mix_with_dpace_trains_from_the_command_line(tmp_path):
    from spec_drafters.cli.main import main

    overlay = tmp_path / "mix.yaml"
    overlay.write_text(
        "model:\n  loss:\n    class_path: LossMix\n    init_args:\n"
        "      losses: [{class_path: HardCE}, {class_path: TotalVariation}]\n"
        "      coefficients: [0.1, 0.9]\n"
        "      weights: {class_path: DPACE, init_args: {alpha: 0.5}}\n"
    )
    main(["fit", "--config", "tests/configs/tiny.yaml", "--config", str(overlay), "--trainer.max_steps", "3",
          "--trainer.default_root_dir", str(tmp_path), "--results", str(tmp_path / "fit.json")])  # fmt: skip
    import json

    metrics = json.loads((tmp_path / "fit.json").read_text())["metrics"]
    assert math.isfinite(metrics["train/loss"]) and "train/tv" in metrics and "train/hard_ce" in metrics


def test_dspark_confidence_target_is_the_acceptance_probability():
    from spec_drafters.train.acceptance_losses import DSparkConfidence

    slots, sup = torch.tensor([1]), torch.tensor([[[False, True]]])
    loss = DSparkConfidence(HardCE(gamma=None), weight=1.0)
    loss.bind(3)
    batch = _batch(Q.log()[None], torch.tensor([0]), slots, sup, teacher=P.log()[None])
    out = loss(batch)  # the head starts at p = 0.5: BCE to c* = 0.7 is ln 2 whatever c* is
    assert out["confidence_bce"].item() == pytest.approx(math.log(2), rel=1e-6)
    with torch.no_grad():
        loss.head.bias.fill_(math.log(0.7 / 0.3))  # predicts exactly c* = sum_v min(p, q) = 0.7
    entropy = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))
    out = loss(_batch(Q.log()[None], torch.tensor([0]), slots, sup, teacher=P.log()[None]))
    assert out["confidence_bce"].item() == pytest.approx(entropy, rel=1e-5)  # the minimum: c* itself
    assert loss.needs_distribution


def test_an_inline_loss_on_the_command_line_is_checked_like_a_file():
    from spec_drafters.cli.checks import check_argv_components
    from spec_drafters.registry import UnknownComponentError

    mix = "{class_path: LossMix, init_args: {losses: [{class_path: HardCE}], coefficients: [1.0]}}"
    check_argv_components(["--model.loss", mix])  # known names: no error
    with pytest.raises(UnknownComponentError, match=r"unknown loss 'NoSuchLoss'; valid: cap"):
        check_argv_components(["--model.loss", mix.replace("LossMix", "NoSuchLoss")])
