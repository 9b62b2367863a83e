"""Label alignment (slot k -> token at p + k, slot 0 untrained) and loss weights on hand-built cases."""

import math

import pytest
import torch

from spec_drafters.model.blocks import build_blocks
from spec_drafters.train.acceptance_losses import CAP, accepted_indicator
from spec_drafters.train.anchors import UniformAnchors, block_labels
from spec_drafters.train.losses import CEKLBlend, HardCE, SlotBatch, SoftKL, slot_weights


def slot_batch(logits, labels, slots, target_logits=None, supervised=None, hidden=None):
    m = labels.shape[0]
    if supervised is None:
        supervised = torch.zeros((1, 1, m + 1), dtype=torch.bool)
        supervised[0, 0, 1:] = True
    hidden = torch.zeros((m, 2)) if hidden is None else hidden
    return SlotBatch.from_logits(logits, labels, slots, hidden, supervised, target_logits)


def test_blocks_and_labels_by_hand():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    labels = ids + 100  # "the target says 100 + token" at every position
    label_ok = torch.ones_like(ids, dtype=torch.bool)
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 0, 1]])
    anchors = torch.tensor([[1, 4, 0]])
    anchor_ok = torch.tensor([[True, True, False]])
    block, pos = build_blocks(ids, anchors, 3, mask_token_id=99)
    assert block.tolist() == [[11, 99, 99, 14, 99, 99, 10, 99, 99]]
    assert pos.tolist() == [[1, 2, 3, 4, 5, 6, 0, 1, 2]]
    lab, ok = block_labels(labels, label_ok, loss_mask, anchors, anchor_ok, 3)
    assert lab[0, 0].tolist() == [111, 112, 113]  # slot k of anchor 1 gets position 1 + k
    assert ok[0, 0].tolist() == [False, True, True]  # slot 0 is never trained
    assert ok[0, 1].tolist() == [False, False, True]  # position 5 is unsupervised, 6 is
    assert ok[0, 2].tolist() == [False, False, False]  # padded anchor


def test_labels_past_the_end_are_invalid():
    ids = torch.arange(5)[None]
    _, ok = block_labels(
        ids,
        torch.ones_like(ids, dtype=torch.bool),
        torch.ones_like(ids),
        torch.tensor([[3]]),
        torch.tensor([[True]]),
        4,
    )
    assert ok[0, 0].tolist() == [False, True, False, False]  # only position 4 exists


def test_slot_weights_by_hand():
    w = slot_weights(torch.tensor([1, 2, 3]), gamma=4.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-0.25), math.exp(-0.5)]))
    assert torch.equal(slot_weights(torch.tensor([1, 5]), gamma=None), torch.ones(2))
    with pytest.raises(ValueError, match="slot 0"):
        slot_weights(torch.tensor([0, 1]), gamma=4.0)


def test_hard_ce_is_the_weighted_mean_of_per_slot_ce():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2, 1])
    slots = torch.tensor([1, 2, 3])
    ce = [-math.log(math.exp(2) / (math.exp(2) + 2)), -math.log(1 / (math.e + 2)), math.log(3)]
    w = [1.0, math.exp(-1 / 7), math.exp(-2 / 7)]
    want = sum(a * b for a, b in zip(w, ce, strict=True)) / sum(w)
    got = HardCE(gamma=7.0)(slot_batch(logits, labels, slots))["loss"]
    assert got.item() == pytest.approx(want, rel=1e-6)


def test_soft_kl_and_blend_by_hand():
    student = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    teacher = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    labels, slots = torch.tensor([0, 1]), torch.tensor([1, 2])

    def kl(p_logits, q_logits, t):
        p = [math.exp(x / t) for x in p_logits]
        q = [math.exp(x / t) for x in q_logits]
        p = [x / sum(p) for x in p]
        q = [x / sum(q) for x in q]
        return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True)) * t * t

    for t in (1.0, 2.0):
        w = [1.0, math.exp(-1 / 4)]
        per = [kl(teacher[i].tolist(), student[i].tolist(), t) for i in range(2)]
        want_kl = (w[0] * per[0] + w[1] * per[1]) / sum(w)
        batch = slot_batch(student, labels, slots, target_logits=teacher)
        got = SoftKL(gamma=4.0, temperature=t)(batch)["loss"]
        assert got.item() == pytest.approx(want_kl, rel=1e-6)
        blend = CEKLBlend(gamma=4.0, alpha=0.15, temperature=t)(batch)
        want_ce = HardCE(gamma=4.0)(batch)["loss"].item()
        assert blend["loss"].item() == pytest.approx(want_ce + 0.15 * want_kl, rel=1e-6)
        assert blend["kl"].item() == pytest.approx(want_kl, rel=1e-6)
    same = SoftKL()(slot_batch(teacher, labels, slots, target_logits=teacher))["loss"]
    assert same.item() == pytest.approx(0)


