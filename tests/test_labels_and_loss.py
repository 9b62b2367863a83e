"""Label alignment (slot k -> token at p + k, slot 0 untrained) and loss weights on hand-built cases."""

import math

import pytest
import torch

from spec_drafters.anchors import block_labels, build_blocks
from spec_drafters.losses import HardCE, slot_weights


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
    assert HardCE(gamma=7.0)(logits, labels, slots).item() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("gamma", [0.0, -1.0, float("inf")])
def test_bad_gamma_is_rejected_with_the_flag(gamma):
    with pytest.raises(ValueError, match="gamma"):
        HardCE(gamma=gamma)