def test_acceptance_indicator_by_hand():
    hit = torch.tensor([[[False, True, True, False, True], [False, False, True, True, True]]])
    sup = torch.tensor([[[False, True, True, True, True], [False, True, True, False, True]]])
    acc, known = accepted_indicator(hit, sup)
    # block 0: slots 1, 2 match, slot 3 misses, so 3 and 4 are not accepted
    assert acc[0, 0].tolist() == [False, True, True, False, False]
    assert known[0, 0].tolist() == [False, True, True, True, True]
    # block 1: slot 1 misses; slot 3 is unsupervised, so acceptance of 3 and 4 is unknown
    assert acc[0, 1].tolist() == [False] * 5
    assert known[0, 1].tolist() == [False, True, True, False, False]


def test_cap_adds_a_confidence_bce_to_any_loss():
    torch.manual_seed(0)
    sup = torch.tensor([[[False, True, True, True]]])
    logits = torch.tensor([[3.0, 0.0], [0.0, 3.0], [3.0, 0.0]], requires_grad=True)
    labels = torch.tensor([0, 1, 1])  # slots 1, 2 hit, slot 3 misses -> accepted 1, 1, 0
    hidden = torch.randn(3, 4, requires_grad=True)
    cap = CAP(HardCE(gamma=4.0), weight=0.5)
    cap.bind(4)
    torch.nn.init.normal_(cap.head.weight)
    out = cap(slot_batch(logits, labels, torch.tensor([1, 2, 3]), supervised=sup, hidden=hidden))
    z = cap.head(hidden).squeeze(-1)
    want_bce = torch.nn.functional.binary_cross_entropy_with_logits(z, torch.tensor([1.0, 1.0, 0.0]))
    assert out["cap_bce"].item() == pytest.approx(want_bce.item(), rel=1e-6)
    assert out["loss"].item() == pytest.approx(out["main"].item() + 0.5 * want_bce.item(), rel=1e-6)
    out["loss"].backward()
    assert cap.head.weight.grad.abs().sum() > 0 and hidden.grad.abs().sum() > 0
    assert cap.confidence(hidden).shape == (3,)
    assert CAP(SoftKL()).needs_distribution and not CAP(HardCE()).needs_distribution


@pytest.mark.parametrize("gamma", [0.0, -1.0, float("inf")])
def test_bad_gamma_is_rejected(gamma):
    with pytest.raises(ValueError, match=f"^gamma must be a positive number or null, got {gamma}$"):
        HardCE(gamma=gamma)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SoftKL(temperature=0.0), "temperature must be a positive number, got 0.0"),
        (lambda: CEKLBlend(alpha=-1.0), "alpha must be >= 0, got -1.0"),
        (lambda: CAP(HardCE(), weight=0.0), "weight must be a positive number, got 0.0"),
        (lambda: CAP(CAP(HardCE())), "main cannot itself be cap"),
        (lambda: UniformAnchors(max_anchors=0), "max_anchors must be >= 1, got 0"),
    ],
)
def test_components_name_their_argument_not_a_flag(make, message):
    """The same class serves under several flags; the caller adds the flag (errors.argument)."""
    with pytest.raises(ValueError) as raised:
        make()
    assert str(raised.value) == message


def test_training_loss_does_not_keep_the_whole_logits_block():
    """Unchunked training: the (M, V) logits live only as long as backward needs them (the batch does
    not hold them), with the same loss, gradient and argmax as a batch over the kept logits."""
    import weakref

    g = torch.Generator().manual_seed(0)
    head_w = torch.randn((50, 4), generator=g)
    hidden = torch.randn((6, 4), generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (6,), generator=g)
    slots = torch.tensor([1, 2, 3, 1, 2, 3])
    sup = torch.ones((1, 2, 3), dtype=torch.bool)
    made = []

    def head(x):
        out = x @ head_w.T
        made.append(weakref.ref(out))
        return out

    batch = SlotBatch(hidden, labels, slots, sup, head=head)
    loss = HardCE(gamma=4.0)(batch)["loss"]
    assert batch._logits is None and len(made) == 1
    assert torch.equal(batch.argmax(), (hidden @ head_w.T).argmax(-1)) and len(made) == 1
    loss.backward()
    del loss
    assert made[0]() is None  # nothing holds the block once backward is done
    got = hidden.grad.clone()

    hidden.grad = None
    kept = SlotBatch.from_logits(hidden @ head_w.T, labels, slots, hidden, sup)
    want = HardCE(gamma=4.0)(kept)["loss"]
    want.backward()
    assert torch.allclose(got, hidden.grad, atol=1e-6)
    with torch.no_grad():  # validation keeps the block for its metrics
        val = SlotBatch(hidden, labels, slots, sup, head=head)
        HardCE(gamma=4.0)(val)
        assert val._logits is not None
